"""The encoder's fast paths give exactly what the slow ones give: one direct render (text and
{% generation %} spans together) against apply_chat_template for every render and mask, and the
linear passes over tokens against their plain definitions (hypothesis)."""

from __future__ import annotations

import copy
import inspect
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_ftready.data import rendering
from pytest_ftready.data.encoding import (Encoder, _block_flags, _block_spans, _flags_in_order, _in_order,
                                          _runs_in_order, _trained_flags, _zero_width)
from pytest_ftready.data.layouts import row_problems
from pytest_ftready.data.rendering import Renderer, _overlap_mask, generation_mask
from pytest_ftready.data.rows import Row
from pytest_ftready.data.verify import runs, verify_turns
from pytest_ftready.tiny import CHATML
from tests.data.test_encoding import (CHAT, CHATML_EMPTY_MARKERS, CHATML_EOS_OUTSIDE, CHATML_NO_MARKERS, GEMMA,
                                      GEMMA_WRONG_PROMPT, LLAMA3, LLAMA3_TRAINS_USER, MISTRAL, THINK_TURNS,
                                      THINKING, TWO_TURNS)

TOOLS = [{"type": "function", "function": {"name": "weather_lookup", "parameters": {"type": "object"}}}]
WITH_TOOLS = CHATML.replace("{{ bos_token }}", "{{ bos_token }}{% if tools %}{{ tools | tojson }}\n{% endif %}")
FAILS_ON_LONG = CHATML.replace("{{ bos_token }}", "{% if messages|length > 3 %}{{ raise_exception('too long') }}"
                               "{% endif %}{{ bos_token }}")
