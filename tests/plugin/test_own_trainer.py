"""A team's own Trainer through the ``pytest_ftready_trainer`` hook, used as a team's repo uses
it: ``conftest_templates/own_trainer_trl.py`` copied to conftest.py beside a copy of the tiny
example, then ``pytest --ftready=recipe.toml`` in a subprocess. One whole run of the template
(the four checks that run the Trainer), and one of a team Trainer whose resume loses the
scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import copy_example
from tests.helpers import outcomes, properties
from tests.plugin.full_run import run_pytest

SLOW = pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = (ROOT / "conftest_templates" / "own_trainer_trl.py").read_text(encoding="utf-8")
RUNS_THE_TRAINER = ("model.step_memory", "model.overfit", "lifecycle.resume", "lifecycle.generate")

# A team's Trainer that, on resume, loads only the optimizer ("so an edited schedule takes
# effect"): the saved scheduler state is lost, only in the resuming (fresh) process.
LOSES_THE_SCHEDULER = '''

from trl import SFTTrainer


class ResumeKeepsOurSchedule(SFTTrainer):
    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is not None:
            import os

            import torch

            state = torch.load(os.path.join(checkpoint, "optimizer.pt"), map_location="cpu", weights_only=True)
            self.optimizer.load_state_dict(state)
'''


def team_repo(folder: Path, model_dir: Path, conftest: str) -> Path:
    example = copy_example(folder, model_dir)
    (example / "conftest.py").write_text(conftest, encoding="utf-8")
    return example


@pytest.fixture(scope="module")
def own_trainer_run(tmp_path_factory, tiny_model_dir):
    """The template's hook in a team's conftest.py: the checks that run the Trainer, run once."""
    folder = team_repo(tmp_path_factory.mktemp("own-trainer") / "tiny", tiny_model_dir, TEMPLATE)
    result = run_pytest(folder, "-k", " or ".join(RUNS_THE_TRAINER), "--junitxml=out.xml")
    assert (folder / "out.xml").is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    return folder, result


@SLOW
def test_the_templates_trainer_is_what_step_overfit_resume_and_generate_run(own_trainer_run):
    folder, result = own_trainer_run
    found = outcomes(folder / "out.xml")
    assert {check: found[check][0] for check in RUNS_THE_TRAINER} == dict.fromkeys(RUNS_THE_TRAINER, "passed"), \
        result.stdout[-3000:]
    for check in RUNS_THE_TRAINER:  # named by the class the hook returned
        assert properties(folder / "out.xml", check)["step_trainer"] == "conftest SFTTrainer"
    step = properties(folder / "out.xml", "model.step_memory")
    assert int(step["step_tokens[tokens]"]) > 0 and int(step["engine_step_tokens[tokens]"]) > 0  # beside the engine's
    resume = properties(folder / "out.xml", "lifecycle.resume")  # its own resume_from_checkpoint, in a fresh process
    assert resume["resumed_steps[steps]"] == "2" and float(resume["resume_max_loss_difference[nats]"]) == 0
    assert properties(folder / "out.xml", "model.overfit")["pipeline"] == "builtin"  # data checks: the recipe's


@SLOW
def test_a_team_trainer_whose_resume_loses_the_scheduler_fails_lifecycle_resume(tmp_path, tiny_model_dir):
    assert TEMPLATE.count("    return SFTTrainer(") == 1
    planted = TEMPLATE.replace("    return SFTTrainer(", "    return ResumeKeepsOurSchedule(") + LOSES_THE_SCHEDULER
    folder = team_repo(tmp_path / "tiny", tiny_model_dir, planted)
    result = run_pytest(folder, "-k", "lifecycle.resume", "--junitxml=out.xml")
    state, message = outcomes(folder / "out.xml").get("lifecycle.resume", ("missing", result.stdout[-3000:]))
    assert state == "failed", message
    # the checkpoint is whole: only the fresh process, which built the team's class from conftest.py, lost it
    assert "conftest ResumeKeepsOurSchedule: " in message, message  # whose resume: the class the hook returned
    assert "cause: the scheduler state: learning rate 0.01 at step 3 after the resume, 0.005 uninterrupted" in message
    assert "lacks" not in message, message


def test_a_hook_whose_trainer_drops_the_handed_bounds_fails_naming_the_key(tiny_example, tmp_path, monkeypatch):
    """The template imported by path (as the resume's fresh process imports a conftest), its Trainer
    built over real rows, but the hook hands it no max_steps: the run would not be the bounded one."""
    import json
    import sys
    from dataclasses import asdict

    from pytest_ftready.machine.devices import Device
    from pytest_ftready.outcomes import Fail
    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.trainers.base import Bounds, ResumeRequest, RunRows
    from pytest_ftready.trainers.conftest import ConftestTrainer, OwnTrainerHook

    monkeypatch.setattr(sys, "path", list(sys.path))
    template = OwnTrainerHook.from_files([str(ROOT / "conftest_templates" / "own_trainer_trl.py")])
    monkeypatch.delitem(sys.modules, "_ftready_own_trainer_0")
    recipe = load_recipe(tiny_example / "recipe.toml")
    cpu = asdict(Device("cpu", "cpu", "cpu", None))
    inputs = ResumeRequest(str(recipe.source), str(tmp_path), "", 2, cpu).inputs(recipe)  # as a fresh process does
    lines = (tiny_example / "data" / "train.jsonl").read_text(encoding="utf-8").splitlines()[:4]
    run = RunRows.write(tmp_path / "run", [json.loads(line) for line in lines])

    def unbounded(**kwargs):
        kwargs["arguments"].pop("max_steps")
        return template.call(**kwargs)

    with pytest.raises(Fail) as info, ConftestTrainer(OwnTrainerHook(unbounded)).built(inputs, run, Bounds.step()):
        pass
    assert "does not use the arguments the check handed it: its args have max_steps -1 (handed 1)" in str(info.value)
    with pytest.raises(Fail, match=r"^pytest_ftready_trainer raised ZeroDivisionError: division by zero$"), \
            ConftestTrainer(OwnTrainerHook(lambda **kwargs: 1 / 0)).built(inputs, run, Bounds.step()):
        pass
