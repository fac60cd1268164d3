"""Faults: two runs sharing one artifacts folder at once; pytest -n (pytest-xdist)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_two_runs_sharing_an_artifacts_folder_never_use_each_others_checkpoint(make_state, run_check, tiny_example,
                                                                               real_machine, monkeypatch):
    from pytest_ftready.trainers import worker
    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.session.state import RunState

    first = make_state()
    other_recipe = tiny_example / "recipe-b.toml"  # same name, other seed: another team member's run
    other_recipe.write_text((tiny_example / "recipe.toml").read_text().replace("seed = 42", "seed = 7"))
    second = RunState(artifacts_root=first.run.artifacts_root,
                      machine_factory=lambda: real_machine).recipe_state(load_recipe(other_recipe))
    assert first.artifacts == second.artifacts

    real_resume = worker.run
    interleaved = []

    def second_run_saves_in_between(trainer, request, *args):
        if not interleaved:  # the first run saved its checkpoint; the second run does its whole resume now
            interleaved.append(Path(request.folder))
            run_check(second, "lifecycle.resume")
        return real_resume(trainer, request, *args)

    monkeypatch.setattr(worker, "run", second_run_saves_in_between)
    run_check(first, "lifecycle.resume")  # would resume the other run's state if they shared a folder
    assert first.scratch != second.scratch and first.scratch.parent == second.scratch.parent == first.artifacts
    assert interleaved[0].parent == first.scratch


def test_pytest_n_is_refused_with_one_line(pytester, tiny_example):
    pytest.importorskip("xdist")
    result = pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "-n", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert errors == ["ERROR: ftready: the checks of a recipe share one loaded model and run in order in one process; "
                      "run them without -n (pytest-xdist), e.g. -n 0"]
