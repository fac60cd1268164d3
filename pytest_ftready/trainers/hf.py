"""What the trainers built on ``transformers.Trainer`` (TRL, Axolotl, LLaMA-Factory) share:
the log of every optimizer step (loss, learning rate, tokens), a bounded ``train`` without
the trainers' own deprecation noise, the measured worst-case step of a built Trainer, the
parts of a Trainer checkpoint a resume needs, and the cause of a resume whose losses differ.
Imports transformers only inside the functions that need it."""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

# The files of a transformers.Trainer checkpoint a resume needs, and what each holds.
CHECKPOINT_PARTS = (("optimizer.pt", "the optimizer state (optimizer.pt)"),
                    ("scheduler.pt", "the scheduler state (scheduler.pt)"),
                    ("rng_state.pth", "the RNG state (rng_state.pth)"),
                    ("trainer_state.json", "the trainer state: step and data position (trainer_state.json)"))


# The cumulative token count a trainer logs: TRL's num_tokens, transformers' num_input_tokens_seen
# (include_num_input_tokens_seen), Axolotl's tokens/trainable.
TOKEN_KEYS = ("num_tokens", "num_input_tokens_seen", "tokens/trainable")


@dataclass(frozen=True)
class StepLog:
    """One optimizer step as the Trainer logged it (``logging_steps = 1``)."""

    step: int
    loss: float
    learning_rate: Optional[float]
    tokens: Optional[float]  # tokens seen so far (TOKEN_KEYS), when logged

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


def row_data(examples: Sequence) -> list[dict]:
    """The rows of training examples as the team wrote them: what a trainer's own run is fed."""
    return [dict(e.row.data) for e in examples]


ROWS_FILE = "rows.jsonl"  # the rows a trainer's own run reads, written under the run's scratch


def write_rows(folder: Path, rows: Sequence[dict]) -> Path:
    """``rows`` as ``folder/rows.jsonl``, owner-only (they are the team's data), for a trainer that
    loads its dataset from a file."""
    import json

    from ..files import ensure_private_dir, write_private

    path = ensure_private_dir(folder) / ROWS_FILE
    write_private(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path


def worst_case_examples(state) -> list:
    """The micro-batch of the longest training examples (repeated where there are fewer rows)."""
    mb = state.recipe.training.micro_batch_size
    longest = sorted(state.training_examples(), key=lambda e: e.length, reverse=True)[:mb]
    return [longest[i % len(longest)] for i in range(mb)]


@dataclass(frozen=True)
class SavedRun:
    """A trainer's uninterrupted run of ``steps`` and its own checkpoint at ``steps // 2``."""

    folder: Path  # the run's output_dir, with what the fresh process needs to rebuild the trainer
    checkpoint: Path  # checkpoint-<steps // 2>
    steps: int
    logs: tuple  # StepLog of every step of the uninterrupted run
    checkpoint_bytes: int
    exact: bool


def saved(folder: Path, steps: int, logs: Sequence[StepLog], exact: bool, who: str) -> SavedRun:
    """The SavedRun of a finished straight run whose trainer saved at ``steps // 2``."""
    from ..outcomes import Fail

    checkpoint = Path(folder) / f"checkpoint-{steps // 2}"
    if not checkpoint.is_dir():
        raise Fail(f"{who} wrote no checkpoint at step {steps // 2} in {folder} (save_steps = {steps // 2})")
    return SavedRun(Path(folder), checkpoint, steps, tuple(logs), checkpoint_bytes(checkpoint), exact)


def resumed_in_fresh_process(state, trainer_name: str, run: SavedRun, who: str):
    """The trainer's ``resume_here`` of ``run.checkpoint`` in a fresh process (``trainers.worker``),
    beside the straight run's losses (base.ResumeRun), the difference named by ``resume_difference``."""
    from ..engine.checkpoint import run_worker
    from . import worker
    from .base import ResumeRun

    state.progress(f"lifecycle.resume: resuming {who}'s checkpoint-{run.steps // 2} in a fresh process", force=True)
    payload = run_worker(worker.command(trainer_name, str(state.recipe.source), str(run.folder), str(run.checkpoint),
                                        str(run.steps), state.torch_device))
    resumed = [StepLog(*log) for log in payload["logs"]]
    return ResumeRun([log.loss for log in run.logs], [log.loss for log in resumed], run.steps, run.checkpoint_bytes,
                     resume_difference(run.logs, resumed, run.checkpoint, run.exact))


def weights_before(model) -> tuple[dict, dict]:
    """Fingerprints of the frozen and the trainable weights, before an overfit trains them."""
    from ..engine.trainable import param_fingerprints

    return param_fingerprints(model, trainable=False), param_fingerprints(model, trainable=True)


def judged_overfit(state, model, examples: Sequence, logs: Sequence[StepLog], before: tuple[dict, dict]):
    """The overfit's verdict once a trainer trained ``model`` on ``examples`` (engine.overfit.judged)."""
    from ..engine.overfit import judged

    first = examples[0]
    return judged(model, state.recipe, [log.loss for log in logs], *before,
                  prompt_ids=state.encoder.prompt_ids(first.row), stop_ids=state.encoder.stop_ids,
                  pad_id=state.tokenizer.pad_token_id, torch_device=state.torch_device,
                  # not the engine's folder: the engine's overfit, run beside it, saves there
                  save_to=state.scratch / f"overfit-weights-{state.trainer.name}", example_where=first.row.where)


@contextlib.contextmanager
def trainer_warnings():
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


def measure_step(state, trainer, model):
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

    device, capacity = state.torch_device, state.device.memory_total_bytes
    with trainer_warnings():
        batch = next(iter(trainer.get_train_dataloader()))
    tokens = int(batch["input_ids"].numel())
    layers = num_layers(model)
    try:
        with peak_memory(device, count_tensors=not state.device.is_accelerator) as peak:
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
