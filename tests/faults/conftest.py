"""Helpers shared by the fault-matrix tests."""

from __future__ import annotations

import pytest

from pytest_ftready.outcomes import Fail


def pytest_collection_modifyitems(config, items):
    """``faults_slow`` cases run only when asked for (``pytest tests/faults -m faults_slow``, CI's
    second line): the default run stays fast."""
    if "faults_slow" in (config.option.markexpr or ""):
        return
    slow = [item for item in items if item.get_closest_marker("faults_slow")]
    if slow:
        items[:] = [item for item in items if item.get_closest_marker("faults_slow") is None]
        config.hook.pytest_deselected(items=slow)


@pytest.fixture
def fails(run_check):
    """``fails(state, check_id)``: run the check, expect a Fail; returns its one-line message."""
    def run(state, check_id):
        with pytest.raises(Fail) as info:
            run_check(state, check_id)
        return str(info.value)
    return run


def dependents_of(check_id: str) -> list[str]:
    """Every registered check that needs ``check_id``, directly or through another check."""
    from pytest_ftready.checks.registry import all_checks

    specs = all_checks()
    found: set[str] = set()
    frontier = {check_id}
    while frontier:
        frontier = {s.id for s in specs if set(s.requires) & frontier} - found
        found |= frontier
    return sorted(found)
