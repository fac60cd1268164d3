"""The built-in engine as a trainer, the trainer of last resort: pytest-ftready's own encoder
(``BuiltinPipeline``) and its own training loop (``engine.step``, ``engine.overfit``,
``engine.checkpoint``). Every other trainer's run is compared with this one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

from ..data.encoding import Encoded
from ..outcomes import Fail
from .base import Pipeline, PipelineInputs, ResumeRequest, RunInputs, SavedRun, StepLog, Trainer

ENGINE = "pytest-ftready engine"  # the engine's step_trainer: the name on each of its results


class BuiltinPipeline(Pipeline):
    """pytest-ftready's encoder. It can travel to worker processes: the data pass
    (data.passes) encodes large datasets with it in parallel."""

    name = "builtin"

    def __init__(self, encoder) -> None:
        self.encoder = encoder

    def encode(self, rows: Sequence) -> list[Encoded]:
        return [self.encoder.encode(row) for row in rows]


class EngineTrainer(Trainer):
    name = "builtin"
    step_trainer = ENGINE
    label = "pytest-ftready's engine"

    def pipeline(self, inputs: PipelineInputs) -> Pipeline:
        return BuiltinPipeline(inputs.encoder())

    def step(self, inputs: RunInputs):
        """The engine's worst-case step on the recipe's model (engine.step.StepMeasurement)."""
        from ..engine.step import measure_step, plain_timer

        device = inputs.device
        measured = measure_step(inputs.recipe, inputs.examples, inputs.pad_id, inputs.torch_device, inputs.base,
                                capacity_bytes=device.memory_total_bytes, count_tensors=not device.is_accelerator,
                                timer=inputs.timer or plain_timer, rounds=inputs.recipe.checks.benchmark_rounds)
        return replace(measured, trainer=self.step_trainer)

    def overfit(self, inputs: RunInputs):
        """The engine's overfit of the first ``overfit_examples`` trainable examples."""
        from ..engine.overfit import overfit

        examples = list(inputs.examples[: inputs.recipe.checks.overfit_examples])
        first, encoder = examples[0], inputs.encoder()
        result = overfit(inputs.recipe, examples, inputs.pad_id, inputs.torch_device, inputs.base,
                         prompt_ids=encoder.prompt_ids(first.row), stop_ids=inputs.stop_ids,
                         save_to=inputs.scratch / "overfit-weights", example_where=first.row.where,
                         progress=inputs.progress)
        return replace(result, trainer=self.step_trainer)

    def saved_run(self, inputs: RunInputs) -> SavedRun:
        """K uninterrupted steps, and K/2 steps saved as the engine's checkpoint."""
        from ..engine.checkpoint import straight_and_half

        steps, examples = self.straight_run(inputs)
        run = straight_and_half(inputs.recipe, examples, inputs.pad_id, inputs.torch_device, inputs.base,
                                inputs.scratch / "resume-checkpoint", steps, exact=not inputs.device.is_accelerator)
        logs = tuple(StepLog(i, loss) for i, loss in enumerate(run.straight_losses, start=1))
        return SavedRun(run.folder, run.folder, steps, logs, run.checkpoint_bytes, run.exact)

    def resume_files(self, checkpoint: Path) -> list[str]:
        from ..engine.checkpoint import resume_files

        return resume_files(checkpoint)

    def check_saved(self, saved: SavedRun) -> None:
        from ..engine.checkpoint import MissingState, load_state

        try:
            load_state(saved.checkpoint)
        except MissingState as exc:
            raise Fail(f"the checkpoint lacks {exc}: a resume cannot continue the run") from None

    def resume_here(self, request: ResumeRequest, recipe) -> list[StepLog]:
        from ..engine.checkpoint import resume_and_train

        inputs, half = request.inputs(recipe), request.steps // 2
        losses = resume_and_train(recipe, inputs.base(), Path(request.folder), request.steps - half,
                                  inputs.torch_device, inputs.pad_id, request.steps)
        return [StepLog(half + i, loss) for i, loss in enumerate(losses, start=1)]

    def difference(self, saved: SavedRun, resumed: Sequence[StepLog]) -> str:
        from ..engine.checkpoint import compare_losses

        return compare_losses(saved.straight_losses[saved.steps // 2:], [log.loss for log in resumed], saved.exact)
