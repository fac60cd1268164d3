"""Headroom checks: the whole run's checkpoints, logs and evaluation fit on the disk, and the
measured throughput finishes the data within the time budget."""

from __future__ import annotations

from ..data.lengths import tokens_to_process
from ..units import human_bytes
from ..outcomes import Fail
from .registry import STAGES, check


@check("headroom.disk", stage=STAGES["headroom"], requires=("lifecycle.resume",))
def disk(ctx) -> None:
    """Checkpoints x save_total_limit + logs + evaluation outputs fit in free space on output_dir's disk."""
    recipe, state = ctx.recipe, ctx.state
    checkpoint = state.saved_run.checkpoint_bytes
    keep = recipe.training.save_total_limit
    budget = recipe.budget
    exports = state.step.breakdown.weights_bytes if recipe.export.format != "none" else 0
    need = checkpoint * keep + budget.log_bytes + budget.eval_bytes + exports
    free = state.run.disk_free(recipe.training.output_dir)
    usable = int(free * (1 - budget.disk_headroom))
    ctx.measure("checkpoint_bytes", checkpoint, "bytes")
    ctx.measure("checkpoints_kept", keep, "checkpoints")
    ctx.measure("run_disk_bytes", need, "bytes")
    ctx.measure("disk_free", free, "bytes")
    if need > usable:
        raise Fail(f"the run writes {human_bytes(need)} ({keep} checkpoints of {human_bytes(checkpoint)}, logs "
                   f"{human_bytes(budget.log_bytes)}, evaluation {human_bytes(budget.eval_bytes)}"
                   + (f", export {human_bytes(exports)}" if exports else "")
                   + f") but {recipe.training.output_dir} has {human_bytes(usable)} usable ({human_bytes(free)} free "
                   f"less the {budget.disk_headroom:.0%} disk_headroom): lower save_total_limit or free space")


@check("headroom.time", stage=STAGES["headroom"] + 1, requires=("model.step_memory",))
def time_(ctx) -> None:
    """Tokens to train / measured tokens per second, plus evaluation and retry margin, fits max_hours."""
    recipe, state = ctx.recipe, ctx.state
    sustained = state.computed("sustained")  # a sustained rate when this run measured one: it is the truer figure
    if sustained and sustained.rates:
        from ..units import percentile

        rate, source = percentile(sustained.rates, 0.5), "sustained.throughput"
    else:
        step = state.step
        if step.out_of_memory:
            raise Fail("the worst-case step runs out of memory (see model.step_memory): no throughput to plan with")
        rate, source = step.tokens_per_s, "model.step_memory (worst-case batch)"
    lengths = state.digest.trainable_lengths  # every trainable row, as a compact array
    per_epoch = tokens_to_process(lengths, recipe.training.micro_batch_size, recipe.data.packing)
    tokens = per_epoch * recipe.training.epochs
    budget = recipe.budget
    train_h = tokens / rate / 3600
    eta_h = train_h * (1 + budget.eval_share) * (1 + budget.time_headroom)
    ctx.measure("tokens_to_train", int(tokens), "tokens")
    ctx.measure("throughput_used", rate, "tokens/s")
    ctx.measure("throughput_source", source, "")
    ctx.measure("eta_training", train_h, "h", estimate=True)
    ctx.measure("eta_with_margins", eta_h, "h", estimate=True)
    if eta_h > budget.max_hours:
        raise Fail(f"the run needs ~{eta_h:.1f} h ({tokens:,.0f} tokens at {rate:,.0f} tokens/s from {source} = "
                   f"{train_h:.1f} h, + {budget.eval_share:.0%} evaluation, + {budget.time_headroom:.0%} retries) but "
                   f"max_hours is {budget.max_hours}: fewer epochs or tokens, a faster lever (levers.sweep), "
                   f"or more time")
