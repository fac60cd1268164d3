"""Serving checks that need no serving engine installed (issue 41): the [serving] table, an Ollama
Modelfile read as Ollama reads it, vLLM's sourced LoRA rules against a saved adapter, and the
serving chat template against the training render, on the real tiny model."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail
from pytest_ftready.recipe.schema import RecipeError, parse_recipe
from pytest_ftready.serving import modelfile, vllm

from ..conftest import values

GOOD = '[model]\npath = "model"\n[data]\ntrain = ["train.jsonl"]\n'


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text('{"messages": []}\n')
    (tmp_path / "Modelfile").write_text("FROM ./model.gguf\n")
    return tmp_path


def test_serving_table_is_read_and_defaults_to_no_engine(folder):
    recipe = parse_recipe(GOOD, folder / "r.toml")
    assert recipe.serving.engine == "none" and recipe.serving.max_lora_rank == 0
    recipe = parse_recipe(GOOD + '[serving]\nengine = "ollama"\nquantization = "q4_k_m"\nmodelfile = "Modelfile"\n',
                          folder / "r.toml")
    assert recipe.serving.modelfile == (folder / "Modelfile").resolve()


@pytest.mark.parametrize("table, where, says", [
    ('engine = "llama.cpp"\nquantization = "Q4_KM"', "[serving] quantization", "did you mean Q4_K_M?"),
    ('engine = "vllm"\nmodelfile = "Modelfile"', "[serving] modelfile", 'write engine = "ollama"'),
    ('engine = "ollama"\nmax_lora_rank = 32', "[serving] max_lora_rank", "vLLM's --max-lora-rank"),
    ('quantization = "Q8_0"', "[serving] quantization", "set, but no engine"),
    ('engine = "tgi"', "[serving] engine", "expected one of"),
])
def test_bad_serving_tables_name_the_key_and_the_fix(folder, table, where, says):
    with pytest.raises(RecipeError) as info:
        parse_recipe(GOOD + "[serving]\n" + table + "\n", folder / "r.toml")
    assert where in str(info.value) and says in str(info.value)


def test_modelfile_is_read_as_ollama_reads_it(tmp_path):
    path = tmp_path / "Modelfile"
    path.write_text('# served\nFROM ./tuned.gguf\nTEMPLATE """{{ if .System }}<|im_start|>system\n{{ .System }}'
                    '<|im_end|>\n{{ end }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n"""\n'
                    'system "Be brief.\\nVery."\nPARAMETER stop <|im_end|>\nPARAMETER stop "<|im_start|>"\n'
                    'parameter temperature 0\n')
    parsed = modelfile.parse(path)
    assert parsed.base == "./tuned.gguf" and parsed.system == "Be brief.\nVery."
    assert parsed.stops == ["<|im_end|>", "<|im_start|>"] and parsed.parameters["temperature"] == ["0"]
    assert parsed.template.startswith("{{ if .System }}") and parsed.template.endswith("assistant\n")
    path.write_text('FROM x\nMESSAGE user """Is it blue?"""\nmessage assistant Yes.\n')
    assert modelfile.parse(path).messages == [{"role": "user", "content": "Is it blue?"},
                                              {"role": "assistant", "content": "Yes."}]
    path.write_text('FROM x\nMESSAGE tool {}\n')
    with pytest.raises(modelfile.ModelfileError, match=r"Modelfile:2: MESSAGE role 'tool'; Ollama takes system, user"):
        modelfile.parse(path)
    assert "{{" not in modelfile.literal_text(parsed.template)
    path.write_text("FROM x\nSTOP now\n")
    with pytest.raises(modelfile.ModelfileError, match=r"Modelfile:2: unknown instruction 'STOP'"):
        modelfile.parse(path)


def _adapter(tmp_path, **config):
    folder = tmp_path / "adapter"
    folder.mkdir(exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "bias": "none",
                                                            "target_modules": ["q_proj", "v_proj"], **config}))
    return folder


def test_vllm_rules_are_sourced_and_pass_a_plain_adapter(tmp_path):
    rules = vllm.load_rules()
    assert rules.default_rank == 16 and 64 in rules.allowed_ranks
    assert "vllm/lora/peft_helper.py" in rules.sources["refused"] and "LlamaForCausalLM" in rules.architectures
    assert vllm.judge_adapter(_adapter(tmp_path), rules, architecture="LlamaForCausalLM") == []


