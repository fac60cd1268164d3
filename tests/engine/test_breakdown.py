"""engine.breakdown: where the measured step's memory goes (the levers are forecast.levers')."""

from pytest_ftready.engine.breakdown import Breakdown

MiB = 1024 ** 2


def test_activation_bytes_are_what_the_peak_holds_besides_the_rest():
    b = Breakdown(weights_bytes=1000 * MiB, frozen_numel=500 * MiB, trainable_bytes=10 * MiB,
                  gradient_bytes=10 * MiB, optimizer_state_bytes=20 * MiB, peak_bytes=2000 * MiB)
    assert b.activation_bytes == 970 * MiB
    assert Breakdown(100, 0, 100, 100, 50, 200).activation_bytes == 0  # never negative
