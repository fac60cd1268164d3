"""Lever checks: what to change when memory is short (levers.advice), and a measured sweep of
the levers this recipe allows, side by side in one pytest-benchmark group (levers.sweep)."""

from __future__ import annotations

from ..engine.breakdown import advice_text, levers_for
from ..outcomes import Fail, Skip
from ..units import human_bytes
from .registry import STAGES, check


@check("levers.advice", stage=STAGES["levers"])
def advice(ctx) -> None:
    """When the step does not fit (or fits with less than the headroom), list the levers and what each saves."""
    state = ctx.state
    step = state.step
    levers = levers_for(ctx.recipe, step.breakdown, step.num_layers, state.length_p95)
    ctx.measure("levers_considered", len(levers), "levers")
    for lever in levers:
        ctx.measure(f"saves[{lever.name}]", lever.saves_bytes, "bytes", estimate=True)
    usable = step.usable_bytes(ctx.recipe.hardware.memory_headroom)
    if step.out_of_memory:
        raise Fail(f"the step runs out of memory ({step.out_of_memory}). Levers, largest saving first:\n"
                   f"{advice_text(levers)}")
    if usable is not None and step.peak_bytes > usable:
        raise Fail(f"the step needs {human_bytes(step.peak_bytes)}, {human_bytes(step.peak_bytes - usable)} "
                   f"more than the {human_bytes(usable)} usable. Levers, largest saving first:\n"
                   f"{advice_text(levers)}")


def sweep_variants(recipe) -> list[tuple[str, dict]]:
    """(id, {"table.key": value}) for the recipe itself and each lever it allows."""
    t, d, m = recipe.training, recipe.data, recipe.model
    out = [("recipe", {})]
    out.append((f"checkpointing={'off' if t.gradient_checkpointing else 'on'}",
                {"training.gradient_checkpointing": not t.gradient_checkpointing}))
    if t.micro_batch_size > 1:
        out.append((f"micro_batch={t.micro_batch_size // 2}", {"training.micro_batch_size": t.micro_batch_size // 2}))
    out.append((f"micro_batch={t.micro_batch_size * 2}", {"training.micro_batch_size": t.micro_batch_size * 2}))
    if d.max_length >= 32:
        out.append((f"max_length={d.max_length // 2}", {"data.max_length": d.max_length // 2}))
    for attn in ("eager", "sdpa", "flash_attention_2"):
        if attn != m.attn_implementation:
            out.append((f"attn={attn}", {"model.attn_implementation": attn}))
    if t.optimizer == "adamw":
        out.append(("optimizer=adamw_8bit", {"training.optimizer": "adamw_8bit"}))
    return out


@check("levers.sweep", stage=STAGES["levers"] + 1, accelerator=True, nightly=True,
       requires=("data.masking", "model.step_memory"), params=sweep_variants)
def sweep(ctx) -> None:
    """One lever variant: peak memory and tokens/s of the real step, in the recipe's benchmark group."""
    from ..engine.step import measure_step
    from ..engine.trainable import attention_of
    from ..recipe.schema import with_changes
    from ..machine.compat import load
    from ..machine.compatibility import kernel_problem

    state = ctx.state
    device = ctx.torch_device()
    variant = with_changes(ctx.recipe, ctx.param, "levers.sweep")
    rows = {r["name"]: r for r in load("compute")["kernel"]}
    needs = [("flash_attention_2", "attn=flash_attention_2", variant.model.attn_implementation == "flash_attention_2"),
             ("bitsandbytes", "optimizer=adamw_8bit", variant.training.optimizer == "adamw_8bit")]
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
        setting = "the recipe's own setting" if not ctx.param else ", ".join(f"{k} = {v!r}" for k, v in ctx.param.items())
        raise Fail(f"{setting} runs out of memory on {ctx.device.name}: {step.out_of_memory}. This variant does not "
                   "fit here; keep it out of the run's settings")
    ctx.measure("peak_memory", step.peak_bytes, "bytes")
    ctx.measure("tokens_per_s", step.tokens_per_s, "tokens/s")
    ctx.measure("step_seconds", step.step_seconds, "s")
