"""Sustained checks (accelerator, nightly): the recipe's real training step for a sustained
window, tokens/s per window, and the telemetry sampled meanwhile."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from ..machine.compat import load
from ..units import percentile
from ..outcomes import Fail, Skip
from .registry import STAGES, check

CPU_SHORT_SECONDS = 10.0  # --ftready-cpu-short caps the sustained window


@dataclass(frozen=True)
class Step:
    end_s: float  # seconds since the measured window began
    seconds: float
    positions: int  # token positions processed (padded batch)
    tokens: int  # real (non-pad) tokens


def windows(steps: list[Step], window_s: float) -> list[float]:
    """Token positions per second in consecutive windows of ``window_s`` (by step end time)."""
    if not steps:
        return []
    out, bucket, n = [], 0, 1
    busy = 0.0
    for step in steps:
        while step.end_s > n * window_s:
            if busy:
                out.append(bucket / busy)
            bucket, busy, n = 0, 0.0, n + 1
        bucket += step.positions
        busy += step.seconds
    if busy:
        out.append(bucket / busy)
    return out


def throughput_drop(rates: list[float]) -> tuple[float, int]:
    """(drop from the best early window to the last, index of that best window). Early: first third."""
    if len(rates) < 2:
        return 0.0, 0
    early = rates[: max(1, len(rates) // 3)]
    best = max(range(len(early)), key=lambda i: early[i])
    return max(0.0, (early[best] - rates[-1]) / early[best]), best


@dataclass(frozen=True)
class ThermalVerdict:
    max_temperature_c: float | None
    throttled: list[tuple[str, float]]  # (reason, first time seen in seconds)
    thermal_or_power: list[tuple[str, float]]


def thermal_verdict(samples: list[tuple[float, dict]]) -> ThermalVerdict:
    kinds = load("nvml")["kinds"]
    temps = [r["temperature_c"] for _, r in samples if "temperature_c" in r]
    first: dict[str, float] = {}
    for t, reading in samples:
        for reason in reading.get("throttle_reasons", []):
            if reason not in kinds["benign"]:
                first.setdefault(reason, t)
    throttled = sorted(first.items(), key=lambda kv: kv[1])
    serious = [(r, t) for r, t in throttled if r in kinds["thermal"] or r in kinds["power"]]
    return ThermalVerdict(max(temps) if temps else None, throttled, serious)


def sustained_settings(ctx) -> tuple[float, float, float]:
    c = ctx.recipe.checks
    if not ctx.device.is_accelerator:  # --ftready-cpu-short
        total = min(c.sustained_seconds, CPU_SHORT_SECONDS)
        return min(c.warmup_seconds, total / 5), total, min(c.window_seconds, total / 5)
    return c.warmup_seconds, c.sustained_seconds, c.window_seconds


def run_sustained(state, device: str, warmup_s: float, total_s: float, sources) -> tuple[list[Step], object, int]:
    """Train the recipe's real step for warm-up + ``total_s`` seconds with telemetry sampling.
    Every step runs the worst-case batch (micro_batch x max_length of the longest rows), so
    windows do identical work and a drop is the machine's, not the data's."""
    from ..machine.telemetry import Sampler
    from ..engine.training import make_optimizer, make_scheduler, train_step, trainable
    from .model import worst_case_batch

    recipe = state.recipe
    batch = worst_case_batch(state.trainable_examples, recipe.training.micro_batch_size, recipe.data.max_length,
                             state.tokenizer.pad_token_id)
    positions, tokens = int(batch["input_ids"].numel()), int(batch["attention_mask"].sum())
    steps: list[Step] = []
    with trainable(state) as model:
        params = sum(p.numel() for p in model.parameters())
        optimizer = make_optimizer(model, recipe)
        scheduler = make_scheduler(optimizer, recipe, 10 ** 9, constant=True)
        sync = _synchronizer(device)
        deadline = time.perf_counter() + warmup_s
        while time.perf_counter() < deadline:
            train_step(model, optimizer, scheduler, [batch], device)
        sync()
        with Sampler(sources, interval_s=max(0.2, min(1.0, total_s / 50))) as sampler:
            start = time.perf_counter()
            while time.perf_counter() - start < total_s:
                t0 = time.perf_counter()
                train_step(model, optimizer, scheduler, [batch], device)
                sync()
                t1 = time.perf_counter()
                steps.append(Step(t1 - start, t1 - t0, positions, tokens))
    return steps, sampler, params


def _synchronizer(device: str):
    import torch

    if device.startswith("cuda"):
        return torch.cuda.synchronize
    if device.startswith("mps"):
        return torch.mps.synchronize
    return lambda: None


def model_flops_utilization(state, params: int, tokens_per_s: float) -> float | None:
    """6 x parameters FLOPs per token against the device's dense peak (facts), None if unknown."""
    gpu = state.machine.gpus[0] if state.machine.gpus else None
    if gpu is None:
        return None
    row = next((r for r in load("compute")["peak_tflops"] if r["match"] in gpu.name), None)
    peak = row.get(state.recipe.model.dtype) if row else None
    if not peak:
        return None
    return 6 * params * tokens_per_s / (peak * 1e12)


