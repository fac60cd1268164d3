"""The Markdown summary a CI job shows on its page (GitHub Actions' ``GITHUB_STEP_SUMMARY``):
verdict per area, failures with their fix line, key figures, regressions. Formats the run's
records; computes no figure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Optional

from ..units import format_value
from .records import RecipeRun

ENV_STEP_SUMMARY = "GITHUB_STEP_SUMMARY"
ICONS = {"passed": "✅", "failed": "❌", "error": "❌", "skipped": "⏭️", "not run": "➖"}

# (label, check, measurement names in order of preference): the figures a reviewer looks at first.
KEY_FIGURES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("peak memory of the worst-case step", "model.step_memory",
     ("peak_device_reserved", "peak_tensor_bytes")),
    ("device capacity", "model.step_memory", ("device_capacity",)),
    ("training step throughput", "model.step_memory", ("step_tokens_per_s",)),
    ("overfit: final loss", "model.overfit", ("overfit_final_loss",)),
    ("length p95", "data.lengths", ("length_p95",)),
    ("rows truncated", "data.lengths", ("truncation_rate",)),
    ("sustained throughput (median window)", "sustained.throughput", ("tokens_per_s_median",)),
    ("throughput drop, best early window to last", "sustained.throughput", ("throughput_drop",)),
    ("hottest GPU temperature", "sustained.thermal", ("max_temperature",)),
    ("checkpoint size", "lifecycle.resume", ("checkpoint_size",)),
    ("run ETA with margins (estimate)", "headroom.time", ("eta_with_margins",)),
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(runs: Iterable[RecipeRun], report_paths: Optional[dict[str, Path]] = None) -> str:
    """One section per recipe."""
    return "\n".join(_recipe(run, (report_paths or {}).get(run.name)) for run in runs)


def _recipe(run: RecipeRun, report: Optional[Path]) -> str:
    c = run.counts()
    ran = ", ".join(f"{c[k]} {k}" for k in ("failed", "error", "passed", "skipped") if c[k])
    out = [f"## pytest-ftready: {run.name}", ""]
    kind = (f"**partial run**: {c['not run']} check(s) not selected" if run.partial else "full run")
    out += [f"{ran or 'nothing ran'} ({kind})", ""]
    out += ["| area | verdict | passed | failed | skipped | not run |", "|---|---|---:|---:|---:|---:|"]
    for a in run.areas():
        n = a.counts
        out.append(f"| {a.area} | {ICONS[a.verdict]} {a.verdict} | {n['passed']} | {n['failed'] + n['error']} | "
                   f"{n['skipped']} | {n['not run']} |")
    failures = [row for row in run.checks if row.outcome in ("failed", "error")]
    if failures:
        out += ["", "### Failures", ""]
        for row in failures:
            out.append(f"- **{row.id}**: {_cell(row.first_line)}")
            if row.fix_line:
                out.append(f"  - {_cell(row.fix_line)}")
    if run.baseline:
        out += ["", f"### Regressions against `{run.baseline}`", ""]
        if run.regressions:
            out += ["| check | figure | before | now | change | limit |", "|---|---|---:|---:|---:|---:|"]
            out += [f"| {r.check_id} | {r.name} | {format_value(r.before, r.unit)} | {format_value(r.after, r.unit)} | "
                    f"{r.relative:+.1%} | "
                    f"{r.threshold:.0%} ({r.kind}) |" for r in run.regressions]
        else:
            out.append("No figure regressed past its `max_regression` threshold.")
    figures = [(label, m) for label, check, names in KEY_FIGURES if (m := run.find(check, *names)) is not None]
    if figures:
        out += ["", "### Key figures", "", "| figure | value | check |", "|---|---:|---|"]
        out += [f"| {label} | {format_value(m.value, m.unit)} | {m.check} |" for label, m in figures]
    if report is not None:
        out += ["", f"Report: `{report}`"]
    return "\n".join(out) + "\n"


def append_step_summary(runs: list[RecipeRun], report_paths: Optional[dict[str, Path]] = None,
                        environ: Optional[dict] = None,
                        gate: Callable[[str], str] = lambda text: text) -> Optional[Path]:
    """Append the summary to the file ``GITHUB_STEP_SUMMARY`` names, when it is set (through
    ``gate``, the session's output gate: a CI page never shows a secret found in data)."""
    target = (environ if environ is not None else os.environ).get(ENV_STEP_SUMMARY)
    if not target or not runs:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(gate(markdown(runs, report_paths)) + "\n")
    return path
