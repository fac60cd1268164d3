"""What the trainers built on ``transformers.Trainer`` (TRL, Axolotl, LLaMA-Factory) share:
the worst-case step measured through a built Trainer (``measured_step``), the log of every
optimizer step (loss, learning rate, tokens), the parts of a Trainer checkpoint a resume
needs, and the cause of a resume whose losses differ. Imports transformers only inside the
functions that need it."""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

# The files of a transformers.Trainer checkpoint a resume needs, and what each holds.
CHECKPOINT_PARTS = (("optimizer.pt", "the optimizer state (optimizer.pt)"),
                    ("scheduler.pt", "the scheduler state (scheduler.pt)"),
                    ("rng_state.pth", "the RNG state (rng_state.pth)"),
                    ("trainer_state.json", "the trainer state: step and data position (trainer_state.json)"))


# The cumulative token count a trainer logs: TRL's num_tokens, Axolotl's trained tokens.
TOKEN_KEYS = ("num_tokens", "tokens/trainable")


@dataclass(frozen=True)
class StepLog:
    """One optimizer step as the Trainer logged it (``logging_steps = 1``)."""

    step: int
    loss: float
    learning_rate: Optional[float]
    tokens: Optional[float]  # tokens seen so far (TRL's num_tokens), when the trainer logs it

    def to_list(self) -> list:
        return [self.step, self.loss, self.learning_rate, self.tokens]


def step_logger(stop_below: Optional[float] = None):
    """A ``TrainerCallback`` keeping a ``StepLog`` per step in ``.logs``; it stops training at a
    loss at or below ``stop_below``, or at a loss that is not finite."""
    from transformers import TrainerCallback

    class StepLogger(TrainerCallback):
        def __init__(self) -> None:
            self.logs: list[StepLog] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                loss = float(logs["loss"])
                tokens = next((float(logs[key]) for key in TOKEN_KEYS if key in logs), None)
                self.logs.append(StepLog(state.global_step, loss, logs.get("learning_rate"), tokens))
                if not math.isfinite(loss) or (stop_below is not None and loss <= stop_below):
                    control.should_training_stop = True

    return StepLogger()


def quiet(trainer) -> None:
    """No progress bars or printed log dicts from a trainer the checks run."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)


@contextlib.contextmanager
def trainer_warnings():
    """The warnings a trainer's own code raises (its deprecations, its DataLoader's pin_memory
    without an accelerator, its imports of TRL's experimental modules) are the trainer's, not the
    user's: ignored while it runs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true but no accelerator")
        warnings.filterwarnings("ignore", message="You are importing from 'trl.experimental'")
        yield


def row_data(examples: Sequence) -> list[dict]:
    """The rows of training examples as the team wrote them: what a trainer's own run is fed."""
    return [dict(e.row.data) for e in examples]


def worst_case_rows(state) -> list:
    """The worst-case micro-batch a trainer's step runs: the ``micro_batch_size`` longest
    training examples (repeated when there are fewer)."""
    mb = state.recipe.training.micro_batch_size
    longest = sorted(state.training_examples(), key=lambda e: e.length, reverse=True)[:mb]
    return [longest[i % len(longest)] for i in range(mb)]


def measured_step(state, trainer, train: Callable[[], None]):
    """The step of a Trainer built for one ``max_steps = 1`` run over the worst-case micro-batch:
    ``train()`` runs it under the engine's peak-memory measurement, then the trainer's own
    ``training_step`` (its loss, its backward) and its optimizer are timed as the engine times
    its step (engine.step.StepMeasurement; out of memory is a measurement, any allocator's)."""
    import statistics

    from ..engine.breakdown import breakdown
    from ..engine.memory import free_device_memory, peak_memory
    from ..engine.step import StepMeasurement, plain_timer
    from ..engine.trainable import num_layers
    from ..outcomes import out_of_memory

    device, model = state.torch_device, trainer.model
    capacity = state.device.memory_total_bytes
    with trainer_warnings():
        batch = next(iter(trainer.get_train_dataloader()))
    tokens = int(batch["input_ids"].numel())
    layers = num_layers(model)
    try:
        with peak_memory(device, count_tensors=not state.device.is_accelerator) as peak:
            train()
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
    inputs = trainer._prepare_inputs(batch)

    def one_step() -> None:  # the trainer's own training_step (its loss, its backward), then its optimizer
        trainer.training_step(model, inputs)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    seconds = (state.timer or plain_timer)(one_step, state.recipe.checks.benchmark_rounds)
    return StepMeasurement(peak_bytes, capacity, peak.host_bytes, peak.host_method, tokens, statistics.median(seconds),
                           breakdown(model, optimizer, peak_bytes), layers, peak.device_allocated_bytes,
                           peak.device_reserved_bytes)


def checkpoint_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


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
    tokens = [(s.step, a, b) for s, a, b in zip(after, _tokens_per_step(after, before), _tokens_per_step(resumed, counted))
              if a is not None and b is not None and a != b]
    if tokens:
        step, was, now = tokens[0]
        causes.append(f"the data order: step {step} trained {now:.0f} tokens after the resume, {was:.0f} uninterrupted")
    if not causes:
        causes.append("the optimizer state or an RNG (dropout, sampling): the learning rates and the tokens per "
                      "step match")
    return f"{said}; cause: " + "; ".join(causes)
