"""The interface every trainer offers the session, and the pipelines that are no trainer's own.

A ``Trainer`` answers what the session asks of the run the team will launch: its
``pipeline`` (rows -> training examples, judged by the data checks), its worst-case
``step`` (peak memory, time), its ``overfit`` of a tiny sample, and its save-and-resume
(``saved_run`` then ``resume``). ``name`` is the pipeline measurement (``pipeline = trl``),
``step_trainer`` the step measurement (``step_trainer = trl SFTTrainer``).

Pipelines here: ``Pipeline`` (the interface), ``FunctionPipeline`` (a team's own formatting
function from the ``pytest_ftready_pipeline`` hook). Labels not made by the built-in encoder
get the same independent verification (``data.verify.judge_labels``). Imports no torch at
module import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..data.encoding import Encoded
from ..data.layouts import read_sample
from ..data.verify import IGNORE_INDEX, judge_labels


class Pipeline:
    """What a pipeline offers the checks. ``name`` shows in measurements and messages."""

    name = "pipeline"

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
            problems = judge_labels(self.tok, read_sample(row, data.format, data.train_on, data.roles)[0], data.train_on, ids, labels, self.stop_ids,
                                    max_length=data.max_length)
            trained = sum(1 for label in labels if label != IGNORE_INDEX)
            out.append(Encoded(row, tuple(ids), tuple(labels), self.method, len(ids), trained, tuple(problems)))
        return out

    def collate(self, examples: Sequence[Encoded], pad_id: int) -> dict:
        if self.collator is None:
            return super().collate(examples, pad_id)
        return self.collator([{"input_ids": list(e.input_ids), "labels": list(e.labels)} for e in examples])


def pipeline_stops(state) -> frozenset[int]:
    """The end-of-turn token ids a pipeline's labels must train (EOS and the recipe's stop tokens)."""
    from ..data.encoding import stop_token_ids
    from ..engine.loading import generation_eos_ids

    return stop_token_ids(state.tokenizer, generation_eos_ids(state.recipe), state.recipe.data.stop_tokens)


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


# ---- the trainer interface ------------------------------------------------------------------
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


class Trainer:
    """One trainer's knowledge, as the session asks for it (see the module docstring)."""

    name = "trainer"  # the pipeline measurement
    step_trainer = "trainer"  # the step measurement
    module: Optional[str] = None  # what must import for this trainer to run here
    install = ""  # how to install it
    native = True  # its own pipeline runs here; False: chosen only when [data] pipeline names it

    def missing(self) -> str:
        """"" when this trainer can run here, else what to install."""
        import importlib.util

        if self.module is None or importlib.util.find_spec(self.module) is not None:
            return ""
        return f"{self.module} is not installed in this environment ({self.install})"

    def pipeline(self, state) -> Pipeline:  # pragma: no cover - interface
        raise NotImplementedError

    def step(self, state):  # pragma: no cover - interface
        """The worst-case step, measured (engine.step.StepMeasurement)."""
        raise NotImplementedError

    def overfit(self, state):  # pragma: no cover - interface
        """The overfit of the first ``overfit_examples`` (engine.overfit.OverfitResult)."""
        raise NotImplementedError

    def saved_run(self, state):  # pragma: no cover - interface
        """The straight run and the checkpoint at its half (anything with ``checkpoint_bytes``)."""
        raise NotImplementedError

    def resume(self, state, saved) -> ResumeRun:  # pragma: no cover - interface
        raise NotImplementedError
