"""The interface every trainer offers the session, what it is handed, and the pipelines that are
no trainer's own.

A ``Trainer`` answers what the session asks of the run the team will launch: its ``pipeline``
(rows -> training examples, judged by the data checks), its worst-case ``step`` (peak memory,
time), its ``overfit`` of a tiny sample and what the overfit's saved artifacts generate loaded
afresh (``reloaded_outputs``, named ``Reloaded`` outputs: by default the engine's reload, as a
server loads a transformers checkpoint; a trainer that saves its own way adds or replaces them),
and its save-and-resume (``saved_run``, then ``resume`` in a fresh process, where
``resume_here`` runs). It is handed frozen inputs, never the session: ``PipelineInputs`` to
build its pipeline, ``RunInputs`` (the examples, the pad id, the base model, the scratch
folder, progress) for its runs. Each result names the trainer that produced it (``trainer``:
``step_trainer`` below), so the checks tell a trainer's run from the engine's by name. ``name``
is the pipeline measurement (``pipeline = trl``), ``step_trainer`` the step measurement
(``step_trainer = trl SFTTrainer``).

Pipelines here: ``Pipeline`` (the interface), ``FunctionPipeline`` (a team's own formatting
function from the ``pytest_ftready_pipeline`` hook). Labels not made by the built-in encoder
get the same independent verification (``data.verify.judge_labels``). Imports no torch at
module import."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..data.encoding import Encoded
from ..data.layouts import read_sample
from ..data.verify import IGNORE_INDEX, judge_labels
from ..machine.devices import Device
from ..outcomes import Fail


class Pipeline:
    """What a pipeline offers the checks. ``name`` shows in measurements and messages."""

    name = "pipeline"
    # an encoder that can travel to worker processes (the data pass encodes large data with it in
    # parallel); None: the pipeline encodes in this process, in large chunks
    encoder: Any = None

    def encode(self, rows: Sequence) -> list[Encoded]:  # pragma: no cover - interface
        raise NotImplementedError

    def collate(self, examples: Sequence[Encoded], pad_id: int) -> dict:
        """A padded batch (input_ids, attention_mask, labels as tensors)."""
        from ..engine.batches import collate

        return collate(examples, pad_id)


class FunctionPipeline(Pipeline):
    """A team's own ``function(row: dict) -> {"input_ids": [...], "labels": [...]}``, the one
    their trainer maps over the dataset; ``collator(list of such dicts) -> batch`` optional."""

    def __init__(self, function: Callable[[dict], dict], recipe, tokenizer, stop_ids: frozenset[int],
                 collator: Optional[Callable[[list], Any]] = None, name: str = "conftest") -> None:
        self.function, self.collator, self.name = function, collator, name
        self.recipe, self.tok, self.stop_ids = recipe, tokenizer, stop_ids
        self.method = f"{name} pipeline"

    def encode(self, rows: Sequence) -> list[Encoded]:
        data = self.recipe.data
        out = []
        for row in rows:
            try:
                example = self.function(dict(row.data))
                ids, labels = [int(t) for t in example["input_ids"]], [int(t) for t in example["labels"]]
            except Exception as exc:  # their code: report it on the row, like a template error
                failed = f"the {self.name} pipeline failed: {type(exc).__name__}: {exc}"
                out.append(Encoded(row, (), (), self.method, 0, 0, (("render_error", failed),)))
                continue
            problems = judge_labels(self.tok, read_sample(row, data.format, data.train_on, data.roles)[0],
                                    data.train_on, ids, labels, self.stop_ids,
                                    max_length=data.max_length)
            trained = sum(1 for label in labels if label != IGNORE_INDEX)
            out.append(Encoded(row, tuple(ids), tuple(labels), self.method, len(ids), trained, tuple(problems)))
        return out

    def collate(self, examples: Sequence[Encoded], pad_id: int) -> dict:
        if self.collator is None:
            return super().collate(examples, pad_id)
        return self.collator([{"input_ids": list(e.input_ids), "labels": list(e.labels)} for e in examples])


def as_pipeline(provided: Any, recipe, tokenizer, stop_ids: frozenset[int]) -> Pipeline:
    """What a ``pytest_ftready_pipeline`` hook returned, as a Pipeline: a Pipeline as is, a
    function, or a (function, collator) pair."""
    if isinstance(provided, Pipeline):
        return provided
    if isinstance(provided, tuple) and len(provided) == 2 and callable(provided[0]):
        return FunctionPipeline(provided[0], recipe, tokenizer, stop_ids, collator=provided[1])
    if callable(provided):
        return FunctionPipeline(provided, recipe, tokenizer, stop_ids)
    raise ValueError(f"pytest_ftready_pipeline returned {type(provided).__name__}; expected a function "
                     "row -> {input_ids, labels}, a (function, collator) pair, or a pytest_ftready Pipeline")


# ---- what a trainer is handed ----------------------------------------------------------------
def _no_progress(line: str, force: bool = False) -> None:
    """Progress where no terminal listens (a fresh process)."""


@dataclass(frozen=True)
class PipelineInputs:
    """What a trainer builds its pipeline from."""

    recipe: Any  # the Recipe; ``recipe.origin`` is the trainer config's translation, read once
    tokenizer: Any
    stop_ids: frozenset  # the end-of-turn ids the labels must train (EOS and the recipe's stop tokens)
    device: Device
    scratch_folder: Callable[[], Path]  # this run's own working folder, made on first use (the plugin removes it)
    encoder: Callable[[], Any] = lambda: None  # the built-in encoder, made on demand

    @property
    def scratch(self) -> Path:
        return self.scratch_folder()

    @property
    def torch_device(self) -> str:
        """The torch device string; a Fail when the recipe's device is not on this machine."""
        if self.device.missing:
            raise Fail(self.device.missing)
        return self.device.torch_device


