"""The trainers: one module per trainer holding what the plugin knows of it (its pipeline,
its own training step, its save and resume), behind one interface (``base.Trainer``) that
the session asks. ``builtin`` is pytest-ftready's own engine, the trainer of last resort;
``trl`` runs TRL's own preprocessing, step, overfit and resume; ``axolotl`` Axolotl's own
preprocessing, step, overfit and resume (the Trainer Axolotl builds from the team's config);
``llamafactory`` LLaMA-Factory's own
preprocessing, step, overfit and resume. ``hf`` holds what the trainers built on
``transformers.Trainer`` share (step logs, the measured step, the fresh-process resume and its
cause); ``worker`` is that fresh process.
A trainer's config reader stays in ``recipe/importers/`` (the recipe is read before any
trainer runs).

Imports the recipe, the data path, the engine and the machine; never the session, the
checks or pytest. No trainer package is imported until its work runs."""

from __future__ import annotations

import importlib

from .base import Pipeline, Trainer, as_pipeline, pipeline_stops

# [data] pipeline -> (module, class); a config's origin format picks its trainer the same way.
TRAINERS = {
    "builtin": ("builtin", "EngineTrainer"),
    "trl": ("trl", "TrlTrainer"),
    "axolotl": ("axolotl", "AxolotlTrainer"),
    "llamafactory": ("llamafactory", "LlamaFactoryTrainer"),
}


def trainer_named(name: str) -> Trainer:
    module, cls = TRAINERS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)()


def select_trainer(recipe) -> Trainer:
    """The recipe's trainer: the one ``[data] pipeline`` names; under "auto", for a trainer's
    config, that trainer when it is installed here; else the built-in engine."""
    asked = recipe.data.pipeline
    if asked != "auto":
        return trainer_named(asked)
    origin = recipe.origin
    if origin is not None and origin.format in TRAINERS:
        trainer = trainer_named(origin.format)
        if trainer.native and not trainer.missing():
            return trainer
    return trainer_named("builtin")


def select_pipeline(state) -> Pipeline:
    """What makes the training examples: the team's (``pytest_ftready_pipeline`` hook) first,
    then the recipe's trainer's."""
    recipe, tokenizer = state.recipe, state.tokenizer
    hook = getattr(state.run, "pipeline_hook", None)
    provided = hook(recipe, tokenizer) if hook is not None else None
    if provided is None:
        return state.trainer.pipeline(state)
    return as_pipeline(provided, recipe, tokenizer, pipeline_stops(state))
