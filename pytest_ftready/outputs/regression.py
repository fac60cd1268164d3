"""The regression gate: this run's measurements against a previous run's.

A baseline is a previous run's ``measurements.json`` (in the artifacts folder: the last full
run's; a partial run's figures are ``measurements-partial.json`` beside it), an artifacts
folder (each recipe's last full run), a pytest-benchmark saved run whose ``ftready`` key
holds the measurements (``--benchmark-json`` / ``--benchmark-autosave``), or a folder of such
saved runs (the newest file is taken). A measurement is compared with the baseline's figure of the same
recipe, check, case and name when both are numbers of the same unit and its kind
(``kinds.py``) has a threshold; a change worse than the threshold is a ``Regression``.
Plain logic: no pytest, no session.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from ..kinds import HIGHER, kind_of
from ..units import format_value
from .measurements import MEASUREMENTS, Measurement, partial_name

PARTIAL = partial_name(MEASUREMENTS)

Key = tuple[str, str, str, str]  # recipe, check, case, name


class BaselineError(ValueError):
    """A baseline that cannot be used; ``str()`` names the path and what to pass instead."""


@dataclass(frozen=True)
class Regression:
    recipe: str
    check: str
    case: str
    name: str
    unit: str
    kind: str
    before: float
    after: float
    change: float  # share, positive = worse in the kind's direction
    threshold: float

    @property
    def relative(self) -> float:
        """The signed change, after against before (+0.25 = a quarter more)."""
        return (self.after - self.before) / self.before

    @property
    def check_id(self) -> str:
        return f"{self.check}[{self.case}]" if self.case else self.check

    def text(self) -> str:
        """'peak_tensor_bytes rose 30.8%, worse than max_regression.peak_device_bytes 10%: 1.20 MiB before,
        1.57 MiB now' (one line)."""
        direction = "rose" if self.after > self.before else "fell"
        return (f"{self.name} {direction} {abs(self.relative):.1%}, worse than "
                f"max_regression.{self.kind} {self.threshold:.0%}: {format_value(self.before, self.unit)} before, "
                f"{format_value(self.after, self.unit)} now")


@dataclass
class Baseline:
    source: Path
    values: dict[Key, tuple[float, str]] = field(default_factory=dict)
    note: str = ""  # which run's figures, when the source is an artifacts file or folder

    def get(self, m: Measurement) -> Optional[tuple[float, str]]:
        return self.values.get((m.recipe, m.check, m.case, m.name))


def _entries(payload: Any, path: Path) -> list[dict]:
    if isinstance(payload, dict):
        if "ftready" not in payload:
            raise BaselineError(f"ftready baseline {path}: a JSON object without an 'ftready' key; pass a run's "
                                "measurements.json or a pytest-benchmark JSON saved by a run with --ftready")
        payload = payload["ftready"]
    if not isinstance(payload, list) or not all(isinstance(e, dict) for e in payload):
        raise BaselineError(f"ftready baseline {path}: expected a list of measurements, got {type(payload).__name__}")
    return payload


def newest_json(folder: Path) -> Path:
    """The newest ``*.json`` below ``folder`` (pytest-benchmark numbers its saves 0001_, 0002_...)."""
    found = sorted(folder.rglob("*.json"), key=lambda p: (p.name, p.stat().st_mtime))
    if not found:
        raise BaselineError(f"ftready baseline {folder}: a folder without any *.json; pass a measurements.json, "
                            "an artifacts folder (.ftready/ or .ftready/<recipe>/) or the folder --benchmark-autosave "
                            "writes (.benchmarks/<machine>/)")
    return found[-1]


def artifacts_files(folder: Path) -> list[Path]:
    """The figures of each recipe's last run in an artifacts folder (``.ftready/`` or
    ``.ftready/<recipe>/``): its full run's measurements.json, else its partial run's."""
    chosen = []
    for full in sorted({*folder.rglob(MEASUREMENTS), *(p.with_name(MEASUREMENTS) for p in folder.rglob(PARTIAL))}):
        chosen.append(full if full.is_file() else full.with_name(PARTIAL))
    return chosen


