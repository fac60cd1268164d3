"""The team's own Trainer: the ``transformers.Trainer`` (or TRL ``SFTTrainer``) a team's
``pytest_ftready_trainer`` hook builds the way its training script or notebook does (its model
loading, adapter, collator, optimizer, scheduler, patches), run by the checks like any trainer
built on ``transformers.Trainer`` (``hf.HFTrainer``: step, overfit, saved run, fresh-process
resume).

Each run hands the hook the run's rows (a ``datasets.Dataset`` of the rows as the JSONL has
them), its output folder, and the bounds in TrainingArguments keys (``arguments``) that the
team merges over its own; the Trainer it returns is checked to use them. The fresh process of
``lifecycle.resume`` has no pytest session: the files that implement the hook (recorded by the
parent, ``OwnTrainerHook.files``) are imported there by path, their folder first on
``sys.path`` as pytest's default (prepend) import mode puts it, and their functions called as
pluggy calls them (last registered first, first result wins).

Its pipeline (``OwnTrainerPipeline``, judged by ``data.masking``) is the Trainer's own
preprocessing: the hook builds the Trainer once over every training row, and each row's labels
are what the Trainer's ``data_collator`` makes of its example in ``train_dataset``, verified
like any labels not made by the built-in encoder. Not in ``TRAINERS``: it is chosen by the hook
being implemented, not by ``[data] pipeline``. Imports no torch, transformers or datasets at
module import."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..data.encoded import Encoded
from ..data.layouts import read_sample
from ..data.verify import IGNORE_INDEX, judge_labels
from ..outcomes import Fail
from . import hf
from .base import Bounds, Pipeline, PipelineInputs, ResumeRequest, RunInputs, RunRows

CONFTEST = "conftest"  # the trainer's name: the worker's argument, the results' prefix
HOOK = "pytest_ftready_trainer"
# TrainingArguments keys of ``arguments`` the returned Trainer must keep: without them the check
# would run another run than it bounded (unbounded steps, another folder, no checkpoint)
ROW_KEY = "ftready_row"  # the column that tells which row an example of the Trainer's dataset came from
KEPT = ("output_dir", "max_steps", "save_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
        "lr_scheduler_type", "logging_steps")


@dataclass(frozen=True)
class OwnTrainerHook:
    """The ``pytest_ftready_trainer`` hook: ``call(recipe=, rows=, output_dir=, arguments=)`` ->
    the team's Trainer or None, and the files that implement it (for the fresh process)."""

    call: Callable[..., Any]
    files: tuple = ()

    @classmethod
    def from_files(cls, files: Sequence[str]) -> "OwnTrainerHook":
        """The hook in a process without pytest: each file imported by path (``imported``), called
        as pluggy calls hook implementations (last registered first, only the arguments a
        function names, the first result that is not None)."""
        functions = [getattr(imported(Path(path), i), HOOK) for i, path in enumerate(files)]

        def call(**kwargs):
            for function in reversed(functions):
                names = inspect.signature(function).parameters
                result = function(**{k: v for k, v in kwargs.items() if k in names})
                if result is not None:
                    return result
            return None

        return cls(call, tuple(files))


def imported(path: Path, index: int = 0):
    """The module at ``path``, its folder first on ``sys.path`` (pytest's prepend import mode),
    so what it imports beside it (the team's training script) imports as under pytest."""
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = f"_ftready_own_trainer_{index}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise Fail(f"{path}: cannot import it to build your Trainer ({HOOK}) in the resume's fresh process")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_arguments(bounds: Bounds, output_dir: Path, torch_device: str) -> dict:
    """What the checks set of a run, in TrainingArguments keys (``arguments`` of the hook)."""
    return {**hf.training_arguments(bounds), "output_dir": str(output_dir), "report_to": "none", "logging_steps": 1,
            "disable_tqdm": True, "use_cpu": not torch_device.startswith(("cuda", "mps"))}


