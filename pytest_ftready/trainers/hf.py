"""The template of every trainer built on ``transformers.Trainer`` (TRL, Axolotl, LLaMA-Factory):
``HFTrainer`` runs the worst-case step, the overfit and the save-and-resume through the
trainer's own ``transformers.Trainer``; a trainer supplies only ``built`` (how it builds its
Trainer and model from the rows, a folder and the bounds) and, where it needs one, ``guarded``
(what its runs must be wrapped in). Here too: the log of every optimizer step (loss, learning
rate, tokens), a bounded ``train`` without the trainers' own deprecation noise, the measured
step of a built Trainer, the parts of a Trainer checkpoint a resume needs, and the cause of a
resume whose losses differ. Imports transformers only inside the functions that need it."""

from __future__ import annotations

import contextlib
import math
import tempfile
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ContextManager, Iterator, Optional, Sequence

from .base import Bounds, ResumeRequest, RunInputs, RunRows, SavedRun, StepLog, Trainer, worst_case_examples

# The files of a transformers.Trainer checkpoint a resume needs, and what each holds.
CHECKPOINT_PARTS = (("optimizer.pt", "the optimizer state (optimizer.pt)"),
                    ("scheduler.pt", "the scheduler state (scheduler.pt)"),
                    ("rng_state.pth", "the RNG state (rng_state.pth)"),
                    ("trainer_state.json", "the trainer state: step and data position (trainer_state.json)"))


# The cumulative token count a trainer logs: TRL's num_tokens, transformers' num_input_tokens_seen
# (include_num_input_tokens_seen), Axolotl's tokens/trainable.
TOKEN_KEYS = ("num_tokens", "num_input_tokens_seen", "tokens/trainable")


@dataclass(frozen=True)
class Built:
    """A trainer's own ``transformers.Trainer`` and the model it trains."""

    trainer: Any
    model: Any


class HFTrainer(Trainer):
    """A trainer whose run is a ``transformers.Trainer``: the step, overfit, saved run and
    fresh-process resume written once (see the module docstring)."""

    def built(self, inputs: RunInputs, run: RunRows, bounds: Bounds,
              callbacks: Sequence = ()) -> ContextManager[Built]:  # pragma: no cover - interface
        """The trainer's own Trainer over ``run.rows`` (or ``run.rows_file``), writing under
        ``run.folder``, bounded by ``bounds``, with ``callbacks``; quiet (``quiet``)."""
        raise NotImplementedError

    def guarded(self, inputs: RunInputs) -> ContextManager[None]:
        """What every run of this trainer is wrapped in (Axolotl: its patches undone after it)."""
        return contextlib.nullcontext()

    def step(self, inputs: RunInputs):
        """The worst-case micro-batch (the longest rows) through one step of the trainer's own
        Trainer (``measure_step``): its collator pads, its loss and optimizer step."""
        inputs.progress(f"model.step_memory: one step of {self.label}'s own trainer", True)
        with self.guarded(inputs), tempfile.TemporaryDirectory(prefix=f"{self.name}-step-", dir=inputs.scratch) as out:
            run = RunRows.of(Path(out), worst_case_examples(inputs))
            with self.built(inputs, run, Bounds.step()) as built:
                return replace(measure_step(inputs, built.trainer, built.model), trainer=self.step_trainer)

    def overfit(self, inputs: RunInputs):
        """The first ``overfit_examples`` rows, all of them in every optimizer step, through the
        trainer's own Trainer at a constant learning rate until the loss threshold or
        ``overfit_steps``; judged as the engine's overfit is (``engine.overfit.judged``)."""
        from ..engine.overfit import judged
        from ..engine.trainable import param_fingerprints

        recipe, checks = inputs.recipe, inputs.recipe.checks
        examples = list(inputs.examples[: checks.overfit_examples])
        logger = step_logger(stop_below=checks.overfit_loss)
        micro_batch = recipe.training.micro_batch_size
        bounds = Bounds.overfit(checks.overfit_steps, micro_batch, math.ceil(len(examples) / micro_batch))
        inputs.progress(f"model.overfit: {self.label}'s own trainer, up to {checks.overfit_steps} steps", True)
        with self.guarded(inputs), tempfile.TemporaryDirectory(prefix=f"{self.name}-overfit-",
                                                               dir=inputs.scratch) as out:
            run = RunRows.of(Path(out), examples)
            with self.built(inputs, run, bounds, [logger]) as built:
                model = built.model
                frozen, trained = param_fingerprints(model, trainable=False), param_fingerprints(model, trainable=True)
                train(built.trainer)
                first = examples[0]
                result = judged(model, recipe, [log.loss for log in logger.logs], frozen, trained,
                                prompt_ids=inputs.encoder().prompt_ids(first.row), stop_ids=inputs.stop_ids,
                                pad_id=inputs.pad_id, torch_device=inputs.torch_device,
                                # not the engine's folder: the engine's overfit, run beside it, saves there
                                save_to=inputs.scratch / f"overfit-weights-{self.name}", example_where=first.row.where)
        return replace(result, trainer=self.step_trainer)

    def saved_run(self, inputs: RunInputs) -> SavedRun:
        """``steps`` uninterrupted steps of the trainer's own Trainer, checkpointed by it at ``steps // 2``."""
        from ..engine.checkpoint import checkpoint_bytes
        from ..outcomes import Fail

        steps, examples = self.straight_run(inputs)
        run = RunRows.of(inputs.scratch / f"{self.name}-resume", examples)
        logger = step_logger()
        with self.guarded(inputs), self.built(inputs, run, Bounds.resume(steps, inputs.recipe), [logger]) as built:
            train(built.trainer)
        checkpoint = run.folder / f"checkpoint-{steps // 2}"
        if not checkpoint.is_dir():
            raise Fail(f"{self.label} wrote no checkpoint at step {steps // 2} in {run.folder} "
                       f"(save_steps = {steps // 2})")
        return SavedRun(run.folder, checkpoint, steps, tuple(logger.logs), checkpoint_bytes(checkpoint),
                        not inputs.device.is_accelerator)

    def resume_here(self, request: ResumeRequest, recipe) -> list[StepLog]:
        """In the fresh process: the same trainer over the same rows, resumed from the checkpoint
        with ``resume_from_checkpoint``; the logs of the steps it trains."""
        inputs = request.inputs(recipe)
        logger = step_logger()
        with self.guarded(inputs), self.built(inputs, RunRows.resumed(Path(request.folder)),
                                              Bounds.resume(request.steps, recipe), [logger]) as built:
            train(built.trainer, resume_from_checkpoint=request.checkpoint)
        return logger.logs

    def resume_files(self, checkpoint: Path) -> list[str]:
        """The model or adapter files (``Trainer.save_model``), then optimizer.pt, scheduler.pt,
        rng_state.pth and trainer_state.json last: the order of ``Trainer._save_checkpoint``."""
        from ..engine.checkpoint import model_files

        return model_files(checkpoint) + [name for name, _ in CHECKPOINT_PARTS if (Path(checkpoint) / name).is_file()]

    def resume_pick(self, folder: Path, newest: Path) -> Path:
        """What ``resume_from_checkpoint=True`` resumes (as TRL's, Axolotl's and LLaMA-Factory's
        auto-resume do): ``transformers.trainer_utils.get_last_checkpoint``, the highest-numbered
        ``checkpoint-N`` folder, complete or not."""
        from transformers.trainer_utils import get_last_checkpoint

        return Path(get_last_checkpoint(str(folder)) or newest)

    def difference(self, saved: SavedRun, resumed: Sequence[StepLog]) -> str:
        return resume_difference(saved.logs, resumed, saved.checkpoint, saved.exact)


