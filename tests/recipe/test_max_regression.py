"""[checks] max_regression: kinds from kinds.py, shares as numbers, errors naming the key."""

from __future__ import annotations

import pytest

from pytest_ftready.recipe.schema import RecipeError, parse_recipe

GOOD = '[model]\npath = "model"\n[data]\ntrain = ["train.jsonl"]\n[checks]\n'


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text('{"messages": []}\n')
    return tmp_path


def test_thresholds_per_kind_are_read(folder):
    recipe = parse_recipe(GOOD + "max_regression = { peak_device_bytes = 0.05, tokens_per_s = 1 }\n",
                          folder / "r.toml")
    assert dict(recipe.checks.max_regression) == {"peak_device_bytes": 0.05, "tokens_per_s": 1.0}
    assert dict(parse_recipe(GOOD, folder / "r.toml").checks.max_regression) == {}


@pytest.mark.parametrize("value, where, message", [
    ("{ peak_devices_bytes = 0.1 }", "[checks] max_regression.peak_devices_bytes",
     "unknown measurement kind; did you mean peak_device_bytes?"),
    ("{ tokens_per_s = -0.1 }", "[checks] max_regression.tokens_per_s", "expected a non-negative share"),
    ("{ tokens_per_s = true }", "[checks] max_regression.tokens_per_s", "expected a non-negative share"),
    ("0.1", "[checks] max_regression", "expected a table like { peak_device_bytes = 0.10 }"),
])
def test_a_bad_threshold_names_the_key(folder, value, where, message):
    with pytest.raises(RecipeError) as info:
        parse_recipe(GOOD + f"max_regression = {value}\n", folder / "r.toml")
    assert info.value.where == where and message in str(info.value)
