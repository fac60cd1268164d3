"""Axolotl (placeholder while being written)."""
from .base import Trainer


class AxolotlTrainer(Trainer):
    name = "axolotl"
    step_trainer = "axolotl"
    module = "axolotl"