def training_arguments(bounds: Bounds) -> dict:
    """``bounds`` in transformers' TrainingArguments keys (TRL and LLaMA-Factory take them)."""
    return {**bounds.keys("per_device_train_batch_size", "lr_scheduler_type"),
            "save_strategy": "steps" if bounds.save_steps else "no"}


def step_logger(stop_below: Optional[float] = None):
    """A ``TrainerCallback`` keeping a ``StepLog`` per step in ``.logs``; it stops training where
    the overfit may stop at ``stop_below`` (``engine.overfit.stop_here``), or at a loss that is not finite."""
    from transformers import TrainerCallback

    from ..engine.overfit import stop_here

    class StepLogger(TrainerCallback):
        def __init__(self) -> None:
            self.logs: list[StepLog] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                loss = float(logs["loss"])
                tokens = next((float(logs[key]) for key in TOKEN_KEYS if key in logs), None)
                self.logs.append(StepLog(state.global_step, loss, logs.get("learning_rate"), tokens))
                if not math.isfinite(loss) or (stop_below is not None
                                               and stop_here([log.loss for log in self.logs], stop_below)):
                    control.should_training_stop = True

    return StepLogger()


def quiet(trainer, callbacks: Sequence = ()):
    """No progress bars or printed log dicts from a trainer the checks run; ``callbacks`` added."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    for callback in callbacks:
        if callback not in trainer.callback_handler.callbacks:
            trainer.add_callback(callback)
    return trainer


@contextlib.contextmanager
def trainer_warnings() -> Iterator[None]:
    """The warnings a trainer's own code and imports raise (a model card that imports gradio and
    click while saving, its own defaults, its DataLoader's pin_memory without an accelerator,
    Axolotl's imports of TRL's experimental modules) are the trainer's, not the user's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true but no accelerator")
        warnings.filterwarnings("ignore", message="You are importing from 'trl.experimental'")
        yield


def train(trainer, **kwargs) -> None:
    """``trainer.train`` without the trainer's own warnings (``trainer_warnings``)."""
    with trainer_warnings():
        trainer.train(**kwargs)