def load_baseline(path: Path | str) -> Baseline:
    """Read a baseline: a file; an artifacts folder (each recipe's last full run, see
    ``artifacts_files``); else the newest JSON of a folder (pytest-benchmark's saves). A
    ``measurements.json`` that a partial run left absent falls back to the partial run's
    figures beside it, and the baseline's ``note`` says so. ``BaselineError`` names the path."""
    from ..files import pseudo_file_system

    path = Path(path)
    if pseudo_file_system(path):
        raise BaselineError(f"ftready baseline {path} lies in a pseudo file system (/proc, /sys, /dev), not a run's "
                            "figures; pass --ftready-baseline=PATH to a previous run's measurements.json or "
                            "artifacts folder")
    if path.is_dir():
        try:
            files = artifacts_files(path)
            if not files:
                return _load_file(newest_json(path), "")
        except OSError as exc:  # a folder below it this user may not list, a link loop
            raise BaselineError(f"ftready baseline {path} cannot be searched: {exc.strerror or exc} "
                                f"({getattr(exc, 'filename', '') or path}); pass --ftready-baseline=PATH to a "
                                "measurements.json, or a folder this user can read") from None
        merged = Baseline(source=path, note="; ".join(_describe(f) for f in files))
        for file in files:
            merged.values.update(_load_file(file, "").values)
        return merged
    if path.name == MEASUREMENTS and not path.exists() and path.with_name(PARTIAL).is_file():
        return _load_file(path.with_name(PARTIAL), _describe(path.with_name(PARTIAL)))
    return _load_file(path, _describe(path) if path.name in (MEASUREMENTS, PARTIAL) else "")


def _describe(file: Path) -> str:
    if file.name == PARTIAL:
        return f"{file.parent.name}: a partial run's figures (no full run there yet)"
    return f"{file.parent.name}: the last full run's figures"


def _load_file(path: Path, note: str) -> Baseline:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"ftready baseline {path} not found; pass --ftready-baseline=PATH to a previous run's "
                            "measurements.json or pytest-benchmark JSON") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BaselineError(f"ftready baseline {path} cannot be read: {exc}") from None
    baseline = baseline_from(payload, path)
    baseline.note = note
    return baseline


def baseline_from(payload: Any, source: Path) -> Baseline:
    """A baseline from parsed JSON: a measurements list, or an object with an ``ftready`` list."""
    baseline = Baseline(source=Path(source))
    for entry in _entries(payload, Path(source)):
        value = entry.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or entry.get("estimate"):
            continue
        key = (str(entry.get("recipe", "")), str(entry.get("check", "")), str(entry.get("case", "")),
               str(entry.get("name", "")))
        baseline.values[key] = (float(value), str(entry.get("unit", "")))
    return baseline


def gated(baseline: Baseline, measured: Iterable[Measurement], thresholds: Mapping[str, float]):
    """(measurement, kind, figure before) for every measurement the gate can judge."""
    for m in measured:
        if m.estimate or isinstance(m.value, bool) or not isinstance(m.value, (int, float)):
            continue
        kind = kind_of(m.name, m.unit)
        before = baseline.get(m)
        if kind is None or kind.name not in thresholds or before is None:
            continue
        if before[1] == m.unit and before[0] > 0:  # a zero baseline has no relative change
            yield m, kind, before[0]


def compare(baseline: Baseline, measured: Iterable[Measurement], thresholds: Mapping[str, float]) -> list[Regression]:
    """The measurements that changed for the worse by more than their kind's threshold."""
    found = []
    for m, kind, before in gated(baseline, measured, thresholds):
        after = float(m.value)
        change = (after - before) / before
        if kind.better == HIGHER:
            change = -change
        if change > thresholds[kind.name]:
            found.append(Regression(m.recipe, m.check, m.case, m.name, m.unit, kind.name, before, after, change,
                                    thresholds[kind.name]))
    return found


@dataclass
class RegressionGate:
    """The baseline of this run, how many figures it judged and every regression found (for the summaries)."""

    baseline: Baseline
    judged: int = 0
    found: list[Regression] = field(default_factory=list)

    def judge(self, measured: Iterable[Measurement], thresholds: Mapping[str, float]) -> str:
        """A check's failure text for its regressions, or '' when none."""
        measured = list(measured)
        self.judged += sum(1 for _ in gated(self.baseline, measured, thresholds))
        regressions = compare(self.baseline, measured, thresholds)
        self.found.extend(regressions)
        if not regressions:
            return ""
        return ("\n".join(r.text() for r in regressions)
                + f"\n(baseline {self.baseline.source}; thresholds: [checks] max_regression)")

    def summary(self) -> str:
        """One line for the terminal: what was compared with what."""
        note = f" ({self.baseline.note})" if self.baseline.note else ""
        return (f"ftready baseline {self.baseline.source}{note}: {self.judged} figure(s) compared, "
                f"{len(self.found)} regressed")
