"""The ``scale`` benchmarks (large generated corpora, minutes) run only when asked for:
``pytest tests -m scale``; a plain ``pytest tests`` deselects them."""

from __future__ import annotations


def pytest_collection_modifyitems(config, items):
    if "scale" in (config.option.markexpr or ""):
        return
    keep = [item for item in items if item.get_closest_marker("scale") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("scale")])
        items[:] = keep
