"""Small SVG charts for the human report (no plotting dependency)."""

from __future__ import annotations

import html

W, H, PAD = 560, 220, 40


def _frame(title: str, body: str, lo: float, hi: float, xlabel: str) -> str:
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' font-family='sans-serif' font-size='11'>"
            f"<text x='{PAD}' y='16' font-size='13'>{html.escape(title)}</text>"
            f"<line x1='{PAD}' y1='{H - PAD}' x2='{W - 10}' y2='{H - PAD}' stroke='#444'/>"
            f"<line x1='{PAD}' y1='30' x2='{PAD}' y2='{H - PAD}' stroke='#444'/>"
            f"<text x='2' y='34'>{hi:.4g}</text><text x='2' y='{H - PAD}'>{lo:.4g}</text>"
            f"<text x='{W // 2}' y='{H - 8}'>{html.escape(xlabel)}</text>{body}</svg>")


def histogram(values: list[float], title: str, xlabel: str, bins: int = 30) -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    width = (hi - lo) / bins or 1.0
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / width))] += 1
    top = max(counts)
    bar_w = (W - PAD - 10) / bins
    bars = "".join(
        f"<rect x='{PAD + i * bar_w:.1f}' y='{H - PAD - c / top * (H - PAD - 30):.1f}' width='{bar_w - 1:.1f}' "
        f"height='{c / top * (H - PAD - 30):.1f}' fill='#4a7fd6'><title>{lo + i * width:.0f}: {c}</title></rect>"
        for i, c in enumerate(counts))
    return _frame(title, bars + f"<text x='{PAD}' y='{H - PAD + 14}'>{lo:.4g}</text>"
                  f"<text x='{W - 50}' y='{H - PAD + 14}'>{hi:.4g}</text>", 0, top, xlabel)


def line(points: list[tuple[float, float]], title: str, xlabel: str) -> str:
    if len(points) < 2:
        return ""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    sx = (W - PAD - 10) / ((x1 - x0) or 1)
    sy = (H - PAD - 30) / ((y1 - y0) or 1)
    path = " ".join(f"{PAD + (x - x0) * sx:.1f},{H - PAD - (y - y0) * sy:.1f}" for x, y in points)
    return _frame(title, f"<polyline fill='none' stroke='#d6574a' stroke-width='1.5' points='{path}'/>"
                  f"<text x='{PAD}' y='{H - PAD + 14}'>{x0:.4g}</text><text x='{W - 50}' y='{H - PAD + 14}'>{x1:.4g}</text>",
                  y0, y1, xlabel)
