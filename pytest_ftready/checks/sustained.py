"""Sustained checks (accelerator, nightly): the recipe's real training step for a sustained
window (the session's ``sustained`` fact, run once by the engine), tokens/s per window, and
the telemetry sampled meanwhile."""

from __future__ import annotations

from ..engine.sustained_run import model_flops_utilization, thermal_verdict, throughput_drop
from ..outcomes import Fail, Skip
from ..units import percentile
from .registry import STAGES, check


@check("sustained.throughput", stage=STAGES["sustained"], accelerator=True, nightly=True,
       requires=("data.masking", "model.step_memory"))
def throughput(ctx) -> None:
    """Tokens/s per window over a sustained run: the drop from the best early window to the last stays small."""
    state, recipe = ctx.state, ctx.recipe
    run = state.sustained
    steps, rates = run.steps, run.rates
    ctx.series("tokens_per_s_windows", rates)
    for metric, values in run.series.items():
        ctx.series(metric, values)
    if len(rates) < 2:
        raise Skip(f"only {len(rates)} throughput window(s) in the sustained run: raise sustained_seconds")
    drop, best = throughput_drop(rates)
    median_rate = percentile(rates, 0.5)
    seconds = [s.seconds for s in steps]
    ctx.measure("windows", len(rates), "windows")
    ctx.measure("steps_measured", len(steps), "steps")
    ctx.measure("tokens_per_s_first_window", rates[0], "tokens/s")
    ctx.measure("tokens_per_s_best_early_window", rates[best], "tokens/s")
    ctx.measure("tokens_per_s_last_window", rates[-1], "tokens/s")
    ctx.measure("tokens_per_s_median", median_rate, "tokens/s")
    ctx.measure("real_tokens_per_s", sum(s.tokens for s in steps) / sum(seconds), "tokens/s")
    ctx.measure("throughput_drop", drop, "share")
    ctx.measure("step_seconds_p50", percentile(seconds, 0.5), "s")
    ctx.measure("step_seconds_p90", percentile(seconds, 0.9), "s")
    ctx.measure("step_seconds_p99", percentile(seconds, 0.99), "s")
    ctx.measure("telemetry_overhead", run.telemetry_overhead, "share")
    ctx.measure("telemetry_missing", "; ".join(run.missing) or "none", "")
    mfu = model_flops_utilization(ctx.machine, recipe.model.dtype, run.parameters, median_rate)
    if mfu is not None:
        ctx.measure("model_flops_utilization", mfu, "share", estimate=True)
    if drop > recipe.checks.max_throughput_drop:
        verdict = thermal_verdict(run.samples)
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
    run = ctx.state.sustained
    samples, missing = run.samples, run.missing
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
        problems.append("clocks were throttled: "
                        + ", ".join(f"{r} from {t:.0f} s" for r, t in verdict.thermal_or_power)
                        + "; improve cooling or airflow, or lower the power limit deliberately (nvidia-smi -pl)")
    if problems:
        raise Fail("\n".join(problems))
