"""Results as data, and the writers that format them: JUnit properties, benchmark
extra_info, the terminal summary and the artifacts folder (owner-only files)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable


@dataclass(frozen=True)
class Measurement:
    recipe: str
    check: str
    name: str
    value: float | int | str
    unit: str
    estimate: bool = False  # an estimate, not a measurement (CHECKS.md: say which is which)

    @property
    def key(self) -> str:
        """The JUnit property / extra_info name: ``name[unit]``."""
        return f"{self.name}[{self.unit}]" if self.unit else self.name

    def display(self) -> str:
        return f"{self.name} = {format_value(self.value, self.unit)}" + (" (estimate)" if self.estimate else "")


def format_value(value: Any, unit: str) -> str:
    if isinstance(value, float):
        if unit == "bytes" or unit.endswith("bytes"):
            return f"{human_bytes(value)}"
        text = f"{value:.4g}"
    elif isinstance(value, int) and unit == "bytes":
        return human_bytes(value)
    else:
        text = str(value)
    return f"{text} {unit}".rstrip()


def human_bytes(n: float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) with owner-only permissions on the folders we create."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
    return path


def write_private(path: Path, data: str | bytes) -> Path:
    """Write atomically (temp file + rename) with mode 0600: never half-written, never public."""
    path = Path(path)
    ensure_private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, payload: Any) -> Path:
    return write_private(path, json.dumps(json_safe(payload), indent=2, sort_keys=True) + "\n")


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


def html_report(recipe_name: str, measurements: list[Measurement], series: dict[str, dict[str, list]],
                outcomes: dict[str, str]) -> str:
    """The human report: outcomes, measurements, and pictures of the time series."""
    import html

    from .charts import histogram, line

    def points(values):
        return [tuple(v) if isinstance(v, (list, tuple)) else (i, v) for i, v in enumerate(values)]

    pictures = []
    for check, named in series.items():
        for name, values in named.items():
            if not values:
                continue
            title = f"{check}: {name}"
            if name == "lengths":
                pictures.append(histogram(values, title, "tokens per row"))
            else:
                xlabel = "seconds" if values and isinstance(values[0], (list, tuple)) else "step / window"
                pictures.append(line(points(values), title, xlabel))
    rows = "".join(f"<tr><td>{html.escape(m.check)}</td><td>{html.escape(m.name)}</td>"
                   f"<td>{html.escape(format_value(m.value, m.unit))}{' (estimate)' if m.estimate else ''}</td></tr>"
                   for m in measurements)
    states = "".join(f"<li>{html.escape(k)}: <b>{html.escape(v)}</b></li>" for k, v in outcomes.items())
    return ("<!doctype html><meta charset='utf-8'><title>ftready report</title>"
            "<style>body{font-family:sans-serif}td{padding:2px 8px}</style>"
            f"<h1>pytest-ftready: {html.escape(recipe_name)}</h1><ul>{states}</ul>"
            "<p><a href='masking.html'>Loss masking examples</a></p>"
            + "".join(f"<div>{p}</div>" for p in pictures if p)
            + f"<h2>Measurements</h2><table>{rows}</table>")
