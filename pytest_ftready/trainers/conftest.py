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

Not in ``TRAINERS``: it is chosen by the hook being implemented, not by ``[data] pipeline``,
and its preprocessing (``data.masking``) stays the recipe's pipeline (the trainer chosen without
the hook; a team's own labels come through ``pytest_ftready_pipeline``). Imports no torch,
transformers or datasets at module import."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..outcomes import Fail
from . import hf
from .base import Bounds, Pipeline, PipelineInputs, ResumeRequest, RunInputs, RunRows, Trainer

CONFTEST = "conftest"  # the trainer's name: the worker's argument, the results' prefix
HOOK = "pytest_ftready_trainer"
# TrainingArguments keys of ``arguments`` the returned Trainer must keep: without them the check
# would run another run than it bounded (unbounded steps, another folder, no checkpoint)
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


class ConftestTrainer(hf.HFTrainer):
    """The team's own Trainer from the ``pytest_ftready_trainer`` hook; its pipeline is the one
    of ``recipe_trainer`` (the trainer chosen without the hook)."""

    name = CONFTEST
    label = f"your own Trainer ({HOOK})"

    def __init__(self, hook: OwnTrainerHook, recipe_trainer: Trainer | None = None) -> None:
        self.hook, self.recipe_trainer = hook, recipe_trainer
        self.hook_files = hook.files
        self.built_class = ""  # the class of the Trainer the hook built, once it has built one

    @property
    def step_trainer(self) -> str:  # type: ignore[override]  # "conftest SFTTrainer": named by what the hook returned
        return f"{CONFTEST} {self.built_class or 'Trainer'}"

    def pipeline(self, inputs: PipelineInputs) -> Pipeline:
        from . import select_trainer

        return (self.recipe_trainer or select_trainer(inputs.recipe)).pipeline(inputs)

    @contextlib.contextmanager
    def built(self, inputs: RunInputs, run: RunRows, bounds: Bounds, callbacks: Sequence = ()) -> Iterator[hf.Built]:
        import datasets
        from transformers import Trainer as TransformersTrainer

        arguments = run_arguments(bounds, run.folder, inputs.torch_device)
        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bar()
        try:
            rows = datasets.Dataset.from_list(list(run.rows))
            with hf.trainer_warnings():
                trainer = self.hook.call(recipe=inputs.recipe, rows=rows, output_dir=Path(run.folder),
                                         arguments=dict(arguments))
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
        self.built_class = type(trainer).__name__
        yield hf.Built(hf.quiet(trainer, callbacks), trainer.model)


def fresh_process_trainer(request: ResumeRequest) -> ConftestTrainer:
    """In the resume's fresh process: the team's Trainer from the files the parent recorded."""
    if not request.hook_files:
        raise Fail(f"the resume of your own Trainer was asked with no file implementing {HOOK}")
    return ConftestTrainer(OwnTrainerHook.from_files(request.hook_files))
