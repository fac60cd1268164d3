"""Measurements as data: a value with its unit, the check and recipe it belongs to, and the
plain payloads the writers format (JUnit properties, benchmark extra_info, JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

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


