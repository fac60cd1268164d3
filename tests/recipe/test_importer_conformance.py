"""Conformance of the trainer-config importers with their key tables (recipe/importers/keys):
every row is exercised by the configs in conformance/, every key ends in its row's class, and a
config whose only difference is one key gives a different recipe or a different note."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pytest_ftready.recipe.importers import IMPORTERS
from pytest_ftready.recipe.importers.table import load_table
from pytest_ftready.recipe.schema import SCHEMA, RecipeError
from pytest_ftready.recipe import load_recipe

CONFORMANCE = Path(__file__).parent / "conformance"
BASES = {"axolotl": "base.yml", "llamafactory": "base.yaml", "trl": "base.yaml"}
ROW = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
# Keys whose conformance value reads the same as the base config's, with why.
SAME_AS_BASE = {
    ("axolotl", "float32"): "the base config's bf16: false already means float32 weights",
    ("axolotl", "sdp_attention"): "sdpa is also what the base config's unset attn_implementation means",
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Each trainer's conformance folder copied beside a model folder and local chat rows."""
    out = {}
    for trainer in BASES:
        folder = tmp_path_factory.mktemp(trainer)
        shutil.copytree(CONFORMANCE / trainer, folder, dirs_exist_ok=True)
        (folder / "model").mkdir()
        (folder / "data").mkdir()
        (folder / "data" / "train.jsonl").write_text(json.dumps(ROW) + "\n")
        (folder / "data" / "dataset_info.json").write_text(json.dumps({"chats": {
            "file_name": "train.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
        out[trainer] = folder
    return out


def variant(folder: Path, trainer: str, extra: dict) -> Path:
    config = {**yaml.safe_load((folder / BASES[trainer]).read_text()), **extra}
    path = folder / f"variant{Path(BASES[trainer]).suffix}"
    path.write_text(yaml.safe_dump(config))
    return path


def seen(recipe) -> tuple:
    """What a user sees of a recipe: its tables, the notes and the keys listed as not checked."""
    tables = {k: v for k, v in recipe.to_dict().items() if k not in ("translation", "source", "name")}
    origin = recipe.origin
    return json.dumps(tables, sort_keys=True, default=str), sorted(origin.caveats), sorted(origin.not_checked)


@pytest.mark.parametrize("trainer", sorted(BASES))
def test_every_row_of_the_table_is_exercised_by_the_conformance_configs(trainer):
    written = set(yaml.safe_load((CONFORMANCE / trainer / "keys.yml").read_text()))
    written |= set(yaml.safe_load((CONFORMANCE / trainer / BASES[trainer]).read_text()))
    missing = [name for row in load_table(trainer).rows for name in (*row.names, *row.aliases)
               if not (any(k.startswith(name) for k in written) if row.prefix else name in written)]
    assert missing == []


@pytest.mark.parametrize("trainer", sorted(BASES))
def test_each_key_alone_changes_the_recipe_or_a_note_and_ends_in_its_rows_class(trainer, folders):
    folder, table = folders[trainer], load_table(trainer)
    base = seen(load_recipe(variant(folder, trainer, {})))
    assert load_recipe(variant(folder, trainer, {})).origin.unknown == ()
    problems = []
    for key, value in yaml.safe_load((CONFORMANCE / trainer / "keys.yml").read_text()).items():
        row = table.row(key)
        try:
            recipe = load_recipe(variant(folder, trainer, {key: value}))
        except RecipeError as exc:
            if row.cls != "refused" or exc.where != key or "\n" in str(exc):
                problems.append(f"{key}: {exc}")
            continue
        if row.cls == "refused":
            problems.append(f"{key}: a refused key imported")
            continue
        if dict(recipe.origin.classes).get(key) != row.cls:
            problems.append(f"{key}: class {dict(recipe.origin.classes).get(key)}, row says {row.cls}")
        if seen(recipe) == base and (trainer, key) not in SAME_AS_BASE:
            problems.append(f"{key}={value!r}: same recipe and notes as without it")
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("trainer", sorted(BASES))
def test_the_tables_name_real_recipe_keys_and_handlers(trainer):
    handlers = IMPORTERS[trainer].HANDLERS
    names = []
    for row in load_table(trainer).rows:
        names += [*row.names, *row.aliases]
        assert row.source.startswith("https://"), row.names
        if row.recipe:
            table, _, key = row.recipe.partition(".")
            assert key in SCHEMA[table], row.names
        if row.how:
            assert row.how in handlers, row.names
    assert len(names) == len(set(names))  # one row per key


# ---- configs as teams write them (conformance/patterns/): each gives the trainer's meaning or a note naming the key
PATTERNS = CONFORMANCE / "patterns"
NEOX = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 128, "max_position_embeddings": 64,
        "rotary_pct": 0.25}
NEOX_LINEAR = ["dense", "dense_4h_to_h", "dense_h_to_4h", "query_key_value"]  # GPTNeoXLayer's nn.Linear leaves


@pytest.fixture(scope="module")
def patterns(tmp_path_factory, folders) -> Path:
    """The pattern configs beside a model folder, a GPT-NeoX config, a tokenizer folder and rows."""
    folder = tmp_path_factory.mktemp("patterns")
    shutil.copytree(PATTERNS, folder, dirs_exist_ok=True)
    shutil.copytree(folders["llamafactory"] / "data", folder / "data")
    (folder / "model").mkdir()
    (folder / "neox").mkdir()
    (folder / "neox" / "config.json").write_text(json.dumps(NEOX))
    (folder / "tokenizer").mkdir()
    (folder / "tokenizer" / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    row = {"messages": [{"role": "user", "content": "2+2?"},
                        {"role": "assistant", "content": "4", "thinking": "two and two make four"}]}
    (folder / "data" / "reasoning.jsonl").write_text(json.dumps(row) + "\n")
    return folder


def notes(recipe, key: str) -> list[str]:
    return [c for c in recipe.origin.caveats if c.startswith(key + ":")]


def test_a_local_model_folder_absent_here_is_named_and_the_side_file_fixes_it(patterns):
    path = patterns / "trl_local_model.yaml"
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.where == "model_name_or_path" and "\n" not in str(info.value)
    assert "'/workspace/models/llama-3-8b/' is a local model folder that is not on this machine" in str(info.value)
    assert "the side file's [model] path fixes it" in str(info.value)
    (patterns / "trl_local_model.ftready.toml").write_text('[model]\npath = "model"\n')
    assert load_recipe(path).model.path == patterns / "model"


@pytest.mark.parametrize(("config", "stage", "offload", "source"), [
    ("axolotl_bundled_zero2.yml", 2, "optimizer", "axolotl/blob/"),
    ("llamafactory_bundled_z3_offload.yaml", 3, "both", "LLaMA-Factory/blob/"),
])
def test_the_trainers_bundled_deepspeed_configs_are_read_from_their_contents(patterns, config, stage, offload, source):
    recipe = load_recipe(patterns / config)
    assert (recipe.distributed.zero_stage, recipe.distributed.cpu_offload) == (stage, offload)
    assert any(source in src for src, dst in recipe.origin.mapped if dst == "[distributed] zero_stage")
    assert not any("read from its name" in c for c in recipe.origin.caveats)


def test_older_trl_keys_keep_the_meaning_they_had(patterns):
    recipe = load_recipe(patterns / "trl_older_keys.yaml")
    assert recipe.model.attn_implementation == "flash_attention_2"  # use_flash_attention_2: true
    assert recipe.training.loss == "fused_linear"  # use_liger: the old name of use_liger_kernel
    assert recipe.data.chat_template == patterns / "tokenizer" / "chat_template.jinja"  # tokenizer_name_or_path
    assert list(recipe.training.trainable) == ["^lm_head.weight$", "model.layers.1.self_attn.q_proj"]  # Spectrum
    assert recipe.data.add_special_tokens is False  # dataset_kwargs.add_special_tokens (TRL 0.8 to 0.14)
    for key in ("use_flash_attention_2", "use_liger", "tokenizer_name_or_path", "spectrum_config_path",
                "dataset_kwargs.add_special_tokens", "dataset_kwargs.append_concat_token"):
        assert notes(recipe, key), key
    assert "TRL 0.10 to 0.17" in notes(recipe, "use_liger")[0]
    assert recipe.origin.unknown == ()
    assert recipe.origin.value("use_liger_kernel") is True and recipe.origin.value("use_liger") is None


def test_axolotl_trains_the_union_of_every_linear_layer_and_the_named_modules(patterns):
    recipe = load_recipe(patterns / "axolotl_target_union.yml")
    # Axolotl's find_all_linear_names drops the output layer (lm_head in transformers 5's GPT-NeoX): the list adds it
    assert list(recipe.adapter.target_modules) == sorted(NEOX_LINEAR + ["lm_head"])
    assert not notes(recipe, "lora_target_linear")


def test_all_linear_is_the_architectures_own_module_names(patterns):
    recipe = load_recipe(patterns / "trl_all_linear.yaml")
    assert list(recipe.adapter.target_modules) == NEOX_LINEAR  # peft's rule leaves the output embedding out
    assert ("lora_target_modules (peft's all-linear on gpt_neox)", "[adapter] target_modules") in recipe.origin.mapped


def test_all_linear_of_a_hub_model_names_the_architecture(patterns):
    (patterns / "axolotl_all_linear_hub.ftready.toml").write_text('[data]\ntrain = ["data/train.jsonl"]\n')
    recipe = load_recipe(patterns / "axolotl_all_linear_hub.yml")
    (note,) = notes(recipe, "lora_target_linear")
    assert "GPTNeoXForCausalLM" in note and "set [model] path in ftready.toml" in note
    (patterns / "axolotl_all_linear_hub.ftready.toml").write_text('[model]\npath = "neox"\n'
                                                                    '[data]\ntrain = ["data/train.jsonl"]\n')
    recipe = load_recipe(patterns / "axolotl_all_linear_hub.yml")  # the local copy's config.json gives the names
    assert list(recipe.adapter.target_modules) == NEOX_LINEAR


def test_axolotls_reasoning_fields_are_named_where_the_checks_would_render_otherwise(patterns):
    recipe = load_recipe(patterns / "axolotl_reasoning.yml")
    (note,) = notes(recipe, "datasets[0].field_thinking")
    assert "'thinking'" in note and "'reasoning_content'" in note and "data.masking" in note
    assert "datasets[0].template_thinking_key" not in dict(recipe.origin.not_checked)


def test_a_vision_flag_is_refused_in_one_line(patterns):
    with pytest.raises(RecipeError) as info:
        load_recipe(patterns / "trl_vision.yaml")
    assert info.value.where == "vision_model" and "refused" in str(info.value) and "\n" not in str(info.value)


def test_an_alignment_handbook_mixer_recipe_packs_as_its_run_sft_did(patterns):
    recipe = load_recipe(patterns / "trl_handbook_mixer.yaml")
    assert recipe.data.packing is True  # the handbook's run_sft.py: SFTTrainer(..., packing=True), over packing: false
    (note,) = [n for n in notes(recipe, "dataset_mixer") if "packing=True" in n]
    assert "over packing: False" in note and "alignment-handbook" in note and "[data] packing = false" in note
    assert any(n.startswith("dataset_mixer:") and "packing=True" in n for n in recipe.origin.memory_notes)


def test_trls_default_task_type_written_out_gives_no_lora_variant_note(patterns):
    recipe = load_recipe(patterns / "trl_lora_task_type.yaml")
    assert not notes(recipe, "lora_task_type") and not any("DoRA" in c for c in recipe.origin.caveats)
    other = patterns / "trl_lora_task_type_seq_cls.yaml"
    other.write_text((patterns / "trl_lora_task_type.yaml").read_text().replace("CAUSAL_LM", "SEQ_CLS"))
    (note,) = notes(load_recipe(other), "lora_task_type")
    assert "CAUSAL_LM" in note


def test_all_written_for_every_linear_layer_is_refused_naming_peft_keyword(patterns):
    with pytest.raises(RecipeError) as info:
        load_recipe(patterns / "trl_target_all.yaml")
    said = str(info.value)
    assert info.value.where == "lora_target_modules" and "'all-linear'" in said and "\n" not in said


def test_a_llamafactory_multimodal_template_is_noted_naming_the_template(patterns):
    recipe = load_recipe(patterns / "llamafactory_vl_template.yaml")
    (note,) = [n for n in notes(recipe, "template") if "multimodal" in n]
    assert "'qwen2_vl'" in note and "freeze_vision_tower" in note
    assert note in recipe.origin.memory_notes