@dataclass(frozen=True)
class RunInputs(PipelineInputs):
    """What a trainer's runs (step, overfit, save and resume) are handed."""

    examples: tuple = ()  # the trainable examples: the first ones in order, then the longest
    pad_id: int = 0
    base: Callable[[], Any] = lambda: None  # the shared base model on the device, loaded once
    progress: Callable[..., None] = _no_progress  # (line, force=False): a line for the terminal
    timer: Optional[Callable[..., list]] = None  # (fn, rounds) -> seconds; pytest-benchmark where a check times


@dataclass(frozen=True)
class Bounds:
    """How the checks bound a run of a trainer: its steps, its checkpoint, and for the one-step
    measurement and the overfit a constant learning rate over a fixed accumulation. Each trainer
    says it in its own keys."""

    max_steps: int
    save_steps: Optional[int] = None  # a checkpoint every this many steps; None: none
    gradient_accumulation_steps: Optional[int] = None  # None: the config's own
    micro_batch_size: Optional[int] = None  # None: the config's own
    constant_lr: bool = False  # a constant learning rate, no warmup
    shuffle: bool = True
    worst_case: bool = False  # the worst-case micro-batch: rows padded to the longest the run may see

    def keys(self, batch: str, scheduler: str, **constant: Any) -> dict:
        """The bounds in a trainer's own keys: ``batch`` and ``scheduler`` name its micro-batch and
        scheduler keys; ``constant`` what else a constant learning rate sets."""
        out: dict[str, Any] = {"max_steps": self.max_steps}
        if self.save_steps:
            out.update(save_steps=self.save_steps, save_total_limit=None)
        if self.gradient_accumulation_steps:
            out["gradient_accumulation_steps"] = self.gradient_accumulation_steps
        if self.micro_batch_size:
            out[batch] = self.micro_batch_size
        if self.constant_lr:
            out.update({scheduler: "constant", "warmup_steps": 0, **constant})
        return out

    @classmethod
    def step(cls) -> "Bounds":
        return cls(1, gradient_accumulation_steps=1, constant_lr=True, shuffle=False, worst_case=True)

    @classmethod
    def overfit(cls, steps: int, micro_batch: int, accumulation: int) -> "Bounds":
        return cls(steps, gradient_accumulation_steps=accumulation, micro_batch_size=micro_batch, constant_lr=True)

    @classmethod
    def resume(cls, steps: int, recipe=None) -> "Bounds":
        """The resume rehearsal's run: ``steps`` steps, a checkpoint at half; where the recipe's
        accumulation is bounded (``rehearsal_recipe``), the bounded count in the trainer's keys."""
        bounded = recipe is not None and recipe.training.gradient_accumulation_steps >= REHEARSAL_ACCUMULATION
        return cls(steps, save_steps=steps // 2, gradient_accumulation_steps=REHEARSAL_ACCUMULATION if bounded
                   else None)


