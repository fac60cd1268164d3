"""The trainer layer itself: what each trainer's own run is handed of its config comes from the key
tables (read once, by the importer), never from a second reading of the file; each result says
which trainer produced it; one fresh-process worker serves every trainer."""

from __future__ import annotations

import ast
import dataclasses
import shutil
from pathlib import Path

import pytest

from pytest_ftready.recipe import load_recipe
from pytest_ftready.recipe.importers.table import load_table

ROOT = Path(__file__).resolve().parents[2]
TRAINERS_DIR = ROOT / "pytest_ftready" / "trainers"


def test_no_trainer_module_reads_a_config_file():
    """A trainer gets its config from the translation (``recipe.origin``): no YAML, TOML or
    dataset_info.json reading under trainers/."""
    for path in TRAINERS_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in node.names} | {node.module for node in ast.walk(tree)
                                                if isinstance(node, ast.ImportFrom) and node.module}
        assert not imported & {"yaml", "tomllib", "tomli", "read_yaml", "importers.base"}, path.name
        assert "dataset_info.json\").read" not in path.read_text() and "read_yaml" not in path.read_text(), path.name


def test_a_trl_config_is_handed_to_trls_run_from_its_translation(tiny_example):
    shutil.copy(ROOT / "examples" / "tiny" / "ftready.toml", tiny_example / "ftready.toml")
    config = tiny_example / "trl-sft.yaml"
    config.write_text((ROOT / "examples" / "tiny" / "trl-sft.yaml").read_text()
                      + "packing_strategy: wrapped\noutput_dir: /somewhere/else\nuse_dora: true\n")
    origin = load_recipe(config).origin
    runs = dict(origin.runs)
    assert runs["packing_strategy"] == "handed" and runs["output_dir"] == "set" and runs["use_dora"] == "neither"
    handed = origin.handed()
    assert handed["packing_strategy"] == "wrapped" and "output_dir" not in handed and "use_dora" not in handed
    assert origin.handed_to_preprocessing() == {"packing_strategy": "wrapped", "assistant_only_loss": True}
    notes = {note.split(":")[0]: note for note in origin.caveats}
    # a note on a handed key concerns the built-in engine's run only; on a key TRL's run is not handed, both
    assert "the built-in engine's run; TRL's own run (SFTTrainer) is handed packing_strategy" in notes["packing_strategy"]
    assert "built-in engine's run" not in notes["use_dora"]


def test_every_sftconfig_key_is_handed_to_trls_run_or_set_by_the_checks():
    from pytest_ftready.trainers.trl import MIN_TRL, trl_classes

    trl = pytest.importorskip("trl", minversion=MIN_TRL, reason="TRL's SFTConfig is what the table is held against")

    SFTConfig, _ = trl_classes()
    table = load_table("trl")
    fields = {f.name for f in dataclasses.fields(SFTConfig)}
    wrong = {name: table.run.of(name, table.row(name)) for name in fields
             if table.run.of(name, table.row(name)) not in ("handed", "set")}
    assert not wrong, f"SFTConfig keys of TRL {trl.__version__} the table never hands TRL's run: {wrong}"
    assert set(table.run.preprocessing) <= fields


def test_the_keys_axolotls_run_sets_are_the_ones_its_table_marks_set():
    from pytest_ftready.trainers.axolotl import UNTRACKED

    listed = {key for key, cls in load_table("axolotl").run.listed if cls == "set"}
    assert set(UNTRACKED) <= listed
    assert {"datasets", "output_dir", "dataset_prepared_path", "max_steps", "save_steps"} <= listed


def test_a_llamafactory_config_keeps_its_dataset_description_for_the_run(tiny_example):
    for name in ("llamafactory.yaml", "ftready.toml"):
        shutil.copy(ROOT / "examples" / "tiny" / name, tiny_example / name)
    shutil.copy(ROOT / "examples" / "tiny" / "data" / "dataset_info.json", tiny_example / "data")
    origin = load_recipe(tiny_example / "llamafactory.yaml").origin
    assert origin.input("dataset_entry") == {"formatting": "sharegpt", "columns": {"messages": "messages"},
                                             "tags": {"role_tag": "role", "content_tag": "content",
                                                      "user_tag": "user", "assistant_tag": "assistant",
                                                      "system_tag": "system"}}
    assert origin.sharding() == [] and dict(origin.runs)["output_dir"] == "set"


def test_a_dataset_info_that_is_not_an_object_is_one_line_naming_it(tiny_example):
    from pytest_ftready.recipe import RecipeError

    for name in ("llamafactory.yaml", "ftready.toml"):
        shutil.copy(ROOT / "examples" / "tiny" / name, tiny_example / name)
    (tiny_example / "data" / "dataset_info.json").write_text('["tiny"]')
    with pytest.raises(RecipeError, match=r"dataset_info.json holds a JSON list; LLaMA-Factory reads an object"):
        load_recipe(tiny_example / "llamafactory.yaml")


def test_each_result_names_the_trainer_that_produced_it(make_state):
    state = make_state()
    assert state.step.trainer == state.engine_step.trainer == "pytest-ftready engine"
    assert state.step is state.engine_step  # the engine is the recipe's trainer: measured once
