"""What every trainer's own run must show, asserted the same way for each trainer (TRL, Axolotl):
the overfit beside the engine's, an exact resume in a fresh process, a lost scheduler named."""

from __future__ import annotations

import pytest

from pytest_ftready.outcomes import Fail


def values(ctx) -> dict:
    return {m.name: m.value for m in ctx.measured}


def assert_overfit_beside_the_engines(state, run_check) -> None:
    got = values(run_check(state, "model.overfit"))
    assert got["step_trainer"] == state.trainer.step_trainer
    assert got["overfit_final_loss"] <= 0.1 < got["overfit_first_loss"]
    assert got["engine_overfit_final_loss"] <= 0.1  # the engine's run of the same examples, side by side
    run_check(state, "lifecycle.generate")  # the trainer's trained adapter reloads and generates the same


def assert_resume_gives_the_same_losses(state, run_check) -> None:
    got = values(run_check(state, "lifecycle.resume"))
    run = state.resume_run
    assert run.difference == "" and got["resume_max_loss_difference"] == 0.0
    assert run.resumed_losses == run.straight_losses[run.steps // 2:]
    assert (state.saved_run.checkpoint / "scheduler.pt").exists()  # the trainer's own checkpoint


def assert_a_lost_scheduler_fails_naming_it(state, run_check) -> None:
    (state.saved_run.checkpoint / "scheduler.pt").unlink()
    with pytest.raises(Fail) as info:
        run_check(state, "lifecycle.resume")
    message = str(info.value)
    assert message.startswith(f"{state.trainer.step_trainer}: step ")
    assert "the scheduler state (scheduler.pt)" in message and "learning rate" in message
