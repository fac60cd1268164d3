"""The built-in engine as a trainer, the trainer of last resort: pytest-ftready's own encoder
(``BuiltinPipeline``) and its own training loop (``engine.step``, ``engine.overfit``,
``engine.checkpoint``). Every other trainer's run is compared with this one."""

from __future__ import annotations

from typing import Sequence

from ..data.encoding import Encoded
from ..outcomes import Fail
from .base import Pipeline, ResumeRun, Trainer


class BuiltinPipeline(Pipeline):
    """pytest-ftready's encoder. It can travel to worker processes: the data pass
    (data.passes) encodes large datasets with it in parallel."""

    name = "builtin"

    def __init__(self, encoder) -> None:
        self.encoder = encoder

    def encode(self, rows: Sequence) -> list[Encoded]:
        return [self.encoder.encode(row) for row in rows]


def engine_step(state):
    """The engine's worst-case step on the recipe's model (engine.step.StepMeasurement)."""
    from ..engine.step import measure_step, plain_timer

    return measure_step(state.recipe, state.training_examples(), state.tokenizer.pad_token_id, state.torch_device,
                        state.shared_base, capacity_bytes=state.device.memory_total_bytes,
                        count_tensors=not state.device.is_accelerator, timer=state.timer or plain_timer,
                        rounds=state.recipe.checks.benchmark_rounds)


def engine_overfit(state):
    """The engine's overfit of the first ``overfit_examples`` trainable examples."""
    from ..engine.overfit import overfit

    examples = state.training_examples()[: state.recipe.checks.overfit_examples]
    first = examples[0]
    return overfit(state.recipe, examples, state.tokenizer.pad_token_id, state.torch_device, state.shared_base,
                   prompt_ids=state.encoder.prompt_ids(first.row), stop_ids=state.encoder.stop_ids,
                   save_to=state.scratch / "overfit-weights", example_where=first.row.where,
                   progress=state.progress)


def resume_steps(recipe) -> int:
    """Steps of the straight run of the resume check (even, at least 2)."""
    return max(2, recipe.checks.resume_steps // 2 * 2)


class EngineTrainer(Trainer):
    name = "builtin"
    step_trainer = "pytest-ftready engine"

    def pipeline(self, state) -> Pipeline:
        return BuiltinPipeline(state.encoder)

    def step(self, state):
        return state.engine_step

    def overfit(self, state):
        return state.engine_overfit

    def saved_run(self, state):
        """K uninterrupted steps, and K/2 steps saved as a checkpoint (engine.checkpoint.SavedRun)."""
        from ..engine.checkpoint import straight_and_half

        steps = resume_steps(state.recipe)
        state.progress(f"training {steps} + {steps // 2} steps for the resume check", force=True)
        return straight_and_half(state.recipe, state.training_examples(), state.tokenizer.pad_token_id,
                                 state.torch_device, state.shared_base, state.scratch / "resume-checkpoint", steps,
                                 exact=not state.device.is_accelerator)

    def resume(self, state, saved) -> ResumeRun:
        from ..engine.checkpoint import MissingState, compare_losses, load_state, resume_in_fresh_process

        try:
            load_state(saved.folder)
        except MissingState as exc:
            raise Fail(f"the checkpoint lacks {exc}: a resume cannot continue the run") from None
        half = saved.steps // 2
        state.progress(f"lifecycle.resume: resuming step {half} in a fresh process", force=True)
        resumed = resume_in_fresh_process(state.recipe, saved.folder, half, saved.steps, state.torch_device)
        straight = saved.straight_losses
        return ResumeRun(straight, resumed, saved.steps, saved.checkpoint_bytes,
                         compare_losses(straight[half:], resumed, saved.exact))
