"""Pathological rows: a row far beyond max_length is tokenized only as far as training can use
it, counted as truncated with a lower bound on its length, in bounded memory (issue 26)."""

from __future__ import annotations

import copy
import tracemalloc
from types import SimpleNamespace

import pytest

from pytest_ftready.data.encoding import Encoder
from pytest_ftready.data.layouts import read_sample
from pytest_ftready.data.rows import Row
from pytest_ftready.tiny import CHATML

MAX_LENGTH = 64
WORDS = "yulquaka likes the red lamp and then rests by the river "


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)  # the session's tiny model: no second BPE training


def encoder(tok, template=CHATML, fmt="messages", train_on="assistant"):
    tok = copy.copy(tok)
    tok.chat_template = template
    data = SimpleNamespace(format=fmt, train_on=train_on, max_length=MAX_LENGTH, add_special_tokens=False)
    return Encoder(tok, data, frozenset({tok.convert_tokens_to_ids("<|im_end|>")}))


def chat_row(content: str) -> Row:
    return Row("train.jsonl", 3, {"messages": [{"role": "user", "content": "Say it all."},
                                               {"role": "assistant", "content": content},
                                               {"role": "user", "content": "Again?"},
                                               {"role": "assistant", "content": "No."}]})


def exact(enc: Encoder, row: Row):
    """The row encoded whole (no cut): what the encoder gave before issue 26."""
    sample, _ = read_sample(row, enc.format, enc.train_on, enc.roles)
    return enc._encode_chat(row, sample, budget=0) if hasattr(sample, "messages") else enc._encode_plain(row, sample, cut=False)


@pytest.mark.parametrize("template", [CHATML, CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", "")],
                         ids=["generation-markers", "prefix-diff"])
def test_a_row_beyond_max_length_gives_the_tokens_and_labels_of_the_whole_row(tokenizer, template):
    enc = encoder(tokenizer, template)
    row = chat_row(WORDS * (3 * enc.char_budget // len(WORDS)))
    cut, whole = enc.encode(row), exact(enc, row)
    assert cut.cut and not whole.cut
    assert (cut.input_ids, cut.labels) == (whole.input_ids, whole.labels)
    assert len(cut.input_ids) == MAX_LENGTH and MAX_LENGTH < cut.full_length <= whole.full_length
    kinds = {kind: detail for kind, detail in cut.problems}
    # the trained run cut off by the budget is not "a span without a stop token"
    assert set(kinds) == {kind for kind, _ in whole.problems} == {"truncated_part"}
    assert "cuts at least" in kinds["truncated_part"] and f"at least {cut.full_length:,} tokens" in kinds["truncated_part"]


def test_a_text_row_is_cut_the_same_way(tokenizer):
    enc = encoder(tokenizer, fmt="text", train_on="all")
    row = Row("train.jsonl", 1, {"text": WORDS * (3 * enc.char_budget // len(WORDS))})
    cut, whole = enc.encode(row), exact(enc, row)
    assert cut.cut and (cut.input_ids, cut.labels) == (whole.input_ids, whole.labels)
    assert {kind for kind, _ in cut.problems} == {"truncated_part"}


def test_a_row_within_the_budget_is_encoded_whole(tokenizer):
    enc = encoder(tokenizer)
    row = chat_row("Yulquaka likes the red.")
    encoded = enc.encode(row)
    assert not encoded.cut and encoded == exact(enc, row)


def test_an_8_mb_row_costs_what_max_length_tokens_cost(tokenizer):
    """One long word of 8 MB (the issue's case: 3.3 GB and a minute before): Python allocates
    less than one more copy of the row while encoding it."""
    enc = encoder(tokenizer)
    content = "a" * (8 * 2**20)
    row = chat_row(content)
    tracemalloc.start()
    try:
        encoded = enc.encode(row)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert encoded.cut and len(encoded.input_ids) == MAX_LENGTH
    assert peak < len(content) // 4, f"{peak:,} bytes allocated while encoding an 8 MB row"
    assert encoded.trainable  # its first max_length tokens still train