def test_vllm_refuses_a_rank_above_its_default_limit_naming_the_flag(tmp_path):
    rules = vllm.load_rules()
    [finding] = vllm.judge_adapter(_adapter(tmp_path, r=64), rules)
    assert "LoRA rank is 64, above vLLM's max_lora_rank 16 (its default" in finding.cause
    assert "--max-lora-rank 64" in finding.fix
    assert vllm.judge_adapter(_adapter(tmp_path, r=64), rules, max_lora_rank=64) == []
    [finding] = vllm.judge_adapter(_adapter(tmp_path, r=8, rank_pattern={"v_proj": 48}), rules)
    assert "rank is 48" in finding.cause and "--max-lora-rank 64" in finding.fix


def test_vllm_refuses_modules_to_save_naming_the_cause_and_the_fix(tmp_path):
    [finding] = vllm.judge_adapter(_adapter(tmp_path, modules_to_save=["lm_head"]), vllm.load_rules())
    assert "modules_to_save = ['lm_head']" in finding.cause and "vLLM only supports modules_to_save being None" in finding.cause
    assert "serve the merged model" in finding.fix


def test_vllm_embedding_and_unknown_targets_and_architecture(tmp_path):
    findings = vllm.judge_adapter(_adapter(tmp_path, target_modules=["embed_tokens", "norm"]), vllm.load_rules(),
                                  architecture="TinyNetForCausalLM")
    text = " | ".join(map(str, findings))
    assert "LoRA on embed_tokens" in text and "norm are not among the layers" in text
    assert "vLLM refuses the adapter ('While loading <adapter>, expected target modules in" in text
    assert "TinyNetForCausalLM is not in vLLM's list of LoRA-capable models" in text


@pytest.mark.parametrize("architecture, targets", [
    ("Qwen3_5ForConditionalGeneration", ["q_proj", "in_proj_qkvz", "out_proj"]),  # Qwen 3.5: multimodal class
    ("MixtralForCausalLM", ["q_proj", "w1", "w2", "w3"]),  # expert layers
    ("Phi3ForCausalLM", ["qkv_proj", "gate_up_proj"]),
    ("GptOssForCausalLM", ["q_proj", "o_proj"]),
    ("Olmo3ForCausalLM", ["q_proj", "down_proj"]),
])
def test_vllm_serves_current_families_with_their_own_layer_names(tmp_path, architecture, targets):
    """The architectures vLLM's supported-models list marks LoRA-capable today (docs at 0046f770)."""
    assert vllm.judge_adapter(_adapter(tmp_path, target_modules=targets), vllm.load_rules(),
                              architecture=architecture) == []


@pytest.mark.parametrize("architecture", ["GPTNeoXForCausalLM", "GPTJForCausalLM", "FalconForCausalLM"])
def test_vllm_serves_some_architectures_without_lora(tmp_path, architecture):
    [finding] = vllm.judge_adapter(_adapter(tmp_path), vllm.load_rules(), architecture=architecture)
    assert f"{architecture} is served by vLLM without LoRA" in finding.cause and "merged model" in finding.fix


def test_an_installed_vllm_is_asked_for_its_own_answer(tmp_path):
    """Where vLLM is installed its model class's supports_lora answers (here a probe as installed_rules builds)."""
    rules = dataclasses.replace(vllm.load_rules(), probe=lambda arch: arch == "BrandNewForCausalLM",
                                origin="vllm 9.9 (installed)")
    assert vllm.judge_adapter(_adapter(tmp_path), rules, architecture="BrandNewForCausalLM") == []
    [finding] = vllm.judge_adapter(_adapter(tmp_path), rules, architecture="LlamaForCausalLM")
    assert "served by vLLM without LoRA (vllm 9.9 (installed)" in finding.cause


# ---- checks on the real tiny model ---------------------------------------------------------------
def _serving(tiny_example, table: str) -> None:
    recipe = tiny_example / "recipe.toml"
    recipe.write_text(recipe.read_text() + "\n[serving]\n" + table + "\n")


def test_serving_checks_skip_without_an_engine(make_state):
    from pytest_ftready.checks.registry import REGISTRY

    state = make_state()
    for check_id in ("lifecycle.serving_template", "lifecycle.ollama", "lifecycle.vllm_adapter", "lifecycle.gguf"):
        assert REGISTRY[check_id].applies(state.recipe) == "the recipe declares no serving engine ([serving] engine)"


