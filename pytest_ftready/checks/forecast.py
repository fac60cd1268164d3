"""Forecast checks: will the recipe's step fit its target device, answered from the model's
config alone before any weights are loaded (model.memory_forecast), and how far the forecast
is from the real step where the real step runs (model.forecast_error)."""

from __future__ import annotations

from ..outcomes import Fail, Skip
from ..units import percentile
from .registry import STAGES, check

REPORT_KEY = "memory_forecast"  # the report, cached for model.forecast_error


def _target(ctx):
    """The recipe's [hardware] target, else this machine's accelerator, else None."""
    from ..machine.targets import TargetError, device_target, resolve_target

    text = ctx.recipe.hardware.target
    if text:
        try:
            return resolve_target(text, f"{ctx.recipe.source} [hardware] target")
        except TargetError as exc:
            raise Fail(str(exc)) from None
    device = ctx.device
    if device.is_accelerator and not device.missing and device.memory_total_bytes:
        return device_target(device.kind, device.name, device.memory_total_bytes)
    return None


def _p95_length(state):
    """p95 of the encoded lengths for the max_length lever, when the tokenizer is here."""
    try:
        return percentile([e.full_length for e in state.encoded], 0.95) or None
    except Fail:  # no tokenizer here (a hub model offline): the lever is left out
        return None


def _report(ctx):
    from ..engine.forecast import ConfigUnavailable, TraceError, forecast_report

    cached = ctx.state.results.get(REPORT_KEY)
    if cached is not None:
        return cached
    try:
        report = forecast_report(ctx.recipe, _target(ctx), p95_length=_p95_length(ctx.state))
    except ConfigUnavailable as exc:
        raise Skip(f"the model's config is not available here: {exc}") from None
    except TraceError as exc:
        raise Skip(str(exc)) from None
    ctx.state.results[REPORT_KEY] = report
    return report


@check("model.memory_forecast", stage=STAGES["model.forecast"])
def memory_forecast(ctx) -> None:
    """Forecast the worst-case step's peak memory from the model config alone; it fits the target less the headroom."""
    from ..engine.forecast import render

    report = _report(ctx)
    f = report.forecast
    for name, value in f.categories().items():
        ctx.measure(f"forecast_{name}", value, "bytes", estimate=True)
    ctx.measure("forecast_trainable_weights", f.trainable_bytes, "bytes", estimate=True)
    ctx.measure("forecast_peak", f.peak_bytes, "bytes", estimate=True)
    ctx.measure("forecast_peak_phase", f.peak_phase, "")
    ctx.measure("forecast_trace_seconds", f.trace_seconds, "s")
    if f.notes:
        ctx.measure("forecast_notes", " | ".join(f.notes), "")
    if report.target is None:
        ctx.measure("forecast_target", "none: set [hardware] target to judge the forecast", "")
        return
    ctx.measure("forecast_target", report.target.name, "")
    ctx.measure("forecast_need", report.need_bytes, "bytes", estimate=True)
    ctx.measure("forecast_usable", report.usable_bytes, "bytes")
    for lever in report.levers:
        ctx.measure(f"forecast_saves[{lever.name}]", lever.saves_bytes, "bytes", estimate=True)
    if not report.fits:
        raise Fail(render(report))


@check("model.forecast_error", stage=STAGES["model.step"], requires=("stack.precision", "stack.kernels"))
def forecast_error(ctx) -> None:
    """The forecast against the real step's peak here (CPU: live tensor bytes; CUDA: max_memory_allocated)."""
    from ..engine.forecast import ConfigUnavailable, TraceError, error_share, forecast, measured_step_peak

    device = ctx.torch_device()
    kind = ctx.device.kind
    if kind not in ("cpu", "cuda", "rocm"):
        raise Skip(f"{kind} has no allocator peak to compare with (MPS reports the driver's total only)")
    on_accelerator = kind in ("cuda", "rocm")
    report = ctx.state.results.get(REPORT_KEY)
    if report is not None and (report.target is not None and report.target.kind in ("cuda", "rocm")) == on_accelerator:
        predicted = report.forecast
    else:  # the optimizer must be traced as this device runs it
        try:
            predicted = forecast(ctx.recipe, accelerator_optimizer=on_accelerator)
        except (ConfigUnavailable, TraceError) as exc:
            raise Skip(f"no forecast to compare: {exc}") from None
    measured = measured_step_peak(ctx.state, ctx.recipe, device, count_tensors=not on_accelerator)
    ctx.measure("forecast_peak", predicted.peak_bytes, "bytes", estimate=True)
    ctx.measure("measured_peak", measured, "bytes")
    ctx.measure("measured_peak_method", "max_memory_allocated" if on_accelerator else "weights + live tensor bytes", "")
    ctx.measure("forecast_error", error_share(predicted.peak_bytes, measured), "share")
