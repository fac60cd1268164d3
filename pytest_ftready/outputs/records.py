"""What one recipe's run leaves for people to read, as plain data: each check's outcome
and reason, what this run selected and what it did not, the measurements, the series, the
regressions and the environment. The report and the CI summary format it; nothing here
measures or recomputes a figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from .measurements import Measurement
from .regression import Regression

NIGHTLY_DEFAULT = "nightly: deselected unless --ftready-nightly or -m nightly"
NOT_SELECTED = "not selected by this run (-k, -m or node ids)"
OUTCOMES = ("failed", "error", "passed", "skipped", "not run")  # worst first


@dataclass(frozen=True)
class CheckRow:
    id: str  # check id, with the variant of a parametrized check: levers.sweep[micro_batch=8]
    area: str
    outcome: str  # passed | failed | error | skipped | not run
    reason: str = ""  # the failure or skip message
    why_not: str = ""  # for "not run": NIGHTLY_DEFAULT or NOT_SELECTED

    @property
    def first_line(self) -> str:
        return self.reason.strip().splitlines()[0] if self.reason.strip() else ""

    @property
    def fix_line(self) -> str:
        """The line of a failure that says what to change ('Fix: ...', 'Levers ...:' with its
        first lever), if it has one besides its first line."""
        lines = [line.strip() for line in self.reason.strip().splitlines()[1:]]
        for i, line in enumerate(lines):
            if line.lower().startswith(("fix", "levers", "use ", "set ")):
                follow = lines[i + 1] if line.endswith(":") and i + 1 < len(lines) else ""
                return f"{line} {follow}".strip()
        return ""


@dataclass(frozen=True)
class AreaVerdict:
    area: str
    verdict: str  # the worst outcome among its checks that ran ("not run" when none did)
    counts: dict[str, int]


@dataclass
class RecipeRun:
    name: str
    checks: list[CheckRow]
    measurements: list[Measurement] = field(default_factory=list)
    series: dict[str, dict[str, list]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # the resolved recipe (Recipe.to_dict())
    regressions: list[Regression] = field(default_factory=list)
    baseline: str = ""  # the baseline file, when the run had one
    environment: Optional[dict[str, Any]] = None  # environment.json, when repro.environment ran

    @property
    def partial(self) -> bool:
        """True when checks were left out by -k/-m/node ids (the nightly default does not count)."""
        return any(c.outcome == "not run" and c.why_not != NIGHTLY_DEFAULT for c in self.checks)

    def ran(self) -> list[CheckRow]:
        return [c for c in self.checks if c.outcome != "not run"]

    def counts(self) -> dict[str, int]:
        return count(self.checks)

    def areas(self) -> list[AreaVerdict]:
        order: dict[str, list[CheckRow]] = {}
        for c in self.checks:
            order.setdefault(c.area, []).append(c)
        return [AreaVerdict(area, worst(rows), count(rows)) for area, rows in order.items()]

    def find(self, check: str, *names: str) -> Optional[Measurement]:
        """The first measurement of ``check`` named one of ``names`` (in the order given)."""
        for name in names:
            hit = next((m for m in self.measurements if m.check == check and m.name == name), None)
            if hit is not None:
                return hit
        return None

    def outcome_of(self, check: str) -> Optional[CheckRow]:
        return next((c for c in self.checks if c.id == check), None)


def count(rows: Iterable[CheckRow]) -> dict[str, int]:
    out = {k: 0 for k in OUTCOMES}
    for row in rows:
        out[row.outcome] = out.get(row.outcome, 0) + 1
    return out


def worst(rows: Iterable[CheckRow]) -> str:
    seen = {r.outcome for r in rows}
    return next((k for k in OUTCOMES if k in seen), "not run")
