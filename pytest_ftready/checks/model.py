"""Model checks: the worst-case step and its peak memory, and the overfit of a tiny sample.
Both ask the session for the fact (measured once, by the recipe's trainer; a trainer's own run is shown
beside the engine's) and judge it."""

from __future__ import annotations

from ..outcomes import Fail, Skip
from ..outputs.forecast_text import levers_text
from ..trainers.builtin import ENGINE
from ..units import human_bytes
from .registry import STAGES, check


def engine_beside(ctx, name: str, result):
    """The engine's run (``engine_step``, ``engine_overfit``) to show beside a trainer's own
    ``result``; None where ``result`` is the engine's own, or, with the reason measured, where the
    engine could not run it (the trainer's result stands)."""
    try:
        engine = getattr(ctx.state, name)
    except (Fail, Skip) as exc:
        ctx.measure(f"{name}_unavailable", str(exc).splitlines()[0])
        return None
    return None if engine.trainer == result.trainer else engine


@check("model.step_memory", stage=STAGES["model.step"], requires=("stack.precision", "stack.kernels", "data.masking"))
def step_memory(ctx) -> None:
    """The worst-case batch runs forward, backward and an optimizer step; peak memory fits."""
    state, recipe = ctx.state, ctx.recipe
    step = state.step
    headroom = recipe.hardware.memory_headroom
    capacity = step.capacity_bytes
    if step.out_of_memory:
        raise Fail(f"out of memory on {ctx.device.name} ({human_bytes(capacity or 0)}) running micro_batch_size "
                   f"{recipe.training.micro_batch_size} x max_length {recipe.data.max_length}: "
                   f"{step.out_of_memory}\nLevers for this recipe:\n{levers_text(state.levers)}")
    if step.device_reserved_bytes is not None:
        ctx.measure("peak_device_allocated", step.device_allocated_bytes, "bytes")
        ctx.measure("peak_device_reserved", step.device_reserved_bytes, "bytes")
    else:
        ctx.measure("peak_tensor_bytes", step.peak_bytes, "bytes")
    ctx.measure("peak_host_step", step.host_peak_bytes, "bytes")
    if recipe.origin is not None and recipe.origin.memory_notes:  # levers of the trainer's config not modelled
        ctx.measure("config_memory_notes", " | ".join(recipe.origin.memory_notes), "")
    ctx.measure("host_peak_method", step.host_method, "")
    b = step.breakdown
    ctx.measure("weights", b.weights_bytes, "bytes")
    ctx.measure("trainable_parameters", b.trainable_bytes, "bytes")
    ctx.measure("optimizer_state", b.optimizer_state_bytes, "bytes")
    ctx.measure("activations_and_workspace", b.activation_bytes, "bytes", estimate=True)
    ctx.measure("step_seconds", step.step_seconds, "s")
    ctx.measure("step_tokens", step.tokens_per_step, "tokens")
    ctx.measure("step_tokens_per_s", step.tokens_per_s, "tokens/s")
    if capacity:
        ctx.measure("device_capacity", capacity, "bytes")
        ctx.measure("peak_share_of_capacity", step.peak_bytes / capacity, "share")
    engine = engine_beside(ctx, "engine_step", step)
    if engine is not None:  # the trainer's own step beside the engine's
        ctx.measure("engine_peak_bytes", engine.peak_bytes, "bytes")
        ctx.measure("engine_step_tokens", engine.tokens_per_step, "tokens")
        ctx.measure("engine_step_seconds", engine.step_seconds, "s")
        ctx.measure("peak_vs_engine", step.peak_bytes / engine.peak_bytes if engine.peak_bytes else 0.0, "ratio")
    if not step.fits(headroom):
        usable = step.usable_bytes(headroom)
        raise Fail(f"the worst-case step needs {human_bytes(step.peak_bytes)} but {ctx.device.name} offers "
                   f"{human_bytes(usable)} ({human_bytes(capacity)} less the {headroom:.0%} memory_headroom).\n"
                   f"Levers for this recipe:\n{levers_text(state.levers)}")
    host_total = ctx.machine.host.memory_total_bytes
    if host_total:
        host_usable = int(host_total * (1 - headroom))
        ctx.measure("host_memory_usable", host_usable, "bytes")
        if step.host_peak_bytes > host_usable:
            raise Fail(f"the worst-case step's own host peak is {human_bytes(step.host_peak_bytes)} "
                       f"({step.host_method}) "
                       f"but this machine offers {human_bytes(host_usable)} of RAM ({human_bytes(host_total)} less the "
                       f"{headroom:.0%} memory_headroom): lower micro_batch_size or max_length, or run where there "
                       "is more RAM")
    unjudged = [what for what, known in (("the device's capacity", capacity), ("the host's memory", host_total))
                if not known]
    if unjudged:
        raise Skip(f"{' and '.join(unjudged)} unknown here: the step's peaks are recorded but not compared")


def _evaluates(recipe):
    """Why the recipe evaluates nothing (None: it evaluates)."""
    if recipe.data.eval or recipe.data.eval_split:
        return None
    return ("the recipe evaluates nothing: no [data] eval files and [data] eval_split = 0 (the trainer's "
            "eval_dataset / val_size)")


