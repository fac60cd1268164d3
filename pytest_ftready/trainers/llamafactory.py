"""LLaMA-Factory: selectable (``[data] pipeline = "llamafactory"``) so that a recipe can ask
for it, but its own preprocessing and step are not run by the checks yet: asked for, the
checks that need them skip saying so; under ``pipeline = "auto"`` a LLaMA-Factory config runs
the built-in pipeline and engine (``pipeline = builtin`` in the measurements)."""

from __future__ import annotations

from ..outcomes import Skip
from .base import Pipeline
from .builtin import EngineTrainer


class LlamaFactoryTrainer(EngineTrainer):
    name = "llamafactory"
    module = "llamafactory"
    native = False
    install = ("pip install llamafactory in an environment of its own beside pytest-ftready (see README, "
               "\"The trainer's own run\")")

    def pipeline(self, state) -> Pipeline:
        raise Skip("pytest-ftready does not run LLaMA-Factory's own preprocessing yet; set [data] pipeline = \"auto\" "
                   "or \"builtin\" to check the labels of the model's template through the built-in encoder")
