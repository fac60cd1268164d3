"""Trainer configs read as recipes: TRL, Axolotl, LLaMA-Factory (recipe/importers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_ftready.recipe.importers import detect
from pytest_ftready.recipe.schema import RecipeError, load_recipe

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny"


@pytest.fixture
def folder(tmp_path):
    """A folder with a model folder (only its existence matters here) and chat rows."""
    (tmp_path / "model").mkdir()
    (tmp_path / "data").mkdir()
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp_path / "data" / "train.jsonl").write_text(json.dumps(row) + "\n")
    return tmp_path


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_each_example_is_recognised_and_translated():
    trl = load_recipe(TINY / "trl-sft.yaml")
    axolotl = load_recipe(TINY / "axolotl.yml")
    factory = load_recipe(TINY / "llamafactory.yaml")
    assert [r.origin.format for r in (trl, axolotl, factory)] == ["trl", "axolotl", "llamafactory"]
    for recipe in (trl, axolotl, factory):
        assert recipe.data.train == [TINY / "data" / "train.jsonl"]
        assert (recipe.data.format, recipe.data.train_on, recipe.data.max_length) == ("messages", "assistant", 128)
        assert (recipe.adapter.method, recipe.adapter.r, recipe.adapter.alpha) == ("lora", 8, 32.0)
        assert recipe.training.micro_batch_size == 4 and recipe.training.gradient_accumulation_steps == 2
        assert recipe.model.path == TINY / "model"
        assert recipe.model.license == "apache-2.0"  # from the side ftready.toml
    assert ("assistant_only_loss", "[data] train_on") in trl.origin.mapped
    assert ("sequence_len", "[data] max_length") in axolotl.origin.mapped
    assert ("cutoff_len", "[data] max_length") in factory.origin.mapped


def test_trl_defaults_are_trls_not_the_recipes(folder):
    path = write(folder, "sft.yaml", "model_name_or_path: model\ndataset_name: data\n")
    recipe = load_recipe(path)
    assert recipe.adapter.method == "none"  # no use_peft: TRL trains every weight
    assert recipe.data.train_on == "all"  # no assistant_only_loss: TRL trains every token of a chat
    assert (recipe.data.max_length, recipe.training.micro_batch_size, recipe.training.learning_rate) == (1024, 8, 2e-5)
    assert recipe.training.gradient_checkpointing is True
    assert any(c.startswith("save_total_limit") for c in recipe.origin.caveats)


def test_an_axolotl_file_lists_every_key_it_does_not_translate(folder):
    path = write(folder, "axolotl.yml", """
base_model: model
adapter: qlora
lora_r: 16
lora_target_linear: true
datasets:
  - path: data/train.jsonl
    type: chat_template
    shards: 4
    roles_to_train: [user, assistant]
