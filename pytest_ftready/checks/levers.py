"""Lever checks: what to change when memory is short (levers.advice), and a measured sweep of
the levers this recipe allows, side by side in one pytest-benchmark group (levers.sweep)."""

from __future__ import annotations

from ..outcomes import Fail, Skip
from ..outputs.forecast_text import levers_text
from ..units import human_bytes
from .registry import STAGES, check


@check("levers.advice", stage=STAGES["levers"])
def advice(ctx) -> None:
    """When the step does not fit (or fits with less than the headroom), list the levers and what each saves."""
    state = ctx.state
    step = state.step
    levers = state.levers  # forecast.levers: traced where the forecast runs, else estimated
    ctx.measure("levers_considered", len(levers), "levers")
    for lever in levers:
        ctx.measure(f"saves[{lever.name}]", lever.saves_bytes, "bytes", estimate=True)
        ctx.measure(f"saves_how[{lever.name}]", lever.how, "")
    usable = step.usable_bytes(ctx.recipe.hardware.memory_headroom)
    if step.out_of_memory:
        raise Fail(f"the step runs out of memory ({step.out_of_memory}). Levers, largest saving first:\n"
                   f"{levers_text(levers)}")
    if usable is not None and step.peak_bytes > usable:
        raise Fail(f"the step needs {human_bytes(step.peak_bytes)}, {human_bytes(step.peak_bytes - usable)} "
                   f"more than the {human_bytes(usable)} usable. Levers, largest saving first:\n"
                   f"{levers_text(levers)}")


SHORT_KEYS = {"gradient_checkpointing": "checkpointing", "micro_batch_size": "micro_batch",
              "attn_implementation": "attn"}


def variant_id(key: str, value) -> str:
    """A sweep variant's id, stable across nights (benchmark records compare by it): its first change."""
    shown = ("on" if value else "off") if isinstance(value, bool) else value
    return f"{SHORT_KEYS.get(key, key)}={shown}"


def sweep_variants(recipe) -> list[tuple[str, dict]]:
    """(id, {"table.key": value}) for the recipe itself, each lever of the one lever model
    (forecast.levers) that a [training] or [data] key expresses, and the speed variants
    (micro-batch doubled, max_length halved, other attention kernels)."""
    from ..forecast.levers import candidates, recipe_changes

    t, d, m = recipe.training, recipe.data, recipe.model
    out: list[tuple[str, dict]] = [("recipe", {})]
    out.append((variant_id("gradient_checkpointing", not t.gradient_checkpointing),
                {"training.gradient_checkpointing": not t.gradient_checkpointing}))
    for lever in candidates(recipe):
        changes = recipe_changes(lever.change)
        # the sweep trains on the session's base model: a lever that loads another base (4-bit,
        # no QLoRA preparation, LoRA instead of full) is the forecast's to trace, not the sweep's
        if changes and all(table in ("training", "data") for table, _, _ in changes):
            out.append((variant_id(*changes[0][1:]), {f"{table}.{key}": value for table, key, value in changes}))
    out.append((variant_id("micro_batch_size", t.micro_batch_size * 2),
                {"training.micro_batch_size": t.micro_batch_size * 2}))
    if d.max_length >= 32:
        out.append((f"max_length={d.max_length // 2}", {"data.max_length": d.max_length // 2}))
    for attn in ("eager", "sdpa", "flash_attention_2"):
        if attn != m.attn_implementation:
            out.append((f"attn={attn}", {"model.attn_implementation": attn}))
    by_name: dict[str, tuple] = {}
    for name, variant in out:
        by_name.setdefault(name, (name, variant))  # the first of each name, in order
    return list(by_name.values())


@check("levers.sweep", stage=STAGES["levers"] + 1, accelerator=True, nightly=True,
       requires=("data.masking", "model.step_memory"), params=sweep_variants)
def sweep(ctx) -> None:
    """One lever variant: peak memory and tokens/s of the real step, in the recipe's benchmark group."""
    from ..engine.step import measure_step
    from ..engine.trainable import BITSANDBYTES_OPTIMIZERS, attention_of
    from ..recipe.schema import with_changes
    from ..machine.compat import load
    from ..machine.compatibility import kernel_problem

    state = ctx.state
    device = ctx.torch_device()
    variant = with_changes(ctx.recipe, ctx.param, "levers.sweep")
    rows = {r["name"]: r for r in load("compute")["kernel"]}
    needs = [("flash_attention_2", "attn=flash_attention_2", variant.model.attn_implementation == "flash_attention_2"),
             ("bitsandbytes", f"optimizer={variant.training.optimizer}",
              variant.training.optimizer in BITSANDBYTES_OPTIMIZERS)]
    for kernel, label, wanted in needs:
        problem = wanted and kernel_problem(rows[kernel], label, variant, ctx.machine, ctx.device)
        if problem:
            raise Skip(f"not available on this device: {problem}")
    ctx.measure("is_recipe_setting", not ctx.param, "")
    # LoRA trains on the shared base: it runs this variant's attention kernel for the step.
    # A full fine-tune loads a fresh model with the variant's kernel (engine.trainable).
    shared = state.model if variant.adapter.method == "lora" else None
    group = f"levers.sweep {ctx.recipe.name}"
    with attention_of(shared, variant.model.attn_implementation):
        step = measure_step(variant, state.training_examples(), state.tokenizer.pad_token_id, device,
                            state.shared_base, capacity_bytes=ctx.device.memory_total_bytes,
                            count_tensors=not ctx.device.is_accelerator,
                            timer=lambda fn, rounds: ctx.benchmark(fn, rounds=rounds, group=group),
                            rounds=ctx.recipe.checks.benchmark_rounds)
    if step.out_of_memory:
        ctx.measure("out_of_memory", True, "")
        setting = ("the recipe's own setting" if not ctx.param
                   else ", ".join(f"{k} = {v!r}" for k, v in ctx.param.items()))
        raise Fail(f"{setting} runs out of memory on {ctx.device.name}: {step.out_of_memory}. This variant does not "
                   "fit here; keep it out of the run's settings")
    ctx.measure("peak_memory", step.peak_bytes, "bytes")
    ctx.measure("tokens_per_s", step.tokens_per_s, "tokens/s")
    ctx.measure("step_seconds", step.step_seconds, "s")
