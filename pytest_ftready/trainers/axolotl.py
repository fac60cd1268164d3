"""Axolotl: the training examples as Axolotl's own prompt strategy tokenizes and labels each
row (``axolotl.prompt_strategies.load(type, tokenizer, cfg, dataset)`` then
``tokenize_prompt(row)``, the function Axolotl's preprocess maps over the dataset), read from
the team's config by Axolotl's own ``load_cfg``; nothing is written to the config's
``dataset_prepared_path``. The labels get the plugin's independent verification.

The step, overfit and resume are the built-in engine's (``step_trainer`` says so): Axolotl's
own Trainer is not run by the checks yet.

Axolotl pins its own transformers and TRL, so it lives in its own environment with the plugin
(see README, "The trainer's own run"); importing it costs about a minute here."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from ..outcomes import Fail, Skip
from .base import FunctionPipeline, Pipeline, pipeline_stops
from .builtin import EngineTrainer

# Axolotl reports usage unless told not to; the checks never send anything anywhere.
QUIET_ENV = {"AXOLOTL_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1", "WANDB_DISABLED": "true"}


def axolotl_cfg(recipe):
    """The team's config as Axolotl reads it (``load_cfg``), the model at the recipe's path."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    try:
        from axolotl.cli.config import load_cfg
    except ImportError as exc:
        raise Skip(f"the recipe asks for Axolotl's pipeline but axolotl does not import here ({exc}); "
                   f"{AxolotlTrainer.install}") from None
    origin = recipe.origin
    if origin is None or origin.format != "axolotl":
        raise Fail("[data] pipeline = \"axolotl\" needs an Axolotl config: run pytest --ftready=<your axolotl.yml>")
    overrides = {"base_model": str(Path(recipe.model.path).resolve())} if recipe.model.path else {}
    with contextlib.redirect_stdout(io.StringIO()):  # load_cfg prints the whole resolved config
        return load_cfg(origin.source, **overrides)


class AxolotlPipeline(FunctionPipeline):
    """Each row through Axolotl's prompt strategy for the config's dataset entry."""

    def __init__(self, state) -> None:
        from axolotl.loaders import load_tokenizer
        from axolotl.prompt_strategies import load as load_strategy

        recipe = state.recipe
        cfg = axolotl_cfg(recipe)
        kinds = {str(entry.get("type")) for entry in cfg.datasets or ()}
        if len(kinds) != 1:
            raise Fail(f"{recipe.origin.source}: datasets of {len(kinds)} types ({', '.join(sorted(kinds))}); the "
                       "checks read every training file with one Axolotl prompt strategy: keep one type per config")
        entry = cfg.datasets[0]
        tokenizer = load_tokenizer(cfg)
        strategy = load_strategy(entry["type"], tokenizer, cfg, entry)
        if strategy is None or not hasattr(strategy, "tokenize_prompt"):
            raise Skip(f"Axolotl's dataset type {entry['type']!r} has no per-row prompt strategy the checks can run")
        super().__init__(strategy.tokenize_prompt, recipe, state.tokenizer, pipeline_stops(state), name="axolotl")
        self.method = f"Axolotl {entry['type']}"


class AxolotlTrainer(EngineTrainer):
    name = "axolotl"
    module = "axolotl"
    install = ("pip install axolotl in an environment of its own beside pytest-ftready (it pins transformers and "
               "TRL): python -m venv V && V/bin/pip install torch axolotl pytest-ftready")

    def pipeline(self, state) -> Pipeline:
        return AxolotlPipeline(state)
