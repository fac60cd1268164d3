"""Lifecycle checks: save, resume in a fresh process and get the same losses; a save killed
before each of its files, then the trainer's resume; load the saved artifact (adapter and merged
model) and generate what the in-memory model generated."""

from __future__ import annotations

from ..outcomes import Fail
from .registry import STAGES, check


@check("lifecycle.resume", stage=STAGES["lifecycle"], requires=("data.masking", "model.step_memory"))
def resume(ctx) -> None:
    """K steps straight vs K/2, save, resume in a fresh process, K/2 more: same losses."""
    from ..trainers.base import REHEARSAL_ACCUMULATION, rehearsal_note

    run = ctx.state.resume_run  # the trainer's own checkpoint and resume
    half = run.steps // 2
    note = rehearsal_note(ctx.recipe)
    if note:
        ctx.measure("rehearsal_accumulation", REHEARSAL_ACCUMULATION, "micro-batches")
        ctx.suite_property("rehearsal", note)
    ctx.measure("checkpoint_size", run.checkpoint_bytes, "bytes")
    ctx.series("losses_straight", run.straight_losses)
    ctx.series("losses_resumed", run.resumed_losses)
    ctx.measure("resumed_steps", len(run.resumed_losses), "steps")
    ctx.measure("resume_max_loss_difference",
                max(abs(a - b) for a, b in zip(run.straight_losses[half:], run.resumed_losses)), "nats")
    if run.difference:
        raise Fail(f"{run.trainer}: {run.difference}")


@check("lifecycle.generate", stage=STAGES["lifecycle"] + 1, requires=("model.overfit",))
def generate(ctx) -> None:
    """Each saved artifact the trainer reloads (``Trainer.reloaded_outputs``: by default the adapter
    on a fresh original base and the merged model) generates what the trained model did, and it stops."""
    state = ctx.state
    result = state.overfit
    inputs = state.run_inputs()
    tok, stops = state.tokenizer, inputs.stop_ids
    expected = result.greedy_ids
    ctx.measure("generated_tokens", len(expected), "tokens")
    if not expected:
        raise Fail(f"the trained model generated nothing for {result.example_where}")
    trainer = result.trainer or state.trainer.step_trainer
    for output in state.trainer.reloaded_outputs(inputs, result):  # the trainer's saves, loaded its way
        if list(output.ids) != list(expected):
            raise Fail(f"{trainer}: the {output.name} generates {tok.decode(list(output.ids))!r} but the in-memory "
                       f"trained model generated {tok.decode(expected)!r}: the saved artifact is not the trained model"
                       + (f" ({output.why})" if output.why else ""))
    if expected[-1] not in stops:
        # a template ignoring add_generation_prompt leaves the assistant header out of the prompt: the
        # model writes it first and runs on; that, not the stop token, is the cause (issue 47)
        cause = ("the inference prompt lacks the assistant header: the chat template ignores add_generation_prompt "
                 "(see data.template)" if state.digest.count("generation_prompt_ignored")
                 else "the stop token is not trained")
        raise Fail(f"after the overfit the model does not stop within {ctx.recipe.checks.max_new_tokens} tokens "
                   f"(no end-of-turn token): it generated {tok.decode(expected)!r}; {cause}")


@check("lifecycle.interrupted_save", stage=STAGES["lifecycle"] + 2, requires=("lifecycle.resume",))
def interrupted_save(ctx) -> None:
    """A save killed before each of its files: the resume starts from the last complete checkpoint or
    refuses the partial one."""
    results = ctx.state.interrupted_saves
    trainer = ctx.state.trainer.step_trainer
    ctx.measure("checkpoint_files", results[0].files if results else 0, "files")
    ctx.measure("killed_saves", len(results), "saves")
    ctx.measure("resumed_from_complete", sum(r.picked != r.partial for r in results), "saves")
    ctx.measure("partial_refused", sum(bool(r.refusal) for r in results), "saves")
    taken = [r for r in results if r.taken_as_complete]
    if not taken:
        return
    first, limit = taken[0], ctx.recipe.training.save_total_limit
    also = "" if len(taken) == 1 else f" (likewise without {', '.join(r.missing for r in taken[1:])})"
    raise Fail(f"{trainer}: a save killed before {first.missing} was written leaves {first.partial} with "
               f"{first.written} of the {first.files} files a resume needs, and the resume takes it as complete: it "
               f"starts from {first.picked} without {first.missing} and says nothing{also}. Keep save_total_limit >= 2 "
               f"(the recipe's is {limit}) so a complete checkpoint survives, verify that trainer_state.json and the "
               "optimizer file (optimizer.pt) are in a checkpoint before resuming from it, or resume from an "
               "explicit earlier checkpoint (resume_from_checkpoint = its folder) rather than the newest")


def _mlx_export_applies(recipe):
    if recipe.hardware.device != "mlx":
        return "not an MLX recipe ([hardware] device != \"mlx\")"
    if recipe.export.format == "none":
        return "the recipe declares no export ([export] format = \"none\")"
    return None


@check("lifecycle.mlx_export", stage=STAGES["lifecycle"] + 3, requires=("model.overfit",), applies=_mlx_export_applies)
def mlx_export(ctx) -> None:
    """The declared export, run as mlx_lm fuse runs it: the fused model equals base + adapters; a GGUF reads back."""
    from ..outcomes import Skip
    from ..trainers.mlx import export_refusal

    refusal = export_refusal(ctx.recipe)  # read from config.json: decided before anything runs
    if refusal:
        raise Fail(refusal)
    state = ctx.state
    trainer = state.trainer
    if not hasattr(trainer, "export"):
        raise Skip(f"the recipe's trainer is {trainer.label}, not mlx-lm: the MLX export runs mlx-lm's fuse on its "
                   "adapters (pip install \"mlx[cpu]\" \"mlx-lm[cpu]\", or mlx-lm on a Mac)")
    for name, value in trainer.export(ctx.recipe, state.overfit, state.scratch).items():
        ctx.measure(name, value, "bytes" if name.endswith("bytes") else "")
