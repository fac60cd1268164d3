"""One measured training step: the worst-case batch (the longest rows, micro_batch x
max_length) runs forward, backward and an optimizer step on the recipe's trainable model;
its peak memory (device allocator, live tensors on a CPU, host RSS), its breakdown and its
time are measured, and an out-of-memory error becomes part of the result, not a crash."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..outcomes import out_of_memory
from .batches import worst_case_batch
from .breakdown import Breakdown, breakdown
from .trainable import make_optimizer, make_scheduler, num_layers, train_step, trainable

# (fn, rounds) -> seconds of each timed round; pytest-benchmark's pedantic mode where a
# check times the step, a plain loop elsewhere.
Timer = Callable[[Callable[[], Any], int], list]


def plain_timer(fn: Callable[[], Any], rounds: int) -> list[float]:
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return seconds


@dataclass(frozen=True)
class StepMeasurement:
    peak_bytes: int  # what must fit on the device: allocator reserved peak (CPU: weights + live tensors)
    capacity_bytes: Optional[int]
    host_peak_bytes: int
    host_method: str
    tokens_per_step: int  # token positions one micro-batch step processes
    step_seconds: float  # median of the timed rounds (0 when out of memory)
    breakdown: Breakdown
    num_layers: int
    device_allocated_bytes: Optional[int] = None
    device_reserved_bytes: Optional[int] = None
    out_of_memory: str = ""  # the allocator's message when the step did not fit
    vocab_size: int = 0  # of the model's output embeddings (the lever estimates' loss size)
    trainer: str = ""  # whose step this is (a trainer's step_trainer: "pytest-ftready engine", "trl SFTTrainer")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_seconds if self.step_seconds else 0.0

    def usable_bytes(self, headroom: float) -> Optional[int]:
        return int(self.capacity_bytes * (1 - headroom)) if self.capacity_bytes else None

    def fits(self, headroom: float) -> bool:
        usable = self.usable_bytes(headroom)
        return not self.out_of_memory and (usable is None or self.peak_bytes <= usable)


def measure_step(recipe, examples: Sequence, pad_id: int, torch_device: str, shared_base: Callable[[], Any], *,
                 capacity_bytes: Optional[int], count_tensors: bool, timer: Timer = plain_timer,
                 rounds: int = 3) -> StepMeasurement:
    """Measure the recipe's worst-case step. ``count_tensors``: count live tensor bytes (the
    CPU has no allocator statistics)."""
    from .memory import free_device_memory, peak_memory

    batch = worst_case_batch(examples, recipe.training.micro_batch_size, recipe.data.max_length, pad_id)
    tokens = int(batch["input_ids"].numel())
    with trainable(recipe, torch_device, shared_base) as model:
        optimizer = make_optimizer(model, recipe)
        scheduler = make_scheduler(optimizer, recipe, total_steps=1, constant=True)
        layers = num_layers(model)
        head = model.get_output_embeddings()
        vocab = int(head.weight.shape[0]) if head is not None else 0
        try:
            with peak_memory(torch_device, count_tensors=count_tensors) as peak:
                train_step(model, optimizer, scheduler, [batch], torch_device)
        except (RuntimeError, MemoryError) as exc:  # any allocator's out of memory; other errors go on
            reason = out_of_memory(exc)
            if not reason:
                raise
            optimizer.zero_grad(set_to_none=True)
            free_device_memory(torch_device)
            return StepMeasurement(capacity_bytes or 0, capacity_bytes, 0, "", tokens, 0.0,
                                   breakdown(model, optimizer, capacity_bytes or 0), layers, out_of_memory=reason,
                                   vocab_size=vocab)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        peak_bytes = peak.device_reserved_bytes if peak.device_reserved_bytes is not None else weights + peak.tensor_bytes
        parts = breakdown(model, optimizer, peak_bytes)
        seconds = timer(lambda: train_step(model, optimizer, scheduler, [batch], torch_device), rounds)
    return StepMeasurement(peak_bytes, capacity_bytes, peak.host_bytes, peak.host_method, tokens,
                           statistics.median(seconds), parts, layers, peak.device_allocated_bytes,
                           peak.device_reserved_bytes, vocab_size=vocab)
