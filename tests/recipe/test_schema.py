"""Recipe validation: every bad recipe gives one line naming file, key, expectation."""

from __future__ import annotations

import pytest

from pytest_ftready.recipe.schema import SCHEMA, RecipeError, is_commit_hash, parse_recipe

from pytest_ftready.recipe import load_recipe

GOOD = """
[model]
path = "model"
[data]
train = ["train.jsonl"]
"""


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text('{"messages": []}\n')
    return tmp_path


def parse(folder, text):
    return parse_recipe(text, folder / "recipe.toml")


def test_minimal_recipe_has_documented_defaults_and_resolved_paths(folder):
    recipe = parse(folder, GOOD)
    assert recipe.name == "recipe"
    assert recipe.model.path == (folder / "model").resolve()
    assert list(recipe.data.train) == [(folder / "train.jsonl").resolve()]
    assert recipe.data.max_length == 2048 and recipe.adapter.method == "lora"
    assert recipe.training.output_dir == (folder / "runs").resolve()
    for table, keys in SCHEMA.items():
        assert set(getattr(recipe, table).keys()) == set(keys)


def test_recipe_is_frozen(folder):
    recipe = parse(folder, GOOD)
    with pytest.raises(AttributeError):
        recipe.data.max_length = 5
    with pytest.raises(TypeError):
        recipe.data.train[0] = "x"


def test_to_dict_is_plain(folder):
    import json

    assert json.loads(json.dumps(parse(folder, GOOD).to_dict()))["data"]["max_length"] == 2048


BAD = [
    ("[model\npath='x'", "", "not valid TOML"),
    (GOOD + "[training]\nmicro_batch = 2\n", "[training] micro_batch", "unknown key; did you mean micro_batch_size?"),
    (GOOD + "[traning]\nseed = 1\n", "[traning]", "did you mean training?"),
    (GOOD + "[data2]\n", "[data2]", "did you mean data?"),
    (GOOD.replace('path = "model"', 'path = "model"\nid = "org/m"\nrevision = "' + "a" * 40 + '"'), "[model]",
     "exactly one of id (a hub id) or path (a local folder), got both"),
    (GOOD.replace('path = "model"', ""), "[model]", "got neither"),
    (GOOD.replace('path = "model"', 'id = "meta-llama/Llama-3.1-8B"'), "[model] revision", "missing; a hub id needs the commit"),
    (GOOD.replace('"train.jsonl"', '"nope.jsonl"'), "[data] train", "'nope.jsonl' does not exist"),
    (GOOD.replace('path = "model"', 'path = "absent"'), "[model] path", "'absent' does not exist"),
    (GOOD + "[training]\nmicro_batch_size = 0\n", "[training] micro_batch_size", "expected a positive integer, got 0"),
    (GOOD + "[training]\nmicro_batch_size = -2\n", "[training] micro_batch_size", "expected a positive integer, got -2"),
    (GOOD.replace('[data]', '[data]\nmax_length = "long"'), "[data] max_length",
     "expected a positive integer, got 'long' (str)"),
    (GOOD + "[training]\nmicro_batch_size = 2.5\n", "[training] micro_batch_size", "got 2.5 (float)"),
    (GOOD.replace('[model]', '[model]\ndtype = "bf16"'), "[model] dtype",
     "expected one of float32, float16, bfloat16, got 'bf16' (str)"),
    (GOOD.replace('[data]', '[data]\nformat = "chat"'), "[data] format",
     "expected one of auto, messages, sharegpt, alpaca, prompt_completion, text"),
    (GOOD + "[hardware]\nmemory_headroom = 1.5\n", "[hardware] memory_headroom", "expected a share between 0 and 1"),
    (GOOD.replace('[model]', '[model]\ntrust_remote_code = "yes"'), "[model] trust_remote_code", "expected true or false"),
    (GOOD.replace('["train.jsonl"]', '[]'), "[data] train", "expected at least one file"),
    (GOOD.replace('[data]\ntrain = ["train.jsonl"]', ''), "[data]", "missing; a recipe needs at least [data] train"),
    (GOOD.replace('[data]', '[data]\nformat = "messages"\ntrain_on = "completion"'), "[data] train_on",
     "'completion' goes with format"),
    (GOOD.replace('[data]', '[data]\nformat = "sharegpt"\ntrain_on = "completion"'), "[data] train_on",
     "for sharegpt use \"assistant\""),
    (GOOD.replace('[data]', '[data]\nroles = { bot = "assistent" }'), "[data] roles.bot",
     "expected one of system, user, assistant, tool, developer, got 'assistent'"),
    (GOOD + "[adapter]\ntarget_modules = \"q_proj\"\n", "[adapter] target_modules", "expected a list of strings"),
    (GOOD.replace('[model]', '[model]\nquantization = "4bit"') + "[adapter]\nmethod = \"none\"\n", "[model] quantization",
     "cannot be fully fine-tuned"),
    (GOOD + "[checks]\nskip = 3\n", "[checks] skip", "expected check ids with reasons"),
    (GOOD + "[privacy]\nscan = [\"passwords\"]\n", "[privacy] scan", "unknown scan 'passwords'"),
    (GOOD + "[pins]\npackages = { torch = 2.5 }\n", "[pins] packages.torch", "expected a version string"),
    ('name = "a b"\n' + GOOD, "name", "expected letters, digits"),
    (GOOD.replace('[data]', '[data]\nformat = "text"'), "[data] train_on", "needs conversations (format = \"messages\""),
]


@pytest.mark.parametrize("text, where, message", BAD, ids=[f"bad{i:02d}" for i in range(len(BAD))])
def test_bad_recipe_names_file_key_and_fix(folder, text, where, message):
    with pytest.raises(RecipeError) as info:
        parse(folder, text)
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith(f"Invalid recipe {folder / 'recipe.toml'}")
    assert info.value.where == where
    assert message in line


def test_missing_file_and_unreadable_file(tmp_path):
    with pytest.raises(RecipeError, match="file not found"):
        load_recipe(tmp_path / "absent.toml")
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(RecipeError, match="cannot be read"):
        load_recipe(tmp_path / "bin.toml")


def test_skip_accepts_reasons_table_and_list(folder):
    recipe = parse(folder, GOOD + '[checks]\nskip = { "sustained.thermal" = "no NVML in our container" }\n')
    assert recipe.checks.skip["sustained.thermal"] == "no NVML in our container"
    recipe = parse(folder, GOOD + '[checks]\nskip = ["sustained.thermal"]\n')
    assert "sustained.thermal" in recipe.checks.skip


def test_commit_hash():
    assert is_commit_hash("0123456789abcdef0123456789abcdef01234567")
    assert not is_commit_hash("main") and not is_commit_hash("v1.0")
