"""The trainers: one module per trainer holding what the plugin knows of it (its pipeline, its
own training step, its save and resume), behind one interface (``base.Trainer``) that the
session asks, each handed frozen inputs (``base.RunInputs``), never the session.

``builtin`` is pytest-ftready's own engine, the trainer of last resort and the one every other
trainer's run is shown beside. ``hf`` is the template of the trainers built on
``transformers.Trainer`` (step, overfit, saved run, fresh-process resume written once): ``trl``,
``axolotl``, ``llamafactory`` and ``unsloth`` each supply how they build their Trainer, and ``conftest``
the team's own Trainer (the ``pytest_ftready_trainer`` hook) is built by the team's code; ``mlx`` is
mlx-lm on Apple's MLX (its CPU backend on Linux). ``worker`` is the
fresh process of every trainer's resume.

Adding a trainer: one module with its class (on ``hf.HFTrainer`` where it builds a
``transformers.Trainer``) and a row in ``TRAINERS``; it overrides ``reloaded_outputs`` only where
it saves what it trained its own way (Unsloth's merge, mlx-lm's fuse). A trainer's config is
read once, by ``recipe/importers/`` (the recipe is read before any trainer runs), and its
translation (``recipe.origin``) says what of it the trainer's own run is handed.

Imports the recipe, the data path, the engine and the machine; never the session, the checks
or pytest. No trainer package is imported until its work runs."""

from __future__ import annotations

import importlib

from .base import Trainer

# [data] pipeline -> (module, class); a config's origin format picks its trainer the same way.
TRAINERS = {
    "builtin": ("builtin", "EngineTrainer"),
    "trl": ("trl", "TrlTrainer"),
    "axolotl": ("axolotl", "AxolotlTrainer"),
    "llamafactory": ("llamafactory", "LlamaFactoryTrainer"),
    "unsloth": ("unsloth", "UnslothTrainer"),
    "mlx": ("mlx", "MlxTrainer"),
}
ENGINE = "builtin"  # the built-in engine's name: every trainer's run is shown beside its run


def trainer_named(name: str) -> Trainer:
    module, cls = TRAINERS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)()


def select_trainer(recipe, own=None) -> Trainer:
    """The recipe's trainer: the team's own Trainer where ``own`` (a ``conftest.OwnTrainerHook``,
    the ``pytest_ftready_trainer`` hook) is given (its pipeline the Trainer's own preprocessing); else
    the one ``[data] pipeline`` names; under "auto", for a trainer's config, that trainer when it
    is installed here; else the built-in engine."""
    if own is not None:
        from .conftest import ConftestTrainer

        return ConftestTrainer(own)
    asked = recipe.data.pipeline
    if asked != "auto":
        return trainer_named(asked)
    origin = recipe.origin
    if origin is not None and origin.format in TRAINERS:
        trainer = trainer_named(origin.format)
        if trainer.native and not trainer.missing():
            return trainer
    return trainer_named(ENGINE)