# Micro-batches per optimizer step of the resume rehearsal, at most: what a resume restores (weights,
# optimizer and scheduler state, data position, RNG) is the same at any accumulation, and 10,000
# micro-batches a step would make a few steps run for minutes (issue 47).
REHEARSAL_ACCUMULATION = 8


def rehearsal_recipe(recipe):
    """The recipe the resume rehearsal runs (in the session and in its fresh process alike): its
    ``[training] gradient_accumulation_steps`` at most REHEARSAL_ACCUMULATION."""
    t = recipe.training
    if t.gradient_accumulation_steps <= REHEARSAL_ACCUMULATION:
        return recipe
    return recipe.set("training", t.set("gradient_accumulation_steps", REHEARSAL_ACCUMULATION))


def rehearsal_note(recipe) -> str:
    """What the resume check says of a bounded rehearsal ("" when it runs the recipe's own count)."""
    count = recipe.training.gradient_accumulation_steps
    if count <= REHEARSAL_ACCUMULATION:
        return ""
    return (f"[training] gradient_accumulation_steps = {count:,}: the rehearsal accumulates {REHEARSAL_ACCUMULATION} "
            "micro-batches per step (what a resume restores is the same at any count)")


ROWS_FILE = "rows.jsonl"  # the rows a trainer's own run reads, written in its run folder


