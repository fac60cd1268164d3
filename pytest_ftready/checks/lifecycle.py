"""Lifecycle checks: save, resume in a fresh process and get the same losses; load the saved
artifact (adapter and merged model) and generate what the in-memory model generates."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from ..files import ensure_private_dir
from ..engine.training import MissingState
from ..outcomes import Fail
from .registry import STAGES, check


def straight_and_half(state, device: str, folder: Path, steps: int, exact: bool = True) -> list[float]:
    """Losses of ``steps`` uninterrupted steps; then a second run of steps/2 saved to ``folder``."""
    from ..engine.training import DataOrder, make_optimizer, make_scheduler, next_batches, save_checkpoint, trainable, train_step

    recipe = state.recipe
    t = recipe.training
    pad = state.tokenizer.pad_token_id
    examples = state.trainable_examples[: max(2, t.micro_batch_size * t.gradient_accumulation_steps * steps)]
    runs = []
    for length in (steps, steps // 2):
        with trainable(state) as model:
            optimizer = make_optimizer(model, recipe)
            scheduler = make_scheduler(optimizer, recipe, steps)
            order = DataOrder(len(examples), t.micro_batch_size, t.seed)
            losses = [train_step(model, optimizer, scheduler, next_batches(order, examples, t.gradient_accumulation_steps, pad),
                                 device) for _ in range(length)]
            if length == steps // 2:
                save_checkpoint(folder, model, optimizer, scheduler, order, length, examples)
            runs.append(losses)
    if compare_losses(runs[0][: steps // 2], runs[1], exact):
        raise Fail(f"two runs from the same seed differ before any resume ({runs[0][:steps // 2]} vs {runs[1]}): "
                   "training is not deterministic here, so resume cannot be checked"
                   + ("" if exact else " (set torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG)"))
    return runs[0]


def resume_in_fresh_process(recipe, folder: Path, steps: int, total: int, device: str) -> list[float]:
    import torch

    from ..engine import worker

    cmd = worker.command("resume", str(recipe.source), str(folder), str(steps), str(total), device,
                         str(torch.get_num_threads()))
    # run() kills the worker on any exception while waiting: the check's time limit, Ctrl-C
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise Fail(f"the resume in a fresh process failed (exit {proc.returncode}): "
                   f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    payload = json.loads(lines[-1])
    if "missing" in payload:
        raise Fail(f"the checkpoint lacks {payload['missing']}: a resume cannot continue the run")
    return payload["losses"]


def compare_losses(straight: list[float], resumed: list[float], exact: bool) -> str:
    """'' when they match, else what differs."""
    tolerance = 0.0 if exact else 1e-3
    for i, (a, b) in enumerate(zip(straight, resumed)):
        if abs(a - b) > tolerance * max(1.0, abs(a)):
            return (f"step {i + 1} after the resume: loss {b:.6f}, uninterrupted {a:.6f} (difference {abs(a - b):.3g}); "
                    "check that the scheduler is built before the optimizer state is loaded, and that every RNG "
                    "(torch, python, numpy, data order) is restored")
    return ""


@check("lifecycle.resume", stage=STAGES["lifecycle"], requires=("data.masking", "model.step_memory"))
def resume(ctx) -> None:
    """K steps straight vs K/2, save, resume in a fresh process, K/2 more: same losses."""
    state, recipe = ctx.state, ctx.recipe
    device = ctx.torch_device()
    steps = max(2, recipe.checks.resume_steps // 2 * 2)
    folder = state.scratch / "resume-checkpoint"
    exact = not ctx.device.is_accelerator  # GPU kernels may differ in the last bits run to run
    straight = straight_and_half(state, device, folder, steps, exact)
    from ..engine.training import checkpoint_bytes, load_state

    try:
        load_state(folder)
    except MissingState as exc:
        raise Fail(f"the checkpoint lacks {exc}: a resume cannot continue the run") from None
    size = checkpoint_bytes(folder)
    state.results["checkpoint_bytes"] = size
    ctx.measure("checkpoint_size", size, "bytes")
    resumed = resume_in_fresh_process(recipe, folder, steps // 2, steps, device)
    ctx.series("losses_straight", straight)
    ctx.series("losses_resumed", resumed)
    difference = compare_losses(straight[steps // 2:], resumed, exact)
    ctx.measure("resume_max_loss_difference", max(abs(a - b) for a, b in zip(straight[steps // 2:], resumed)), "nats")
    if difference:
        raise Fail(difference)


def merge_and_save(peft_model, folder: Path) -> None:
    """The merged artifact: adapter folded into the base weights."""
    peft_model.merge_and_unload().save_pretrained(ensure_private_dir(folder))


def verify_generation(state, device: str, merge=None) -> dict[str, list[int]]:
    """Greedy outputs of the adapter loaded on a fresh base and of the merged model."""
    merge = merge or merge_and_save
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ..engine.loading import load_model, torch_dtype
    from ..engine.memory import free_device_memory
    from ..engine.training import greedy, peft_quiet

    recipe, result = state.recipe, state.results["overfit"]
    pad, stops, n = state.tokenizer.pad_token_id, state.encoder.stop_ids, recipe.checks.max_new_tokens
    outputs = {}
    if recipe.adapter.method == "lora":
        with peft_quiet():
            loaded = PeftModel.from_pretrained(load_model(recipe, device), str(result.adapter_dir))
        outputs["adapter"] = greedy(loaded, result.prompt_ids, n, stops, pad, device)
        merged_dir = state.scratch / "merged-model"
        try:
            merge(loaded, merged_dir)
        except (ValueError, RuntimeError, OSError) as exc:
            raise Fail(f"the adapter reloads and generates, but the merged model cannot be saved: "
                       f"{str(exc).splitlines()[0]}" + (" (transformers does not save models loaded from GGUF: "
                       "merge onto a safetensors checkpoint of the same model, or ship the adapter)"
                       if recipe.model.gguf_file else "")) from None
        del loaded
        free_device_memory(device)
    else:
        merged_dir = result.adapter_dir
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch_dtype(recipe.model.dtype),
                                                  attn_implementation=recipe.model.attn_implementation).to(device)
    outputs["merged"] = greedy(merged, result.prompt_ids, n, stops, pad, device)
    del merged
    free_device_memory(device)
    return outputs


@check("lifecycle.generate", stage=STAGES["lifecycle"] + 1, requires=("model.overfit",))
def generate(ctx) -> None:
    """The saved adapter and merged model generate exactly what the trained model generated, and stop."""
    state = ctx.state
    result = state.results.get("overfit")
    if result is None:
        raise Fail("model.overfit did not produce a trained model")
    outputs = verify_generation(state, ctx.torch_device())
    tok = state.tokenizer
    expected = result.greedy_ids
    ctx.measure("generated_tokens", len(expected), "tokens")
    if not expected:
        raise Fail(f"the trained model generated nothing for {result.example_where}")
    for name, ids in outputs.items():
        if ids != expected:
            raise Fail(f"the reloaded {name} generates {tok.decode(ids)!r} but the in-memory model generated "
                       f"{tok.decode(expected)!r}: the saved artifact is not the trained model"
                       + (" (was the adapter merged before saving?)" if name == "merged" else ""))
    if expected[-1] not in state.encoder.stop_ids:
        raise Fail(f"after the overfit the model does not stop within {ctx.recipe.checks.max_new_tokens} tokens "
                   f"(no end-of-turn token): it generated {tok.decode(expected)!r}; the stop token is not trained")
