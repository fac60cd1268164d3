"""Pipelines: rows -> training examples (input_ids, labels) and batches, as the run will make
them. The data checks judge, and the model checks train on, what the recipe's pipeline makes:

* ``BuiltinPipeline``: pytest-ftready's own encoder (``encoding.Encoder``);
* ``trl_pipeline.TrlPipeline``: TRL's SFTTrainer preparing and collating the rows itself;
* ``FunctionPipeline``: a team's own formatting function (and collator), returned by the
  ``pytest_ftready_pipeline`` hook in their conftest.py.

Labels not made by the built-in encoder get the same independent verification
(``data.verify.judge_labels``). Imports no torch at module import."""

from __future__ import annotations

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
        from .batches import collate

        return collate(examples, pad_id)


class BuiltinPipeline(Pipeline):
    """pytest-ftready's encoder. It can travel to worker processes: the data pass
    (data.passes) encodes large datasets with it in parallel."""

    name = "builtin"

    def __init__(self, encoder) -> None:
        self.encoder = encoder

    def encode(self, rows: Sequence) -> list[Encoded]:
        return [self.encoder.encode(row) for row in rows]


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


def select_pipeline(state) -> Pipeline:
    """The recipe's pipeline: the team's (``pytest_ftready_pipeline`` hook) first, then TRL's
    (``[data] pipeline = "trl"``, set by the TRL importer), else the built-in encoder."""
    from ..data.encoding import stop_token_ids
    from .loading import generation_eos_ids

    recipe, tokenizer = state.recipe, state.tokenizer
    hook = getattr(state.run, "pipeline_hook", None)
    provided = hook(recipe, tokenizer) if hook is not None else None
    if provided is None and recipe.data.pipeline != "trl":
        return BuiltinPipeline(state.encoder)
    stops = stop_token_ids(tokenizer, generation_eos_ids(recipe), recipe.data.stop_tokens)
    if provided is not None:
        return as_pipeline(provided, recipe, tokenizer, stops)
    from .trl_pipeline import TrlPipeline

    return TrlPipeline(recipe, tokenizer, stops)
