"""The ``scale`` benchmarks (large generated corpora, minutes) and the ``published`` ones (the
memory forecast against published measured peaks) run only when asked for: ``pytest tests -m
scale`` or ``-m published``; a plain ``pytest tests`` deselects them."""

from __future__ import annotations

ON_REQUEST = ("scale", "published")


def pytest_collection_modifyitems(config, items):
    asked = config.option.markexpr or ""
    held = [name for name in ON_REQUEST if name not in asked]
    keep = [item for item in items if not any(item.get_closest_marker(name) for name in held)]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
