"""Merging a LoRA adapter trained on a quantized base (issue 41, peft#2321): the three merges
(original base, dequantized base, re-quantized base) held against the adapter on the bitsandbytes
4-bit base as trained, with real bitsandbytes, real peft and the real tiny model; lifecycle.merged_model
on a real QLoRA overfit; [serving] merge_into read and refused; the merged folder llama.cpp's
converter is handed; lifecycle.generate on a QLoRA run."""

from __future__ import annotations

import json

import pytest

from pytest_ftready.outcomes import Fail, Skip
from pytest_ftready.recipe.schema import RecipeError, parse_recipe

from ..conftest import values
from ..helpers import outcomes

PROMPT = [1, 5, 7, 9, 11, 13]


def _qlora(tiny_example, table: str = 'engine = "transformers"') -> None:
    """The tiny recipe on a bitsandbytes 4-bit base, served as ``table`` declares."""
    recipe = tiny_example / "recipe.toml"
    text = recipe.read_text().replace('attn_implementation = "sdpa"', 'attn_implementation = "sdpa"\n'
                                      'quantization = "4bit"')
    recipe.write_text(text + "\n[serving]\n" + table + "\n")


@pytest.fixture(scope="module")
def planted_adapter(tmp_path_factory, tiny_model_dir):
    """A LoRA adapter (r 8, every linear layer) on the 4-bit tiny base with lora_B drawn from N(0, 0.05),
    saved as peft saves it: a delta the size training leaves, without training."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from pytest_ftready.engine.trainable import peft_quiet

    quantized = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, quantization_config=quantized,
                                                device_map={"": "cpu"})
    with peft_quiet():
        model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    generator = torch.Generator().manual_seed(0)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            parameter.data.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    folder = tmp_path_factory.mktemp("planted") / "adapter"
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def measured(planted_adapter, tiny_model_dir, tmp_path_factory):
    from transformers import AutoTokenizer

    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.serving import merge

    from ..conftest import copy_example

    example = copy_example(tmp_path_factory.mktemp("m") / "tiny", tiny_model_dir)
    _qlora(example)
    recipe = load_recipe(example / "recipe.toml")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return merge.measure(recipe, planted_adapter, PROMPT, [15, 17, 19, 21], {tok.eos_token_id}, tok.pad_token_id,
                         "cpu")


def test_the_three_merges_are_measured_against_the_adapter_model(measured):
    ways = measured.ways
    assert list(ways) == ["original", "dequantized", "quantized"]
    deq, quantized, original = ways["dequantized"], ways["quantized"], ways["original"]
    assert len(measured.adapter_ids) > 0
    # the dequantized base is the trained weights: the merge stays with the adapter model; re-quantizing
    # after the merge rounds the delta away, and the original base lacks the quantization error
    for other in (quantized, original):
        assert deq.greedy_match > other.greedy_match
        assert deq.argmax_agreement > other.argmax_agreement and other.argmax_agreement < 1.0
        assert other.max_logit_difference > 2 * deq.max_logit_difference
    assert deq.argmax_agreement >= 0.9


def test_the_merge_key_is_read_and_refused_with_the_allowed_values(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text('{"messages": []}\n')
    good = '[model]\npath = "model"\n[data]\ntrain = ["train.jsonl"]\n[serving]\n'
    assert parse_recipe(good + 'engine = "vllm"\n', tmp_path / "r.toml").serving.merge_into == ""
    recipe = parse_recipe(good + 'engine = "llama.cpp"\nmerge_into = "dequantized"\n', tmp_path / "r.toml")
    assert recipe.serving.merge_into == "dequantized"
    with pytest.raises(RecipeError) as info:
        parse_recipe(good + 'engine = "llama.cpp"\nmerge_into = "dequantize"\n', tmp_path / "r.toml")
    assert "[serving] merge_into" in str(info.value)
    assert 'expected one of "", original, dequantized, quantized' in str(info.value)
    assert "did you mean 'dequantized'?" in str(info.value)
    with pytest.raises(RecipeError, match=r"\[serving\] merge_into.*set, but no engine"):
        parse_recipe(good + 'merge_into = "original"\n', tmp_path / "r.toml")


# ---- lifecycle.merged_model on a real QLoRA overfit of the tiny model ------------------------------
def test_planted_merge_into_the_quantized_base_fails_naming_the_cause_and_a_measured_remedy(tiny_example,
                                                                                           make_state, run_check):
    _qlora(tiny_example, 'engine = "transformers"\nmerge_into = "quantized"')
    with pytest.raises(Fail) as info:
        run_check(make_state(), "lifecycle.merged_model")
    message = str(info.value)
    assert 'merge_into = "quantized"' in message and "re-quantizes: the small delta is rounded away" in message
    assert "it generates" in message and "where the adapter on the 4bit base generates" in message
    assert "teacher-forced argmax agreement" in message and "max |logit difference|" in message
    remedy = message.split("Remedy: ")[1]
    # offered only as measured: on the tiny model the dequantized merge agrees and the original does not
    assert 'set [serving] merge_into = "dequantized"' in remedy and "Unsloth save_method=\"merged_16bit\"" in remedy
    assert 'merge_into = "original"' not in remedy


def test_merge_into_the_dequantized_base_passes_and_all_three_are_measured(tiny_example, make_state, run_check):
    _qlora(tiny_example, 'engine = "llama.cpp"\nmerge_into = "dequantized"')
    got = values(run_check(make_state(), "lifecycle.merged_model"))
    assert got["merged_dequantized_greedy_match"] == got["adapter_greedy_tokens"] > 0
    assert got["merged_dequantized_argmax_agreement"] > got["merged_quantized_argmax_agreement"]
    for way in ("original", "dequantized", "quantized"):
        assert f"merged_{way}_max_logit_difference" in got


def test_merged_model_skips_where_there_is_nothing_to_judge(tiny_example, make_state, run_check):
    from pytest_ftready.checks.registry import REGISTRY

    assert REGISTRY["lifecycle.merged_model"].applies(make_state().recipe) == \
        "the recipe declares no serving engine ([serving] engine)"
    recipe = tiny_example / "recipe.toml"
    recipe.write_text(recipe.read_text() + '\n[serving]\nengine = "transformers"\n')
    with pytest.raises(Skip, match="the base is not quantized: lifecycle.generate holds the merged model"):
        run_check(make_state(), "lifecycle.merged_model")
    with pytest.raises(Skip, match="a full fine-tune: there is no adapter to merge"):
        run_check(make_state(method='"none"'), "lifecycle.merged_model")
    recipe.write_text(recipe.read_text().replace('engine = "transformers"', 'engine = "vllm"')
                      .replace('method = "none"', 'method = "lora"')
                      .replace('attn_implementation = "sdpa"', 'attn_implementation = "sdpa"\nquantization = "4bit"'))
    with pytest.raises(Skip, match=r"vLLM serves the adapter on the base, unmerged \(lifecycle.vllm_adapter\)"):
        run_check(make_state(), "lifecycle.merged_model")


def test_the_folder_for_llama_cpp_is_merged_the_declared_way(tiny_example, make_state, tmp_path):
    from pytest_ftready.serving import export

    _qlora(tiny_example, 'engine = "llama.cpp"\nmerge_into = "quantized"')
    with pytest.raises(Fail, match=r"llama.cpp's converter reads 16-bit weights: set \[serving\] merge_into = "
                                   r"\"dequantized\""):
        export.merged_folder(make_state(), tmp_path / "refused")
    recipe = tiny_example / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('merge_into = "quantized"', 'merge_into = "dequantized"'))
    folder = export.merged_folder(make_state(), tmp_path / "merged")
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and (folder / "tokenizer_config.json").is_file()


def test_generate_reloads_a_qlora_run_merged_into_the_dequantized_base(tiny_example, make_state, run_check):
    _qlora(tiny_example)
    got = values(run_check(make_state(), "lifecycle.generate"))
    assert got["generated_tokens"] > 0


@pytest.mark.slow  # a whole pytest run of the tiny example on a 4-bit base
def test_a_qlora_recipe_merged_into_the_quantized_base_fails_through_the_plugin(pytester, tiny_example):
    _qlora(tiny_example, 'engine = "transformers"\nmerge_into = "quantized"')
    pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "-k", "lifecycle.merged_model",
                                  "--junitxml=out.xml", "-p", "no:cacheprovider")
    state, message = outcomes(pytester.path / "out.xml")["lifecycle.merged_model"]
    assert state == "failed" and "the small delta is rounded away" in message
    assert 'set [serving] merge_into = "dequantized"' in message