TEMPLATES = {  # name: (template, eos)
    "chatml": (CHATML, "<|im_end|>"), "no-markers": (CHATML_NO_MARKERS, "<|im_end|>"),
    "markers-mark-nothing": (CHATML_EMPTY_MARKERS, "<|im_end|>"), "eos-outside": (CHATML_EOS_OUTSIDE, "<|im_end|>"),
    "llama3": (LLAMA3, "<|eot_id|>"), "llama3-trains-user": (LLAMA3_TRAINS_USER, "<|eot_id|>"),
    "gemma": (GEMMA, "<end_of_turn>"), "gemma-wrong-prompt": (GEMMA_WRONG_PROMPT, "<end_of_turn>"),
    "mistral": (MISTRAL, "</s>"), "thinking": (THINKING, "<|im_end|>"), "tools": (WITH_TOOLS, "<|im_end|>"),
    "fails-on-long": (FAILS_ON_LONG, "<|im_end|>"), "named": ({"default": CHATML, "tool_use": WITH_TOOLS}, "<|im_end|>"),
}
ROWS = [
    {"messages": CHAT}, {"messages": TWO_TURNS}, {"messages": THINK_TURNS}, {"messages": CHAT, "tools": TOOLS},
    {"messages": [CHAT[0], CHAT[1], dict(CHAT[2], weight=0), TWO_TURNS[3], TWO_TURNS[4]]},
    {"messages": [CHAT[1], CHAT[2], TWO_TURNS[3], dict(TWO_TURNS[4], weight=0)]},
    {"messages": [CHAT[1], dict(CHAT[2], training=False), TWO_TURNS[3], TWO_TURNS[4]]},
    {"messages": [{"role": "assistant", "content": "I open."}, {"role": "user", "content": "ok"},
                  {"role": "assistant", "content": "Fine."}]},
    {"messages": [{"role": "user", "content": "call it"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
                  {"role": "tool", "content": "42"}, {"role": "assistant", "content": "It is 42."}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "same"}, {"role": "assistant", "content": "same"},
                  {"role": "user", "content": "same"}, {"role": "assistant", "content": "same"}]},
    {"messages": [{"role": "user", "content": "x " * 120}, {"role": "assistant", "content": "y " * 30}]},
    {"messages": [{"role": "user", "content": "a<|im_end|>b"}, {"role": "assistant", "content": "c<|im_start|>d"}]},
    {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
    {"prompt": CHAT[:2], "completion": CHAT[2:]},
    {"prompt": "Q: what is red?\nA:", "completion": " a colour"}, {"text": "Just some text to learn."},
]
CONFIGS = [(512, False), (24, False), (512, True)]  # (max_length, add_special_tokens)


@pytest.fixture(scope="module")
def tokenizers(tiny_model_dir):
    from transformers import AutoTokenizer

    from pytest_ftready.tiny import build_tokenizer

    return {"tiny": AutoTokenizer.from_pretrained(tiny_model_dir), "adds-bos": build_tokenizer(add_bos=True)}


def encoder(tok, template, eos, train_on, max_length, add_special):
    tok = copy.deepcopy(tok)
    tok.chat_template, tok.eos_token = template, eos
    data = SimpleNamespace(format="auto", train_on=train_on, max_length=max_length, add_special_tokens=add_special)
    return Encoder(tok, data, frozenset({tok.convert_tokens_to_ids(eos)}))


def outcome(call):
    try:
        return call()
    except Exception as exc:  # the same error either way
        return type(exc).__name__, str(exc)


def test_the_direct_render_is_used_with_the_installed_transformers(tokenizers):
    assert Renderer(tokenizers["tiny"]).fast  # else the comparison below compares the slow path with itself


@pytest.mark.parametrize("name", list(TEMPLATES))
@pytest.mark.parametrize("tok_name", ["tiny", "adds-bos"])
def test_fast_and_fallback_encode_every_row_identically(tokenizers, name, tok_name, monkeypatch):
    template, eos = TEMPLATES[name]
    compared = 0
    for train_on in ("all", "assistant", "last_assistant"):
        for max_length, add_special in CONFIGS:
            fast = encoder(tokenizers[tok_name], template, eos, train_on, max_length, add_special)
            slow = encoder(tokenizers[tok_name], template, eos, train_on, max_length, add_special)
            slow.renderer.force_slow()
            assert fast.renderer.fast and not slow.renderer.fast
            rows = [Row("t.jsonl", k, data) for k, data in enumerate(ROWS)]
            rows = [row for row in rows if not row_problems(row, "auto", train_on)]
            with monkeypatch.context() as patch:  # the slow way all along: no marked blocks taken as the flags,
                # and no offsets taken as in order without each use checking them itself
                patch.setattr("pytest_ftready.data.encoding._zero_width", lambda offsets, columns=None: None)
                patch.setattr("pytest_ftready.data.encoding._in_order", lambda offsets: None)
                expected = [(outcome(lambda: slow.encode(row)), outcome(lambda: slow.prompt_ids(row))) for row in rows]
            got = [(outcome(lambda: fast.encode(row)), outcome(lambda: fast.prompt_ids(row))) for row in rows]
            for row, one, other in zip(rows, got, expected):
                assert one == other, (train_on, max_length, add_special, row.data)
            compared += len(rows)
    assert compared > 100


def test_a_prepared_sample_encodes_like_the_row(tokenizers):
    enc = encoder(tokenizers["tiny"], CHATML, "<|im_end|>", "assistant", 512, False)
    row = Row("t.jsonl", 1, {"messages": TWO_TURNS})
    assert enc.encode(row, enc.sample(row)) == enc.encode(row)
    assert enc.encode(row).problems == () and enc.encode(row).trained > 0


def test_a_mask_the_two_transformers_ways_disagree_on_goes_through_apply_chat_template(tokenizers, monkeypatch):
    enc = encoder(tokenizers["tiny"], CHATML, "<|im_end|>", "assistant", 512, False)
    row = Row("t.jsonl", 1, {"messages": TWO_TURNS})
    expected = enc.encode(row)
    calls = []
    real = type(enc.tok).apply_chat_template
    monkeypatch.setattr("pytest_ftready.data.encoding.generation_runs", lambda encoding, spans, columns=None: None)
    monkeypatch.setattr(type(enc.tok), "apply_chat_template", lambda self, *a, **k: calls.append(k) or real(self, *a, **k))
    assert enc.encode(row) == expected and any(k.get("return_assistant_tokens_mask") for k in calls)


def test_the_fallback_is_taken_where_transformers_differs(tokenizers, monkeypatch):
    class Overriding(type(tokenizers["tiny"])):
        def apply_chat_template(self, *args, **kwargs):
            return super().apply_chat_template(*args, **kwargs)

    tok = copy.deepcopy(tokenizers["tiny"])
    tok.__class__ = Overriding
    assert not Renderer(tok).fast  # its own apply_chat_template may do more than the base one
    assert Renderer(tokenizers["tiny"]).render(CHAT) == Renderer(tok).render(CHAT)

    def other_signature(conversations, chat_template, **kwargs):
        return None

    monkeypatch.setattr("transformers.utils.chat_template_utils.render_jinja_template", other_signature)
    assert rendering._internals() is None and not Renderer(tokenizers["tiny"]).fast
    monkeypatch.delattr("transformers.utils.chat_template_utils._normalize_chat_messages")
    assert rendering._internals() is None


def test_generation_mask_is_apply_chat_templates(tokenizers):
    tok = tokenizers["tiny"]
    for messages in (CHAT, TWO_TURNS, THINK_TURNS):
        text, spans = Renderer(tok).render_marked(messages)
        out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        base = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        assert list(base["input_ids"]) == list(out["input_ids"]) and spans
        assert generation_mask(base, spans) == [bool(m) for m in out["assistant_masks"]]


# ---- the linear passes against their definitions ---------------------------------------------------
def transformers_overlap(offsets, spans):
    """transformers 5's assistant mask loop, as written there."""
    mask, k = [False] * len(offsets), 0
    for t, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        mask[t] = end > spans[k][0]
    return mask


def defined_flags(offsets, spans):
    """A token trains when its first character lies in the span with the greatest start at or before it."""
    ordered = sorted(spans)
    out = []
    for a, b in offsets:
        before = [s for s in ordered if s[0] <= a]
        out.append(b > a and bool(before) and a < before[-1][1])
    return out


span = st.tuples(st.integers(0, 30), st.integers(0, 30))
in_order = st.lists(st.integers(0, 3), max_size=30).map(
    lambda gaps: [(sum(gaps[:i]) + i, sum(gaps[:i]) + i + 1 + (gaps[i] % 2)) for i in range(len(gaps))])
# starts and ends that never go back, every token with characters: apart, touching, sharing characters
# (byte-level tokens splitting a character of several bytes) or leaving some between them
def _never_back(steps):
    out, start, end = [], 0, 0
    for step, width in steps:
        start += step
        end = max(end, start + width)
        out.append((start, end))
    return out


never_back = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3)), max_size=30).map(_never_back)
offsets_st = st.one_of(st.lists(span, max_size=30), in_order, never_back)