sequence_len: 256
micro_batch_size: 2
gradient_accumulation_steps: 4
deepspeed: deepspeed_configs/zero3.json
wandb_project: my-run
hub_model_id: me/model
neftune_noise_alpha: 5
""")
    recipe = load_recipe(path)
    origin = recipe.origin
    assert recipe.model.quantization == "4bit" and recipe.adapter.method == "lora"
    assert len(recipe.adapter.target_modules) == 7
    unchecked = dict(origin.not_checked)
    assert {"wandb_project", "hub_model_id", "neftune_noise_alpha", "datasets[0].shards"} <= set(unchecked)
    assert (recipe.distributed.zero_stage, recipe.distributed.strategy) == (3, "fsdp")  # read from the file name
    assert any(c.startswith("deepspeed:") and "ZeRO-3 shards" in c for c in origin.caveats)
    assert any(c.startswith("datasets[0].roles_to_train") for c in origin.caveats)
    # nothing silently dropped: every top-level key is mapped, named in a caveat, or not checked
    named = {src.split("[")[0].split(".")[0].split(" ")[0] for src, _ in origin.mapped}
    named |= {c.split(":")[0].split("[")[0].split(".")[0] for c in origin.caveats} | set(unchecked)
    raw_keys = {"base_model", "adapter", "lora_r", "lora_target_linear", "datasets", "sequence_len",
                "micro_batch_size", "gradient_accumulation_steps", "deepspeed", "wandb_project", "hub_model_id",
                "neftune_noise_alpha"}
    assert raw_keys <= named
    header = "\n".join(origin.header_lines())
    assert "not checked" in header and "wandb_project" in header and "datasets[0].shards" in header


def test_a_non_chat_axolotl_dataset_is_named_not_silently_read(folder):
    path = write(folder, "axolotl.yml", "base_model: model\nmicro_batch_size: 1\ndatasets:\n"
                 "  - path: data/train.jsonl\n    type: alpaca\n")
    expected = r"\[data\] train: no local training file in this config \(datasets\[0\].type: .alpaca. rows"
    with pytest.raises(RecipeError, match=expected):
        load_recipe(path)


def test_llamafactory_reads_dataset_info_and_its_defaults(folder):
    (folder / "data" / "dataset_info.json").write_text(json.dumps({"chats": {
        "file_name": "train.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    path = write(folder, "lf.yaml", "model_name_or_path: model\nstage: sft\ndataset: chats\nmask_history: true\n"
                 "quantization_bit: 4\n")
    recipe = load_recipe(path)
    assert recipe.data.train_on == "last_assistant"
    assert (recipe.adapter.method, recipe.adapter.r, recipe.adapter.alpha) == ("lora", 8, 16.0)
    assert recipe.model.quantization == "4bit" and recipe.data.max_length == 2048
    assert recipe.training.gradient_checkpointing is True


def test_llamafactory_unknown_dataset_names_the_file(folder):
    (folder / "data" / "dataset_info.json").write_text("{}")
    path = write(folder, "lf.yaml", "model_name_or_path: model\nstage: sft\ndataset: nope\n")
    with pytest.raises(RecipeError, match="'nope' is not described in .*dataset_info.json"):
        load_recipe(path)


def test_errors_name_the_source_key(folder):
    path = write(folder, "sft.yaml", "model_name_or_path: model\ndataset_name: data\nmax_length: 0\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert "[data] max_length (from max_length)" in str(info.value) and "sft.yaml" in str(info.value)


def test_side_toml_overrides_and_unknown_tables_fail(folder):
    path = write(folder, "sft.yaml", "model_name_or_path: model\ndataset_name: data\n")
    write(folder, "sft.ftready.toml", "[checks]\noverfit_steps = 7\n[data]\nmax_length = 64\n")
    recipe = load_recipe(path)
    assert recipe.checks.overfit_steps == 7 and recipe.data.max_length == 64
    assert recipe.origin.overrides.endswith("sft.ftready.toml")
    write(folder, "sft.ftready.toml", "[chekcs]\noverfit_steps = 7\n")
    with pytest.raises(RecipeError, match="did you mean checks"):
        load_recipe(path)


def test_hub_model_and_unrecognised_files(folder):
    path = write(folder, "sft.yaml", "model_name_or_path: org/model\nmodel_revision: " + "a" * 40
                 + "\ndataset_name: data\n")
    recipe = load_recipe(path)
    assert recipe.model.id == "org/model" and recipe.model.revision == "a" * 40
    assert detect({"foo": 1}) is None
    with pytest.raises(RecipeError, match="not a TRL, Axolotl or LLaMA-Factory config"):
        load_recipe(write(folder, "other.yaml", "foo: 1\n"))
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(write(folder, "bad.yaml", "a: [1,\n"))


def test_resolved_recipe_keeps_the_translation():
    data = load_recipe(TINY / "axolotl.yml").to_dict()
    assert data["translation"]["format"] == "axolotl"
    assert ["sequence_len", "[data] max_length"] in data["translation"]["mapped"]
    json.dumps(data)  # JSON-ready for config.json


def test_a_hub_dataset_asks_for_local_files_and_the_side_toml_supplies_them(folder):
    path = write(folder, "sft.yaml", "model_name_or_path: model\ndataset_name: trl-lib/Capybara\nlerning_rate: 1e-4\n")
    with pytest.raises(RecipeError, match=r"dataset_name: 'trl-lib/Capybara' is not a local file .* sft.ftready.toml"):
        load_recipe(path)
    write(folder, "ftready.toml", '[data]\ntrain = ["data/train.jsonl"]\n')
    origin = load_recipe(path).origin
    assert dict(origin.not_checked)["lerning_rate"] == "not a key of TRL 1.16 as the plugin knows it; did you mean learning_rate?"
    assert ("learning_rate (default 2e-05)", "[training] learning_rate") in origin.mapped