@check("model.eval_memory", stage=STAGES["model.step"] + 1, requires=("model.step_memory",), applies=_evaluates)
def eval_memory(ctx) -> None:
    """The worst-case eval batch's forward, beside the optimizer state training keeps on the device, and
    the logits the eval set accumulates for compute_metrics, fit the device."""
    from ..engine.step import accumulated_eval_bytes

    state, recipe, device = ctx.state, ctx.recipe, ctx.device
    t, headroom = recipe.training, recipe.hardware.memory_headroom
    rows, measured = state.eval_rows, state.eval_step
    capacity = measured.capacity_bytes
    batch = (f"eval_batch_size {measured.batch_size}"
             + ("" if t.eval_batch_size else " (micro_batch_size; per_device_eval_batch_size)"))
    ctx.measure("eval_rows", rows, "rows")
    ctx.measure("eval_batch_size", measured.batch_size, "examples")
    if measured.out_of_memory:
        raise Fail(f"out of memory on {device.name} ({human_bytes(capacity or 0)}) evaluating {batch} x max_length "
                   f"{recipe.data.max_length}: {measured.out_of_memory}; lower [training] eval_batch_size")
    keeps_logits = t.compute_metrics and not t.prediction_loss_only
    on_device, on_host = (accumulated_eval_bytes(rows, measured.batch_size, recipe.data.max_length, measured.vocab_size,
                                                 measured.logits_element_bytes, t.eval_accumulation_steps)
                          if keeps_logits else (0, 0))
    if not device.is_accelerator:  # the device is host memory: the logits stay in it, moved or not
        on_device = on_host
    optimizer = state.step.breakdown.optimizer_state_bytes  # training's state stays on the device while it evaluates
    need = measured.peak_bytes + optimizer + on_device
    ctx.measure("eval_peak_bytes", measured.peak_bytes, "bytes")
    ctx.measure("optimizer_state", optimizer, "bytes")
    ctx.measure("eval_logits_kept", keeps_logits, "")
    ctx.measure("eval_logits_on_device", on_device, "bytes")
    ctx.measure("eval_logits_on_host", on_host, "bytes")
    ctx.measure("eval_need_bytes", need, "bytes")
    # what lowers the kept logits wherever they are, what moves them off the device, what lowers the forward
    fewer_logits = ([f"set prediction_loss_only = true, or a preprocess_logits_for_metrics that keeps argmax ids "
                     f"(the logits are {rows} rows x max_length {recipe.data.max_length} x vocab "
                     f"{measured.vocab_size} x {measured.logits_element_bytes} bytes)",
                     "evaluate fewer rows ([data] eval / eval_split)"] if keeps_logits else [])
    moved = (["set eval_accumulation_steps (moves the kept logits to host memory every N eval batches)"]
             if keeps_logits and not t.eval_accumulation_steps and device.is_accelerator else [])
    remedies = fewer_logits[:1] + moved + [f"lower [training] {batch}"] + fewer_logits[1:]
    if capacity:
        usable = int(capacity * (1 - headroom))
        ctx.measure("device_capacity", capacity, "bytes")
        if need > usable:
            raise Fail(f"evaluation needs {human_bytes(need)} on {device.name}: the {batch} forward peaks at "
                       f"{human_bytes(measured.peak_bytes)}, the optimizer state {human_bytes(optimizer)} stays, and "
                       f"{human_bytes(on_device)} of logits accumulate over {rows} eval rows, but it offers "
                       f"{human_bytes(usable)} ({human_bytes(capacity)} less the {headroom:.0%} memory_headroom); "
                       + "; or ".join(remedies))
    host_total = ctx.machine.host.memory_total_bytes
    if host_total and device.is_accelerator and on_host > int(host_total * (1 - headroom)):
        raise Fail(f"the logits of {rows} eval rows reach {human_bytes(on_host)} in host memory once moved there, "
                   f"but this machine has {human_bytes(host_total)} of RAM less the {headroom:.0%} memory_headroom; "
                   + "; or ".join(fewer_logits))
    if not capacity:
        raise Skip("the device's capacity is unknown here: the evaluation's figures are recorded but not compared")


@check("model.overfit", stage=STAGES["model.overfit"], requires=("data.masking", "model.step_memory"))
def model_overfit(ctx) -> None:
    """A handful of examples reach the loss threshold; trainable weights change, frozen ones do not."""
    from ..engine.overfit import diagnose

    result = ctx.state.overfit
    ctx.series("loss", result.losses)
    ctx.measure("overfit_steps", len(result.losses), "steps")
    ctx.measure("overfit_first_loss", result.losses[0], "nats")
    ctx.measure("overfit_final_loss", result.losses[-1], "nats")
    engine = engine_beside(ctx, "engine_overfit", result)
    if engine is not None:
        ctx.series("engine_loss", engine.losses)
        ctx.measure("engine_overfit_steps", len(engine.losses), "steps")
        ctx.measure("engine_overfit_final_loss", engine.losses[-1], "nats")
    if not result.reached:
        by = f" by {result.trainer}" if result.trainer != ENGINE else ""
        raise Fail(f"overfit of {ctx.recipe.checks.overfit_examples} examples{by}: "
                   + diagnose(result.losses, result.target_loss, result.learning_rate))
