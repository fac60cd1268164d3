"""Hooks pytest-ftready offers to conftest files and plugins."""

import pytest


@pytest.hookspec(firstresult=True)
def pytest_ftready_machine(config):
    """Return a ``pytest_ftready.probes.Machine`` to use instead of probing this machine
    (a fake machine in tests, or a machine description from elsewhere). First result wins."""
