"""The human report: one self-contained HTML page per recipe (inline CSS and SVG, no script,
nothing fetched) from the run's records: verdicts with their reasons, what this run
selected, regressions, masking token by token, lengths, memory, the overfit, sustained
throughput and telemetry, the lever sweep, the environment and every measurement. Every
figure shown is one the run recorded; nothing here measures or recomputes.

A run that left checks out (``-k``, ``-m``, node ids) writes ``report-partial.html`` and
keeps the last full run's ``report.html`` beside it; a full run writes ``report.html`` and
removes a stale partial one.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from ..files import write_private
from ..units import format_value, human_bytes
from .charts import histogram, lines, memory_bars
from .records import CheckRow, RecipeRun

FULL, PARTIAL = "report.html", "report-partial.html"
SECTIONS = ("verdicts", "selection", "regressions", "masking", "lengths", "memory", "overfit", "sustained", "levers",
            "environment", "measurements")
MASKING_EXAMPLES_SHOWN = 8
STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:18px 28px}header h1{margin:0 0 6px;font-size:22px}
header p{margin:2px 0}main{padding:8px 28px 40px;max-width:1100px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:12px 18px;margin:16px 0}
h2{font-size:18px;margin:4px 0 10px}h3{font-size:14px;margin:12px 0 4px}
table{border-collapse:collapse;font-size:13px;margin:6px 0;max-width:100%}
td,th{padding:3px 10px;border-bottom:1px solid #eceef2;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#f0f2f5}td.num{text-align:right;font-variant-numeric:tabular-nums}.n{white-space:nowrap}
.badge{display:inline-block;padding:1px 7px;border-radius:9px;font-size:12px;font-weight:600;white-space:nowrap}
.passed{background:#d8f3dc;color:#1b5e20}.failed,.error{background:#fbd5d0;color:#8e1b10}
.skipped{background:#fdf0c4;color:#6b5200}.not-run{background:#e6e8ec;color:#4a5060}
.partial{background:#fdf0c4;color:#4d3b00;padding:6px 10px;border-radius:4px;display:inline-block}
.area td{background:#f7f8fa;font-weight:600}.reason{white-space:pre-wrap;font-family:ui-monospace,monospace;
font-size:12px;color:#333}.absent{color:#667;font-style:italic}
.tokens{font-family:ui-monospace,monospace;font-size:12px;line-height:1.9;white-space:pre-wrap;word-break:break-all}
.tok{border:1px solid #c9ced6;border-radius:2px;padding:0 1px;margin:0 1px 0 0}
.tok.t{background:#b9efc0;border-color:#5cb46a;color:#0d3d14}.tok.m{background:#f2f3f5;color:#8a909b}
.tok.p{background:#dbe9fb;border-color:#7aa7e0;color:#1d3f6e}
.gap{color:#c0392b;font-style:italic}.legend span{margin-right:14px}svg.chart{max-width:100%;height:auto}
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def value(m) -> str:
    """A measurement for a table cell: numbers kept on one line, text free to wrap."""
    text = esc(format_value(m.value, m.unit) + (" (estimate)" if m.estimate else ""))
    return text if isinstance(m.value, str) else f"<span class='n'>{text}</span>"


def badge(outcome: str) -> str:
    return f"<span class='badge {outcome.replace(' ', '-')}'>{esc(outcome)}</span>"


def _absent(run: RecipeRun, check: str, what: str) -> str:
    row = run.outcome_of(check)
    if row is None:
        why = f"{check} is not a check of this run"
    elif row.outcome == "not run":
        why = f"{check} did not run: {row.why_not}"
    elif row.reason:
        why = f"{check} {row.outcome}: {row.first_line}"
    else:
        why = f"{check} {row.outcome} without recording it"
    return f"<p class='absent'>No {esc(what)}: {esc(why)}.</p>"


def _section(key: str, title: str, body: str) -> str:
    return f"<section id='{key}'><h2>{esc(title)}</h2>{body}</section>"


def _table(head: Iterable[str], rows: Iterable[Iterable[str]], numeric: Iterable[int] = ()) -> str:
    num = set(numeric)
    head_html = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td{' class=num' if i in num else ''}>{cell}</td>" for i, cell in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><tr>{head_html}</tr>{body}</table>"


def _reason(row: CheckRow) -> str:
    if not row.reason and not row.why_not:
        return ""
    text = row.reason or row.why_not
    if "\n" not in text.strip():
        return f"<div class='reason'>{esc(text.strip())}</div>"
    return (f"<details><summary class='reason'>{esc(row.first_line)}</summary>"
            f"<div class='reason'>{esc(text.strip())}</div></details>")


def verdicts(run: RecipeRun) -> str:
    rows = []
    for area in run.areas():
        n = area.counts
        tally = ", ".join(f"{n[k]} {k}" for k in ("failed", "error", "passed", "skipped", "not run") if n[k])
        rows.append(f"<tr class='area'><td>{esc(area.area)}</td><td>{badge(area.verdict)}</td>"
                    f"<td>{esc(tally)}</td></tr>")
        rows += [f"<tr><td>&nbsp;&nbsp;{esc(c.id)}</td><td>{badge(c.outcome)}</td><td>{_reason(c)}</td></tr>"
                 for c in run.checks if c.area == area.area]
    return _section("verdicts", "Verdicts by area",
                    "<table><tr><th>area / check</th><th>verdict</th><th>reason</th></tr>" + "".join(rows) + "</table>")


def selection(run: RecipeRun, full_report: Optional[str]) -> str:
    ran = run.ran()
    left = [c for c in run.checks if c.outcome == "not run"]
    body = f"<p>This run selected {len(ran)} of {len(run.checks)} checks.</p>"
    if run.partial:
        body += ("<p class='partial'>Partial run: the checks below were left out, so this page does not stand for "
                 "the whole recipe." + (f" The last full run's report is <a href='{esc(full_report)}'>"
                                        f"{esc(full_report)}</a>." if full_report else " No full report exists yet.")
                 + "</p>")
    if left:
        body += _table(("not run", "why"), [(esc(c.id), esc(c.why_not)) for c in left])
    return _section("selection", "Selection", body)


def regressions(run: RecipeRun) -> str:
    if not run.baseline:
        return _section("regressions", "Regressions",
                        "<p class='absent'>No baseline: pass --ftready-baseline=PATH (or --benchmark-compare) to "
                        "compare this run with a previous one.</p>")
    if not run.regressions:
        return _section("regressions", "Regressions", f"<p>Against {esc(run.baseline)}: no figure regressed past its "
                        "[checks] max_regression threshold.</p>")
    rows = [(esc(r.check_id), esc(r.name), esc(format_value(r.before, r.unit)), esc(format_value(r.after, r.unit)),
             f"{r.relative:+.1%}",
             esc(f"{r.threshold:.0%} ({r.kind})")) for r in run.regressions]
    return _section("regressions", "Regressions", f"<p>Against {esc(run.baseline)}:</p>"
                    + _table(("check", "figure", "before", "now", "change", "limit"), rows, numeric=(2, 3, 4)))


def token_spans(example: dict) -> str:
    """One span per token: its boundary boxed, trained tokens green, masked grey, response tokens
    the inference prompt already holds blue."""
    out = []
    given = set(example.get("prompted", ()))
    for i, (text, trained) in enumerate(example["tokens"]):
        if example.get("skipped_at") == i:
            out.append(f"<span class='gap'> … {example['skipped']} tokens not shown … </span>")
        shown = text.replace("\n", "↵\n") if text else "∅"
        kind = "t" if trained else "p" if i in given else "m"
        out.append(f"<span class='tok {kind}'>{esc(shown)}</span>")
    return "".join(out)


def masking_examples(examples: list[dict], limit: Optional[int] = None) -> str:
    legend = ("<p class='legend'><span class='tok t'>trained</span> carries loss <span class='tok m'>masked</span> "
              "label -100 <span class='tok p'>in the prompt</span> part of a response that the inference prompt "
              "already holds (never generated, so not trained). Each box is one token; ↵ a newline.</p>")
    blocks = []
    for ex in examples[:limit]:
        problems = "".join(f"<li>{esc(kind)}: {esc(detail)}</li>" for kind, detail in ex.get("problems", []))
        blocks.append(f"<h3>{esc(ex['where'])}: {ex['trained']} of {ex['length']} tokens trained</h3>"
                      f"<div class='tokens'>{token_spans(ex)}</div>" + (f"<ul>{problems}</ul>" if problems else ""))
    return legend + "".join(blocks)


def masking(run: RecipeRun) -> str:
    examples = run.series.get("data.masking", {}).get("examples")
    if not examples:
        return _section("masking", "Loss masking, token by token", _absent(run, "data.masking", "masking examples"))
    method = run.find("data.masking", "trained_span_method")
    head = f"<p>Trained spans found by <b>{esc(method.value)}</b>.</p>" if method else ""
    more = len(examples) - MASKING_EXAMPLES_SHOWN
    tail = f"<p>{more} more example(s) in <a href='masking.html'>masking.html</a>.</p>" if more > 0 else ""
    return _section("masking", "Loss masking, token by token",
                    head + masking_examples(examples, MASKING_EXAMPLES_SHOWN) + tail)


def lengths(run: RecipeRun) -> str:
    values = run.series.get("data.lengths", {}).get("lengths")
    if not values:
        return _section("lengths", "Example lengths", _absent(run, "data.lengths", "length distribution"))
    max_length = run.settings.get("data", {}).get("max_length")
    rate = run.find("data.lengths", "truncation_rate")
    note = f"truncated: {format_value(rate.value, rate.unit)} of rows" if rate is not None else ""
    chart = histogram(values, "Tokens per row (before truncation)", "tokens per row", marker=max_length,
                      marker_label=f"max_length {max_length}", note=note)
    figures = [m for m in run.measurements if m.check == "data.lengths" and m.unit in ("tokens", "share")]
    table = _table(("figure", "value"), [(esc(m.name), value(m)) for m in figures], (1,))
    return _section("lengths", "Example lengths", chart + table)


def memory(run: RecipeRun) -> str:
    check = "model.step_memory"
    peak = run.find(check, "peak_device_reserved", "peak_tensor_bytes")
    named = [("weights", "weights"), ("gradients", "trainable_parameters"), ("optimizer state", "optimizer_state"),
             ("activations and workspace (estimate)", "activations_and_workspace")]
    parts = [(label, float(m.value)) for label, name in named if (m := run.find(check, name)) is not None]
    if not parts:
        return _section("memory", "Memory", _absent(run, check, "memory breakdown"))
    capacity = run.find(check, "device_capacity")
    headroom = float(run.settings.get("hardware", {}).get("memory_headroom", 0.0))
    chart = memory_bars(parts, float(peak.value) if peak else None, float(capacity.value) if capacity else None,
                        headroom)
    figures = [m for m in run.measurements if m.check == check and m.unit == "bytes"]
    note = ("<p>Gradients: one per trainable parameter (the trainable parameters' bytes). Activations and "
            "workspace: the peak less weights, gradients and optimizer state (an estimate).</p>")
    table = _table(("figure", "value"), [(esc(m.name), value(m)) for m in figures], (1,))
    return _section("memory", "Memory", chart + note + table)


def overfit(run: RecipeRun) -> str:
    losses = run.series.get("model.overfit", {}).get("loss")
    if not losses:
        return _section("overfit", "Overfit of a tiny sample", _absent(run, "model.overfit", "loss curve"))
    target = run.settings.get("checks", {}).get("overfit_loss")
    chart = lines([("loss", [(i + 1, v) for i, v in enumerate(losses)])], "Overfit loss per step", "step",
                  "loss (nats)",
                  limit=target, limit_label=f"overfit_loss {target}" if target is not None else "")
    return _section("overfit", "Overfit of a tiny sample", chart)


TELEMETRY = (("temperature_c", "GPU temperature", "°C"), ("sm_clock_mhz", "SM clock", "MHz"),
             ("mem_clock_mhz", "memory clock", "MHz"), ("power_w", "power", "W"), ("cpu_percent", "CPU", "%"))


def sustained(run: RecipeRun) -> str:
    recorded = run.series.get("sustained.throughput", {})
    rates = recorded.get("tokens_per_s_windows")
    if not rates:
        return _section("sustained", "Sustained throughput and telemetry",
                        _absent(run, "sustained.throughput", "sustained throughput"))
    events = [(float(t), f"{reason} from {float(t):.0f} s")
              for reason, t in run.series.get("sustained.thermal", {}).get("throttle_events", [])]
    charts = [lines([("tokens/s", [(i + 1, v) for i, v in enumerate(rates)])], "Tokens/s per window", "window",
                    "tokens/s")]
    for metric, label, unit in TELEMETRY:
        points = [(float(t), float(v)) for t, v in recorded.get(metric, [])]
        if points:
            limit = run.settings.get("checks", {}).get("max_temperature_c") if metric == "temperature_c" else None
            charts.append(lines([(label, points)], f"{label} over time", "seconds", unit, limit=limit,
                                limit_label=f"max_temperature_c {limit}" if limit else "", events=events))
    missing = run.find("sustained.throughput", "telemetry_missing")
    note = ""
    if len(charts) == 1:
        why = missing.value if missing else "none recorded"
        note = f"<p class='absent'>No temperature, clock or power readings: {esc(why)}.</p>"
    throttle = run.find("sustained.thermal", "throttle_reasons")
    if throttle is not None:
        note += f"<p>Throttle events: {esc(throttle.value)}.</p>"
    return _section("sustained", "Sustained throughput and telemetry", "".join(charts) + note)


def levers(run: RecipeRun) -> str:
    rows = []
    for c in run.checks:
        if not c.id.startswith("levers.sweep["):
            continue
        case = c.id[len("levers.sweep["):-1]
        got = {m.name: m for m in run.measurements if m.check == "levers.sweep" and m.case == case}

        def cell(name: str) -> str:
            return value(got[name]) if name in got else ""
        oom = "out of memory" if "out_of_memory" in got else ""
        variant = f"<span class='n'>{esc(case)}</span>" + (" (as written)" if case == "recipe" else "")
        rows.append((variant, badge(c.outcome),
                     cell("peak_memory") or oom, cell("tokens_per_s"), cell("step_seconds"),
                     esc(c.first_line or c.why_not)))
    body = (_table(("variant", "verdict", "peak memory", "tokens/s", "step", "note"), rows, numeric=(2, 3, 4))
            if rows else _absent(run, "levers.sweep", "lever sweep"))
    saves = [m for m in run.measurements if m.check == "levers.advice" and m.name.startswith("saves[")]
    if saves:
        body += "<h3>What each lever would save (estimates)</h3>" + _table(
            ("lever", "saves"), [(esc(m.name[6:-1]), f"<span class='n'>{esc(human_bytes(float(m.value)))}</span>")
                                 for m in saves], (1,))
    return _section("levers", "Lever sweep", body)


def _flat(prefix: str, value: Any) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [pair for k, v in value.items() for pair in _flat(f"{prefix}.{k}" if prefix else str(k), v)]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [pair for i, v in enumerate(value) for pair in _flat(f"{prefix}[{i}]", v)]
    return [(prefix, ", ".join(map(str, value)) if isinstance(value, list) else str(value))]


def environment(run: RecipeRun) -> str:
    if not run.environment:
        return _section("environment", "Environment", _absent(run, "repro.environment", "environment record"))
    env = dict(run.environment)
    packages = env.pop("packages", {}) or {}
    body = _table(("what", "value"), [(esc(k), esc(v)) for k, v in _flat("", env)])
    if packages:
        body += "<h3>Packages</h3>" + _table(("package", "version"), [(esc(k), esc(v)) for k, v in packages.items()])
    return _section("environment", "Environment", body)


def measurements(run: RecipeRun) -> str:
    rows = [(esc(m.check + (f"[{m.case}]" if m.case else "")), esc(m.name), value(m)) for m in run.measurements]
    return _section("measurements", "All measurements", _table(("check", "name", "value"), rows) if rows
                    else "<p class='absent'>No measurement was recorded.</p>")


def html_report(run: RecipeRun, full_report: Optional[str] = None, now: Optional[datetime] = None) -> str:
    """The whole page. ``full_report``: the file name of the last full report, linked from a partial one."""
    when = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    c = run.counts()
    tally = ", ".join(f"{c[k]} {k}" for k in ("failed", "error", "passed", "skipped", "not run") if c[k])
    kind = "Partial run" if run.partial else "Full run"
    body = "".join((verdicts(run), selection(run, full_report), regressions(run), masking(run), lengths(run),
                    memory(run), overfit(run), sustained(run), levers(run), environment(run), measurements(run)))
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>ftready: {esc(run.name)}</title><style>{STYLE}</style></head><body>"
            f"<header><h1>pytest-ftready: {esc(run.name)}</h1><p id='run-kind'>{kind}, {esc(when)}: {esc(tally)}</p>"
            "</header><main>" + body + "</main></body></html>\n")


def masking_page(examples: list[dict], method: str, counts: Sequence[tuple[str, int]] = ()) -> str:
    """masking.html: every shown example token by token (the report embeds the first few).
    ``counts``: (what, rows) lines shown above them (empty reasoning blocks trained, ...)."""
    shown = "".join(f"<p class='count'>{esc(what)}: {rows:,} row(s)</p>" for what, rows in counts)
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'><title>ftready: loss masking</title>"
            f"<style>{STYLE}</style></head><body><header><h1>Loss masking</h1><p>Trained spans found by "
            f"{esc(method)}.</p>{shown}</header><main><section>{masking_examples(examples)}</section></main>"
            "</body></html>\n")


def write_report(folder: Path, run: RecipeRun, write: Callable[[Path, str], Path] = write_private) -> Path:
    """report.html for a full run (removing a stale partial one); report-partial.html beside the
    last full report for a partial run. ``write``: the session's output gate."""
    folder = Path(folder)
    if run.partial:
        full = folder / FULL
        return write(folder / PARTIAL, html_report(run, FULL if full.is_file() else None))
    (folder / PARTIAL).unlink(missing_ok=True)
    return write(folder / FULL, html_report(run))
