"""Hooks pytest-ftready offers to conftest files and plugins."""

import pytest


@pytest.hookspec(firstresult=True)
def pytest_ftready_machine(config):
    """Return a ``pytest_ftready.machine.probes.Machine`` to use instead of probing this machine
    (a fake machine in tests, or a machine description from elsewhere). First result wins."""


@pytest.hookspec(firstresult=True)
def pytest_ftready_pipeline(recipe, tokenizer):
    """Return the team's own data pipeline, so the checks judge the labels their code makes:
    a function ``row: dict -> {"input_ids": [...], "labels": [...]}`` (the one their trainer
    maps over the dataset), a ``(function, collator)`` pair, or a
    ``pytest_ftready.trainers.base.Pipeline``. None: the recipe's own pipeline. First result wins."""