def test_ollama_stop_that_is_not_the_trained_stop_token_fails_naming_it(tiny_example, make_state, run_check):
    (tiny_example / "Modelfile").write_text("FROM ./tiny.gguf\nPARAMETER stop </s>\n")
    _serving(tiny_example, 'engine = "ollama"\nmodelfile = "Modelfile"')
    state = make_state()
    with pytest.raises(Fail) as info:
        run_check(state, "lifecycle.ollama")
    assert "PARAMETER stop '</s>' is not the trained end-of-turn token <|im_end|>" in str(info.value)
    assert 'write PARAMETER stop "<|im_end|>"' in str(info.value)
    _write_modelfile(tiny_example, CHATML)
    assert values(run_check(make_state(), "lifecycle.ollama"))["modelfile_stops"] == 1


def test_ollama_template_with_foreign_specials_fails(tiny_example, make_state, run_check):
    (tiny_example / "Modelfile").write_text('FROM x.gguf\nTEMPLATE "[INST] {{ .Prompt }} [/INST]"\n')
    _serving(tiny_example, 'engine = "ollama"\nmodelfile = "Modelfile"')
    with pytest.raises(Fail, match=r"TEMPLATE writes \[INST\], \[/INST\], which the training render never has"):
        run_check(make_state(), "lifecycle.ollama")


def _template(tiny_example, text: str) -> None:
    (tiny_example / "serve.jinja").write_text(text)
    _serving(tiny_example, 'engine = "vllm"\nchat_template = "serve.jinja"')


def test_serving_template_equal_to_training_agrees_on_every_prompt(tiny_example, make_state, run_check):
    state = make_state()
    _template(tiny_example, state.tokenizer.chat_template)
    got = values(run_check(make_state(), "lifecycle.serving_template"))
    assert got["served_prompts"] == got["prompt_token_agreement"] > 0


def test_serving_template_without_the_end_of_turn_token_fails(tiny_example, make_state, run_check):
    trained = make_state().tokenizer.chat_template
    _template(tiny_example, trained.replace("message['content'] + '<|im_end|>' }}", "message['content'] }}"))
    with pytest.raises(Fail) as info:
        run_check(make_state(), "lifecycle.serving_template")
    assert "without the trained end-of-turn token <|im_end|>" in str(info.value)


def test_serving_template_adding_bos_where_the_tokenizer_also_does_fails(tiny_example, tiny_model_dir, make_state,
                                                                      run_check, tmp_path):
    from tokenizers import processors
    from transformers import AutoTokenizer

    model = tmp_path / "bos-model"
    shutil.copytree(tiny_model_dir, model)
    tok = AutoTokenizer.from_pretrained(model)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", tok.bos_token_id)])  # the tokenizer adds BOS
    tok.save_pretrained(model)
    (tiny_example / "model").unlink()
    (tiny_example / "model").symlink_to(model)
    _template(tiny_example, tok.chat_template)  # the template writes {{ bos_token }} too
    with pytest.raises(Fail) as info:
        run_check(make_state(), "lifecycle.serving_template")
    assert "starts the prompt with BOS twice ('<s><s>')" in str(info.value)
    assert "remove {{ bos_token }} from the template" in str(info.value)


def test_vllm_adapter_check_fails_on_the_trained_rank_above_the_default(tiny_example, make_state, run_check):
    _serving(tiny_example, 'engine = "vllm"')
    state = make_state(r="32")
    with pytest.raises(Fail) as info:
        run_check(state, "lifecycle.vllm_adapter")
    assert "LoRA rank is 32, above vLLM's max_lora_rank 16" in str(info.value)
    assert "--max-lora-rank 32" in str(info.value)


def test_llamafactory_infer_backend_fills_the_serving_table(tmp_path):
    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.recipe.importers.llamafactory import OPENAI_TAGS
    from pytest_ftready.tiny import example_rows, write_jsonl

    (tmp_path / "model").mkdir()
    write_jsonl(tmp_path / "data" / "train.jsonl", example_rows()[:2])
    entry = {"file_name": "train.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"}, "tags": OPENAI_TAGS}
    (tmp_path / "data" / "dataset_info.json").write_text(json.dumps({"chats": entry}))
    base = "model_name_or_path: model\nstage: sft\ndataset: chats\n"
    (tmp_path / "lf.yaml").write_text(base + "infer_backend: vllm\n")
    recipe = load_recipe(tmp_path / "lf.yaml")
    assert (recipe.serving.engine, recipe.serving.max_lora_rank) == ("vllm", 32)  # LLaMA-Factory's default
    (tmp_path / "lf.yaml").write_text(base + "infer_backend: vllm\nvllm_max_lora_rank: 64\n")
    assert load_recipe(tmp_path / "lf.yaml").serving.max_lora_rank == 64
    (tmp_path / "lf.yaml").write_text(base + "infer_backend: huggingface\n")
    assert load_recipe(tmp_path / "lf.yaml").serving.engine == "transformers"
    (tmp_path / "lf.yaml").write_text(base)
    assert load_recipe(tmp_path / "lf.yaml").serving.engine == "none"


