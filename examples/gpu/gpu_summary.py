"""The one-page summary of a GPU run (``summary.md``) and its figures as data (``summary.json``),
read from the run's own outputs only: ``run.json`` (what ftready_gpu.py did and the machine the
plugin's probe saw), each run's JUnit XML (outcomes, reasons, the measurements as ``name[unit]``
properties), pytest-benchmark JSON and artifacts (``series.json``). Standard library only.
A figure that was not measured is shown as not measured, with the reason where there is one."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional

NOT_MEASURED = "—"


def cases(junit: Path) -> dict:
    """check id -> {"outcome", "message", "seconds", "figures": {name: value}, "units": {name: unit}}."""
    if not junit.is_file():
        return {}
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = child.get("message") or (child.text or "")
        figures, units = {}, {}
        for prop in case.iter("property"):
            name, value = prop.get("name", ""), prop.get("value", "")
            unit = ""
            if name.endswith("]") and "[" in name and not name.startswith("ftready_"):
                name, unit = name[:-1].rsplit("[", 1)
            figures[name], units[name] = _number(value), unit
        found[case.get("name")] = {"outcome": outcome, "message": message.strip(), "seconds": _number(case.get("time")),
                                   "figures": figures, "units": units}
    return found


def _number(value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value
    return int(number) if number.is_integer() and "." not in str(value) else number


def benchmarks(path: Path) -> dict:
    """benchmark name -> {"group", "mean_s", "min_s", "rounds"} of a pytest-benchmark JSON."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {b["name"]: {"group": b.get("group"), "mean_s": b["stats"]["mean"], "min_s": b["stats"]["min"],
                        "rounds": b["stats"]["rounds"]} for b in data.get("benchmarks", [])}


def series(artifacts: Path) -> dict:
    """The recipe's series.json (series-partial.json for a partial run), {} when absent."""
    for folder in sorted(p for p in artifacts.glob("*") if p.is_dir() and not p.name.startswith(".")):
        for name in ("series.json", "series-partial.json"):
            if (folder / name).is_file():
                return json.loads((folder / name).read_text())
    return {}


# ---- formatting ------------------------------------------------------------------------------------
def size(value) -> str:
    if not isinstance(value, (int, float)):
        return NOT_MEASURED
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= scale:
            return f"{value / scale:,.2f} {unit}"
    return f"{value:,.0f} B"


def rate(value) -> str:
    return f"{value:,.0f}" if isinstance(value, (int, float)) else NOT_MEASURED


def share(value, signed: bool = False) -> str:
    if not isinstance(value, (int, float)):
        return NOT_MEASURED
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def seconds(value) -> str:
    if not isinstance(value, (int, float)):
        return NOT_MEASURED
    return f"{value * 1000:,.1f} ms" if value < 1 else f"{value:,.1f} s"


def first_line(text: str, limit: int = 220) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    line = line.replace("|", "/")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def spread(points: list) -> Optional[tuple]:
    values = [p[1] for p in points if isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[1], (int, float))]
    return (min(values), max(values)) if values else None


def table(header: list, rows: list) -> list[str]:
    if not rows:
        return []
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
           ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


# ---- the page --------------------------------------------------------------------------------------
def collect(out: Path) -> dict:
    record = json.loads((out / "run.json").read_text())
    for run in record.get("runs", []):
        name = run["name"]
        run["checks"] = cases(out / f"junit-{name}.xml")
        run["benchmarks"] = benchmarks(out / f"benchmark-{name}.json")
        run["series"] = series(out / "artifacts" / name)
        counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for case in run["checks"].values():
            counts[case["outcome"]] += 1
        run["counts"] = counts
    gpus = (record.get("probe") or {}).get("machine", {}).get("gpus") or []
    record["gpu_found"] = bool(gpus)
    return record


