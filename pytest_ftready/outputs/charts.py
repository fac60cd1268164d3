"""Inline SVG charts for the human report: no plotting dependency, no network. Each function
draws the figures it is given (a marker where a limit lies, events where they happened)
and returns an ``<svg>`` element, or '' when there is nothing to draw."""

from __future__ import annotations

import html
from typing import Optional, Sequence

from ..units import human_bytes

W, H = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 30, 40
COLORS = ("#2f6fd0", "#d0502f", "#2f9d57", "#8a4fc1", "#c08a1e")
MARK = "#c0392b"


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _num(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _svg(title: str, body: str, width: int = W, height: int = H) -> str:
    return (f"<svg xmlns='http://www.w3.org/2000/svg' class='chart' role='img' aria-label='{_esc(title)}' "
            f"width='{width}' height='{height}' viewBox='0 0 {width} {height}' font-family='sans-serif' "
            f"font-size='11'><title>{_esc(title)}</title>"
            f"<text x='{LEFT}' y='18' font-size='13' font-weight='bold'>{_esc(title)}</text>{body}</svg>")


class _Axes:
    """A plot area mapping data to pixels, with its axes, ticks and labels."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float, xlabel: str, ylabel: str = "") -> None:
        self.x0, self.x1 = x0, (x1 if x1 > x0 else x0 + 1)
        self.y0, self.y1 = y0, (y1 if y1 > y0 else y0 + 1)
        self.xlabel, self.ylabel = xlabel, ylabel

    def x(self, value: float) -> float:
        return LEFT + (value - self.x0) / (self.x1 - self.x0) * (W - LEFT - RIGHT)

    def y(self, value: float) -> float:
        return H - BOTTOM - (value - self.y0) / (self.y1 - self.y0) * (H - TOP - BOTTOM)

    def frame(self) -> str:
        base, top = H - BOTTOM, TOP
        parts = [f"<line x1='{LEFT}' y1='{base}' x2='{W - RIGHT}' y2='{base}' stroke='#444'/>",
                 f"<line x1='{LEFT}' y1='{top}' x2='{LEFT}' y2='{base}' stroke='#444'/>"]
        for i in range(5):
            yv = self.y0 + (self.y1 - self.y0) * i / 4
            xv = self.x0 + (self.x1 - self.x0) * i / 4
            parts.append(f"<text x='{LEFT - 4}' y='{self.y(yv) + 4:.1f}' text-anchor='end'>{_num(yv)}</text>")
            parts.append(f"<line x1='{LEFT}' y1='{self.y(yv):.1f}' x2='{W - RIGHT}' y2='{self.y(yv):.1f}' "
                         "stroke='#ddd'/>")
            parts.append(f"<text x='{self.x(xv):.1f}' y='{base + 14}' text-anchor='middle'>{_num(xv)}</text>")
        parts.append(f"<text x='{(LEFT + W - RIGHT) / 2}' y='{H - 6}' text-anchor='middle'>{_esc(self.xlabel)}</text>")
        if self.ylabel:
            parts.append(f"<text x='12' y='{(TOP + base) / 2}' text-anchor='middle' "
                         f"transform='rotate(-90 12 {(TOP + base) / 2})'>{_esc(self.ylabel)}</text>")
        return "".join(parts)

    def vertical(self, value: float, label: str, color: str = MARK, row: int = 0) -> str:
        x = self.x(value)
        anchor = "end" if x > W * 0.7 else "start"
        dx = -4 if anchor == "end" else 4
        return (f"<line class='marker' x1='{x:.1f}' y1='{TOP}' x2='{x:.1f}' y2='{H - BOTTOM}' stroke='{color}' "
                f"stroke-dasharray='5,3' stroke-width='1.5'/><text x='{x + dx:.1f}' y='{TOP + 12 + 13 * row}' "
                f"fill='{color}' text-anchor='{anchor}'>{_esc(label)}</text>")

    def horizontal(self, value: float, label: str, color: str = MARK) -> str:
        y = self.y(value)
        return (f"<line class='marker' x1='{LEFT}' y1='{y:.1f}' x2='{W - RIGHT}' y2='{y:.1f}' stroke='{color}' "
                f"stroke-dasharray='5,3' stroke-width='1.5'/><text x='{W - RIGHT - 4}' y='{y - 4:.1f}' "
                f"fill='{color}' text-anchor='end'>{_esc(label)}</text>")


def histogram(values: Sequence[float], title: str, xlabel: str, marker: Optional[float] = None,
              marker_label: str = "", note: str = "", bins: int = 30) -> str:
    """Counts of ``values`` in ``bins`` bins; ``marker`` (e.g. max_length) as a dashed line."""
    if not values:
        return ""
    lo = min(values)
    hi = max(max(values), marker if marker is not None else lo)
    width = (hi - lo) / bins or 1.0
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / width))] += 1
    axes = _Axes(lo, lo + width * bins, 0, max(counts), xlabel, "rows")
    bars = []
    for i, c in enumerate(counts):
        if c:
            x0, x1 = axes.x(lo + i * width), axes.x(lo + (i + 1) * width)
            bars.append(f"<rect x='{x0:.1f}' y='{axes.y(c):.1f}' width='{max(1.0, x1 - x0 - 1):.1f}' "
                        f"height='{axes.y(0) - axes.y(c):.1f}' fill='{COLORS[0]}'><title>{lo + i * width:.0f}–"
                        f"{lo + (i + 1) * width:.0f}: {c} rows</title></rect>")
    body = axes.frame() + "".join(bars)
    if marker is not None:
        body += axes.vertical(marker, marker_label)
    if note:
        body += f"<text x='{W - RIGHT}' y='18' text-anchor='end' fill='{MARK}'>{_esc(note)}</text>"
    return _svg(title, body)


def lines(series: Sequence[tuple[str, Sequence[tuple[float, float]]]], title: str, xlabel: str, ylabel: str = "",
          limit: Optional[float] = None, limit_label: str = "",
          events: Sequence[tuple[float, str]] = ()) -> str:
    """One polyline per (label, points); a dashed ``limit`` line; ``events`` marked where they happened."""
    drawn = [(label, list(points)) for label, points in series if len(points) >= 1]
    if not drawn:
        return ""
    xs = [x for _, pts in drawn for x, _ in pts] + [t for t, _ in events]
    ys = [y for _, pts in drawn for _, y in pts] + ([limit] if limit is not None else [])
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.08 or abs(y1) * 0.1 or 1.0
    axes = _Axes(min(xs), max(xs), max(0.0, y0 - pad) if y0 >= 0 else y0 - pad, y1 + pad, xlabel, ylabel)
    body = [axes.frame()]
    for i, (label, pts) in enumerate(drawn):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{axes.x(x):.1f},{axes.y(y):.1f}" for x, y in pts)
        body.append(f"<polyline class='series' fill='none' stroke='{color}' stroke-width='1.8' points='{path}'/>")
        if len(pts) == 1 or len(pts) <= 40:
            body.extend(f"<circle cx='{axes.x(x):.1f}' cy='{axes.y(y):.1f}' r='2.2' fill='{color}'>"
                        f"<title>{_num(x)}: {_num(y)}</title></circle>" for x, y in pts)
        if len(drawn) > 1:
            body.append(f"<text x='{W - RIGHT - 4}' y='{TOP + 12 + 13 * i}' text-anchor='end' fill='{color}'>"
                        f"{_esc(label)}</text>")
    if limit is not None:
        body.append(axes.horizontal(limit, limit_label))
    for row, (t, label) in enumerate(events):
        body.append(f"<g class='event'>{axes.vertical(t, label, row=row % 4)}</g>")
    return _svg(title, "".join(body))


def memory_bars(parts: Sequence[tuple[str, float]], peak: Optional[float], capacity: Optional[float],
                headroom: float) -> str:
    """Two stacked bars of the step's memory: against the device's capacity (with the usable
    share and the kept headroom marked), and zoomed to the peak so small parts stay legible."""
    parts = [(label, float(v)) for label, v in parts if v is not None and v >= 0]
    if not parts:
        return ""
    total = sum(v for _, v in parts)
    top = max(total, peak or 0)
    width = W - LEFT - RIGHT
    rows = []

    def bar(y: int, scale: float, caption: str, legend: bool) -> str:
        out, x = [f"<text x='{LEFT}' y='{y - 6}'>{_esc(caption)}</text>"], float(LEFT)
        for i, (label, v) in enumerate(parts):
            w = v / scale * width if scale else 0.0
            color = COLORS[i % len(COLORS)]
            out.append(f"<rect class='part' x='{x:.1f}' y='{y}' width='{max(w, 0.0):.2f}' height='26' fill='{color}'>"
                       f"<title>{_esc(label)}: {human_bytes(v)}</title></rect>")
            if legend:
                lx = LEFT + (i % 3) * (width / 3)
                ly = y + 44 + (i // 3) * 14
                out.append(f"<rect x='{lx:.1f}' y='{ly - 9}' width='10' height='10' fill='{color}'/>"
                           f"<text x='{lx + 14:.1f}' y='{ly}'>{_esc(label)}: {human_bytes(v)}</text>")
            x += w
        return "".join(out)

    if capacity:
        usable_x = LEFT + (1 - headroom) * width
        rows.append(bar(48, capacity, f"against the device capacity {human_bytes(capacity)}"
                        + (f" (peak {human_bytes(peak)} = {peak / capacity:.2%})" if peak else ""), legend=False))
        rows.append(f"<rect x='{usable_x:.1f}' y='48' width='{LEFT + width - usable_x:.1f}' height='26' "
                    f"fill='#f3c6c0' opacity='0.7'><title>memory_headroom {headroom:.0%} kept free</title></rect>"
                    f"<rect x='{LEFT}' y='48' width='{width}' height='26' fill='none' stroke='#444'/>"
                    f"<text x='{usable_x - 4:.1f}' y='88' text-anchor='end' fill='{MARK}'>usable "
                    f"{human_bytes(capacity * (1 - headroom))} | headroom {headroom:.0%}</text>")
    y = 122 if capacity else 48
    rows.append(bar(y, top, f"zoomed to the peak {human_bytes(peak)}" if peak else "zoomed", legend=True))
    if peak and peak > total:
        rows.append(f"<line x1='{LEFT + width:.1f}' y1='{y - 4}' x2='{LEFT + width:.1f}' y2='{y + 30}' "
                    f"stroke='{MARK}' stroke-width='2'/>")
    height = y + 44 + 14 * ((len(parts) + 2) // 3) + 8
    return _svg("Memory of the worst-case step", "".join(rows), height=height)
