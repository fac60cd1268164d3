"""The memory forecast as text: the breakdown at the peak, the verdict against the target, the
levers with their savings (each labelled traced or estimate) and the notes on what was
modelled. Formats a ``forecast.levers.Report`` and ``Lever`` lists it is given; shared by
``ftready-forecast``, the check ``model.memory_forecast`` and ``levers.advice``."""

from __future__ import annotations

from typing import Sequence

from ..units import human_bytes


def saving_text(lever) -> str:
    """'saves 3.40 MiB (traced)'; a lever that saves nothing here, or costs memory, says so."""
    if lever.saves_bytes > 0:
        return f"saves {human_bytes(lever.saves_bytes)} ({lever.how})"
    if lever.saves_bytes < 0:
        return f"adds {human_bytes(-lever.saves_bytes)} ({lever.how})"
    return f"saves nothing here ({lever.how})"


def lever_line(lever, verdict: str = "") -> str:
    """One lever: its change, its saving labelled traced or estimate, its cost."""
    peak = f"peak {human_bytes(lever.peak_bytes)}, " if lever.peak_bytes is not None else ""
    return (f"  - {lever.name}: {lever.change}; {peak}{saving_text(lever)}"
            f"{', ' + verdict if verdict else ''}; cost: {lever.cost}")


def levers_text(levers: Sequence) -> str:
    if not levers:
        return "no lever left in this recipe: a smaller model or a larger device"
    return "\n".join(lever_line(lv) for lv in levers)


def render(report) -> str:
    """The breakdown table, the verdict against the target, the levers and the notes."""
    f = report.forecast
    lines = [f"memory forecast for {report.recipe_name}: {f.model_type}, {f.parameters:,} parameters "
             f"({f.trainable_parameters:,} trainable), one micro-batch of {f.tokens:,} tokens "
             f"traced in {f.trace_seconds:.1f} s (estimate: no weights, fake tensors)"]
    if f.path:
        lines.append(f"  step: {f.path}")
    categories = f.categories()
    width = max(len(name) for name in categories)
    lines.append(f"  at the peak ({f.peak_phase}):")
    for name, value in categories.items():
        extra = f"  (trainable {human_bytes(f.trainable_bytes)})" if name == "weights" else ""
        lines.append(f"    {name:<{width}}  {human_bytes(value):>12}{extra}")
    lines.append(f"    {'peak tensors':<{width}}  {human_bytes(f.peak_bytes):>12}")
    if f.paged_state_bytes:
        lines.append(f"  besides the peak: {human_bytes(f.paged_state_bytes)} paged optimizer state "
                     f"(unified memory, paged to host RAM when the device runs short)")
    t = report.target
    if t is None:
        lines.append("  no target: set [hardware] target = \"24GiB\" or a GPU name, or pass --target")
    else:
        lines.append(f"  target {t.name}: {human_bytes(t.capacity_bytes)}"
                     + (f" x {t.usable_share:.0%} usable" if t.usable_share < 1 else "")
                     + f", less {report.headroom:.0%} memory_headroom = {human_bytes(report.usable_bytes)} usable")
        lines.append(f"  needs {human_bytes(report.need_bytes)} = peak + {t.allocator_share:.0%} allocator overhead + "
                     f"{human_bytes(t.context_bytes)} runtime context (estimates from the facts table)")
        lines.append(f"  verdict: {'FITS' if report.fits else 'DOES NOT FIT'} "
                     f"({human_bytes(abs(report.usable_bytes - report.need_bytes))} "
                     f"{'to spare' if report.fits else 'short'})")
        if t.assumed:
            lines.append(f"  assumed: {t.assumed}")
    if report.levers:
        lines.append("  levers, largest saving first (traced: the recipe forecast with the lever pulled; "
                     "estimate: from the breakdown, where no recipe key expresses it):")
        for lv in report.levers:
            verdict = ""
            if t is not None and lv.peak_bytes is not None:
                verdict = "fits" if t.need_bytes(lv.peak_bytes) <= report.usable_bytes else "still short"
            lines.append("  " + lever_line(lv, verdict))
    for problem in report.problems:
        lines.append(f"  lever not forecast: {problem}")
    for note in f.notes:
        lines.append(f"  note: {note}")
    if t is not None:
        lines.append(f"  sources: {'; '.join(t.sources)}")
    return "\n".join(lines)
