"""Hostile and careless configs, round three (issue 47): trainer configs, their side files, YAML
itself, and the recipe's numbers. Every case ends as one RecipeError line naming the file and the
key, saying what was expected and what to write: never a traceback, never a pytest INTERNALERROR.
Unit-level (the loader), no model, except one whole run that shows the report header's path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_ftready.recipe import RecipeError, load_recipe

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny"
CONFIGS = ("axolotl.yml", "llamafactory.yaml", "trl-sft.yaml")


@pytest.fixture
def configs(tmp_path) -> Path:
    """The tiny example's configs, side file and data (a model folder that only has to exist)."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    for name in (*CONFIGS, "ftready.toml", "recipe.toml"):
        shutil.copy(TINY / name, folder / name)
    (folder / "data").mkdir()
    for name in ("train.jsonl", "dataset_info.json", "MANIFEST.json"):
        shutil.copy(TINY / "data" / name, folder / "data" / name)
    (folder / "model").mkdir()
    return folder


def refused(path: Path) -> str:
    """The one line ``load_recipe`` refuses ``path`` with (a RecipeError, nothing else)."""
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    line = str(info.value)
    assert "\n" not in line and len(line) < 1000, line
    assert "Traceback" not in line
    return line


def edit(path: Path, old: str, new: str) -> Path:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))
    return path


def append(path: Path, text: str) -> Path:
    path.write_text(path.read_text() + text)
    return path


def test_the_tiny_configs_still_load(configs):
    for name in CONFIGS:
        assert load_recipe(configs / name).origin is not None


