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


@pytest.hookspec(firstresult=True)
def pytest_ftready_trainer(recipe, rows, output_dir, arguments):
    """Return the team's own ``transformers.Trainer`` (or TRL ``SFTTrainer``, or any subclass),
    built as the team's training script builds it (its model loading, adapter, collator,
    optimizer, scheduler, patches), so ``model.step_memory``, ``model.overfit``,
    ``lifecycle.resume`` and ``lifecycle.generate`` run *that* Trainer.

    ``rows``: a ``datasets.Dataset`` of the rows the check chose, as the JSONL has them (train on
    it as the script trains on its data). ``output_dir``: the folder the Trainer must write in (its
    checkpoints). ``arguments``: the TrainingArguments keys the check sets (``output_dir``,
    ``max_steps``, ``save_steps``, ``per_device_train_batch_size``, ``gradient_accumulation_steps``,
    a constant ``lr_scheduler_type``, ``report_to``, ``logging_steps``, ``use_cpu``...): merge them
    over the script's own, ``SFTConfig(**{**ours, **arguments})``. It is called once per run, also
    in the fresh process of ``lifecycle.resume``, where the conftest file that implements it is
    imported by path. None: the recipe's own trainer. First result wins."""
