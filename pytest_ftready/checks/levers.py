"""Lever checks: what to change when memory is short (levers.advice), and a measured sweep of
the levers this recipe allows, side by side in one pytest-benchmark group (levers.sweep)."""

from __future__ import annotations

from ..engine.breakdown import advice_text, levers_for
from ..units import human_bytes, percentile
from ..outcomes import Fail, Skip
from .registry import STAGES, check


@check("levers.advice", stage=STAGES["levers"])
def advice(ctx) -> None:
    """When the step does not fit (or fits with less than the headroom), list the levers and what each saves."""
    step = ctx.state.results.get("step")
    if step is None:
        raise Skip("no training step was measured (model.step_memory did not run)")
    p95 = percentile([e.full_length for e in ctx.state.encoded], 0.95) or None
    levers = levers_for(ctx.recipe, step.breakdown, step.num_layers, p95)
    for lever in levers:
        ctx.measure(f"saves[{lever.name}]", lever.saves_bytes, "bytes", estimate=True)
    if step.usable_bytes is not None and step.peak_bytes > step.usable_bytes:
        raise Fail(f"the step needs {human_bytes(step.peak_bytes)}, {human_bytes(step.peak_bytes - step.usable_bytes)} "
                   f"more than the {human_bytes(step.usable_bytes)} usable. Levers, largest saving first:\n"
                   f"{advice_text(levers)}")


def sweep_variants(recipe) -> list[tuple[str, dict]]:
    """(id, {(table, key): value}) for the recipe itself and each lever it allows."""
    t, d, m = recipe.training, recipe.data, recipe.model
    out = [("recipe", {})]
    out.append((f"checkpointing={'off' if t.gradient_checkpointing else 'on'}",
                {("training", "gradient_checkpointing"): not t.gradient_checkpointing}))
    if t.micro_batch_size > 1:
        out.append((f"micro_batch={t.micro_batch_size // 2}", {("training", "micro_batch_size"): t.micro_batch_size // 2}))
    out.append((f"micro_batch={t.micro_batch_size * 2}", {("training", "micro_batch_size"): t.micro_batch_size * 2}))
    if d.max_length >= 32:
        out.append((f"max_length={d.max_length // 2}", {("data", "max_length"): d.max_length // 2}))
    for attn in ("eager", "sdpa", "flash_attention_2"):
        if attn != m.attn_implementation:
            out.append((f"attn={attn}", {("model", "attn_implementation"): attn}))
    if t.optimizer == "adamw":
        out.append(("optimizer=adamw_8bit", {("training", "optimizer"): "adamw_8bit"}))
    return out


def apply_variant(recipe, changes: dict):
    for (table, key), value in changes.items():
        recipe = recipe.set(table, getattr(recipe, table).set(key, value))
    return recipe


@check("levers.sweep", stage=STAGES["levers"] + 1, accelerator=True, nightly=True,
       requires=("data.masking", "model.step_memory"), params=sweep_variants)
def sweep(ctx) -> None:
    """One lever variant: peak memory and tokens/s of the real step, in the recipe's benchmark group."""
    import torch

    from .model import worst_case_batch
    from .stack import kernel_problem
    from ..machine.compat import load
    from ..engine.memory import free_device_memory, peak_memory
    from ..engine.training import make_optimizer, make_scheduler, trainable, train_step

    state = ctx.state
    device = ctx.torch_device()
    variant = apply_variant(ctx.recipe, ctx.param)
    rows = {r["name"]: r for r in load("compute")["kernel"]}
    if variant.model.attn_implementation == "flash_attention_2":
        problem = kernel_problem(rows["flash_attention_2"], "attn=flash_attention_2", variant, ctx.machine, ctx.device)
        if problem:
            raise Skip(f"not available on this device: {problem}")
    if variant.training.optimizer == "adamw_8bit":
        problem = kernel_problem(rows["bitsandbytes"], "optimizer=adamw_8bit", variant, ctx.machine, ctx.device)
        if problem:
            raise Skip(f"not available on this device: {problem}")
    ctx.measure("is_recipe_setting", not ctx.param, "")
    # LoRA trains on the shared base: switch its attention kernel for this variant and back.
    # A full fine-tune loads a fresh model with the variant's kernel (training.trainable).
    shared = state.model if variant.adapter.method == "lora" else None
    base_attn = shared.config._attn_implementation if shared is not None else None
    if shared is not None and variant.model.attn_implementation != base_attn:
        shared.set_attn_implementation(variant.model.attn_implementation)
    batch = worst_case_batch(state.trainable_examples, variant.training.micro_batch_size, variant.data.max_length,
                             state.tokenizer.pad_token_id)
    group = f"levers.sweep {ctx.recipe.name}"
    try:
        with trainable(state, variant) as model:
            optimizer = make_optimizer(model, variant)
            scheduler = make_scheduler(optimizer, variant, 1, constant=True)
            try:
                with peak_memory(device, count_tensors=not ctx.device.is_accelerator) as peak:
                    train_step(model, optimizer, scheduler, [batch], device)
            except torch.OutOfMemoryError:
                optimizer.zero_grad(set_to_none=True)
                free_device_memory(device)
                ctx.measure("out_of_memory", True, "")
                return
            weights = sum(p.numel() * p.element_size() for p in model.parameters())
            peak_bytes = peak.device_reserved_bytes if peak.device_reserved_bytes is not None else weights + peak.tensor_bytes
            seconds = ctx.benchmark(lambda: train_step(model, optimizer, scheduler, [batch], device), group=group)
    finally:
        if shared is not None and shared.config._attn_implementation != base_attn:
            shared.set_attn_implementation(base_attn)
    step_s = sorted(seconds)[len(seconds) // 2]
    ctx.measure("peak_memory", peak_bytes, "bytes")
    ctx.measure("tokens_per_s", batch["input_ids"].numel() / step_s, "tokens/s")
    ctx.measure("step_seconds", step_s, "s")
