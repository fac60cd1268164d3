"""Forecast-versus-measured tables shared by the tiny-model test and the opt-in real-model test."""

from __future__ import annotations

from pytest_ftready.forecast.levers import with_changes
from pytest_ftready.forecast.trace import error_share, forecast, measured_step_peak
from pytest_ftready.units import human_bytes

TOLERANCE = 0.10  # the bar: within +-10 % of the measured CPU peak


def variants(recipe):
    """The recipe and each lever variant of the issue: checkpointing on/off, micro-batch 1/4,
    max_length halved."""
    t = recipe.training
    return [
        ("recipe", []),
        (f"checkpointing={'off' if t.gradient_checkpointing else 'on'}",
         [("training", "gradient_checkpointing", not t.gradient_checkpointing)]),
        ("micro_batch=1", [("training", "micro_batch_size", 1)]),
        ("micro_batch=4", [("training", "micro_batch_size", 4)]),
        (f"max_length={recipe.data.max_length // 2}", [("data", "max_length", recipe.data.max_length // 2)]),
    ]


def error_table(state) -> list[tuple[str, int, int, float]]:
    rows = []
    for name, changes in variants(state.recipe):
        recipe = with_changes(state.recipe, changes)
        predicted = forecast(recipe).peak_bytes
        measured = measured_step_peak(state, recipe, "cpu", count_tensors=True)
        rows.append((name, predicted, measured, error_share(predicted, measured)))
    print(f"\n{'variant':<22}{'forecast':>14}{'measured':>14}{'error':>9}")
    for name, predicted, measured, error in rows:
        print(f"{name:<22}{human_bytes(predicted):>14}{human_bytes(measured):>14}{error:>+9.1%}")
    return rows
