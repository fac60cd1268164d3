"""Forecast checks: will the recipe's step fit its target device, answered from the model's
config alone before any weights are loaded (model.memory_forecast), and how far the forecast
is from the real step where the real step runs (model.forecast_error)."""

from __future__ import annotations

from ..outcomes import Fail, Skip
from ..units import human_bytes
from ..trainers import ENGINE
from .registry import STAGES, check

FORECAST_TOLERANCE = 0.10  # the bar the suite holds the forecast to against the real CPU step


@check("model.memory_forecast", stage=STAGES["model.forecast"])
def memory_forecast(ctx) -> None:
    """Forecast the worst-case step's peak memory from the model config alone; it fits the target less the headroom."""
    from ..outputs.forecast_text import render

    report = ctx.state.memory_forecast
    f = report.forecast
    for name, value in f.categories().items():
        ctx.measure(f"forecast_{name}", value, "bytes", estimate=True)
    ctx.measure("forecast_trainable_weights", f.trainable_bytes, "bytes", estimate=True)
    ctx.measure("forecast_peak", f.peak_bytes, "bytes", estimate=True)
    if f.paged_state_bytes:
        ctx.measure("forecast_paged_optimizer_state", f.paged_state_bytes, "bytes", estimate=True)
    ctx.measure("forecast_peak_phase", f.peak_phase, "")
    ctx.measure("forecast_trace_seconds", f.trace_seconds, "s")
    if f.notes:
        ctx.measure("forecast_notes", " | ".join(f.notes), "")
    if ctx.recipe.origin is not None and ctx.recipe.origin.memory_notes:  # the trainer config's levers not modelled
        ctx.measure("config_memory_notes", " | ".join(ctx.recipe.origin.memory_notes), "")
    if report.target is None:
        raise Skip("no target device to judge the forecast against (the forecast is recorded): set [hardware] "
                   "target (e.g. \"24GiB\" or \"H100\") or pass --target, or run where a GPU is")
    ctx.measure("forecast_target", report.target.name, "")
    ctx.measure("forecast_need", report.need_bytes, "bytes", estimate=True)
    ctx.measure("forecast_usable", report.usable_bytes, "bytes")
    for lever in report.levers:
        ctx.measure(f"forecast_saves[{lever.name}]", lever.saves_bytes, "bytes", estimate=True)
    if not report.fits:
        raise Fail(render(report))


@check("model.forecast_error", stage=STAGES["model.step"], requires=("stack.precision", "stack.kernels"))
def forecast_error(ctx) -> None:
    """The forecast of the step that ran here (the recipe's trainer's, on this device) against its measured peak
    (CPU: live tensor bytes; CUDA: max_memory_allocated), the target device's forecast beside it."""
    from ..forecast.trace import ConfigUnavailable, TraceError, forecast, measured_step_peak
    from ..forecast.trainers import measured_step

    device = ctx.torch_device()
    kind = ctx.device.kind
    if kind == "mlx":
        return _mlx_forecast_error(ctx)
    if kind not in ("cpu", "cuda", "rocm"):
        raise Skip(f"{kind} has no allocator peak to compare with (MPS reports the driver's total only)")
    on_accelerator = kind in ("cuda", "rocm")
    loss = ctx.recipe.training.loss
    if loss in ("fused_linear", "cut_cross_entropy") and kind != "cuda":
        raise Skip(f"the real step's [training] loss = \"{loss}\" needs its Triton kernel on an NVIDIA GPU; this "
                   f"machine trains on {kind} (the forecast models the kernel: see model.memory_forecast)")
    trainer = ctx.state.trainer
    if trainer.name == ENGINE:
        measured, tokens = measured_step_peak(ctx.state, ctx.recipe, device, count_tensors=not on_accelerator), None
    else:  # the trainer's own step, the run the team launches
        measured, tokens = trainers_step_peak(ctx, on_accelerator)
    step = measured_step(trainer.name, kind, tokens)
    report = ctx.state.computed("memory_forecast")
    if report is not None and report.forecast.step == step:
        predicted = report.forecast
    else:  # the forecast of the path that ran here: this device's kernels and optimizer, this trainer's step
        try:
            predicted = forecast(ctx.recipe, step=step)
        except (ConfigUnavailable, TraceError) as exc:
            raise Skip(f"no forecast to compare: {exc}") from None
        if report is not None:  # the target device's forecast beside it (another device may run other kernels)
            ctx.measure("target_forecast_peak", report.forecast.peak_bytes, "bytes", estimate=True)
            ctx.measure("target_forecast_path", report.forecast.path, "")
    _judge(ctx, predicted.peak_bytes, predicted.path, measured,
           "max_memory_allocated" if on_accelerator else "weights + live tensor bytes")


def _judge(ctx, predicted: int, path: str, measured: int, method: str) -> None:
    """The forecast ``predicted`` (by ``path``) against the ``measured`` peak of the trainer's step."""
    from ..forecast.trace import error_share

    trainer = ctx.state.trainer
    ctx.measure("forecast_peak", predicted, "bytes", estimate=True)
    ctx.measure("forecast_path", path, "")
    ctx.measure("measured_step_trainer", trainer.step_trainer, "")
    ctx.measure("measured_peak", measured, "bytes")
    ctx.measure("measured_peak_method", method, "")
    error = error_share(predicted, measured)
    ctx.measure("forecast_error", error, "share")
    if abs(error) > FORECAST_TOLERANCE:
        raise Fail(f"the forecast peak {human_bytes(predicted)} is {error:+.0%} off the measured "
                   f"{human_bytes(measured)} of {trainer.step_trainer}'s step on {ctx.device.kind} (tolerance "
                   f"{FORECAST_TOLERANCE:.0%}; forecast path: {path}): model.memory_forecast's verdict is "
                   "not to be trusted for this recipe here; judge by model.step_memory")


def _mlx_forecast_error(ctx) -> None:
    """An MLX recipe: mlx-lm's step forecast from config.json (forecast/mlx.py) against the peak
    ``mx.get_peak_memory()`` measured of mlx-lm's own step here."""
    own = getattr(ctx.state.trainer, "forecast", None)
    if own is None:
        raise Skip(f"an MLX recipe whose trainer is {ctx.state.trainer.label}: the MLX forecast is held against "
                   "mlx-lm's own step (pip install \"mlx[cpu]\" \"mlx-lm[cpu]\")")
    measured, _ = trainers_step_peak(ctx, on_accelerator=False)
    predicted = own(ctx.state.run_inputs())
    if predicted is None:
        raise Skip("no MLX forecast: the model's config.json is not readable here")
    _judge(ctx, predicted.peak_bytes, "mlx-lm step (forecast/mlx.py)", measured, "mx.get_peak_memory")


def trainers_step_peak(ctx, on_accelerator: bool) -> tuple[int, int]:
    """The peak of the step the recipe's trainer ran (model.step_memory's fact), as the forecast
    counts it (the allocator's allocated peak on an accelerator, weights + live tensors on a CPU),
    and the token positions of the micro-batch it ran."""
    name = ctx.state.trainer.step_trainer
    try:
        step = ctx.state.step
    except Fail as exc:
        raise Skip(f"{name}'s step did not run, so there is no measured step to judge the forecast by "
                   f"(model.step_memory says why): {str(exc).splitlines()[0]}") from None
    if step.out_of_memory:
        raise Skip(f"{name}'s step ran out of memory here, so it has no peak to judge the forecast by "
                   "(model.step_memory reports it)")
    if on_accelerator and step.device_allocated_bytes is not None:
        return step.device_allocated_bytes, step.tokens_per_step
    return step.peak_bytes, step.tokens_per_step