# ---- trainer configs and their side files: each malformed value named -------------------------
INFO = "data/dataset_info.json"
ENTRY = {"file_name": "train.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
         "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}


def _info(value):
    return lambda folder: (folder / INFO).write_text(json.dumps(value))


def _side(text):
    return lambda folder: (folder / "ftready.toml").write_text(text)


def _config(name, old, new):
    return lambda folder: edit(folder / name, old, new)


def _more(name, text):
    return lambda folder: append(folder / name, text)


FREEZE = "finetuning_type: freeze\nfreeze_trainable_layers: "
# (id, config, how to break it, words the one line must hold)
CONFIG_CASES = [
    ("dataset-info-a-list", "llamafactory.yaml", _info([ENTRY]),
     ["dataset_info.json holds a JSON list", "reads an object there"]),
    ("dataset-info-entry-a-list", "llamafactory.yaml", _info({"tiny_chats": [ENTRY]}),
     ["dataset_info.json tiny_chats: expected a mapping", "got list"]),
    ("dataset-info-columns-a-list", "llamafactory.yaml", _info({"tiny_chats": {**ENTRY, "columns": ["messages"]}}),
     ["dataset_info.json tiny_chats.columns: expected a mapping", "got list"]),
    ("dataset-info-tags-a-string", "llamafactory.yaml", _info({"tiny_chats": {**ENTRY, "tags": "role"}}),
     ["dataset_info.json tiny_chats.tags: expected a mapping", "got str"]),
    ("dataset-info-file-name-a-number", "llamafactory.yaml", _info({"tiny_chats": {**ENTRY, "file_name": 7}}),
     ["dataset_info.json tiny_chats.file_name: expected a file name", "got int"]),
    ("side-data-a-string", "axolotl.yml", _side('data = "data/train.jsonl"\n'),
     ["ftready.toml data: expected a table ([data] with its keys below it)", "write [data] on a line of its own"]),
    ("side-model-a-string", "trl-sft.yaml", _side('model = "model"\n'), ["ftready.toml model: expected a table"]),
    ("side-checks-a-list", "llamafactory.yaml", _side("checks = [1, 2]\n"), ["ftready.toml checks: expected a table"]),
    ("axolotl-warmup-ten", "axolotl.yml", _more("axolotl.yml", "warmup_steps: ten\n"),
     ["axolotl.yml warmup_steps: expected warm-up optimizer steps", "got 'ten'", "write a whole number"]),
    ("axolotl-warmup-negative", "axolotl.yml", _more("axolotl.yml", "warmup_steps: -5\n"),
     ["warmup_steps: expected warm-up optimizer steps (or a ratio between 0 and 1) between 0 and"]),
    ("axolotl-warmup-a-list", "axolotl.yml", _more("axolotl.yml", "warmup_steps: [1]\n"), ["warmup_steps", "got [1]"]),
    ("axolotl-save-steps-text", "axolotl.yml", _config("axolotl.yml", "save_steps: 50", "save_steps: often"),
     ["save_steps: expected optimizer steps between checkpoints", "got 'often'"]),
    ("deepspeed-stage-5", "axolotl.yml", _more("axolotl.yml", "deepspeed:\n  zero_optimization:\n    stage: 5\n"),
     ["deepspeed zero_optimization.stage: expected a DeepSpeed ZeRO stage between 0 and 3, got 5"]),
    ("deepspeed-stage-auto", "axolotl.yml", _more("axolotl.yml", "deepspeed:\n  zero_optimization:\n    stage: auto\n"),
     ["zero_optimization.stage: expected a DeepSpeed ZeRO stage, got 'auto'"]),
    ("deepspeed-zero-a-list", "axolotl.yml", _more("axolotl.yml", "deepspeed:\n  zero_optimization: [2]\n"),
     ["deepspeed zero_optimization: expected a mapping", "got list"]),
    ("deepspeed-file-stage-5", "axolotl.yml",
     lambda f: ((f / "ds.json").write_text('{"zero_optimization": {"stage": 5}}'),
                append(f / "axolotl.yml", "deepspeed: ds.json\n")),
     ["deepspeed zero_optimization.stage (in ds.json): expected a DeepSpeed ZeRO stage between 0 and 3, got 5"]),
    ("deepspeed-offload-a-string", "axolotl.yml",
     _more("axolotl.yml", "deepspeed:\n  zero_optimization:\n    stage: 7\n    offload_optimizer: cpu\n"),
     ["got 7"]),
    ("llamafactory-freeze-all", "llamafactory.yaml", _config("llamafactory.yaml", "finetuning_type: lora", FREEZE + "all"),
     ["llamafactory.yaml freeze_trainable_layers: expected a layer count", "got 'all'"]),
    ("llamafactory-freeze-zero", "llamafactory.yaml", _config("llamafactory.yaml", "finetuning_type: lora", FREEZE + "0"),
     ["freeze_trainable_layers: expected a layer count other than 0"]),
    ("axolotl-seed-2-to-the-32", "axolotl.yml", _config("axolotl.yml", "seed: 42", "seed: 4294967296"),
     ["[training] seed (from seed): expected at most 4,294,967,295 (numpy's range", "got 4,294,967,296"]),
    ("trl-seed-2-to-the-40", "trl-sft.yaml", _config("trl-sft.yaml", "seed: 42", f"seed: {2 ** 40}"),
     ["[training] seed", "expected at most 4,294,967,295"]),
    ("trl-max-length-2-to-the-63", "trl-sft.yaml", _config("trl-sft.yaml", "max_length: 128", f"max_length: {2 ** 63 - 1}"),
     ["[data] max_length (from max_length): expected at most 16,777,216 tokens"]),
    ("axolotl-epochs-1e300", "axolotl.yml", _config("axolotl.yml", "num_epochs: 3", "num_epochs: 1.0e+300"),
     ["[training] epochs (from num_epochs): expected at most 1,000,000.0 epochs"]),
    ("side-max-hours-1e300", "axolotl.yml", _config("ftready.toml", "max_hours = 1.0", "max_hours = 1e300"),
     ["[budget] max_hours (from ftready.toml [budget] max_hours): expected at most 87,600.0 hours"]),
    ("side-target-regex-broken", "trl-sft.yaml", _more("ftready.toml", '\n[adapter]\ntarget_regex = "(q_proj"\n'),
     ["[adapter] target_regex", "'(q_proj' is not a regular expression (missing ), unterminated subpattern"]),
]


@pytest.mark.parametrize("case, config, plant, words", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_a_malformed_config_value_is_one_line_naming_its_key(configs, case, config, plant, words):
    plant(configs)
    line = refused(configs / config)
    for word in words:
        assert word in line, line
