"""Encoded examples as tokens for people: one entry per token with its label, long examples
shown head and tail, and no secret surviving even when the tokenizer splits it."""

from __future__ import annotations

import pytest

from pytest_ftready.data.encoding import IGNORE_INDEX, Encoded
from pytest_ftready.data.rows import Row
from pytest_ftready.data.token_view import token_view
from tests import planted


@pytest.fixture(scope="module")
def tokenizer():
    from pytest_ftready.tiny import build_tokenizer

    return build_tokenizer()


def encoded(tokenizer, prompt: str, answer: str) -> Encoded:
    p = tokenizer.encode(prompt, add_special_tokens=False)
    a = tokenizer.encode(answer, add_special_tokens=False)
    return Encoded(Row("train.jsonl", 7, {}), tuple(p + a), tuple([IGNORE_INDEX] * len(p) + a), "test", len(p + a),
                   len(a), (("truncated_part", f"cut near {answer}"),))


def test_one_entry_per_token_with_its_label(tokenizer):
    enc = encoded(tokenizer, "What does the red do?", " The red rests.")
    view = token_view(tokenizer, enc)
    assert len(view["tokens"]) == enc.length and view["where"] == "train.jsonl:7"
    assert "".join(t for t, _ in view["tokens"]) == "What does the red do? The red rests."
    assert [flag for _, flag in view["tokens"]] == [label != IGNORE_INDEX for label in enc.labels]
    assert view["trained"] == enc.trained and view["skipped_at"] is None


def test_a_long_example_shows_its_head_and_its_tail(tokenizer):
    enc = encoded(tokenizer, "word " * 300, " the end.")
    view = token_view(tokenizer, enc, head=10, tail=5)
    assert len(view["tokens"]) == 15 and view["skipped_at"] == 10 and view["skipped"] == enc.length - 15
    assert "".join(t for t, _ in view["tokens"][-5:]).endswith("the end.") and view["tokens"][-1][1]


@pytest.mark.parametrize("kind", ["email", "aws_access_key_id"])
def test_a_secret_split_across_tokens_is_blanked_everywhere(tokenizer, kind):
    value = {**planted.SECRETS, **planted.PII}[kind]
    enc = encoded(tokenizer, "Contact me at", f" {value} today.")
    view = token_view(tokenizer, enc)
    pieces = [t for t, _ in view["tokens"]]
    assert sum(1 for p in pieces if p.endswith("redacted>")) == 1
    shown = "".join(pieces) + str(view["problems"])
    assert value not in shown and value[:6] not in shown, shown
    assert "today." in "".join(pieces)


def test_a_known_value_is_blanked_and_clean_tokens_stay_as_they_are(tokenizer):
    enc = encoded(tokenizer, "plain", " words here")
    assert [t for t, _ in token_view(tokenizer, enc)["tokens"]] == [tokenizer.decode([i]) for i in enc.input_ids]
    secret = token_view(tokenizer, enc, known={"words here": "password"})
    assert "words" not in "".join(t for t, _ in secret["tokens"])