def measure_step(inputs: RunInputs, trainer, model):
    """One ``max_steps = 1`` run of a built Trainer over its worst-case micro-batch, its peak
    memory measured as the engine measures its own (``engine.memory.peak_memory``); then the
    trainer's own ``training_step`` and optimizer timed (engine.step.StepMeasurement). An out of
    memory of any allocator is a measurement, not an error."""
    import statistics

    from ..engine.breakdown import breakdown
    from ..engine.memory import free_device_memory, peak_memory
    from ..engine.step import StepMeasurement, plain_timer
    from ..engine.trainable import num_layers
    from ..outcomes import out_of_memory

    device, capacity = inputs.torch_device, inputs.device.memory_total_bytes
    with trainer_warnings():
        batch = next(iter(trainer.get_train_dataloader()))
    tokens = int(batch["input_ids"].numel())
    layers = num_layers(model)
    try:
        with peak_memory(device, count_tensors=not inputs.device.is_accelerator) as peak:
            train(trainer)
    except (RuntimeError, MemoryError) as exc:  # any allocator's out of memory (outcomes); other errors go on
        reason = out_of_memory(exc)
        if not reason:
            raise
        free_device_memory(device)
        return StepMeasurement(capacity or 0, capacity, 0, "", tokens, 0.0,
                               breakdown(model, trainer.optimizer, capacity or 0), layers, out_of_memory=reason)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    peak_bytes = peak.device_reserved_bytes if peak.device_reserved_bytes is not None else weights + peak.tensor_bytes
    optimizer, scheduler = trainer.optimizer, trainer.lr_scheduler
    prepared = trainer._prepare_inputs(batch)

    def one_step() -> None:  # the trainer's own training_step (its loss, its backward), then its optimizer
        trainer.training_step(model, prepared)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    seconds = (inputs.timer or plain_timer)(one_step, inputs.recipe.checks.benchmark_rounds)
    return StepMeasurement(peak_bytes, capacity, peak.host_bytes, peak.host_method, tokens, statistics.median(seconds),
                           breakdown(model, optimizer, peak_bytes), layers, peak.device_allocated_bytes,
                           peak.device_reserved_bytes)


def _tokens_per_step(logs: Sequence[StepLog], before: Optional[float]) -> list:
    out, last = [], before
    for log in logs:
        out.append(None if log.tokens is None or last is None else log.tokens - last)
        last = log.tokens
    return out


def resume_difference(straight: Sequence[StepLog], resumed: Sequence[StepLog], checkpoint: Path, exact: bool) -> str:
    """"" when the steps after the resume equal the uninterrupted run's; else the first step
    that differs and its cause where the logs or the checkpoint tell it: a missing part of
    the checkpoint, the scheduler (learning rates differ), the data order (tokens per step
    differ), else the optimizer state or an RNG."""
    from ..engine.checkpoint import compare_losses

    half = len(straight) - len(resumed)
    after = list(straight[half:])
    if len(resumed) != len(after):
        return f"the resumed run logged {len(resumed)} steps, the uninterrupted run {len(after)} after step {half}"
    differs = compare_losses([s.loss for s in after], [r.loss for r in resumed], exact)
    lrs = [(s.step, s.learning_rate, r.learning_rate) for s, r in zip(after, resumed)
           if s.learning_rate is not None and r.learning_rate is not None
           and not math.isclose(s.learning_rate, r.learning_rate, rel_tol=1e-9)]
    if not differs and not lrs:
        return ""
    first = next((i for i, (s, r) in enumerate(zip(after, resumed)) if s.loss != r.loss), 0)
    said = (f"step {after[first].step} after the resume at step {half}: loss {resumed[first].loss:.6f}, "
            f"uninterrupted {after[first].loss:.6f}" if differs else "the losses after the resume match")
    causes = [what for name, what in CHECKPOINT_PARTS if not (Path(checkpoint) / name).exists()]
    if causes:
        causes = ["the checkpoint lacks " + ", ".join(causes)]
    if lrs:
        step, was, now = lrs[0]
        causes.append(f"the scheduler state: learning rate {now:.6g} at step {step} after the resume, "
                      f"{was:.6g} uninterrupted")
    before = straight[half - 1].tokens if half else 0
    # a trainer may restore its token count on resume or start it again from 0
    counted = before if resumed and after and resumed[0].tokens == after[0].tokens else 0
    tokens = [(s.step, a, b) for s, a, b in zip(after, _tokens_per_step(after, before),
                                                _tokens_per_step(resumed, counted))
              if a is not None and b is not None and a != b]
    if tokens:
        step, was, now = tokens[0]
        causes.append(f"the data order: step {step} trained {now:.0f} tokens after the resume, {was:.0f} uninterrupted")
    if not causes:
        causes.append("the optimizer state or an RNG (dropout, sampling): the learning rates and the tokens per "
                      "step match")
    return f"{said}; cause: " + "; ".join(causes)