def _value(value: Any) -> Any:
    value = getattr(value, "value", value)  # transformers' enums (lr_scheduler_type)
    return str(Path(value).resolve()) if isinstance(value, Path) else value


def ignored(trainer, arguments: dict) -> list[str]:
    """The handed ``arguments`` the built Trainer's ``args`` do not hold, as "key X (handed Y)"."""
    out = []
    for key in KEPT:
        if key not in arguments:
            continue
        want, have = arguments[key], getattr(trainer.args, key, None)
        if key == "output_dir":
            want, have = str(Path(want).resolve()), str(Path(have).resolve()) if have else have
        if _value(have) != _value(want):
            out.append(f"{key} {_value(have)!r} (handed {_value(want)!r})")
    return out


def build(hook: OwnTrainerHook, recipe, rows: Sequence[dict], output_dir: Path, arguments: dict):
    """The Trainer the hook returns for ``rows`` (a datasets.Dataset of them), checked to be a
    transformers.Trainer that keeps the handed ``arguments``."""
    import datasets
    from transformers import Trainer as TransformersTrainer

    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bar()
    try:
        table = datasets.Dataset.from_list(list(rows))
        with hf.trainer_warnings():
            trainer = hook.call(recipe=recipe, rows=table, output_dir=Path(output_dir), arguments=dict(arguments))
    except Fail:
        raise
    except Exception as exc:  # the team's code: said in one line, naming the hook
        raise Fail(f"{HOOK} raised {type(exc).__name__}: {' '.join(str(exc).split())[:500]}") from None
    finally:
        if bars:
            datasets.enable_progress_bar()
    if trainer is None:
        raise Fail(f"{HOOK} returned None for this run; return your transformers.Trainer built over `rows`")
    if not isinstance(trainer, TransformersTrainer):
        raise Fail(f"{HOOK} returned a {type(trainer).__name__}; expected a transformers.Trainer (or TRL "
                   "SFTTrainer) built over `rows`")
    lost = ignored(trainer, arguments)
    if lost:
        raise Fail(f"the Trainer {HOOK} returned does not use the arguments the check handed it: its args have "
                   f"{'; '.join(lost)}; merge them over yours: TrainingArguments(**{{**yours, **arguments}})")
    return trainer


