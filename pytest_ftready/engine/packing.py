"""The packing comparison: a packed batch's per-example losses against each example alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..data.encoding import IGNORE_INDEX


@dataclass(frozen=True)
class PackingResult:
    examples: int
    max_difference: float
    tolerance: float


def per_token_losses(model, input_ids, labels, position_ids=None, attention_mask=None):
    import torch

    with torch.no_grad():
        logits = model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                       use_cache=False).logits.float()
    shift_logits, shift_labels = logits[:, :-1], labels[:, 1:]
    return torch.nn.functional.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]),
                                             shift_labels.reshape(-1), ignore_index=IGNORE_INDEX,
                                             reduction="none").view(shift_labels.shape)


def packing_mismatch(model, examples: Sequence, max_length: int, device: str) -> PackingResult:
    """Pack as many examples as fit in ``max_length`` (position ids restart per example, the
    first label of each masked) and compare each example's summed loss with its own forward."""
    import torch

    chosen, used = [], 0
    for e in examples:
        if used + e.length <= max_length:
            chosen.append(e)
            used += e.length
        if len(chosen) == 8:
            break
    if len(chosen) < 2:
        return PackingResult(len(chosen), 0.0, 0.0)
    was_training = model.training
    model.eval()
    ids: list[int] = []
    labels, pos, bounds = [], [], []
    for e in chosen:
        start = len(ids)
        ids += list(e.input_ids)
        labels += [IGNORE_INDEX] + list(e.labels[1:])
        pos += list(range(e.length))
        bounds.append((start, len(ids)))
    t = lambda xs: torch.tensor([xs], device=device)  # noqa: E731
    packed = per_token_losses(model, t(ids), t(labels), position_ids=t(pos))[0]
    worst = 0.0
    for e, (start, end) in zip(chosen, bounds):
        alone = per_token_losses(model, t(list(e.input_ids)), t(list(e.labels)))[0].sum().item()
        together = packed[start:end - 1].sum().item()
        worst = max(worst, abs(alone - together) / max(1.0, abs(alone)))
    model.train(was_training)
    dtype = next(model.parameters()).dtype
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    return PackingResult(len(chosen), worst, tolerance)
