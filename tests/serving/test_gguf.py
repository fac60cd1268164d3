"""lifecycle.gguf with llama.cpp for real (issue 41): llama.cpp's own converter, quantizer and
llama-cpp-python on a model the converter knows (a tiny Llama with Qwen 2's real tokenizer, read
offline from llama.cpp's vocabulary file), and the planted refusal: the tiny example's own
tokenizer, which the converter does not recognise. Skipped where llama-cpp-python (the
``llamacpp`` extra) or llama.cpp's converter (FTREADY_LLAMA_CPP_SRC: an unpacked llama-cpp-python
source distribution) is absent; CI's serving job runs them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail, Skip
from pytest_ftready.serving import gguf

from ..conftest import values

SRC = Path(os.environ.get("FTREADY_LLAMA_CPP_SRC", "/nonexistent"))
needs_llama_cpp = pytest.mark.skipif(gguf.missing() is not None or gguf.find_converter() is None,
                                     reason=f"{gguf.missing() or 'llama.cpp converter absent'}: set "
                                            "FTREADY_LLAMA_CPP_SRC and install the llamacpp extra (CI's serving job)")


def _serving(tiny_example, table: str) -> None:
    recipe = tiny_example / "recipe.toml"
    recipe.write_text(recipe.read_text() + "\n[serving]\n" + table + "\n")


def test_gguf_check_skips_naming_the_extra_or_the_converter(tiny_example, make_state, run_check, monkeypatch):
    _serving(tiny_example, 'engine = "llama.cpp"')
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(Skip, match=r"needs llama-cpp-python, gguf, sentencepiece \(pip install pytest-ftready\[llamacpp\]\)"):
        run_check(make_state(), "lifecycle.gguf")


@pytest.fixture(scope="module")
def known_model(tmp_path_factory):
    """A tiny Llama with Qwen 2's tokenizer (llama.cpp's ggml-vocab-qwen2.gguf, its ChatML template
    embedded), its end-of-turn token <|im_end|> as EOS."""
    from transformers import AutoTokenizer

    from pytest_ftready.tiny import build_model

    tok = AutoTokenizer.from_pretrained(str(SRC / "vendor" / "llama.cpp" / "models"), gguf_file="ggml-vocab-qwen2.gguf")
    tok.eos_token = "<|im_end|>"
    tok.pad_token = tok.pad_token or "<|endoftext|>"
    return build_model(tok, tmp_path_factory.mktemp("qwen2-vocab") / "model")


def _on_model(tiny_example, model: Path) -> None:
    (tiny_example / "model").unlink()
    (tiny_example / "model").symlink_to(model)


@needs_llama_cpp
@pytest.mark.parametrize("quantization", ["Q8_0", "Q4_K_M"])
def test_gguf_of_a_model_the_converter_knows_passes_and_records(tiny_example, known_model, make_state, run_check,
                                                                quantization):
    _on_model(tiny_example, known_model)
    _serving(tiny_example, f'engine = "llama.cpp"\nquantization = "{quantization}"')
    state = make_state()
    ctx = run_check(state, "lifecycle.gguf")
    got = values(ctx)
    print(got)  # the figures the report quotes
    assert got["gguf_prompts"] == got["gguf_prompt_token_agreement"] > 0
    assert got["trained_stop_ids_stopped_on"] >= 1 and got["gguf_eos_id"] in state.encoder.stop_ids
    assert got["greedy_match_f16"] == got["greedy_tokens"] > 0
    assert 0 < got["gguf_quantized_size"] < got["gguf_f16_size"]


@needs_llama_cpp
def test_converter_refuses_the_tiny_tokenizer_naming_what_to_do(tiny_example, make_state, run_check):
    _serving(tiny_example, 'engine = "llama.cpp"')
    with pytest.raises(Fail) as info:
        run_check(make_state(), "lifecycle.gguf")
    assert "BPE pre-tokenizer was not recognized" in str(info.value)
    assert "train on the base model's own tokenizer files unchanged" in str(info.value)


LLAMA3 = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|eot_id|>{% endgeneration %}"
          "{% else %}{{ m['content'] }}<|eot_id|>{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


@needs_llama_cpp
def test_gguf_template_adding_bos_where_llama_cpp_also_does_fails(tiny_example, make_state, run_check, tmp_path):
    """Llama 3's tokenizer adds BOS (llama.cpp's add_bos_token) and its template writes {{ bos_token }}:
    training rendered one BOS (add_special_tokens = false), llama.cpp's server two."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    from pytest_ftready.tiny import build_model

    tok = AutoTokenizer.from_pretrained(str(SRC / "vendor" / "llama.cpp" / "models"),
                                        gguf_file="ggml-vocab-llama-bpe.gguf")
    tok.eos_token, tok.pad_token, tok.chat_template = "<|eot_id|>", "<|end_of_text|>", LLAMA3
    # as Meta's Llama 3 tokenizer.json: its post-processor adds <|begin_of_text|> (the GGUF's add_bos_token)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
        special_tokens=[("<|begin_of_text|>", tok.bos_token_id)])
    _on_model(tiny_example, build_model(tok, tmp_path / "llama3-vocab"))
    _serving(tiny_example, 'engine = "llama.cpp"')
    with pytest.raises(Fail) as info:
        run_check(make_state(), "lifecycle.gguf")
    assert "starts the prompt with BOS twice ('<|begin_of_text|><|begin_of_text|>')" in str(info.value)


@pytest.mark.skipif(not os.environ.get("FTREADY_SERVING_CI"), reason="CI's serving job only (FTREADY_SERVING_CI=1)")
def test_ci_serving_job_has_llama_cpp_and_the_converter():
    """In CI's serving job a skipped llama.cpp test would pass the job without looking: it fails here."""
    assert gguf.missing() is None, gguf.missing()
    assert gguf.find_converter() is not None, gguf.GET_CONVERTER


def test_the_converter_is_found_where_the_team_says(tmp_path, monkeypatch):
    """[serving] converter, then $FTREADY_GGUF_CONVERTER, then $FTREADY_LLAMA_CPP_SRC's vendored copy."""
    sdist = tmp_path / "llama_cpp_python-0.3.36"
    vendored = sdist / gguf.IN_SDIST
    vendored.parent.mkdir(parents=True)
    vendored.write_text("# llama.cpp's converter\n")
    checkout = tmp_path / "llama.cpp" / "convert_hf_to_gguf.py"
    checkout.parent.mkdir()
    checkout.write_text("# a llama.cpp checkout's converter\n")
    monkeypatch.setenv("FTREADY_LLAMA_CPP_SRC", str(sdist))
    monkeypatch.delenv("FTREADY_GGUF_CONVERTER", raising=False)
    assert gguf.find_converter(None) == vendored
    monkeypatch.setenv("FTREADY_GGUF_CONVERTER", str(checkout))
    assert gguf.find_converter(None) == checkout
    configured = tmp_path / "tools" / "convert_hf_to_gguf.py"
    configured.parent.mkdir()
    configured.write_text("# the recipe's\n")
    assert gguf.find_converter(configured) == configured
