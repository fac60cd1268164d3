"""Where the memory of a measured training step goes: weights, gradients, optimizer state and
what the peak holds besides (activations). What each lever would save is the forecast's one
lever model (``forecast.levers``), which estimates from this breakdown where it cannot trace."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Breakdown:
    weights_bytes: int  # every parameter (frozen and trainable)
    frozen_numel: int
    trainable_bytes: int
    gradient_bytes: int  # one gradient per trainable parameter
    optimizer_state_bytes: int
    peak_bytes: int  # the measured peak of the step

    @property
    def activation_bytes(self) -> int:
        """What the peak holds besides weights, gradients and optimizer state."""
        return max(0, self.peak_bytes - self.weights_bytes - self.gradient_bytes - self.optimizer_state_bytes)


def breakdown(model, optimizer, peak_bytes: int) -> Breakdown:
    import torch

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    frozen_numel = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    trainable = [p for p in model.parameters() if p.requires_grad]
    trainable_bytes = sum(p.numel() * p.element_size() for p in trainable)
    state = 0
    for per_param in optimizer.state.values():
        for value in per_param.values():
            if isinstance(value, torch.Tensor):
                state += value.numel() * value.element_size()
    return Breakdown(weights, frozen_numel, trainable_bytes, trainable_bytes, state, peak_bytes)
