"""Model checks: one worst-case step with its peak memory, and the overfit of a tiny sample."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional

from ..engine.breakdown import Breakdown, advice_text, breakdown, levers_for
from ..files import ensure_private_dir
from ..units import human_bytes, percentile
from ..outcomes import Fail
from .registry import STAGES, check


@dataclass(frozen=True)
class StepResult:
    peak_bytes: int  # what must fit on the device (allocator peak; CPU: weights + live tensors)
    capacity_bytes: Optional[int]
    usable_bytes: Optional[int]
    host_peak_bytes: int
    tokens_per_step: int  # token positions processed by one micro-batch step
    step_seconds: float
    breakdown: Breakdown
    num_layers: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_seconds if self.step_seconds else float("inf")


def num_layers(model) -> int:
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    return int(getattr(config, "num_hidden_layers", 1) or 1)


def worst_case_batch(examples, micro_batch: int, max_length: int, pad_id: int):
    from ..engine.training import collate

    longest = sorted(examples, key=lambda e: e.length, reverse=True)[:micro_batch]
    while len(longest) < micro_batch:
        longest.append(longest[len(longest) % len(longest)])
    return collate(longest, pad_id, pad_to=max_length)


def fits(peak: int, capacity: Optional[int], headroom: float) -> tuple[bool, Optional[int]]:
    if not capacity:
        return True, None
    usable = int(capacity * (1 - headroom))
    return peak <= usable, usable


@check("model.step_memory", stage=STAGES["model.step"], requires=("stack.precision", "stack.kernels", "data.masking"))
def step_memory(ctx) -> None:
    """The worst-case batch runs forward, backward and an optimizer step; peak memory fits."""
    import torch

    from ..engine.memory import free_device_memory, peak_memory
    from ..engine.training import make_optimizer, make_scheduler, trainable, train_step

    state, recipe = ctx.state, ctx.recipe
    device = ctx.torch_device()
    examples = state.trainable_examples
    if not examples:
        raise Fail("no trainable example (see data.masking)")
    batch = worst_case_batch(examples, recipe.training.micro_batch_size, recipe.data.max_length,
                             state.tokenizer.pad_token_id)
    capacity = ctx.device.memory_total_bytes
    headroom = recipe.hardware.memory_headroom
    p95 = percentile([e.full_length for e in state.encoded], 0.95) or None
    with trainable(state) as model:
        optimizer = make_optimizer(model, recipe)
        scheduler = make_scheduler(optimizer, recipe, total_steps=1, constant=True)
        layers = num_layers(model)
        try:
            with peak_memory(device, count_tensors=not ctx.device.is_accelerator) as peak:
                train_step(model, optimizer, scheduler, [batch], device)
        except torch.OutOfMemoryError as exc:
            optimizer.zero_grad(set_to_none=True)
            free_device_memory(device)
            b = breakdown(model, optimizer, capacity or 0)
            raise Fail(f"out of memory on {ctx.device.name} ({human_bytes(capacity or 0)}) running micro_batch_size "
                       f"{recipe.training.micro_batch_size} x max_length {recipe.data.max_length}: "
                       f"{str(exc).splitlines()[0]}\nLevers for this recipe:\n"
                       f"{advice_text(levers_for(recipe, b, layers, p95))}") from None
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        if peak.device_reserved_bytes is not None:
            peak_bytes = peak.device_reserved_bytes
            ctx.measure("peak_device_allocated", peak.device_allocated_bytes, "bytes")
            ctx.measure("peak_device_reserved", peak.device_reserved_bytes, "bytes")
        else:
            peak_bytes = weights + peak.tensor_bytes
            ctx.measure("peak_tensor_bytes", peak_bytes, "bytes")
        ctx.measure("peak_host_step", peak.host_bytes, "bytes")
        ctx.measure("host_peak_method", peak.host_method, "")
        b = breakdown(model, optimizer, peak_bytes)
        ctx.measure("weights", b.weights_bytes, "bytes")
        ctx.measure("trainable_parameters", b.trainable_bytes, "bytes")
        ctx.measure("optimizer_state", b.optimizer_state_bytes, "bytes")
        ctx.measure("activations_and_workspace", b.activation_bytes, "bytes", estimate=True)
        seconds = ctx.benchmark(lambda: train_step(model, optimizer, scheduler, [batch], device),
                                group=f"ftready-step-{recipe.name}")
    tokens = int(batch["input_ids"].numel())
    result = StepResult(peak_bytes, capacity, None, peak.host_bytes, tokens, statistics.median(seconds), b, layers)
    ok, usable = fits(peak_bytes, capacity, headroom)
    result = StepResult(**{**result.__dict__, "usable_bytes": usable})
    state.results["step"] = result
    ctx.measure("step_seconds", result.step_seconds, "s")
    ctx.measure("step_tokens_per_s", result.tokens_per_s, "tokens/s")
    if capacity:
        ctx.measure("device_capacity", capacity, "bytes")
        ctx.measure("peak_share_of_capacity", peak_bytes / capacity, "share")
    if not ok:
        raise Fail(f"the worst-case step needs {human_bytes(peak_bytes)} but {ctx.device.name} offers "
                   f"{human_bytes(usable)} ({human_bytes(capacity)} less the {headroom:.0%} memory_headroom).\n"
                   f"Levers for this recipe:\n{advice_text(levers_for(recipe, b, layers, p95))}")


def param_fingerprints(model, trainable: bool) -> dict[str, tuple[float, float]]:
    """A cheap per-parameter fingerprint (sum and sum of squares), not a copy of the weights."""
    import torch

    with torch.no_grad():
        return {n: (float(p.float().sum()), float(p.float().pow(2).sum()))
                for n, p in model.named_parameters() if p.requires_grad == trainable}


def nonfinite_loss(loss: float, step: int, before: list, recipe) -> str:
    """Why the loss became nan/inf at ``step``: from the start, or diverging mid-run."""
    if not before:
        overflow = ("float16 overflows from the start: train in bfloat16" if recipe.model.dtype == "float16"
                    else "the model's weights produce nan/inf from the start (a broken checkpoint?)")
        return (f"loss is {loss} at step 1 of the overfit: a batch with no supervised token (labels all -100), "
                f"or {overflow}")
    return (f"loss is {loss} at step {step} of the overfit (step {step - 1}: {before[-1]:.4g}): training "
            f"diverged; likely learning_rate = {recipe.training.learning_rate} is too high for "
            f"{recipe.model.dtype}, or float16 overflowed: lower the learning rate, train in bfloat16, or clip "
            "gradients")


@dataclass(frozen=True)
class OverfitResult:
    losses: list
    reached: bool
    adapter_dir: object  # Path of the saved trained weights / adapter
    prompt_ids: list
    greedy_ids: list  # the in-memory trained model's greedy answer to prompt_ids
    example_where: str


def overfit(state, device: str, save_to) -> OverfitResult:
    """Train the recipe's model on a few examples until the loss threshold or the step limit."""
    from ..engine.training import greedy, make_optimizer, make_scheduler, train_step, collate, trainable

    recipe = state.recipe
    checks = recipe.checks
    examples = state.trainable_examples[: checks.overfit_examples]
    if not examples:
        raise Fail("no trainable example to overfit (see data.masking)")
    mb = recipe.training.micro_batch_size
    pad = state.tokenizer.pad_token_id
    batches = [collate(examples[i:i + mb], pad) for i in range(0, len(examples), mb)]
    with trainable(state) as model:
        frozen_before = param_fingerprints(model, trainable=False)
        trained_before = param_fingerprints(model, trainable=True)
        optimizer = make_optimizer(model, recipe)
        scheduler = make_scheduler(optimizer, recipe, checks.overfit_steps, constant=True)
        losses = []
        for step in range(1, checks.overfit_steps + 1):
            loss = train_step(model, optimizer, scheduler, batches, device)
            losses.append(loss)
            if not math.isfinite(loss):
                raise Fail(nonfinite_loss(loss, step, losses[:-1], recipe))
            if loss <= checks.overfit_loss:
                break
        changed_frozen = [n for n, fp in param_fingerprints(model, trainable=False).items() if fp != frozen_before[n]]
        after = param_fingerprints(model, trainable=True)
        unchanged = [n for n, fp in after.items() if fp == trained_before[n]]
        if changed_frozen:
            raise Fail(f"{len(changed_frozen)} frozen parameters changed during training, e.g. {changed_frozen[0]}")
        if unchanged and len(unchanged) == len(after):
            raise Fail(f"no trainable parameter changed in {len(losses)} steps (learning_rate = "
                       f"{recipe.training.learning_rate}): the optimizer does not update the model")
        prompt = state.encoder.prompt_ids(examples[0].row)
        answer = greedy(model, prompt, checks.max_new_tokens, state.encoder.stop_ids, pad, device)
        model.save_pretrained(ensure_private_dir(save_to))
    return OverfitResult(losses, losses[-1] <= checks.overfit_loss, save_to, prompt, answer, examples[0].row.where)


@check("model.overfit", stage=STAGES["model.overfit"], requires=("data.masking", "model.step_memory"))
def model_overfit(ctx) -> None:
    """A handful of examples reach the loss threshold; trainable weights change, frozen ones do not."""
    state, checks = ctx.state, ctx.recipe.checks
    result = overfit(state, ctx.torch_device(), state.scratch / "overfit-weights")
    state.results["overfit"] = result
    ctx.series("loss", result.losses)
    ctx.measure("overfit_steps", len(result.losses), "steps")
    ctx.measure("overfit_first_loss", result.losses[0], "nats")
    ctx.measure("overfit_final_loss", result.losses[-1], "nats")
    if not result.reached:
        raise Fail(f"loss {result.losses[-1]:.3f} after {len(result.losses)} steps on {checks.overfit_examples} "
                   f"examples (first {result.losses[0]:.3f}), above overfit_loss {checks.overfit_loss}: labels, "
                   f"template or optimizer settings are broken (learning_rate = {ctx.recipe.training.learning_rate})")
