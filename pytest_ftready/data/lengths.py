"""Token counts of a dataset as training batches it: positions processed when each
micro-batch is padded to its longest row (or when rows are packed), and the padding share."""

from __future__ import annotations

from typing import Sequence


def padded_positions(lengths: Sequence[int], micro_batch: int) -> int:
    """Token positions processed when consecutive batches of ``micro_batch`` rows are padded to their longest."""
    total = 0
    for start in range(0, len(lengths), micro_batch):
        batch = lengths[start:start + micro_batch]
        total += max(batch) * len(batch)
    return total


def padding_waste(lengths: Sequence[int], micro_batch: int) -> float:
    """Share of pad tokens when batches of ``micro_batch`` rows are padded to their longest."""
    padded = padded_positions(lengths, micro_batch)
    return 0.0 if padded == 0 else 1.0 - sum(lengths) / padded


def tokens_to_process(lengths: Sequence[int], micro_batch: int, packing: bool) -> int:
    """Token positions one epoch processes: packed rows back to back, or padded per micro-batch."""
    return sum(lengths) if packing else padded_positions(lengths, micro_batch)