def machine_lines(record: dict) -> list[str]:
    probe = record.get("probe") or {}
    machine = probe.get("machine") or {}
    torch, nvml = machine.get("torch") or {}, machine.get("nvml") or {}
    gpus = machine.get("gpus") or []
    install = record.get("install") or {}
    rows = []
    for gpu in gpus:
        capability = gpu.get("capability")
        rows.append(("GPU", f"{gpu.get('name')}, {size(gpu.get('memory_total_bytes'))}"
                            + (f", compute capability {capability}" if capability else "")))
    if not gpus:
        rows.append(("GPU", f"none found (nvidia-smi: {record.get('nvidia_smi')}; NVML: "
                            f"{nvml.get('error') or 'no device'}; torch sees no CUDA device)"))
    rows.append(("driver", f"{nvml.get('driver_version') or NOT_MEASURED} (CUDA driver "
                           f"{nvml.get('cuda_driver_version') or NOT_MEASURED})"))
    rows.append(("torch", f"{torch.get('version')} (CUDA {torch.get('cuda') or 'none'}, HIP {torch.get('hip') or 'none'}; "
                          f"arch list {', '.join(torch.get('arch_list') or []) or 'none'})"))
    host = machine.get("host") or {}
    cpu = (f"{host.get('cpu_model')}, {host.get('cores_logical')} logical cores, {size(host.get('memory_total_bytes'))}; "
           if host.get("cpu_model") else "")
    rows.append(("host", f"{cpu}Python {probe.get('python')} ({probe.get('executable')})"))
    rows.append(("pytest-ftready", f"{probe.get('plugin_version')} from {probe.get('plugin_file')}"))
    rows.append(("installed from the carry", ", ".join(install.get("installed") or []) or "nothing"))
    rows.append(("already there", ", ".join(f"{k} {v}" for k, v in sorted((install.get("present") or {}).items()))
                 or "nothing"))
    rows.append(("environment problems", "; ".join(install.get("problems") or []) or "none"))
    return table(["", ""], rows)


def figure(run: dict, check: str, name: str):
    return (run["checks"].get(check) or {}).get("figures", {}).get(name)


def outcome_of(run: dict, check: str, limit: int = 220) -> str:
    case = run["checks"].get(check)
    if not case:
        return "not run"
    message = case["message"].removeprefix("Failed: ")
    return case["outcome"] if case["outcome"] == "passed" else f"{case['outcome']}: {first_line(message, limit)}"


def short_outcome(run: dict, check: str) -> str:
    case = run["checks"].get(check)
    return case["outcome"] if case else "not run"


def skips(run: dict, prefix: str) -> dict:
    """reason -> the ids starting with ``prefix`` that skipped for it."""
    out: dict = {}
    for check_id, case in run["checks"].items():
        if check_id.startswith(prefix) and case["outcome"] == "skipped":
            out.setdefault(first_line(case["message"]), []).append(check_id)
    return out


def not_run(runs: list, check: str) -> str:
    said = {f"{short_outcome(r, check)}: {first_line(r['checks'].get(check, {}).get('message', ''))}" for r in runs
            if check in r["checks"]}
    return f"`{check}` did not run: " + "; ".join(sorted(said)) if said else f"`{check}` did not run."


def compact(ids: list) -> str:
    """Check ids, a parametrized check's variants folded: `levers.sweep` [recipe, attn=eager, ...]."""
    plain, variants = [], {}
    for check_id in sorted(ids):
        base, _, rest = check_id.partition("[")
        if rest:
            variants.setdefault(base, []).append(rest[:-1])
        else:
            plain.append(f"`{check_id}`")
    return ", ".join(plain + [f"`{base}` [{', '.join(v)}]" for base, v in variants.items()])


