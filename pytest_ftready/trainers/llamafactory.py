"""LLaMA-Factory (placeholder while being written)."""
from .base import Trainer


class LlamaFactoryTrainer(Trainer):
    name = "llamafactory"
    step_trainer = "llamafactory"
    module = "llamafactory"