# ---- lifecycle.ollama executes the Modelfile's TEMPLATE as Ollama does ----------------------------
OLLAMA = Path(__file__).parent / "ollama"  # Ollama's own templates (SOURCES.md)
# the tiny model's training template writes {{ bos_token }} (<s>) itself and its tokenizer adds none
CHATML = "<s>" + (OLLAMA / "chatml.gotmpl").read_text(encoding="utf-8")


def _write_modelfile(tiny_example, template: str, extra: str = "PARAMETER stop <|im_end|>\n") -> None:
    (tiny_example / "Modelfile").write_text(f'FROM ./tiny.gguf\nTEMPLATE """{template}"""\n{extra}', encoding="utf-8")


def _ollama(tiny_example, template: str, extra: str = "PARAMETER stop <|im_end|>\n") -> None:
    _write_modelfile(tiny_example, template, extra)
    _serving(tiny_example, 'engine = "ollama"\nmodelfile = "Modelfile"')


def _ollama_fails(tiny_example, make_state, run_check, template: str, extra: str = "PARAMETER stop <|im_end|>\n"):
    _ollama(tiny_example, template, extra)
    with pytest.raises(Fail) as info:
        run_check(make_state(), "lifecycle.ollama")
    return str(info.value)


def test_ollama_chatml_template_matching_the_training_render_agrees_on_every_prompt(tiny_example, make_state,
                                                                                    run_check):
    _ollama(tiny_example, CHATML)
    got = values(run_check(make_state(), "lifecycle.ollama"))
    assert got["ollama_prompts"] == got["ollama_prompt_token_agreement"] > 1


def test_ollama_template_missing_the_newline_after_the_assistant_header_fails_naming_it(tiny_example, make_state,
                                                                                       run_check):
    said = _ollama_fails(tiny_example, make_state, run_check, CHATML.replace("}}<|im_start|>assistant\n",
                                                                             "}}<|im_start|>assistant"))
    assert "the Modelfile TEMPLATE (as Ollama executes it) renders the inference prompt to" in said
    assert "first difference at token" in said and "served '', trained '\\n'" in said


def test_ollama_template_dropping_the_system_message_fails_naming_it(tiny_example, make_state, run_check):
    said = _ollama_fails(tiny_example, make_state, run_check, CHATML.replace(
        "{{- range .Messages }}", '{{- range .Messages }}{{- if eq .Role "system" }}{{ continue }}{{ end }}'))
    assert "train.jsonl:1:" in said and "first difference at token 2: served 'user\\n', trained 'syst'" in said


def test_ollama_llama3_template_on_a_chatml_model_fails_naming_the_first_token(tiny_example, make_state, run_check):
    said = _ollama_fails(tiny_example, make_state, run_check, "<s>" + (OLLAMA / "llama3-instruct.gotmpl").read_text())
    assert "first difference at token 1: served '<|start_header_id|>" in said and "trained '<|im_start|>" in said


def test_ollama_system_is_put_first_where_the_conversation_has_none(tiny_example, make_state, run_check):
    said = _ollama_fails(tiny_example, make_state, run_check, CHATML,
                         'SYSTEM "Be brief."\nPARAMETER stop <|im_end|>\n')
    assert "the Modelfile TEMPLATE (as Ollama executes it with its SYSTEM)" in said
    assert "train.jsonl:2:" in said and "first difference at token 2: served 'syst', trained 'user\\n'" in said


def test_ollama_template_that_cannot_be_evaluated_fails_never_passes(tiny_example, make_state, run_check):
    said = _ollama_fails(tiny_example, make_state, run_check, CHATML + '{{ template "tools" . }}')
    assert "the TEMPLATE cannot be evaluated (lines counted within its text): line 4, column 1: {{template}} " \
        "(named templates) is not supported" in said
