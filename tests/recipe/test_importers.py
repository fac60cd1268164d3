"""Trainer configs read as recipes: TRL, Axolotl, LLaMA-Factory (recipe/importers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_ftready.recipe.importers import detect
from pytest_ftready.recipe.schema import RecipeError
from pytest_ftready.recipe import load_recipe

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


def test_an_axolotl_hub_dataset_keeps_every_later_key(folder):
    """The data sits on the hub (the usual case): the keys after datasets still translate."""
    path = write(folder, "axolotl.yml", """
base_model: meta-llama/Llama-3.1-8B-Instruct
datasets:
  - path: mlabonne/FineTome-100k
    type: chat_template
sequence_len: 4096
sample_packing: true
attn_implementation: flash_attention_2
chat_template: llama3
eot_tokens: ["<|eot_id|>"]
adapter: lora
lora_target_modules: 'model\\.layers\\.\\d+\\.self_attn\\.(q|v)_proj'
liger_fused_linear_cross_entropy: true
optimizer: paged_adamw_8bit
micro_batch_size: 2
learning_rate: 0.0002
""")
    write(folder, "ftready.toml", '[data]\ntrain = ["data/train.jsonl"]\n')
    with pytest.raises(RecipeError, match=r"revision: missing; .* or check a local copy: \[model\] path"):
        load_recipe(path)  # a hub id without revision_of_model, and no local model yet
    write(folder, "ftready.toml", '[model]\npath = "model"\n[data]\ntrain = ["data/train.jsonl"]\n')
    recipe = load_recipe(path)
    assert (recipe.data.max_length, recipe.data.packing, recipe.model.attn_implementation) == (4096, True,
                                                                                           "flash_attention_2")
    assert recipe.data.stop_tokens == ["<|eot_id|>"] and recipe.data.format == "messages"
    assert recipe.adapter.target_regex == r"model\.layers\.\d+\.self_attn\.(q|v)_proj"  # whole, not 40 letters
    assert (recipe.training.loss, recipe.training.optimizer) == ("fused_linear", "paged_adamw_8bit")
    assert any(c.startswith("chat_template: Axolotl renders with its built-in 'llama3'") for c in recipe.origin.caveats)
    # the side file's local model replaces the hub id, and the header says so
    assert recipe.model.path == folder / "model" and recipe.model.id == ""
    header = "\n".join(recipe.origin.header_lines())
    assert "[model] id 'meta-llama/Llama-3.1-8B-Instruct' replaced by [model] path" in header


def test_side_file_keys_win_and_are_listed_as_overridden(folder):
    path = write(folder, "sft.yaml", "model_name_or_path: model\ndataset_name: data\nmax_length: 4096\n")
    write(folder, "ftready.toml", "[data]\nmax_length = 256\n")
    recipe = load_recipe(path)
    assert recipe.data.max_length == 256
    assert recipe.origin.overridden == ("[data] max_length 4096 -> 256",)
    assert "overridden by ftready.toml: [data] max_length 4096 -> 256" in "\n".join(recipe.origin.header_lines())


@pytest.mark.parametrize(("config", "key"), [
    ("base_model: model\nrl: dpo\ndatasets: [{path: data/train.jsonl, type: chat_template}]\n", "rl"),
    ("base_model: model\nprocessor_type: AutoProcessor\ndatasets: [{path: data/train.jsonl, type: chat_template}]\n",
     "processor_type"),
    ("model_name_or_path: model\nstage: dpo\ndataset: chats\n", "stage"),
    ("model_name_or_path: model\ndataset_name: data\nreward_funcs: [accuracy]\n", "reward_funcs"),
])
def test_what_is_not_text_sft_is_refused_in_one_line_naming_the_key(folder, config, key):
    with pytest.raises(RecipeError) as info:
        load_recipe(write(folder, "c.yaml", config))
    assert info.value.where == key and "refused" in str(info.value) and "\n" not in str(info.value)


def test_trl_published_names_and_levers(folder):
    """torch_dtype and max_seq_length (the names most recipes use), an inline chat template,
    accelerate_config and Liger: each reaches the recipe."""
    path = write(folder, "sft.yaml", """
