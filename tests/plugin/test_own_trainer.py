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
    assert properties(folder / "out.xml", "model.overfit")["pipeline"] == "conftest"  # the Trainer's own labels


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


# ---- data.masking on the labels the team's own Trainer makes ---------------------------------------
# A team Trainer whose preprocessing trains every token: a plain transformers.Trainer over the rendered
# conversations with DataCollatorForLanguageModeling (labels = input_ids), the key column removed by map().
TRAINS_EVERYTHING = '''
def pytest_ftready_trainer(recipe, rows, output_dir, arguments):
    from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                              TrainingArguments)

    tokenizer = AutoTokenizer.from_pretrained(str(recipe.model.path))
    model = AutoModelForCausalLM.from_pretrained(str(recipe.model.path))

    def tokenize(row):
        return {"input_ids": tokenizer.apply_chat_template(row["messages"], tokenize=True, return_dict=False)}

    dataset = rows.map(tokenize, remove_columns=rows.column_names)
    return Trainer(model=model, args=TrainingArguments(**arguments), train_dataset=dataset,
                   data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
'''


def own_trainer_state(tiny_example: Path, artifacts: Path, machine, hook_file: Path):
    from pytest_ftready.checks.registry import all_checks
    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.session.state import RunState
    from pytest_ftready.trainers.conftest import OwnTrainerHook

    all_checks()
    hook = OwnTrainerHook.from_files([str(hook_file)])
    run = RunState(artifacts_root=artifacts, machine_factory=lambda: machine, trainer_hook=lambda: hook)
    return run.recipe_state(load_recipe(tiny_example / "recipe.toml"))


def test_data_masking_judges_the_labels_the_teams_own_trainer_makes(tiny_example, tmp_path, real_machine,
                                                                    run_check, monkeypatch):
    """The template's SFTTrainer (assistant_only_loss) built once over every row: each row's labels
    are its collator's, verified; on the tiny template they are the built-in encoder's labels."""
    import sys

    from pytest_ftready.data.rows import read_rows
    from tests.conftest import values

    monkeypatch.setattr(sys, "path", list(sys.path))
    state = own_trainer_state(tiny_example, tmp_path / "arts", real_machine,
                              ROOT / "conftest_templates" / "own_trainer_trl.py")
    got = values(run_check(state, "data.masking"))
    assert got["pipeline"] == "conftest"
    assert got["trained_span_method"] == "your Trainer's collator (pytest_ftready_trainer)"
    rows = read_rows(state.recipe.data.train)[0]
    own = state.pipeline.encode(rows[:5])
    builtin = [state.encoder.encode(row) for row in rows[:5]]
    assert [e.labels for e in own] == [e.labels for e in builtin] and all(not e.problems for e in own)


def test_a_team_trainer_that_trains_every_token_fails_data_masking(tiny_example, tmp_path, real_machine, run_check,
                                                                   monkeypatch):
    import sys

    from pytest_ftready.outcomes import Fail

    monkeypatch.setattr(sys, "path", list(sys.path))
    hook_file = tmp_path / "hooks" / "conftest.py"
    hook_file.parent.mkdir()
    hook_file.write_text(TRAINS_EVERYTHING, encoding="utf-8")
    state = own_trainer_state(tiny_example, tmp_path / "arts", real_machine, hook_file)
    with pytest.raises(Fail) as info:
        run_check(state, "data.masking")
    assert "wrong_role_trained" in str(info.value) and "(user) carry loss" in str(info.value), str(info.value)
