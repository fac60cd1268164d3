"""The overfit of a tiny sample: train a few examples until the loss threshold or the step
limit, verify trainable weights changed and frozen ones did not, save the trained weights,
and tell apart why a loss did not get there (broken, still falling, plateaued)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..files import ensure_private_dir, make_private
from ..outcomes import Fail
from .batches import collate
from .generate import greedy
from .trainable import make_optimizer, make_scheduler, param_fingerprints, train_step, trainable


@dataclass(frozen=True)
class OverfitResult:
    losses: list
    reached: bool
    adapter_dir: Path  # the saved trained weights / adapter
    prompt_ids: list
    greedy_ids: list  # the in-memory trained model's greedy answer to prompt_ids
    example_where: str
    target_loss: float = 0.0
    learning_rate: float = 0.0
    trainer: str = ""  # whose overfit this is (a trainer's step_trainer)


# Steps an overfit takes at least: the first loss is the model's before any update, and after one
# step LoRA's A has had no gradient yet (B starts at 0), so "every trainable parameter changed" is
# judged from the second step on.
MIN_STEPS = 2


def stop_here(losses: Sequence[float], target: float) -> bool:
    """Whether an overfit may stop after ``losses``: the target met, and at least MIN_STEPS taken
    (so that the parameters' changes are judged, even where the start already meets the target)."""
    return len(losses) >= MIN_STEPS and losses[-1] <= target


def target_reached(losses: Sequence[float], target: float) -> bool:
    """The loss fell from above ``target`` to at or below it: a target the first loss (the
    untrained model's) already meets proves nothing, so it is never reached."""
    return len(losses) >= MIN_STEPS and losses[0] > target >= losses[-1]


def overfit(recipe, examples: Sequence, pad_id: int, torch_device: str, shared_base: Callable[[], Any], *,
            prompt_ids: list, stop_ids, save_to: Path, example_where: str,
            progress: Optional[Callable[[str], None]] = None) -> OverfitResult:
    """Train ``examples`` (already the overfit sample) for at most ``overfit_steps`` steps."""
    checks = recipe.checks
    if not examples:
        raise Fail("no trainable example to overfit (see data.masking)")
    mb = recipe.training.micro_batch_size
    batches = [collate(examples[i:i + mb], pad_id) for i in range(0, len(examples), mb)]
    with trainable(recipe, torch_device, shared_base) as model:
        frozen_before = param_fingerprints(model, trainable=False)
        trained_before = param_fingerprints(model, trainable=True)
        optimizer = make_optimizer(model, recipe)
        scheduler = make_scheduler(optimizer, recipe, checks.overfit_steps, constant=True)
        losses: list[float] = []
        for step in range(1, checks.overfit_steps + 1):
            loss = train_step(model, optimizer, scheduler, batches, torch_device)
            losses.append(loss)
            if not math.isfinite(loss):
                raise Fail(nonfinite_loss(loss, step, losses[:-1], recipe))
            if progress:
                progress(f"model.overfit step {step}/{checks.overfit_steps}, loss {loss:.4f} "
                         f"(target {checks.overfit_loss})")
            if stop_here(losses, checks.overfit_loss):
                break
        return judged(model, recipe, losses, frozen_before, trained_before, prompt_ids=prompt_ids,
                      stop_ids=stop_ids, pad_id=pad_id, torch_device=torch_device, save_to=save_to,
                      example_where=example_where)


def judged(model, recipe, losses: list, frozen_before: dict, trained_before: dict, *, prompt_ids: list, stop_ids,
           pad_id: int, torch_device: str, save_to: Path, example_where: str) -> OverfitResult:
    """The overfit's result once its steps ran (by the engine or by a trainer): frozen weights
    unchanged, trainable ones changed, every loss finite, the trained model's greedy answer,
    its weights saved to ``save_to``."""
    checks = recipe.checks
    for step, loss in enumerate(losses, start=1):
        if not math.isfinite(loss):
            raise Fail(nonfinite_loss(loss, step, losses[:step - 1], recipe))
    changed_frozen = [n for n, fp in param_fingerprints(model, trainable=False).items() if fp != frozen_before[n]]
    after = param_fingerprints(model, trainable=True)
    unchanged = [n for n, fp in after.items() if fp == trained_before[n]]
    if changed_frozen:
        raise Fail(f"{len(changed_frozen)} frozen parameters changed during training, e.g. {changed_frozen[0]}")
    if unchanged and len(unchanged) == len(after):
        raise Fail(f"no trainable parameter changed in {len(losses)} steps (learning_rate = "
                   f"{recipe.training.learning_rate}): the optimizer does not update the model")
    if unchanged and len(losses) > 1:  # after one step LoRA's A has had no gradient yet (B starts at 0)
        raise Fail(f"{len(unchanged)} of {len(after)} trainable parameters never changed in {len(losses)} steps, e.g. "
                   f"{', '.join(unchanged[:3])}: they get no gradient or are not in the optimizer (a module "
                   "outside the forward pass, or an optimizer built before the adapter was added)")
    answer = greedy(model, prompt_ids, checks.max_new_tokens, stop_ids, pad_id, torch_device)
    model.save_pretrained(ensure_private_dir(save_to))
    make_private(save_to)
    return OverfitResult(losses, target_reached(losses, checks.overfit_loss), save_to, list(prompt_ids), answer,
                         example_where,
                         checks.overfit_loss, recipe.training.learning_rate)


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


def slope(values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against their index (change per step)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    num = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    den = sum((i - mean_x) ** 2 for i in range(n))
    return num / den


def diagnose(losses: Sequence[float], target: float, learning_rate: float) -> str:
    """Why a finite loss curve did not reach ``target``: flat or rising (broken labels,
    template or optimizer), still falling (more steps), or falling then stuck (capacity/LR)."""
    first, last = losses[0], losses[-1]
    n = len(losses)
    if first <= target:
        return (f"the first loss {first:.3f} (the model before any update) already meets [checks] overfit_loss = "
                f"{target}, so reaching it proves nothing: set [checks] overfit_loss well below the first loss "
                f"(the default is 0.1)")
    if n < MIN_STEPS:
        return (f"[checks] overfit_steps allows {n} step: the first loss is the untrained model's, so at least "
                f"{MIN_STEPS} steps are needed to see it fall and every trainable parameter change; set "
                f"[checks] overfit_steps = 200 (the default)")
    fall = (first - last) / first if first > 0 else 0.0
    if fall < 0.10:
        return (f"the loss did not fall ({first:.3f} -> {last:.3f} in {n} steps): labels, template or optimizer "
                f"settings are broken (learning_rate = {learning_rate}); check data.masking's examples")
    tail = losses[-max(5, n // 4):]
    per_step = slope(tail)
    head = f"the loss fell {fall:.0%} ({first:.3f} -> {last:.3f} in {n} steps)"
    if per_step < 0 and (last - target) / -per_step < 20 * n:
        more = math.ceil((last - target) / -per_step)
        return (f"{head} and is still falling ({per_step:.3g} per step over the last {len(tail)} steps) but has not "
                f"reached overfit_loss {target}: at this slope it needs ~{more} more steps; raise [checks] "
                f"overfit_steps to ~{n + more}, or raise learning_rate (now {learning_rate})")
    return (f"{head} and then stopped falling ({per_step:.3g} per step over the last {len(tail)} steps) above "
            f"overfit_loss {target}: the adapter may be too small or the learning rate too low or too high "
            f"(learning_rate = {learning_rate}); raise [adapter] r or learning_rate, or target more modules")
