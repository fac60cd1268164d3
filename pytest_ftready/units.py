"""Units and numbers shared by every layer: bytes for people, a value with its unit, one
percentile. Imports nothing heavy."""

from __future__ import annotations

from typing import Any, Sequence


def format_value(value: Any, unit: str) -> str:
    if unit == "share" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value * 100:.3g}%"
    if isinstance(value, float):
        if unit == "bytes" or unit.endswith("bytes"):
            return f"{human_bytes(value)}"
        text = f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.4g}"
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


def format_duration(seconds: float) -> str:
    """'45 s', '12 min', '3.2 h': a time for people, to two figures at most."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between closest ranks (numpy's default);
    0.0 for no values. The one percentile of the package: data lengths, lever advice and step
    times all quote the same figure."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