@check("sustained.throughput", stage=STAGES["sustained"], accelerator=True, nightly=True,
       requires=("data.masking", "model.step_memory"))
def throughput(ctx) -> None:
    """Tokens/s per window over a sustained run: the drop from the best early window to the last stays small."""
    from ..machine.telemetry import sources_for

    state, recipe = ctx.state, ctx.recipe
    device = ctx.torch_device()
    warmup_s, total_s, window_s = sustained_settings(ctx)
    factory = state.run.telemetry_factory or sources_for
    sources, missing = factory(ctx.device, ctx.machine)
    steps, sampler, params = run_sustained(state, device, warmup_s, total_s, sources)
    rates = windows(steps, window_s)
    state.results["telemetry"] = (sampler.samples, missing)
    state.results["sustained_windows"] = rates
    ctx.series("tokens_per_s_windows", rates)
    for metric in ("temperature_c", "sm_clock_mhz", "mem_clock_mhz", "power_w", "cpu_percent"):
        if values := sampler.series(metric):
            ctx.series(metric, values)
    if len(rates) < 2:
        raise Skip(f"only {len(rates)} throughput window(s) in {total_s:.0f} s: raise sustained_seconds")
    drop, best = throughput_drop(rates)
    median_rate = statistics.median(rates)
    state.results["sustained_tokens_per_s"] = median_rate
    seconds = [s.seconds for s in steps]
    ctx.measure("windows", len(rates), "windows")
    ctx.measure("tokens_per_s_first_window", rates[0], "tokens/s")
    ctx.measure("tokens_per_s_best_early_window", rates[best], "tokens/s")
    ctx.measure("tokens_per_s_last_window", rates[-1], "tokens/s")
    ctx.measure("tokens_per_s_median", median_rate, "tokens/s")
    ctx.measure("real_tokens_per_s", sum(s.tokens for s in steps) / sum(seconds), "tokens/s")
    ctx.measure("throughput_drop", drop, "share")
    ctx.measure("step_seconds_p50", percentile(seconds, 0.5), "s")
    ctx.measure("step_seconds_p90", percentile(seconds, 0.9), "s")
    ctx.measure("step_seconds_p99", percentile(seconds, 0.99), "s")
    ctx.measure("telemetry_overhead", sampler.overhead_share, "share")
    ctx.measure("telemetry_missing", "; ".join(missing) or "none", "")
    mfu = model_flops_utilization(state, params, median_rate)
    if mfu is not None:
        ctx.measure("model_flops_utilization", mfu, "share", estimate=True)
    if drop > recipe.checks.max_throughput_drop:
        verdict = thermal_verdict(sampler.samples)
        cause = ""
        if verdict.thermal_or_power:
            reason, when = verdict.thermal_or_power[0]
            cause = f"; it coincides with {reason} throttling from {when:.0f} s"
        raise Fail(f"throughput fell {drop:.0%} from {rates[best]:,.0f} tokens/s (window {best + 1}) to "
                   f"{rates[-1]:,.0f} tokens/s (last of {len(rates)}), more than max_throughput_drop "
                   f"{recipe.checks.max_throughput_drop:.0%}{cause}")


@check("sustained.thermal", stage=STAGES["sustained"] + 1, accelerator=True, nightly=True)
def thermal(ctx) -> None:
    """Temperature stays under max_temperature_c; throttling is reported with its reason and start."""
    found = ctx.state.results.get("telemetry")
    if found is None:
        raise Skip("sustained.throughput did not run: no telemetry was sampled")
    samples, missing = found
    verdict = thermal_verdict(samples)
    ctx.measure("samples", len(samples), "samples")
    if verdict.max_temperature_c is None:
        raise Skip("; ".join(missing) or "no temperature readings")
    limit = ctx.recipe.checks.max_temperature_c
    ctx.measure("max_temperature", verdict.max_temperature_c, "C")
    ctx.measure("throttle_reasons", ", ".join(f"{r} from {t:.0f} s" for r, t in verdict.throttled) or "none", "")
    ctx.series("throttle_events", [[r, t] for r, t in verdict.throttled])  # marked on the report's telemetry charts
    problems = []
    if verdict.max_temperature_c > limit:
        hot = next(t for t, r in samples if r.get("temperature_c", 0) > limit)
        problems.append(f"the GPU reached {verdict.max_temperature_c:.0f} C (limit max_temperature_c {limit:.0f}), "
                        f"above the limit from {hot:.0f} s")
    if verdict.thermal_or_power:
        problems.append("clocks were throttled: " + ", ".join(f"{r} from {t:.0f} s" for r, t in verdict.thermal_or_power)
                        + "; improve cooling or airflow, or lower the power limit deliberately (nvidia-smi -pl)")
    if problems:
        raise Fail("\n".join(problems))
