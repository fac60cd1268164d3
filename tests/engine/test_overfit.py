"""Why an overfit did not reach its target: told apart from the loss curve alone."""

import pytest

from pytest_ftready.engine.overfit import diagnose, slope


def test_slope_is_the_least_squares_change_per_step():
    assert slope([5.0, 4.0, 3.0, 2.0]) == pytest.approx(-1.0)
    assert slope([1.0]) == 0.0


def test_a_flat_or_rising_loss_is_broken():
    message = diagnose([5.0, 5.1, 4.9, 5.2] * 10, 0.1, 1e-4)
    assert "did not fall" in message and "labels, template or optimizer settings are broken" in message


def test_a_loss_still_falling_asks_for_more_steps_with_a_figure():
    losses = [9.75 - 0.031 * i for i in range(300)]  # 9.75 -> ~0.5, still falling steadily
    message = diagnose(losses, 0.1, 1e-3)
    assert "fell 95%" in message and "still falling" in message
    assert "raise [checks] overfit_steps to ~" in message and "broken" not in message
    more = int(message.split("needs ~")[1].split(" ")[0])
    assert 10 <= more <= 20  # (0.48 - 0.1) / 0.031


def test_a_loss_that_fell_then_stopped_names_capacity_or_learning_rate():
    losses = [6.0 - i * 0.5 for i in range(8)] + [2.0] * 40
    message = diagnose(losses, 0.1, 1e-4)
    assert "stopped falling" in message and "raise [adapter] r or learning_rate" in message