model_name_or_path: model
dataset_name: data
torch_dtype: bfloat16
max_seq_length: 2048
chat_template: "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
accelerate_config: zero2
use_liger_kernel: true
""")
    recipe = load_recipe(path)
    assert (recipe.model.dtype, recipe.data.max_length, recipe.training.loss) == ("bfloat16", 2048, "fused_linear")
    assert recipe.data.chat_template.read_text().startswith("{% for m in messages %}")
    assert (recipe.distributed.zero_stage, recipe.distributed.strategy) == (2, "ddp")
    assert not any("autocast over float32" in c for c in recipe.origin.caveats)
    assert any(c.startswith("max_seq_length: max_seq_length was renamed max_length") for c in recipe.origin.caveats)


def test_trl_without_trl_reads_its_table_to_the_same_recipe(monkeypatch):
    from pytest_ftready.recipe.importers import trl

    with_trl = load_recipe(TINY / "trl-sft.yaml")
    monkeypatch.setattr(trl, "ask_trl", lambda raw: None)
    without = load_recipe(TINY / "trl-sft.yaml")
    assert "parser" in with_trl.origin.title and "parser" not in without.origin.title
    plain = [{k: v for k, v in r.to_dict().items() if k != "translation"} for r in (with_trl, without)]
    assert plain[0] == plain[1]


def test_llamafactory_precision_levers_and_freeze(folder, tiny_model_dir):
    (folder / "data" / "dataset_info.json").write_text(json.dumps({"chats": {
        "file_name": "train.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    path = write(folder, "lf.yaml", f"model_name_or_path: {tiny_model_dir}\nstage: sft\ndataset: chats\n"
                 "finetuning_type: freeze\nfreeze_trainable_layers: 1\npure_bf16: true\ncutoff_len: 4096\n"
                 "use_galore: true\ntemplate: qwen\n")
    recipe = load_recipe(path)
    assert (recipe.model.dtype, recipe.data.max_length, recipe.adapter.method) == ("bfloat16", 4096, "none")
    assert recipe.training.trainable == [r".*\.layers\.(1)\..*.*"]  # the last of the tiny model's 2 layers
    assert recipe.training.low_rank_optimizer == "galore"
    assert any(c.startswith("template: LLaMA-Factory renders chats with its own template") for c in recipe.origin.caveats)


def test_a_regex_target_reaches_peft_whole(tiny_model_dir, folder):
    """peft full-matches a string target as a regex: the engine passes it as one string."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from pytest_ftready.engine.trainable import lora_config, peft_quiet

    path = write(folder, "a.yml", f"base_model: {tiny_model_dir}\nadapter: lora\nlearning_rate: 0.001\n"
                 "lora_target_modules: 'model\\.layers\\.1\\.self_attn\\.(q|v)_proj'\n"
                 "datasets: [{path: data/train.jsonl, type: chat_template}]\n")
    recipe = load_recipe(path)
    with peft_quiet():
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), lora_config(recipe))
    adapted = sorted({n.split(".lora_A")[0] for n, _ in model.named_parameters() if ".lora_A" in n})
    assert [n.split(".layers.")[-1] for n in adapted] == ["1.self_attn.q_proj", "1.self_attn.v_proj"]


def test_an_empty_sibling_key_takes_no_default_and_bundled_deepspeed_configs_are_read(folder):
    """`fp16:` written empty beside `bf16: true` (Axolotl's examples) leaves bf16; a DeepSpeed
    config the trainers ship, not beside the config, is read from its contents (LLaMA-Factory's
    ds_z3_offload_config.json offloads optimizer and parameters); a file beside it as it is."""
    path = write(folder, "axolotl.yml", "base_model: model\nbf16: true\nfp16:\nlearning_rate: 0.0001\n"
                 "deepspeed: examples/deepspeed/ds_z3_offload_config.json\n"
                 "datasets: [{path: data/train.jsonl, type: chat_template}]\n")
    recipe = load_recipe(path)
    assert recipe.model.dtype == "bfloat16"
    assert (recipe.distributed.zero_stage, recipe.distributed.cpu_offload) == (3, "both")
    assert any("LLaMA-Factory/blob/" in src for src, _ in recipe.origin.mapped)
    (folder / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                                                      "offload_param": {"device": "cpu"}}}))
    recipe = load_recipe(write(folder, "axolotl.yml", path.read_text().replace(
        "examples/deepspeed/ds_z3_offload_config.json", "ds.json")))
    assert (recipe.distributed.zero_stage, recipe.distributed.cpu_offload, recipe.distributed.strategy) == (2, "both", "ddp")


def test_the_memory_forecast_names_the_config_levers_it_cannot_model(tiny_example, tmp_path, real_machine, run_check):
    """A lever the trainer's config turns on (activation offloading here) is carried into the
    recipe and named, with the bound of the error, by the memory check itself."""
    import shutil

    from pytest_ftready.checks.registry import all_checks
    from pytest_ftready.session.state import RunState

    for name in ("trl-sft.yaml", "ftready.toml"):
        shutil.copy(TINY / name, tiny_example / name)
    path = tiny_example / "trl-sft.yaml"
    path.write_text(path.read_text() + "activation_offloading: true\n")
    side = tiny_example / "ftready.toml"  # a target, so the forecast judges (without one it records and skips)
    side.write_text(side.read_text().replace('device = "auto"', 'device = "auto"\ntarget = "24GiB"'))
    recipe = load_recipe(path)
    assert recipe.training.activation_offloading is True
    all_checks()
    state = RunState(artifacts_root=tmp_path / "arts", machine_factory=lambda: real_machine).recipe_state(recipe)
    measured = {m.name: m.value for m in run_check(state, "model.memory_forecast").measured}
    assert "activation_offloading: carried as [training] activation_offloading" in measured["config_memory_notes"]
    assert "over-counts by up to the saved activations" in measured["config_memory_notes"]


def test_an_image_dataset_in_dataset_info_is_refused(folder):
    (folder / "data" / "dataset_info.json").write_text(json.dumps({"pics": {
        "file_name": "train.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"}}}))
    path = write(folder, "lf.yaml", "model_name_or_path: model\nstage: sft\ndataset: pics\n")
    with pytest.raises(RecipeError, match=r"dataset: 'pics' has images columns in dataset_info.json: multimodal"):
        load_recipe(path)