class OwnTrainerPipeline(Pipeline):
    """The labels the team's Trainer trains on: the hook's Trainer built once over every training
    row (each row carrying ``ROW_KEY``), its ``data_collator`` applied to each example of its
    ``train_dataset``. The model the hook loads is dropped once the examples are read."""

    name = CONFTEST

    def __init__(self, hook: OwnTrainerHook, inputs: PipelineInputs) -> None:
        self.hook, self.inputs = hook, inputs
        self.method = f"your Trainer's collator ({HOOK})"
        self.examples: dict[tuple[str, int], int] = {}  # (file, line) -> index in ``prepared``
        self.prepared: Any = None
        self.collator: Any = None
        self.built_for: set = set()

    def _build(self, rows: Sequence) -> None:
        """The Trainer over ``rows`` (the training files' rows first, so one build serves the pass)."""
        from ..data.rows import read_rows

        recipe = self.inputs.recipe
        if not self.built_for:
            rows = [*read_rows(recipe.data.train)[0], *rows]
        keyed: list[dict] = []
        where: list[tuple[str, int]] = []
        for row in rows:
            if (row.file, row.line) in self.built_for or not isinstance(row.data, dict):
                continue
            self.built_for.add((row.file, row.line))
            keyed.append({**row.data, ROW_KEY: len(where)})
            where.append((row.file, row.line))
        arguments = run_arguments(Bounds.step(), self.inputs.scratch / "own-trainer-masking", "cpu")
        trainer = build(self.hook, recipe, keyed, self.inputs.scratch / "own-trainer-masking", arguments)
        prepared, self.collator = trainer.train_dataset, trainer.data_collator
        del trainer  # the model the hook loaded: only the examples and the collator are needed
        if ROW_KEY in getattr(prepared, "column_names", ()):
            positions = {int(key): k for k, key in enumerate(prepared[ROW_KEY])}
        elif len(prepared) == len(where):  # the key column removed by the team's map(): rows kept in order
            positions = {k: k for k in range(len(where))}
        else:
            raise Fail(f"your Trainer's train_dataset has {len(prepared)} examples for {len(where)} rows and dropped "
                       f"the {ROW_KEY!r} column the rows carried: its labels cannot be matched to rows. Keep the "
                       "column (remove_columns without it) or one example per row (no packing) for data.masking")
        self.prepared = prepared
        self.examples = {where[key]: position for key, position in positions.items()}

    def _labelled(self, position: int) -> tuple[list[int], list[int]]:
        """One example through the Trainer's collator, its padding taken off."""
        example = {k: v for k, v in self.prepared[position].items() if k != ROW_KEY}
        batch = self.collator([example])
        ids, labels = [int(t) for t in batch["input_ids"][0]], [int(t) for t in batch["labels"][0]]
        mask = batch.get("attention_mask") if hasattr(batch, "get") else None
        if mask is not None:
            kept = [k for k, m in enumerate(mask[0]) if int(m)]
            ids, labels = [ids[k] for k in kept], [labels[k] for k in kept]
        return ids, labels

    def encode(self, rows: Sequence) -> list[Encoded]:
        if any((row.file, row.line) not in self.built_for for row in rows):
            self._build(rows)
        data, out = self.inputs.recipe.data, []
        for row in rows:
            sample = read_sample(row, data.format, data.train_on, data.roles)[0]
            position = self.examples.get((row.file, row.line))
            if position is None:
                out.append(Encoded(row, (), (), self.method, 0, 0, (
                    ("no_supervised", "your Trainer's train_dataset has no example for this row (its preprocessing "
                                      "dropped it)"),)))
                continue
            ids, labels = self._labelled(position)
            problems = judge_labels(self.inputs.tokenizer, sample, data.train_on, ids, labels, self.inputs.stop_ids,
                                    max_length=data.max_length)
            trained = sum(1 for label in labels if label != IGNORE_INDEX)
            out.append(Encoded(row, tuple(ids), tuple(labels), self.method, len(ids), trained, tuple(problems)))
        return out


class ConftestTrainer(hf.HFTrainer):
    """The team's own Trainer from the ``pytest_ftready_trainer`` hook; its pipeline is the
    Trainer's own preprocessing and collator (``OwnTrainerPipeline``)."""

    name = CONFTEST
    label = f"your own Trainer ({HOOK})"

    def __init__(self, hook: OwnTrainerHook) -> None:
        self.hook = hook
        self.hook_files = hook.files
        self.built_class = ""  # the class of the Trainer the hook built, once it has built one

    @property
    def step_trainer(self) -> str:  # type: ignore[override]  # "conftest SFTTrainer": named by what the hook returned
        return f"{CONFTEST} {self.built_class or 'Trainer'}"

    def pipeline(self, inputs: PipelineInputs) -> Pipeline:
        return OwnTrainerPipeline(self.hook, inputs)

    @contextlib.contextmanager
    def built(self, inputs: RunInputs, run: RunRows, bounds: Bounds, callbacks: Sequence = ()) -> Iterator[hf.Built]:
        arguments = run_arguments(bounds, run.folder, inputs.torch_device)
        trainer = build(self.hook, inputs.recipe, run.rows, run.folder, arguments)
        self.built_class = type(trainer).__name__
        yield hf.Built(hf.quiet(trainer, callbacks), trainer.model)


def fresh_process_trainer(request: ResumeRequest) -> ConftestTrainer:
    """In the resume's fresh process: the team's Trainer from the files the parent recorded."""
    if not request.hook_files:
        raise Fail(f"the resume of your own Trainer was asked with no file implementing {HOOK}")
    return ConftestTrainer(OwnTrainerHook.from_files(request.hook_files))