@dataclass(frozen=True)
class RunRows:
    """The rows one run of a trainer trains on, as the team wrote them, and where it writes."""

    rows: tuple  # the rows (dicts)
    rows_file: Path  # the same rows as JSONL, owner-only, for a trainer that loads its dataset from a file
    folder: Path  # the run's output folder (its checkpoints)

    @classmethod
    def of(cls, folder: Path, examples: Sequence) -> "RunRows":
        """The rows of training ``examples``, as the team wrote them (``write``)."""
        return cls.write(folder, [e.row.data for e in examples])

    @classmethod
    def write(cls, folder: Path, rows: Sequence) -> "RunRows":
        """``rows`` written to ``folder/rows.jsonl`` (they are the team's data: owner-only), the run
        writing in ``folder``."""
        from ..files import ensure_private_dir, write_private

        rows = tuple(dict(row) for row in rows)
        path = ensure_private_dir(folder) / ROWS_FILE
        write_private(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        return cls(rows, path, Path(folder))

    @classmethod
    def resumed(cls, saved_folder: Path) -> "RunRows":
        """In the fresh process: the saved run's rows, the resumed run writing beside them."""
        path = Path(saved_folder) / ROWS_FILE
        rows = tuple(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line)
        return cls(rows, path, Path(saved_folder) / "resumed")


def resume_steps(recipe) -> int:
    """Steps of the straight run of the resume check (even, at least 2)."""
    return max(2, recipe.checks.resume_steps // 2 * 2)


def resume_examples(recipe, examples: Sequence, steps: int) -> list:
    """The examples a run of ``steps`` optimizer steps reads once through (at least two)."""
    t = recipe.training
    return list(examples[: max(2, t.micro_batch_size * t.gradient_accumulation_steps * steps)])


def worst_case_examples(inputs: RunInputs) -> list:
    """The micro-batch of the longest training examples (repeated where there are fewer rows)."""
    mb = inputs.recipe.training.micro_batch_size
    longest = sorted(inputs.examples, key=lambda e: e.length, reverse=True)[:mb]
    return [longest[i % len(longest)] for i in range(mb)]


# ---- what a trainer's runs give -----------------------------------------------------------------
@dataclass(frozen=True)
class StepLog:
    """One optimizer step as the trainer logged it."""

    step: int
    loss: float
    learning_rate: Optional[float] = None
    tokens: Optional[float] = None  # tokens seen so far, when logged

    def to_list(self) -> list:
        return [self.step, self.loss, self.learning_rate, self.tokens]


@dataclass(frozen=True)
class SavedRun:
    """A trainer's uninterrupted run of ``steps`` and its own checkpoint at ``steps // 2``."""

    folder: Path  # the run's folder, with what the fresh process needs to rebuild the run (its rows)
    checkpoint: Path  # the checkpoint at steps // 2
    steps: int
    logs: tuple  # StepLog of every step of the uninterrupted run
    checkpoint_bytes: int
    exact: bool  # CPU: the resumed losses must be equal; GPU kernels may differ in the last bits

    @property
    def straight_losses(self) -> list:
        return [log.loss for log in self.logs]


@dataclass(frozen=True)
class ResumeRun:
    """A trainer's save-and-resume: ``steps`` uninterrupted losses, and the losses after a
    resume at ``steps // 2`` in a fresh process. ``difference`` is "" when they match, else
    what differs and, where it can be told, why."""

    straight_losses: list
    resumed_losses: list
    steps: int
    checkpoint_bytes: int
    difference: str
    trainer: str = ""  # the step_trainer that saved and resumed


@dataclass(frozen=True)
class Reloaded:
    """What one saved artifact of an overfit, loaded afresh, generates greedily for its prompt
    (``Trainer.reloaded_outputs``); ``lifecycle.generate`` holds ``ids`` against the trained model's."""

    name: str  # the artifact as the failure names it ("reloaded adapter")
    ids: tuple[int, ...]  # its greedy token ids
    why: str = ""  # where they differ, the likely cause, said in parentheses after the failure


# The likely cause where a reloaded merged model generates otherwise than the trained one.
UNMERGED = "was the adapter merged before saving?"


def reloaded(outputs: dict) -> list[Reloaded]:
    """A reload's {"adapter": ids, "merged": ids} (the engine's, mlx-lm's) as named outputs."""
    return [Reloaded(f"reloaded {name}", tuple(ids), UNMERGED if name == "merged" else "")
            for name, ids in outputs.items()]


@dataclass(frozen=True)
class ResumeRequest:
    """What the fresh process of a resume is told (``worker``)."""

    recipe: str  # the recipe's file
    folder: str  # the saved run's folder
    checkpoint: str
    steps: int  # of the uninterrupted run
    device: dict = field(default_factory=dict)  # the Device, as its fields
    hook_files: tuple = ()  # the files implementing pytest_ftready_trainer (a team's own Trainer, trainers.conftest)

    def inputs(self, recipe) -> RunInputs:
        """The inputs of a run in the fresh process: the recipe's tokenizer and base model
        loaded there, nothing of the parent's session."""
        from functools import lru_cache

        from ..engine.loading import load_model, load_tokenizer

        device = Device(**{**self.device, "capability": tuple(self.device["capability"])
                           if self.device.get("capability") else None})
        tokenizer = load_tokenizer(recipe)
        base = lru_cache(maxsize=1)(lambda: load_model(recipe, device.torch_device))
        return RunInputs(recipe, tokenizer, frozenset(), device, lambda: Path(self.folder),
                         pad_id=tokenizer.pad_token_id,
                         base=base)


class Trainer:
    """One trainer's knowledge, as the session asks for it (see the module docstring)."""

    name = "trainer"  # the pipeline measurement
    step_trainer = "trainer"  # the step measurement, and the name on each result
    label = "the trainer"  # as messages name it ("TRL")
    module: Optional[str] = None  # what must import for this trainer to run here
    install = ""  # how to install it
    native = True  # its own pipeline runs here; False: chosen only when [data] pipeline names it
    hook_files: tuple = ()  # files the fresh process of a resume imports to build it (a team's own Trainer)

    def missing(self) -> str:
        """"" when this trainer can run here, else what to install."""
        import importlib.util

        if self.module is None or importlib.util.find_spec(self.module) is not None:
            return ""
        return f"{self.module} is not installed in this environment ({self.install})"

    def pipeline(self, inputs: PipelineInputs) -> Pipeline:  # pragma: no cover - interface
        raise NotImplementedError

    def step(self, inputs: RunInputs):  # pragma: no cover - interface
        """The worst-case step, measured (engine.step.StepMeasurement)."""
        raise NotImplementedError

    def overfit(self, inputs: RunInputs):  # pragma: no cover - interface
        """The overfit of the first ``overfit_examples`` (engine.overfit.OverfitResult)."""
        raise NotImplementedError

    def reloaded_outputs(self, inputs: RunInputs, result) -> list[Reloaded]:
        """``lifecycle.generate`` on this trainer's own overfit ``result`` (engine.overfit.OverfitResult):
        what each of its saved artifacts, loaded afresh, generates for the overfit's prompt. By
        default as a server loads a transformers checkpoint (``engine.generate.reloaded_outputs``:
        the adapter on a fresh original base, and the merged model); a trainer that saves its own
        way adds or replaces them (Unsloth's reload and ``save_pretrained_merged``, mlx-lm's load
        and fuse)."""
        from ..engine.generate import reloaded_outputs

        return reloaded(reloaded_outputs(inputs.recipe, result.adapter_dir, result.prompt_ids, inputs.stop_ids,
                                         inputs.pad_id, inputs.torch_device, inputs.scratch / "merged-model",
                                         trained_ids=result.greedy_ids))

    def saved_run(self, inputs: RunInputs) -> SavedRun:  # pragma: no cover - interface
        """The straight run and the checkpoint at its half."""
        raise NotImplementedError

    def resume_here(self, request: ResumeRequest, recipe) -> list[StepLog]:  # pragma: no cover - interface
        """In the fresh process (``worker.resume`` starts it): resume ``request.checkpoint`` and train to
        ``request.steps``; the logs of the steps trained after the resume."""
        raise NotImplementedError

    def difference(self, saved: SavedRun, resumed: Sequence[StepLog]) -> str:  # pragma: no cover - interface
        """"" when the steps after the resume equal the uninterrupted run's, else what differs."""
        raise NotImplementedError

    def straight_run(self, inputs: RunInputs) -> tuple[int, list]:
        """The uninterrupted run of the resume check: its steps (even) and the examples it reads
        once through; said on the terminal."""
        steps = resume_steps(inputs.recipe)
        inputs.progress(f"lifecycle.resume: {steps} steps of {self.label}, a checkpoint at step {steps // 2}"
                        + (f" ({REHEARSAL_ACCUMULATION} micro-batches a step)"
                           if inputs.recipe.training.gradient_accumulation_steps == REHEARSAL_ACCUMULATION else ""),
                        True)
        return steps, resume_examples(inputs.recipe, inputs.examples, steps)

    def resume_files(self, checkpoint: Path) -> list[str]:  # pragma: no cover - interface
        """The files of the complete ``checkpoint`` a resume needs, in the order this trainer's save
        writes them (``lifecycle.interrupted_save`` kills a save before each)."""
        raise NotImplementedError

    def resume_pick(self, folder: Path, newest: Path) -> Path:
        """The checkpoint this trainer's resume starts from in the run folder ``folder``, whose
        newest save is ``newest``: by default the one it is handed."""
        return newest

    def check_saved(self, saved: SavedRun) -> None:
        """Before a fresh process resumes ``saved``: a Fail when the checkpoint cannot be resumed."""
