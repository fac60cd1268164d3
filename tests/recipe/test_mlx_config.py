"""mlx-lm's LoRA config (``mlx_lm lora -c lora_config.yaml``) read as a recipe
(recipe/importers/mlx.py, keys/mlx.toml): told apart from the other trainers' YAML, every key
translated, noted or refused, mask_prompt read with the row layout as mlx-lm's dataset classes
read it. Needs no mlx: the config is read, mlx-lm is not imported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_ftready.recipe import load_recipe
from pytest_ftready.recipe.importers import detect, mlx
from pytest_ftready.recipe.schema import RecipeError

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                     {"role": "user", "content": "and?"}, {"role": "assistant", "content": "bye"}]}
BASE = "model: model\ndata: data\nnum_layers: -1\nlora_parameters: {rank: 4, scale: 10.0, dropout: 0.1}\n"


@pytest.fixture
def folder(tmp_path):
    """A model folder (a config.json of 2 blocks) and an mlx-lm data folder of chat rows."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    (tmp_path / "data").mkdir()
    rows = "".join(json.dumps(CHAT) + "\n" for _ in range(10))
    (tmp_path / "data" / "train.jsonl").write_text(rows)
    (tmp_path / "data" / "valid.jsonl").write_text(rows[: len(rows) // 5])
    return tmp_path


def read(folder: Path, text: str, rows: dict | None = None):
    if rows is not None:
        (folder / "data" / "train.jsonl").write_text("".join(json.dumps(rows) + "\n" for _ in range(10)))
    path = folder / "lora_config.yaml"
    path.write_text(text)
    return load_recipe(path)


@pytest.mark.parametrize("raw, fmt", [
    ({"model": "m", "data": "d", "fine_tune_type": "lora"}, "mlx"),
    ({"model": "m", "data": "d", "lora_parameters": {"rank": 8, "scale": 20.0}}, "mlx"),
    ({"model": "m", "data": "d", "iters": 100, "mask_prompt": True}, "mlx"),
    ({"model": "m", "max_seq_length": 512}, None),  # one shared-looking key is nobody's
    ({"base_model": "m", "num_layers": 2, "iters": 3}, "axolotl"),  # another trainer's key wins
    ({"model_name_or_path": "m", "dataset": "d", "stage": "sft", "num_layers": 2, "iters": 3}, "llamafactory"),
    ({"model_name_or_path": "m", "max_length": 512, "mask_prompt": True, "iters": 3}, "trl"),
    ({"model": {"name": "m"}, "fine_tune_type": "lora"}, None),  # model as a mapping: not mlx-lm's
])
def test_an_mlx_config_is_told_apart_from_the_other_trainers(raw, fmt):
    assert detect(raw) == fmt


def test_the_config_becomes_an_mlx_recipe_with_mlx_lms_meaning(folder):
    recipe = read(folder, BASE + "mask_prompt: true\nbatch_size: 2\niters: 10\nlearning_rate: 2e-4\n"
                  "grad_checkpoint: true\nmax_seq_length: 256\nseed: 7\nadapter_path: out\n")
    assert recipe.origin.format == "mlx" and recipe.hardware.device == "mlx"
    assert recipe.data.train == [folder / "data" / "train.jsonl"] and recipe.data.eval == [folder / "data" / "valid.jsonl"]
    # mask_prompt on chat rows: mlx-lm's offset is every message but the last, so the last turn only is trained
    assert (recipe.data.format, recipe.data.train_on) == ("messages", "last_assistant")
    # scale is the adapter's multiplier, peft's alpha / r: alpha = scale x rank
    assert (recipe.adapter.method, recipe.adapter.r, recipe.adapter.alpha, recipe.adapter.dropout) == ("lora", 4, 40.0, 0.1)
    assert recipe.training.micro_batch_size == 2 and recipe.training.learning_rate == 2e-4
    assert recipe.training.gradient_checkpointing is True and recipe.data.max_length == 256
    assert recipe.training.seed == 7 and recipe.training.epochs == pytest.approx(2.0)  # 10 iterations x 2 / 10 rows
    assert recipe.training.lr_scheduler == "constant"  # no lr_schedule: mlx-lm's learning rate is constant
    assert any("last message" in c for c in recipe.origin.caveats)


def test_mlx_lms_defaults_apply_where_the_config_is_silent(folder, monkeypatch):
    """Without mlx-lm the table's defaults, with it CONFIG_DEFAULTS read from its source: the same."""
    monkeypatch.setattr(mlx, "ask_mlx", lambda raw: None)
    recipe = read(folder, "model: model\ndata: data\nnum_layers: 2\nfine_tune_type: lora\n")
    assert (recipe.training.micro_batch_size, recipe.training.learning_rate, recipe.data.max_length) == (4, 1e-5, 2048)
    assert (recipe.adapter.r, recipe.adapter.alpha, recipe.training.seed) == (8, 160.0, 0)
    assert recipe.data.train_on == "all"  # mask_prompt defaults to false: every token trained
    assert recipe.training.gradient_checkpointing is False


@pytest.mark.parametrize("rows, mask, want", [
    ({"prompt": "p", "completion": "c"}, True, ("prompt_completion", "completion")),
    ({"prompt": "p", "completion": "c"}, False, ("prompt_completion", "all")),
    (CHAT, False, ("messages", "all")),
    ({"text": "t"}, False, ("text", "all")),
])
def test_mask_prompt_and_the_row_layout_decide_what_is_trained(folder, rows, mask, want):
    recipe = read(folder, BASE + f"mask_prompt: {str(mask).lower()}\n", rows)
    assert (recipe.data.format, recipe.data.train_on) == want


def test_mask_prompt_on_text_rows_is_refused_as_mlx_lm_refuses_it(folder):
    with pytest.raises(RecipeError) as info:
        read(folder, BASE + "mask_prompt: true\n", {"text": "t"})
    assert "mask_prompt" in str(info.value) and "Prompt masking not supported" in str(info.value)


@pytest.mark.parametrize("lora, said", [
    ("{rank: 8, alpha: 16}", "not alpha"),
    ("{rank: 8}", "missing required key 'scale'"),
    ("[8, 20]", "expected a mapping"),
])
def test_lora_parameters_mlx_lm_would_stop_on_are_refused(folder, lora, said):
    with pytest.raises(RecipeError) as info:
        read(folder, f"model: model\ndata: data\nnum_layers: 2\nlora_parameters: {lora}\n")
    assert "lora_parameters" in str(info.value) and said in str(info.value)


def test_more_layers_than_the_model_has_is_refused_naming_both(folder):
    with pytest.raises(RecipeError) as info:
        read(folder, "model: model\ndata: data\nfine_tune_type: lora\n")  # the default 16 > 2 blocks
    assert "num_layers" in str(info.value) and "16" in str(info.value) and "only has 2 layers" in str(info.value)


def test_fewer_layers_is_a_memory_note_and_lora_keys_become_the_targets(folder):
    recipe = read(folder, "model: model\ndata: data\nnum_layers: 1\n"
                  "lora_parameters: {rank: 8, scale: 2.0, dropout: 0.0, keys: [self_attn.q_proj, self_attn.v_proj]}\n")
    assert list(recipe.adapter.target_modules) == ["q_proj", "v_proj"]
    assert any(n.startswith("num_layers") and "last 1 blocks" in n for n in recipe.origin.memory_notes)


@pytest.mark.parametrize("kind, method, noted", [("full", "none", False), ("dora", "lora", True)])
def test_fine_tune_type(folder, kind, method, noted):
    recipe = read(folder, BASE + f"fine_tune_type: {kind}\n")
    assert recipe.adapter.method == method
    assert any(n.startswith("fine_tune_type") and "DoRA" in n for n in recipe.origin.memory_notes) is noted


def test_an_unknown_fine_tune_type_is_refused(folder):
    with pytest.raises(RecipeError, match="fine_tune_type.*lora, dora or full"):
        read(folder, BASE + "fine_tune_type: qlora\n")


def test_every_key_is_translated_noted_or_named_unknown(folder):
    recipe = read(folder, BASE + "optimizer: muon\nresume_adapter_file: adapters/adapters.safetensors\n"
                  "report_to: wandb\nclear_cache_threshold: 1000\nlr_schedule: {name: cosine_decay, warmup: 5, "
                  "arguments: [1e-5, 100]}\nmask_promt: true\n")
    classes = dict(recipe.origin.classes)
    assert set(classes) >= {"model", "data", "num_layers", "lora_parameters", "optimizer", "resume_adapter_file",
                            "report_to", "clear_cache_threshold", "lr_schedule", "mask_promt"}
    assert classes["resume_adapter_file"] == "noted" and classes["mask_promt"] == "noted"
    unchecked = dict(recipe.origin.not_checked)
    assert "did you mean mask_prompt" in unchecked["mask_promt"]
    assert recipe.training.optimizer == "adamw" and any(n.startswith("optimizer") for n in recipe.origin.memory_notes)
    assert (recipe.training.lr_scheduler, recipe.training.warmup_steps) == ("cosine", 5)
    assert any("adapter weights only" in c for c in recipe.origin.caveats)  # what a resume restores


def test_a_data_folder_without_train_jsonl_is_refused(folder):
    (folder / "data" / "train.jsonl").rename(folder / "data" / "rows.jsonl")
    with pytest.raises(RecipeError, match="train.jsonl"):
        read(folder, BASE)


def test_a_hub_dataset_needs_a_local_copy(folder):
    with pytest.raises(RecipeError) as info:
        read(folder, BASE.replace("data: data", "data: mlx-community/WikiSQL"))
    assert "[data] train" in str(info.value)


def test_a_device_mlx_recipe_reads_as_before(folder):
    path = folder / "recipe.toml"
    path.write_text('[model]\npath = "model"\n[data]\ntrain = ["data/train.jsonl"]\n[hardware]\ndevice = "mlx"\n')
    recipe = load_recipe(path)
    assert recipe.hardware.device == "mlx" and recipe.origin is None
