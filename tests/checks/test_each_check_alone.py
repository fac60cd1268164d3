"""Any single check does its job when it runs alone (as `pytest -k <id>` runs it): it computes
the facts it needs itself, so it never skips because another check did not run."""

from __future__ import annotations

import pytest

from pytest_ftready.checks.registry import all_checks
from pytest_ftready.outcomes import Fail, Skip

# Checks that skip on the tiny example for a reason of their own, and that reason.
OWN_SKIPS = {
    "checkpoint.revision": "a local model folder has no hub revision",
    "repro.pins": "no package pins declared",
    "privacy.retention": "the backups folder",
    "model.memory_forecast": "no target device to judge the forecast against",  # a CPU-only machine  # the example declares backups/ but ships no backup
}
# Checks that train and restart a model alone (seconds each): CI's second line runs them
# (pytest tests -m "slow or faults_slow"); whole runs cover them in the default one.
SLOW_ALONE = {"lifecycle.resume"}
ALONE = [pytest.param(spec.id, marks=[pytest.mark.slow] if spec.id in SLOW_ALONE else [])
         for spec in all_checks() if not spec.accelerator]
# Units that count what a check looked at; every check states at least one (issue 32).
LOOKED_AT = {"files", "bytes", "rows", "tokens", "steps", "shards", "ranks", "paths", "examples", "packages",
             "generators", "precisions", "kernels", "levers", "elements", "samples", "checkpoints", "bugs"}
# Checks that judge a declaration, not a body of material: nothing to count.
DECLARATIONS = {"privacy.license": "the model's license and the recipe's data rights"}


@pytest.mark.parametrize("check_id", ALONE)
def test_each_check_selected_alone_passes_or_skips_for_its_own_reason(check_id, make_state, run_check):
    state = make_state()
    spec = next(s for s in all_checks() if s.id == check_id)
    if spec.applies and spec.applies(state.recipe):
        pytest.skip(f"{check_id} does not apply to the tiny recipe")
    try:
        run_check(state, check_id)
    except Skip as exc:
        assert check_id in OWN_SKIPS and OWN_SKIPS[check_id] in str(exc), f"{check_id} skipped: {exc}"
        return
    except Fail as exc:
        pytest.fail(f"{check_id} failed alone: {exc}")
    assert check_id not in OWN_SKIPS
    counted = [(m.name, m.value, m.unit) for m in state.run.measurements if m.check == check_id and m.unit in LOOKED_AT]
    assert counted or check_id in DECLARATIONS, f"{check_id} passed without stating how much it looked at"


def test_progress_lines_reach_the_terminal_sink_while_the_overfit_runs(make_state, run_check):
    state = make_state()
    lines = []
    state.run.progress = lines.append
    run_check(state, "model.overfit")
    assert any(line.startswith("ftready tiny: model.overfit step 1/") and "loss" in line for line in lines), lines


def test_an_overfit_that_falls_too_slowly_says_how_many_steps_it_needs(make_state, run_check):
    state = make_state(overfit_steps="20")  # the tiny model needs ~70 steps: cut short, it is still falling
    with pytest.raises(Fail) as info:
        run_check(state, "model.overfit")
    message = str(info.value)
    assert "overfit of 8 examples: the loss fell" in message and "still falling" in message, message
    assert "raise [checks] overfit_steps to ~" in message and "broken" not in message
