"""Measurements as data: a value with its unit, the check and recipe it belongs to, and the
plain payloads the writers format (JUnit properties, benchmark extra_info, JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ..units import format_value


@dataclass(frozen=True)
class Measurement:
    recipe: str
    check: str
    name: str
    value: float | int | str
    unit: str
    estimate: bool = False  # an estimate, not a measurement (CHECKS.md: say which is which)
    case: str = ""  # the variant of a parametrized check (levers.sweep[micro_batch=8] -> "micro_batch=8")

    @property
    def key(self) -> str:
        """The JUnit property / extra_info name: ``name[unit]``."""
        return f"{self.name}[{self.unit}]" if self.unit else self.name

    def display(self) -> str:
        return f"{self.name} = {format_value(self.value, self.unit)}" + (" (estimate)" if self.estimate else "")


def measurements_payload(measurements: Iterable[Measurement]) -> list[dict[str, Any]]:
    return [asdict(m) for m in measurements]


def summary_lines(measurements: list[Measurement]) -> list[str]:
    """Terminal summary: one block per recipe and check."""
    lines: list[str] = []
    current = None
    for m in measurements:
        head = (m.recipe, m.check)
        if head != current:
            lines.append(f"{m.recipe} :: {m.check}")
            current = head
        lines.append(f"    {m.display()}")
    return lines




MEASUREMENTS, SERIES = "measurements.json", "series.json"


def partial_name(name: str) -> str:
    """Where a partial run (``-k``, ``-m``, node ids) writes a file the full run names ``name``:
    ``measurements.json`` -> ``measurements-partial.json``."""
    stem, _, suffix = name.rpartition(".")
    return f"{stem}-partial.{suffix}"


def write_figures(folder: Path, partial: bool, measured: Iterable[Measurement], series: Mapping[str, Any],
                  write_json: Callable[[Path, Any], Any]) -> None:
    """measurements.json and series.json of a full run (removing stale partial ones); a partial
    run writes ``*-partial.json`` beside them and leaves the last full run's figures, the default
    baseline, as they are. ``write_json``: the session's output gate."""
    folder = Path(folder)
    files = {MEASUREMENTS: measurements_payload(measured), SERIES: dict(series)}
    for name, payload in files.items():
        target = folder / (partial_name(name) if partial else name)
        if not partial:
            (folder / partial_name(name)).unlink(missing_ok=True)
        if payload or name == MEASUREMENTS:
            write_json(target, payload)
        else:  # no series this run: a stale file of an earlier run would be read as this one's
            target.unlink(missing_ok=True)
