"""Helpers shared by the fault-matrix tests."""

from __future__ import annotations

import pytest

from pytest_ftready.outcomes import Fail


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
