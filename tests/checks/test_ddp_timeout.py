"""Rank 0's preprocessing against the distributed timeout (issue 42, item 4): data.loader
measures how long tokenizing every row takes at this machine's rate (shared by the config's
preprocessing workers) and, for a distributed recipe, fails past ``[training] ddp_timeout_s``
(the trainers' ddp_timeout, read from their configs) with the remedies."""

from __future__ import annotations

import shutil

import pytest

from pytest_ftready.outcomes import Fail
from pytest_ftready.recipe import load_recipe

from ..conftest import EXAMPLE, values


def with_lines(path, table: str, *lines: str) -> None:
    text = path.read_text()
    if f"[{table}]\n" in text:
        text = text.replace(f"[{table}]\n", f"[{table}]\n" + "".join(f"{line}\n" for line in lines), 1)
    else:
        text += f"\n[{table}]\n" + "".join(f"{line}\n" for line in lines)
    path.write_text(text)


def test_a_distributed_recipe_whose_preprocessing_outlasts_ddp_timeout_fails_naming_it(tiny_example, make_state,
                                                                                       run_check):
    recipe = tiny_example / "recipe.toml"
    with_lines(recipe, "training", "ddp_timeout_s = 1e-9")
    with_lines(recipe, "distributed", "world_size = 2")
    with pytest.raises(Fail) as info:
        run_check(make_state(), "data.loader")
    said = str(info.value)
    assert "ddp_timeout_s" in said and "rank 0 tokenizes the 50 rows" in said and "tokenized_path" in said


def test_a_single_process_recipe_measures_the_preprocessing_and_is_not_judged_by_it(tiny_example, make_state,
                                                                                   run_check):
    with_lines(tiny_example / "recipe.toml", "training", "ddp_timeout_s = 1e-9")
    got = values(run_check(make_state(), "data.loader"))
    assert got["preprocessing_s"] > 0 and "preprocessing_share_of_ddp_timeout" not in got


@pytest.mark.parametrize(("config", "line", "expected"), [
    ("llamafactory.yaml", "ddp_timeout: 180000000", 180000000.0),  # LLaMA-Factory's examples write this
    ("llamafactory.yaml", "", 1800.0),  # transformers' default
    ("axolotl.yml", "ddp_timeout: 7200", 7200.0),
    ("axolotl.yml", "", 1800.0),  # unset: transformers' default
])
def test_the_trainers_ddp_timeout_is_read_from_their_configs(tiny_example, config, line, expected):
    for name in (config, "ftready.toml", "data/dataset_info.json"):
        shutil.copy(EXAMPLE / name, tiny_example / name)
    path = tiny_example / config
    path.write_text(path.read_text() + line + "\n")
    assert load_recipe(path).training.ddp_timeout_s == expected