@settings(max_examples=400, deadline=None, database=None)
@given(offsets_st, st.lists(span, max_size=6))
def test_trained_flags_follow_their_definition(offsets, spans):
    assert _trained_flags(offsets, spans) == defined_flags(offsets, spans)


@settings(max_examples=400, deadline=None, database=None)
@given(offsets_st, st.lists(span, max_size=6))
def test_overlap_mask_is_transformers_loop(offsets, spans):
    assert _overlap_mask(offsets, spans) == transformers_overlap(offsets, spans)
    ordered = sorted(spans)
    assert _overlap_mask(offsets, ordered) == transformers_overlap(offsets, ordered)


@settings(max_examples=400, deadline=None, database=None)
@given(offsets_st, st.lists(st.booleans(), max_size=30))
def test_block_flags_are_the_flags_of_the_block_tokens(offsets, marked):
    marked = (marked + [False] * len(offsets))[: len(offsets)]
    blocks = runs(marked)
    assert blocks == [(i, j) for i, j in _defined_runs(marked)]
    zero = _zero_width(offsets)
    if zero is not None:
        spans = [o for i, j in blocks for o in offsets[i:j] if o[1] > o[0]]
        assert _block_flags(len(offsets), blocks, zero) == _trained_flags(offsets, spans)
        assert zero == [k for k, (a, b) in enumerate(offsets) if b <= a]


