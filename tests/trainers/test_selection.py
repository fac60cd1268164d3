"""Which trainer a recipe's checks run, and the measurements that say so on every data and model check."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_ftready.recipe.schema import load_recipe
from pytest_ftready.trainers import TRAINERS, select_trainer, trainer_named

ROOT = Path(__file__).resolve().parents[2]


def test_a_recipe_runs_the_engine_unless_it_names_a_trainer(tiny_example, edit_recipe):
    recipe = tiny_example / "recipe.toml"
    assert select_trainer(load_recipe(recipe)).name == "builtin"
    text = recipe.read_text().replace("[data]\n", "[data]\npipeline = \"trl\"\n")
    recipe.write_text(text)
    chosen = select_trainer(load_recipe(recipe))
    assert (chosen.name, chosen.step_trainer) == ("trl", "trl SFTTrainer")


@pytest.mark.parametrize("config", ["axolotl.yml", "llamafactory.yaml"])
def test_a_trainers_config_runs_that_trainer_where_it_is_installed_else_the_engine(tiny_example, config):
    for name in (config, "ftready.toml"):
        shutil.copy(ROOT / "examples" / "tiny" / name, tiny_example / name)
    if config == "llamafactory.yaml":
        shutil.copy(ROOT / "examples" / "tiny" / "data" / "dataset_info.json", tiny_example / "data")
    recipe = load_recipe(tiny_example / config)
    own = trainer_named(recipe.origin.format)
    assert select_trainer(recipe).name == ("builtin" if own.missing() or not own.native else own.name)


def test_every_trainer_is_named_once_and_says_what_is_missing():
    names = {trainer_named(key).name for key in TRAINERS}
    assert names == set(TRAINERS)
    for key in TRAINERS:
        missing = trainer_named(key).missing()
        assert missing == "" or (key in missing and "install" in missing)


def test_data_and_model_checks_record_whose_pipeline_and_step_they_ran(make_state, run_check):
    state = make_state()
    for check_id in ("data.format", "data.masking", "model.step_memory"):
        got = {m.name: m.value for m in run_check(state, check_id).measured}
        assert (got["pipeline"], got["step_trainer"]) == ("builtin", "pytest-ftready engine"), check_id
    repro = {m.name for m in run_check(state, "repro.config").measured}
    assert "step_trainer" not in repro  # not a data or model check


def test_asking_for_llamafactorys_pipeline_skips_saying_it_is_not_run_yet(tiny_example, real_machine, run_check):
    from pytest_ftready.checks.registry import all_checks
    from pytest_ftready.outcomes import Skip
    from pytest_ftready.session.state import RunState

    all_checks()
    recipe = tiny_example / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("[data]\n", "[data]\npipeline = \"llamafactory\"\n"))
    run = RunState(artifacts_root=tiny_example / "arts", machine_factory=lambda: real_machine)
    state = run.recipe_state(load_recipe(recipe))
    with pytest.raises(Skip, match="does not run LLaMA-Factory's own preprocessing yet"):
        run_check(state, "data.masking")
