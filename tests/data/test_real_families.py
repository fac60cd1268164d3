"""The encoder and the label verification on real chat templates of the main families, kept
verbatim in tests/data/templates/ (sources in SOURCES.md): Qwen 3.5's reasoning template (the
inference prompt ends inside the response, earlier turns lose their reasoning) and Phi-3's
GGUF template (no system branch, no tool branch).

The tokenizer is the tiny trained BPE with the family's special tokens; with
FTREADY_REAL_TOKENIZERS naming a folder of tokenizer folders saved from llama.cpp's
vocabulary files (``qwen35``, ``phi-3``: ``AutoTokenizer.from_pretrained(models,
gguf_file="ggml-vocab-qwen35.gguf").save_pretrained(folder / "qwen35")``), every test runs on
the real tokenizers too."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_ftready.data.encoding import IGNORE_INDEX, Encoder, stop_token_ids
from pytest_ftready.data.layouts import read_sample
from pytest_ftready.data.rows import Row
from pytest_ftready.data.token_view import token_view
from pytest_ftready.data.verify import judge_labels, verify_turns
from pytest_ftready.outputs.report import token_spans

TEMPLATES = Path(__file__).parent / "templates"
QWEN35 = (TEMPLATES / "Qwen3.5-4B.jinja").read_text()
PHI3_GGUF = (TEMPLATES / "Phi-3-gguf.jinja").read_text()
# family -> (the llama.cpp vocabulary's folder name, eos, special tokens the tiny tokenizer lacks)
FAMILIES = {"qwen35": ("qwen35", "<|im_end|>", ()),
            "phi3": ("phi-3", "<|end|>", ("<|user|>", "<|assistant|>", "<|system|>", "<|end|>"))}
REAL = os.environ.get("FTREADY_REAL_TOKENIZERS")

REASONING_IN_CONTENT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "How many comets does kalo see?"},
    {"role": "assistant", "content": "<think>\nKalo counts one, then two.\n</think>\n\nKalo sees two comets."}]
REASONING_APART = REASONING_IN_CONTENT[:2] + [
    {"role": "assistant", "reasoning_content": "Kalo counts one, then two.", "content": "Kalo sees two comets."}]
REASONING_IN_HISTORY = REASONING_IN_CONTENT[1:] + [
    {"role": "user", "content": "And the lamps?"},
    {"role": "assistant", "content": "<think>\nThree lamps glow.\n</think>\n\nKalo sees three lamps."}]
TRAINED = "Kalo counts one, then two.\n</think>\n\nKalo sees two comets.<|im_end|>"


@pytest.fixture(scope="module", params=["tiny"] + (["llama.cpp"] if REAL else []))
def tokenizers(request):
    """family -> tokenizer (the tiny BPE with the family's special tokens, or llama.cpp's vocabulary)."""
    from pytest_ftready.tiny import build_tokenizer

    out = {}
    for family, (folder, eos, specials) in FAMILIES.items():
        if request.param == "llama.cpp":
            from transformers import AutoTokenizer

            out[family] = AutoTokenizer.from_pretrained(Path(REAL) / folder)
        else:
            tok = build_tokenizer()
            tok.add_tokens(list(specials), special_tokens=True)
            tok.eos_token = eos
            out[family] = tok
    return out


def encoder(tokenizers, family: str, template: str, train_on: str = "last_assistant") -> Encoder:
    tok = copy.deepcopy(tokenizers[family])
    tok.chat_template = template
    data = SimpleNamespace(format="messages", train_on=train_on, max_length=1024, add_special_tokens=False)
    return Encoder(tok, data, stop_token_ids(tok, extra=[FAMILIES[family][1]]))


def encode(enc: Encoder, messages: list[dict]):
    """The row encoded row by row, held equal to the batched (spliced where it can) path."""
    row = Row("train.jsonl", 3, {"messages": messages})
    sample = read_sample(row, "messages", enc.train_on)[0]
    one = enc.encode(row, sample)
    assert enc.encode_many([(row, sample)]) == [one]
    return one


def trained_text(enc: Encoder, encoded) -> str:
    return enc.tok.decode([t for t, label in zip(encoded.input_ids, encoded.labels) if label != IGNORE_INDEX])


@pytest.mark.parametrize("train_on", ["last_assistant", "assistant"])
@pytest.mark.parametrize("messages", [REASONING_IN_CONTENT, REASONING_APART], ids=["in-content", "reasoning_content"])
def test_qwen35_reasoning_trains_all_the_model_generates_and_nothing_the_prompt_holds(tokenizers, messages, train_on):
    enc = encoder(tokenizers, "qwen35", QWEN35, train_on)
    encoded = encode(enc, messages)
    assert encoded.problems == ()
    assert trained_text(enc, encoded) == TRAINED  # the same labels whichever field holds the reasoning
    prompt = enc.render(messages[:2], add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    if messages is REASONING_IN_CONTENT:  # the content's "<think>\n" is the inference prompt's: shown as such
        given = [k for start, end in encoded.prompted for k in range(start, end)]
        assert enc.tok.decode([encoded.input_ids[k] for k in given]).strip() == "<think>"
        view = token_view(enc.tok, encoded)
        assert [view["tokens"][k][1] for k in view["prompted"]] == [False] * len(given)
        assert "".join(view["tokens"][k][0] for k in view["prompted"]).strip() == "<think>"
        assert token_spans(view).count("<span class='tok p'>") == len(given)  # drawn apart in masking.html
    else:
        assert encoded.prompted == ()


def test_qwen35_response_tokens_after_the_prompt_must_still_train(tokenizers):
    enc = encoder(tokenizers, "qwen35", QWEN35)
    encoded = encode(enc, REASONING_IN_CONTENT)
    labels = list(encoded.labels)
    first = next(k for k, label in enumerate(labels) if label != IGNORE_INDEX)
    labels[first] = IGNORE_INDEX  # the reasoning's first word, which the model does generate, left out
    sample = read_sample(encoded.row, "messages", "last_assistant")[0]
    problems = judge_labels(enc.tok, sample, "last_assistant", encoded.input_ids, labels, enc.stop_ids)
    assert [kind for kind, _ in problems] == ["assistant_untrained"]
    assert problems[0][1].startswith("1 of ")
    # the labels as made pass the same verification a trainer's labels get (TRL, LLaMA-Factory, Axolotl)
    assert judge_labels(enc.tok, sample, "last_assistant", encoded.input_ids, encoded.labels, enc.stop_ids) == []
    # without the prompt's end, the "<think>" the prompt holds is (wrongly) required to train
    text = enc.tok.decode(list(encoded.input_ids), skip_special_tokens=False)
    offsets = enc.tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    flags = [label != IGNORE_INDEX for label in encoded.labels]
    assert [k for k, _ in verify_turns(sample, text, offsets, flags, "last_assistant")] == ["assistant_untrained"]


def test_qwen35_stripping_earlier_reasoning_is_history_rewritten_not_a_prompt_mismatch(tokenizers):
    every_turn = encode(encoder(tokenizers, "qwen35", QWEN35, "assistant"), REASONING_IN_HISTORY)
    assert [kind for kind, _ in every_turn.problems] == ["history_rewritten"]
    assert "messages[1] renders differently once later turns follow" in every_turn.problems[0][1]
    last = encoder(tokenizers, "qwen35", QWEN35)
    encoded = encode(last, REASONING_IN_HISTORY)
    assert encoded.problems == ()
    assert trained_text(last, encoded) == "Three lamps glow.\n</think>\n\nKalo sees three lamps.<|im_end|>"


def test_qwen35_without_its_generation_prompt_branch_says_the_header_is_missing(tokenizers):
    bare = QWEN35[: QWEN35.rindex("{%- if add_generation_prompt %}")]
    encoded = encode(encoder(tokenizers, "qwen35", bare), REASONING_APART)
    assert [kind for kind, _ in encoded.problems] == ["generation_prompt_ignored"]
    assert "the inference prompt before messages[2] lacks the assistant header" in encoded.problems[0][1]
    assert "counts" not in encoded.problems[0][1]  # the header shown holds reasoning: not shown


@pytest.mark.parametrize("dropped, role", [
    ({"role": "system", "content": "You answer in one short sentence."}, "system"),
    ({"role": "tool", "content": "{\"comets\": 2}"}, "tool"),
], ids=["system", "tool"])
def test_phi3_gguf_template_dropping_a_message_names_it(tokenizers, dropped, role):
    enc = encoder(tokenizers, "phi3", PHI3_GGUF, "assistant")
    rest = [{"role": "user", "content": "How many comets?"}, {"role": "assistant", "content": "Two comets."}]
    encoded = encode(enc, [dropped] + rest if role == "system" else rest[:1] + [dropped] + rest[1:])
    label = "messages[0]" if role == "system" else "messages[1]"
    assert ("message_dropped", f"the chat template drops {label} ({role}): its content is nowhere in the "
            "rendered text") in encoded.problems
    assert encode(enc, rest).problems == ()  # the same template with nothing to drop
