"""Run state, kept in ``config.stash``: the machine (probed once), one ``RecipeState`` per
recipe with its tokenizer, rows, encoded data and model built lazily and once, the outcome
of every check, and every measurement."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Optional

from ..machine.devices import Device, resolve_device
from ..machine.probes import Machine
from ..recipe.schema import Recipe
from ..outcomes import Fail
from ..outputs.measurements import Measurement

PROGRESS_ROWS = 5000  # datasets this long report their encoding progress


@dataclass
class RunState:
    artifacts_root: Path
    machine_factory: Callable[[], Machine]
    recipe_paths: list[Path] = field(default_factory=list)
    cpu_short: bool = False
    hub_timeout_s: float = 10.0
    hub_factory: Optional[Callable[[], Any]] = None  # -> hub.Hub; default: the real hub and its cache
    free_bytes: Optional[Callable[[Path], int]] = None  # -> free bytes on a path's disk (tests: a small disk)
    telemetry_factory: Optional[Callable[..., Any]] = None  # (device, machine) -> (sources, missing); tests: fake NVML
    progress: Optional[Callable[[str], None]] = None  # a line for the terminal while long work runs
    recipes: dict[Path, "RecipeState"] = field(default_factory=dict)
    measurements: list[Measurement] = field(default_factory=list)

    @cached_property
    def machine(self) -> Machine:
        return self.machine_factory()

    @cached_property
    def hub(self):
        from ..machine.hub import RealHub

        return self.hub_factory() if self.hub_factory else RealHub()

    def disk_free(self, path: Path) -> int:
        from ..machine.hub import free_bytes

        return (self.free_bytes or free_bytes)(path)

    def recipe_state(self, recipe: Recipe) -> "RecipeState":
        state = self.recipes.get(recipe.source)
        if state is None:
            state = self.recipes[recipe.source] = RecipeState(recipe=recipe, run=self)
        return state


@dataclass
class RecipeState:
    recipe: Recipe
    run: RunState
    outcomes: dict[str, str] = field(default_factory=dict)  # check id -> passed | failed | skipped
    blocked: dict[str, str] = field(default_factory=dict)  # check id -> the failed check that stopped it
    results: dict[str, Any] = field(default_factory=dict)  # what one check hands to later ones
    series: dict[str, dict[str, list]] = field(default_factory=dict)  # check -> name -> values

    @property
    def artifacts(self) -> Path:
        return self.run.artifacts_root / self.recipe.name

    @property
    def machine(self) -> Machine:
        return self.run.machine

    @cached_property
    def device(self) -> Device:
        return resolve_device(self.machine, self.recipe.hardware.device)

    def _load_once(self, what: str, load: Callable[[], Any]) -> Any:
        """Load once; a failure is remembered and becomes each asking check's failure (no retry
        of a slow hub per check)."""
        key = f"load:{what}"
        if key not in self.results:
            try:
                self.results[key] = load()
            except Exception as exc:  # OSError, ValueError, ImportError...: all mean "cannot load"
                source = self.recipe.model.path or f"{self.recipe.model.id}@{self.recipe.model.revision}"
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                self.results[key] = Fail(f"cannot load the {what} from {source}: {type(exc).__name__}: {first}")
        if isinstance(self.results[key], Fail):
            raise self.results[key]
        return self.results[key]

    @property
    def tokenizer(self):
        from ..engine.loading import load_tokenizer

        return self._load_once("tokenizer", lambda: load_tokenizer(self.recipe))

    @cached_property
    def rows(self):
        """(rows, problems) of every training file."""
        from ..data.rows import read_rows

        return read_rows(self.recipe.data.train)

    @cached_property
    def encoder(self):
        from ..data.encoding import Encoder, stop_token_ids
        from ..engine.loading import generation_eos_ids

        stops = stop_token_ids(self.tokenizer, generation_eos_ids(self.recipe), self.recipe.data.stop_tokens)
        return Encoder(self.tokenizer, self.recipe.data, stops)

    @cached_property
    def encoded(self):
        """Every well-formed row, encoded: a list of ``Encoded``."""
        from ..data.rows import row_problems

        import time

        rows, _ = self.rows
        fmt, train_on = self.recipe.data.format, self.recipe.data.train_on
        encoder, out = self.encoder, []
        last = time.monotonic()
        for i, row in enumerate(rows, start=1):
            if not row_problems(row, fmt, train_on):
                out.append(encoder.encode(row))
            if self.run.progress and len(rows) >= PROGRESS_ROWS and time.monotonic() - last > 2.0:
                self.run.progress(f"ftready {self.recipe.name}: encoded {i:,} of {len(rows):,} rows")
                last = time.monotonic()
        return out

    @property
    def trainable_examples(self):
        """Encoded rows that train: no problem that would corrupt the loss."""
        from ..checks.data import BLOCKING

        return [e for e in self.encoded if e.trained and not any(k in BLOCKING for k, _ in e.problems)]

    @cached_property
    def dataset(self):
        """The encoded data as a ``datasets.Dataset`` (input_ids, attention_mask, labels)."""
        import datasets

        return datasets.Dataset.from_list([
            {"input_ids": list(e.input_ids), "attention_mask": [1] * e.length, "labels": list(e.labels),
             "source": e.row.where} for e in self.trainable_examples])

    @property
    def model(self):
        """The base model, loaded once per recipe per session."""
        from ..engine.loading import load_model

        return self._load_once("model", lambda: load_model(self.recipe, self.device.torch_device))

    def record(self, check: str, name: str, value: Any, unit: str, estimate: bool = False, case: str = "") -> Measurement:
        m = Measurement(recipe=self.recipe.name, check=check, name=name, value=value, unit=unit, estimate=estimate,
                        case=case)
        self.run.measurements.append(m)
        return m

    def add_series(self, check: str, name: str, values: list) -> None:
        self.series.setdefault(check, {})[name] = list(values)

    def failed_prerequisite(self, requires: tuple[str, ...]) -> Optional[str]:
        """The failed check behind a prerequisite: one that failed, or that was itself stopped
        by a failure further up (data.masking -> model.overfit -> lifecycle.generate)."""
        for check_id in requires:
            if self.outcomes.get(check_id) == "failed":
                return check_id
            if check_id in self.blocked:
                return self.blocked[check_id]
        return None