def render(record: dict) -> str:
    runs = [r for r in record.get("runs", []) if r.get("checks")]
    gpus = (record.get("probe") or {}).get("machine", {}).get("gpus") or []
    probed = bool(record.get("probe"))
    title = ", ".join(g["name"] for g in gpus) if gpus else "no GPU found" if probed else "stopped before the runs"
    lines = [f"# pytest-ftready GPU run: {title}", "",
             f"{record.get('started')}, {record.get('seconds', 0):.0f} s, exit {record.get('exit_code')}: "
             f"`{record.get('command')}`", ""]
    if not probed:
        lines += ["**The setup stopped before the checks ran** (see `run.log` and the environment problems below); "
                  "nothing was measured.", ""]
    elif not gpus:
        lines += ["**No GPU was found on this machine.** The accelerator and nightly checks skipped, each with its "
                  "reason (below); no GPU figure was measured and none is shown. The figures below are this "
                  "machine's (CPU: weights + live tensor bytes, no CUDA allocator).", ""]
    lines += ["## Machine", ""] + machine_lines(record) + [""]

    lines += ["## Runs", ""] + table(
        ["run", "recipe", "passed", "failed", "skipped", "time", "status"],
        [[r["name"], f"`{r['recipe']}`", *(r.get("counts", {}).get(k, 0) for k in ("passed", "failed")),
          r.get("counts", {}).get("skipped", 0), seconds(r.get("seconds")), r.get("status", "not run")]
         for r in record.get("runs", [])]) + [""]
    build = record.get("build")
    if isinstance(build, dict):
        lines += [f"The 135M-class model: a Llama of the shape in `{Path(build['medium_config']).name}` with "
                  f"{build['medium_parameters']:,} parameters, seeded random weights (bfloat16), the tiny example's "
                  "tokenizer and rows.", ""]
    elif build:
        lines += [f"Building the models: {build}", ""]

    marked = {spec["id"]: spec for spec in (record.get("probe") or {}).get("checks") or []}
    rows = []
    for run in runs:
        groups: dict = {}
        for check_id, case in run["checks"].items():
            if check_id.split("[")[0] in marked:
                groups.setdefault((case["outcome"], first_line(case["message"])), []).append(check_id)
        for (outcome, why), ids in sorted(groups.items()):
            rows.append([run["name"], f"{outcome} ({len(ids)})", compact(ids), why])
    lines += ["## Accelerator and nightly checks", "",
              "Marked `accelerator`: " + ", ".join(f"`{i}`" + (" (GPU recipes)" if s["accelerator"] not in ("yes", "")
                                                              else "") for i, s in marked.items() if s["accelerator"])
              + "; `nightly`: " + ", ".join(f"`{i}`" for i, s in marked.items() if s["nightly"]) + ".", ""]
    lines += (table(["run", "outcome", "checks", "reason"], rows) or ["None ran."]) + [""]

    rows = []
    for run in runs:
        step = run["checks"].get("model.step_memory", {}).get("figures", {})
        error = run["checks"].get("model.forecast_error", {}).get("figures", {})
        if not step and not error:
            continue
        rows.append([run["name"], step.get("step_trainer", error.get("measured_step_trainer", NOT_MEASURED)),
                     size(step.get("peak_device_allocated")), size(step.get("peak_device_reserved")),
                     f"{size(error.get('measured_peak'))} ({error.get('measured_peak_method', NOT_MEASURED)})",
                     size(error.get("forecast_peak")), share(error.get("forecast_error"), signed=True),
                     outcome_of(run, "model.forecast_error", 90)])
    lines += ["## Memory: the measured step and the forecast", "",
              "Peak allocated and reserved: `torch.cuda.max_memory_allocated` / `max_memory_reserved` over the "
              "worst-case step (`model.step_memory`); the forecast (`model.memory_forecast`, from config.json on "
              "fake tensors) against the measured peak (`model.forecast_error`).", ""] + table(
        ["run", "trainer", "peak allocated", "peak reserved", "measured peak (how)", "forecast", "error",
         "model.forecast_error"], rows) + [""]

    rows = []
    for run in runs:
        step = run["checks"].get("model.step_memory", {}).get("figures", {})
        held = run["checks"].get("sustained.throughput", {}).get("figures", {})
        if not step:
            continue
        window = (f"{rate(held.get('tokens_per_s_median'))} ({rate(held.get('tokens_per_s_first_window'))} → "
                  f"{rate(held.get('tokens_per_s_last_window'))})" if held.get("tokens_per_s_median") is not None
                  else short_outcome(run, "sustained.throughput"))
        rows.append([run["name"], f"{rate(step.get('step_tokens_per_s'))} ({step.get('step_tokens', NOT_MEASURED)} "
                                  f"tokens in {seconds(step.get('step_seconds'))})", window,
                     share(held.get("throughput_drop")),
                     f"{seconds(held.get('step_seconds_p50'))} / {seconds(held.get('step_seconds_p99'))}",
                     share(held.get("model_flops_utilization"))])
    lines += ["## Throughput (tokens/s)", ""] + table(
        ["run", "step (worst-case batch)", "sustained median (first → last window)", "drop", "step p50 / p99",
         "MFU (estimate)"], rows) + [""]

    rows = []
    for run in runs:
        if run["checks"].get("sustained.thermal", {}).get("outcome", "skipped") == "skipped" and \
                not (run["series"] or {}).get("sustained.throughput"):
            continue
        thermal = run["checks"]["sustained.thermal"]["figures"]
        held = (run["series"] or {}).get("sustained.throughput", {})
        ranges = {m: spread(held.get(m, [])) for m in ("temperature_c", "sm_clock_mhz", "mem_clock_mhz", "power_w")}
        fmt = lambda m, unit: (f"{ranges[m][0]:,.0f}–{ranges[m][1]:,.0f} {unit}" if ranges[m]  # noqa: E731
                               else NOT_MEASURED)
        rows.append([run["name"], thermal.get("samples", NOT_MEASURED), fmt("temperature_c", "C"),
                     fmt("sm_clock_mhz", "MHz"), fmt("mem_clock_mhz", "MHz"), fmt("power_w", "W"),
                     thermal.get("throttle_reasons", NOT_MEASURED), outcome_of(run, "sustained.thermal")])
    lines += ["## Telemetry over the sustained window (NVML)", ""] + (table(
        ["run", "samples", "temperature", "SM clock", "memory clock", "power", "throttle reasons",
         "sustained.thermal"], rows) or [not_run(runs, "sustained.thermal")]) + [""]

    rows = []
    for run in runs:
        for check_id in sorted(c for c in run["checks"] if c.startswith("levers.sweep[")):
            if run["checks"][check_id]["outcome"] == "skipped":
                continue
            fig = run["checks"][check_id]["figures"]
            bench = run["benchmarks"].get(check_id, {})
            rows.append([run["name"], check_id[len("levers.sweep["):-1], outcome_of(run, check_id),
                         size(fig.get("peak_memory")), rate(fig.get("tokens_per_s")), seconds(bench.get("mean_s")),
                         bench.get("rounds", NOT_MEASURED)])
    kernels = [f"- {r['name']}: SDPA backends {figure(r, 'stack.kernels', 'sdpa_backends') or NOT_MEASURED}; "
               f"kernels the recipe needs: {figure(r, 'stack.kernels', 'kernels_required') or NOT_MEASURED}"
               for r in runs if "stack.kernels" in r["checks"]]
    skipped = [f"- {r['name']}: skipped {compact(ids)}: {why}" for r in runs
               for why, ids in skips(r, "levers.sweep[").items()]
    lines += ["## Kernels and levers (`levers.sweep`, pytest-benchmark)", ""] + (kernels + [""] if kernels else []) + table(
        ["run", "variant", "outcome", "peak memory", "tokens/s", "mean step", "rounds"], rows) + [""] + skipped + [""]

    failed = [f"- {r['name']} `{c}`: {first_line(case['message'])}" for r in runs
              for c, case in r["checks"].items() if case["outcome"] in ("failed", "error")]
    lines += ["## Failures", ""] + (failed or ["None."]) + [""]
    files = sorted(str(p.relative_to(record["_out"])) for p in Path(record["_out"]).rglob("*")
                   if p.is_file() and p.name not in ("summary.md", "summary.json"))
    lines += ["## Files", "", ", ".join(f"`{f}`" for f in files if f.count("/") <= 1) +
              f"; `artifacts/<run>/<recipe>/`: the plugin's report.html, measurements.json, series.json, "
              f"environment.json and the rest ({sum(f.startswith('artifacts/') for f in files)} files)", ""]
    return "\n".join(lines)


def write(out: Path) -> dict:
    """Write ``summary.md`` and ``summary.json`` into ``out``; returns the collected record."""
    out = Path(out)
    record = collect(out)
    record["_out"] = str(out)
    (out / "summary.md").write_text(render(record) + "\n", encoding="utf-8")
    record.pop("_out")
    (out / "summary.json").write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    return record
