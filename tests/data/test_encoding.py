"""The encoder and the data-check logic on real chat templates of the common families,
each in a correct and a broken variant, with a real trained BPE tokenizer."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from pytest_ftready.data.encoding import IGNORE_INDEX, Encoder, render_example
from pytest_ftready.data.layouts import row_problems
from pytest_ftready.data.rows import Row
from pytest_ftready.tiny import CHATML

CHATML_EOS_OUTSIDE = CHATML.replace("{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}",
                                    "{% generation %}{{ message['content'] }}{% endgeneration %}{{ '<|im_end|>' }}")
CHATML_NO_MARKERS = CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", "")
CHATML_EMPTY_MARKERS = CHATML.replace("{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}",
                                      "{% generation %}{% endgeneration %}{{ message['content'] + '<|im_end|>' }}")
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | trim }}<|eot_id|>{% endgeneration %}"
    "{% else %}{{ m['content'] | trim }}<|eot_id|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# Broken: the generation block wraps every turn, so user and system tokens are trained.
LLAMA3_TRAINS_USER = (
    "{{ bos_token }}{% for m in messages %}{% generation %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endgeneration %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
# Broken: the inference prompt names the role 'assistant', training renders 'model'.
GEMMA_WRONG_PROMPT = GEMMA.replace("{% if add_generation_prompt %}<start_of_turn>model", "{% if add_generation_prompt %}<start_of_turn>assistant")
MISTRAL = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
MISTRAL_NO_EOS = MISTRAL.replace("{{ eos_token }}", "")
THINKING = (
    "{% set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and loop.index0 < ns.last_user %}{{ m['content'].split('</think>')[-1] | trim }}"
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What does kalo do with the red?"},
        {"role": "assistant", "content": "Kalo paints the red."}]
TWO_TURNS = CHAT + [{"role": "user", "content": "And then?"}, {"role": "assistant", "content": "Then kalo rests."}]
THINK_TURNS = [{"role": "user", "content": "Count the comets."},
               {"role": "assistant", "content": "<think>one, two</think>Two comets."},
               {"role": "user", "content": "And the lamps?"},
               {"role": "assistant", "content": "<think>three</think>Three lamps."}]


@pytest.fixture(scope="session")
def base_tokenizers():
    from pytest_ftready.tiny import build_tokenizer

    return {"plain": build_tokenizer(), "adds_bos": build_tokenizer(add_bos=True)}


@pytest.fixture
def encoder_for(base_tokenizers):
    def make(template, *, train_on="assistant", max_length=512, add_special=False, eos="<|im_end|>",
             bos="<s>", fmt="messages", adds_bos=False):
        tok = copy.deepcopy(base_tokenizers["adds_bos" if adds_bos else "plain"])
        tok.chat_template = template
        tok.eos_token = eos
        tok.bos_token = bos
        data = SimpleNamespace(format=fmt, train_on=train_on, max_length=max_length, add_special_tokens=add_special)
        return Encoder(tok, data, frozenset({tok.convert_tokens_to_ids(eos)}))
    return make


def kinds(encoded):
    return {kind for kind, _ in encoded.problems}


def encode(encoder, messages):
    return encoder.encode(Row("train.jsonl", 7, {"messages": messages}))


def trained_text(encoder, enc):
    return encoder.tok.decode([t for t, label in zip(enc.input_ids, enc.labels) if label != IGNORE_INDEX])


@pytest.mark.parametrize("template, eos, method", [
    (CHATML, "<|im_end|>", "generation-markers"),
    (CHATML_NO_MARKERS, "<|im_end|>", "prefix-diff"),
    (LLAMA3, "<|eot_id|>", "generation-markers"),
    (GEMMA, "<end_of_turn>", "prefix-diff"),
    (MISTRAL, "</s>", "prefix-diff"),
], ids=["chatml", "chatml-no-markers", "llama3", "gemma", "mistral"])
def test_correct_templates_train_exactly_the_assistant_turns(encoder_for, template, eos, method):
    encoder = encoder_for(template, eos=eos)
    assert encoder.chat_method == method
    enc = encode(encoder, TWO_TURNS)
    assert enc.problems == ()
    text = trained_text(encoder, enc)
    assert "Kalo paints the red." in text and "Then kalo rests." in text
    assert "What does kalo" not in text and "Be brief" not in text and "And then" not in text
    assert text.count(eos) == 2  # each turn's stop token carries loss
    assert [t for t, label in zip(enc.input_ids, enc.labels) if label != IGNORE_INDEX] == \
        [label for label in enc.labels if label != IGNORE_INDEX]


def test_prefix_diff_drops_the_templates_trailing_newline(encoder_for):
    encoder = encoder_for(CHATML_NO_MARKERS)
    text = trained_text(encoder, encode(encoder, CHAT))
    assert text == "Kalo paints the red.<|im_end|>"


@pytest.mark.parametrize("template, eos, expected", [
    (CHATML_EOS_OUTSIDE, "<|im_end|>", "stop_untrained"),
    (MISTRAL_NO_EOS, "</s>", "stop_untrained"),
    (LLAMA3_TRAINS_USER, "<|eot_id|>", "wrong_role_trained"),
    (GEMMA_WRONG_PROMPT, "<end_of_turn>", "prompt_not_prefix"),
    (CHATML_EMPTY_MARKERS, "<|im_end|>", "markers_empty"),
], ids=["chatml-eos-outside", "mistral-no-eos", "llama3-trains-user", "gemma-wrong-prompt", "empty-markers"])
def test_broken_templates_are_caught(encoder_for, template, eos, expected):
    enc = encode(encoder_for(template, eos=eos), TWO_TURNS)
    assert expected in kinds(enc)


def test_thinking_template_rewrites_history(encoder_for):
    broken = encode(encoder_for(THINKING), THINK_TURNS)
    assert "history_rewritten" in kinds(broken)
    encoder = encoder_for(THINKING, train_on="last_assistant")
    ok = encode(encoder, THINK_TURNS)
    assert ok.problems == ()
    assert trained_text(encoder, ok) == "<think>three</think>Three lamps.<|im_end|>"


def test_bos_doubled_when_the_trainer_adds_special_tokens(encoder_for):
    enc = encode(encoder_for(CHATML, add_special=True, adds_bos=True), CHAT)
    assert "bos_doubled" in kinds(enc)
    assert encode(encoder_for(CHATML, add_special=False, adds_bos=True), CHAT).problems == ()


def test_truncation_that_eats_the_response(encoder_for):
    encoder = encoder_for(CHATML, max_length=12)
    enc = encode(encoder, CHAT)
    assert "truncated_all" in kinds(enc) and enc.trained == 0 and enc.length == 12
    partial = encode(encoder_for(CHATML, max_length=enc.full_length - 3), CHAT)
    assert "truncated_part" in kinds(partial) and 0 < partial.trained < partial.trained_full


def test_train_on_all_and_text_and_prompt_completion(encoder_for):
    enc = encode(encoder_for(CHATML, train_on="all"), CHAT)
    assert enc.trained == enc.length and enc.problems == ()
    pc = encoder_for(CHATML, fmt="prompt_completion", train_on="completion")
    enc = pc.encode(Row("pc.jsonl", 1, {"prompt": "Q: what is red?\nA:", "completion": " a colour"}))
    assert trained_text(pc, enc) == " a colour<|im_end|>" and enc.problems == ()
    text = encoder_for(CHATML, fmt="text", train_on="all")
    enc = text.encode(Row("t.jsonl", 1, {"text": "the river keeps the lamp"}))
    assert enc.trained == enc.length and enc.input_ids[-1] == text.tok.eos_token_id


def test_render_example_marks_trained_tokens(encoder_for):
    encoder = encoder_for(CHATML)
    shown = render_example(encoder.tok, encode(encoder, CHAT))
    assert "[[Kalo paints the red.<|im_end|>]]" in shown and shown.count("[[") == 1


@pytest.mark.parametrize("data, problem", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "has no assistant turn"),
    ({"messages": [{"role": "human", "content": "hi"}, {"role": "assistant", "content": "x"}]}, "role is 'human'"),
    ({"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}]}, "has empty content"),
    ({"messages": "hello"}, "non-empty list field 'messages'"),
    (["not", "an", "object"], "expected a JSON object"),
])
def test_row_shapes(data, problem):
    assert any(problem in p for p in row_problems(Row("f.jsonl", 1, data), "messages", "assistant"))


@pytest.mark.parametrize("data", [
    {"messages": [{"role": "user", "content": "weather in Oslo?"},
                  {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
                      "name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                  {"role": "tool", "content": "4 C, rain"}, {"role": "assistant", "content": "4 C and rain."}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                  {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}]},
], ids=["tool-calls", "content-parts"])
def test_tool_calls_and_content_parts_are_well_formed(data):
    assert row_problems(Row("f.jsonl", 1, data), "messages", "assistant") == []


def test_unknown_stop_token_is_named(base_tokenizers):
    from pytest_ftready.data.encoding import stop_token_ids

    with pytest.raises(ValueError, match=r"\[data\] stop_tokens: '<\|nope\|>' is not in the tokenizer's vocabulary"):
        stop_token_ids(base_tokenizers["plain"], (), ["<|nope|>"])
    assert stop_token_ids(base_tokenizers["plain"], [7], ["<|eot_id|>"]) >= {7, base_tokenizers["plain"].eos_token_id}


def test_read_rows_reports_malformed_lines_and_keeps_reading(tmp_path):
    from pytest_ftready.data.rows import read_rows

    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a"}\n{"text": \n\n{"text": "c"}\n')
    rows, problems = read_rows([path])
    assert [r.line for r in rows] == [1, 4]
    assert [(p.line, p.kind) for p in problems] == [(2, "malformed")]


# ---- per-message training flags and the other layouts, through the encoder -----------------
FIRST_UNTRAINED = [dict(m) for m in TWO_TURNS]
FIRST_UNTRAINED[2]["weight"] = 0  # the first assistant turn of a two-turn row


@pytest.mark.parametrize("template, method", [(CHATML, "generation-markers"), (CHATML_NO_MARKERS, "prefix-diff")],
                         ids=["markers", "prefix-diff"])
def test_an_assistant_turn_marked_weight_0_carries_no_loss(encoder_for, template, method):
    encoder = encoder_for(template)
    enc = encode(encoder, FIRST_UNTRAINED)
    assert encoder.chat_method == method and enc.problems == ()
    assert trained_text(encoder, enc) == "Then kalo rests.<|im_end|>"


def test_masking_verification_fails_when_the_labels_train_a_weight_0_turn(encoder_for):
    # the template's generation block wraps every turn: the flagged turn ends up trained
    enc = encode(encoder_for(LLAMA3_TRAINS_USER, eos="<|eot_id|>"), FIRST_UNTRAINED)
    details = [detail for kind, detail in enc.problems if kind == "wrong_role_trained"]
    assert any("messages[2] (assistant) carry loss, but it is marked not to train (weight: 0)" in d for d in details)


def test_verification_expects_the_flagged_turn_untrained(encoder_for):
    from pytest_ftready.data.encoding import verify_turns
    from pytest_ftready.data.layouts import read_sample

    encoder = encoder_for(CHATML)
    chat, _ = read_sample(Row("t.jsonl", 1, {"messages": FIRST_UNTRAINED}), "messages", "assistant")
    text = encoder.render(chat.messages)
    offsets = encoder.tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    everything = [True] * len(offsets)
    kinds_found = {kind for kind, _ in verify_turns(chat, text, offsets, everything, "assistant")}
    assert "wrong_role_trained" in kinds_found  # labels that train all of it are caught
    start = text.index("Then kalo rests.")
    only_second = [a >= start for a, _ in offsets]
    assert verify_turns(chat, text, offsets, only_second, "assistant") == []


@pytest.mark.parametrize("data", [
    {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "What does kalo do with the red?"},
                       {"from": "gpt", "value": "Kalo paints the red."}]},
    {"system": "Be brief.", "instruction": "What does kalo do with the red?", "output": "Kalo paints the red."},
    {"prompt": CHAT[:2], "completion": CHAT[2:]},
], ids=["sharegpt", "alpaca", "conversational-prompt-completion"])
def test_every_chat_layout_encodes_like_the_same_messages(encoder_for, data):
    encoder = encoder_for(CHATML, fmt="auto")
    enc = encoder.encode(Row("t.jsonl", 1, data))
    same = encode(encoder, CHAT)
    assert enc.problems == () and (enc.input_ids, enc.labels) == (same.input_ids, same.labels)
    assert encoder.tok.decode(encoder.prompt_ids(Row("t.jsonl", 1, data))).endswith("<|im_start|>assistant\n")


def test_tools_reach_the_template(encoder_for):
    with_tools = CHATML.replace("{{ bos_token }}", "{{ bos_token }}{% if tools %}{{ tools | tojson }}\n{% endif %}")
    encoder = encoder_for(with_tools)
    tools = [{"type": "function", "function": {"name": "weather_lookup"}}]
    enc = encoder.encode(Row("t.jsonl", 1, {"messages": CHAT, "tools": tools}))
    assert "weather_lookup" in encoder.tok.decode(enc.input_ids) and enc.problems == ()
    assert "weather_lookup" not in trained_text(encoder, enc)


def test_prompt_completion_train_on_all_trains_the_prompt_too(encoder_for):
    encoder = encoder_for(CHATML, fmt="prompt_completion", train_on="all")
    enc = encoder.encode(Row("pc.jsonl", 1, {"prompt": "Q: what is red?\nA:", "completion": " a colour"}))
    assert enc.trained == enc.length


def test_a_conversation_without_a_chat_template_is_a_clear_error(encoder_for):
    encoder = encoder_for("", fmt="auto")
    assert encoder.encode(Row("t.jsonl", 1, {"prompt": "Q:", "completion": " A"})).method == "prompt-completion"
    with pytest.raises(ValueError, match="the tokenizer has no chat template"):
        encoder.encode(Row("t.jsonl", 1, {"messages": CHAT}))
    with pytest.raises(ValueError, match="the tokenizer has no chat template"):
        encoder_for("", fmt="sharegpt")
