"""Which trainer a recipe's checks run, and the measurements that say so on every data and model check."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_ftready.recipe import load_recipe
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


def test_asking_for_llamafactorys_pipeline_without_its_config_fails_saying_what_to_run(tiny_example, real_machine,
                                                                                       run_check):
    from pytest_ftready.outcomes import Fail

    from ..conftest import state_for

    recipe = tiny_example / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("[data]\n", "[data]\npipeline = \"llamafactory\"\n"))
    state = state_for(recipe, tiny_example / "arts", real_machine)
    with pytest.raises(Fail, match=r"needs a LLaMA-Factory config: run pytest --ftready=<your llamafactory.yaml>"):
        run_check(state, "data.masking")


def test_asking_for_llamafactory_where_it_does_not_import_skips_saying_what_to_install(tiny_example, real_machine,
                                                                                      run_check):
    import importlib.util

    from pytest_ftready.outcomes import Skip

    from ..conftest import state_for

    if importlib.util.find_spec("llamafactory") is not None:
        pytest.skip("llamafactory is installed here: tests/trainers/test_llamafactory.py runs its pipeline")
    for name in ("llamafactory.yaml", "ftready.toml", "data/dataset_info.json"):
        shutil.copy(ROOT / "examples" / "tiny" / name, tiny_example / name)
    side = tiny_example / "ftready.toml"
    side.write_text(side.read_text().replace("[data]\n", "[data]\npipeline = \"llamafactory\"\n"))
    state = state_for(tiny_example / "llamafactory.yaml", tiny_example / "arts", real_machine)
    with pytest.raises(Skip, match=r"llamafactory does not import here .*pip install llamafactory"):
        run_check(state, "data.masking")
