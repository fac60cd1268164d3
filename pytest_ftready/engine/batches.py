"""Batches as training sees them: seeded RNGs, right-padded collation with padding masked
from attention and loss, the seeded data order (part of a checkpoint), the worst-case batch."""

from __future__ import annotations

import random
from typing import Optional, Sequence

from ..data.encoding import IGNORE_INDEX


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds CUDA / MPS generators


def collate(examples: Sequence, pad_id: int, pad_to: Optional[int] = None) -> dict:
    """Right-padded tensors; padding is masked from attention and loss."""
    import torch

    width = pad_to or max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        n = min(len(e.input_ids), width)
        ids[row, :n] = torch.tensor(e.input_ids[:n])
        labels[row, :n] = torch.tensor(e.labels[:n])
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def to_device(batch: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


class DataOrder:
    """Shuffled micro-batches from a seeded generator; its state is part of a checkpoint."""

    def __init__(self, n_examples: int, micro_batch: int, seed: int) -> None:
        import torch

        self.n = n_examples
        self.micro_batch = micro_batch
        self.generator = torch.Generator().manual_seed(seed)
        self.perm: list[int] = []
        self.pos = 0

    def next_indices(self) -> list[int]:
        import torch

        out: list = []
        while len(out) < self.micro_batch:
            if self.pos >= len(self.perm):
                self.perm = torch.randperm(self.n, generator=self.generator).tolist()
                self.pos = 0
            out.append(self.perm[self.pos])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "perm": list(self.perm), "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.perm, self.pos = list(state["perm"]), int(state["pos"])


def next_batches(order: DataOrder, examples: Sequence, accumulation: int, pad_id: int) -> list[dict]:
    return [collate([examples[i] for i in order.next_indices()], pad_id) for _ in range(accumulation)]




def worst_case_batch(examples: Sequence, micro_batch: int, max_length: int, pad_id: int) -> dict:
    """The ``micro_batch`` longest examples, padded to ``max_length``: the step that must fit."""
    longest = sorted(examples, key=lambda e: e.length, reverse=True)[:micro_batch]
    while len(longest) < micro_batch:
        longest.append(longest[len(longest) % len(longest)])
    return collate(longest, pad_id, pad_to=max_length)