@settings(max_examples=400, deadline=None, database=None)
@given(offsets_st, st.lists(span, max_size=6))
def test_offsets_in_order_are_found_as_defined_and_change_nothing_where_passed(offsets, spans):
    """``_in_order``: every token has characters and neither starts nor ends go back (tokens may
    share characters); the masks, the flags and the verification given its columns judge as they
    do checking the offsets themselves."""
    defined = (all(a < b for a, b in offsets)
               and all(offsets[k][0] <= offsets[k + 1][0] and offsets[k][1] <= offsets[k + 1][1]
                       for k in range(len(offsets) - 1)))
    columns = _in_order(offsets)
    assert (columns is not None) == defined
    if columns is None:
        return
    assert columns == ([a for a, _ in offsets], [b for _, b in offsets])
    assert _overlap_mask(offsets, sorted(spans), columns) == _overlap_mask(offsets, sorted(spans))
    apart = all(offsets[k][1] <= offsets[k + 1][0] for k in range(len(offsets) - 1))
    assert _zero_width(None, columns) == _zero_width(offsets) == ([] if apart else None)
    assert _flags_in_order(columns[0], len(offsets), spans) == _trained_flags(offsets, spans)
    assert _runs_in_order(columns[0], spans) == runs(_trained_flags(offsets, spans))
    text = "".join(chr(97 + k % 26) for k in range(max((b for _, b in offsets), default=0)))
    chat = SimpleNamespace(messages=[{"role": "user", "content": text[a:b]} for a, b in spans if b > a]
                           + [{"role": "assistant", "content": text[-3:]}])
    last = len(chat.messages) - 1  # the assistant turn trains, the user turns do not
    chat.trained, chat.labels, chat.marks = [last], [f"#{k}" for k in range(last + 1)], [""] * (last + 1)
    for trained in ([True] * len(offsets), [k % 3 == 0 for k in range(len(offsets))]):
        assert (verify_turns(chat, text, offsets, trained, "assistant", columns[0])
                == verify_turns(chat, text, offsets, trained, "assistant"))


@settings(max_examples=400, deadline=None, database=None)
@given(offsets_st, st.lists(st.booleans(), max_size=30))
def test_a_marked_block_is_one_span_where_its_tokens_leave_no_character_out(offsets, marked):
    """The spans of marked blocks read from columns (a block without characters left out between
    its tokens as one span) flag the same tokens as every marked token's own span."""
    columns = _in_order(offsets)
    if columns is None:
        return
    blocks = runs((marked + [False] * len(offsets))[: len(offsets)])
    assert _block_spans(blocks, offsets) == [o for i, j in blocks for o in offsets[i:j]]
    assert (_flags_in_order(columns[0], len(offsets), _block_spans(blocks, None, columns))
            == _trained_flags(offsets, _block_spans(blocks, offsets)))


def _defined_runs(flags):
    starts = [i for i, f in enumerate(flags) if f and (i == 0 or not flags[i - 1])]
    return [(i, next((j for j in range(i, len(flags)) if not flags[j]), len(flags))) for i in starts]


def test_the_render_signature_this_relies_on():
    from transformers.utils.chat_template_utils import render_jinja_template

    params = list(inspect.signature(render_jinja_template).parameters)
    assert tuple(params[: len(rendering.RENDER_PARAMS)]) == rendering.RENDER_PARAMS
