"""The human report: one self-contained HTML page per recipe from the run's outcomes,
measurements and time series (never recomputed here)."""

from __future__ import annotations

from ..units import format_value
from .measurements import Measurement


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
