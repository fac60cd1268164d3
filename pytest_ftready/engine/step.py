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
        peak_bytes = (peak.device_reserved_bytes if peak.device_reserved_bytes is not None
                      else weights + peak.tensor_bytes)
        parts = breakdown(model, optimizer, peak_bytes)
        seconds = timer(lambda: train_step(model, optimizer, scheduler, [batch], torch_device), rounds)
    return StepMeasurement(peak_bytes, capacity_bytes, peak.host_bytes, peak.host_method, tokens,
                           statistics.median(seconds), parts, layers, peak.device_allocated_bytes,
                           peak.device_reserved_bytes, vocab_size=vocab)


@dataclass(frozen=True)
class EvalMeasurement:
    """One evaluation forward (no gradients) of the worst-case eval micro-batch, as the trainer's
    evaluation loop runs it between training steps."""

    peak_bytes: int  # as StepMeasurement.peak_bytes: allocator reserved peak (CPU: weights + live tensors)
    capacity_bytes: Optional[int]
    batch_size: int
    tokens: int  # token positions of the eval micro-batch
    vocab_size: int  # the logits' last dimension
    logits_element_bytes: int  # of the logits the forward returned (what the trainer keeps)
    out_of_memory: str = ""


def accumulated_eval_bytes(eval_rows: int, batch_size: int, max_length: int, vocab_size: int,
                           logits_element_bytes: int, accumulation_steps: int) -> tuple[int, int]:
    """(device, host) bytes the kept logits and labels of an eval set grow to, as transformers'
    ``Trainer.evaluation_loop`` keeps them (each batch padded to the longest, here max_length):
    on the device until ``eval_accumulation_steps`` batches (0 = unset: the whole eval set), then
    moved to host memory, where the whole set ends up either way."""
    per_row = max_length * (vocab_size * logits_element_bytes + 8)  # logits + int64 labels
    on_device_rows = eval_rows if not accumulation_steps else min(eval_rows, accumulation_steps * batch_size)
    return on_device_rows * per_row, eval_rows * per_row


def measure_eval_step(recipe, examples: Sequence, pad_id: int, torch_device: str, shared_base: Callable[[], Any], *,
                      batch_size: int, capacity_bytes: Optional[int], count_tensors: bool) -> EvalMeasurement:
    """Measure one evaluation forward of the ``batch_size`` longest examples at max_length, with
    labels (the loss) and the logits kept, on the recipe's trainable model in eval mode."""
    import torch

    from .batches import to_device
    from .memory import free_device_memory, peak_memory

    batch = worst_case_batch(examples, batch_size, recipe.data.max_length, pad_id)
    tokens = int(batch["input_ids"].numel())
    with trainable(recipe, torch_device, shared_base) as model:
        model.eval()
        try:
            with peak_memory(torch_device, count_tensors=count_tensors) as peak, torch.no_grad():
                logits = model(**to_device(batch, torch_device)).logits
                vocab, element = int(logits.shape[-1]), int(logits.element_size())
                del logits
        except (RuntimeError, MemoryError) as exc:  # any allocator's out of memory; other errors go on
            reason = out_of_memory(exc)
            if not reason:
                raise
            free_device_memory(torch_device)
            return EvalMeasurement(capacity_bytes or 0, capacity_bytes, batch_size, tokens, 0, 0, reason)
        finally:
            model.train()
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
    peak_bytes = peak.device_reserved_bytes if peak.device_reserved_bytes is not None else weights + peak.tensor_bytes
    return EvalMeasurement(peak_bytes, capacity_bytes, batch_size, tokens, vocab, element)
