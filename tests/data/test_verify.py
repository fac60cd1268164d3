"""data/verify.py: labels made by someone else, judged like the built-in encoder's."""

from __future__ import annotations

import pytest

from pytest_ftready.data.layouts import read_sample
from pytest_ftready.data.rows import Row
from pytest_ftready.data.verify import judge_labels, runs, verify_turns

ROW = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."},
                    {"role": "assistant", "content": "Blue river."}]}
CHAT = read_sample(Row("train.jsonl", 1, ROW), "auto", "assistant")[0]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def prefix_labels(tok):
    """Correct labels: the assistant content and its <|im_end|>, nothing else."""
    ids = tok.apply_chat_template(ROW["messages"], tokenize=True, return_dict=True)["input_ids"]
    start = len(tok.apply_chat_template(ROW["messages"][:2], tokenize=True, return_dict=True,
                                        add_generation_prompt=True)["input_ids"])
    labels = [-100] * len(ids)
    labels[start:len(ids) - 1] = ids[start:len(ids) - 1]  # the final newline is not trained
    return ids, labels


def stops(tok):
    return frozenset({tok.eos_token_id})


def test_correct_labels_have_no_problem(tok):
    ids, labels = prefix_labels(tok)
    assert judge_labels(tok, CHAT, "assistant", ids, labels, stops(tok)) == []


def test_trained_user_and_system_tokens_are_named(tok):
    ids, _ = prefix_labels(tok)
    kinds = [k for k, _ in judge_labels(tok, CHAT, "assistant", ids, list(ids), stops(tok))]
    assert kinds.count("wrong_role_trained") == 2  # system and user


def test_an_untrained_stop_token_and_a_half_trained_answer_are_named(tok):
    ids, labels = prefix_labels(tok)
    end = len(ids) - 2  # <|im_end|> left out
    labels[end] = -100
    problems = dict(judge_labels(tok, CHAT, "assistant", ids, labels, stops(tok)))
    assert "stop_untrained" in problems
    start = labels.index(next(label for label in labels if label != -100))
    labels[start] = -100
    assert "assistant_untrained" in dict(judge_labels(tok, CHAT, "assistant", ids, labels, stops(tok)))


def test_truncation_is_accounted_for(tok):
    ids, labels = prefix_labels(tok)
    cut = len(ids) - 3  # the stop token and part of the answer fall beyond max_length
    problems = dict(judge_labels(tok, CHAT, "assistant", ids[:cut], labels[:cut], stops(tok),
                                 full_length=len(ids)))
    assert "stop_untrained" not in problems and "truncated_part" in problems
    start = next(i for i, label in enumerate(labels) if label != -100)
    problems = dict(judge_labels(tok, CHAT, "assistant", ids[:start], labels[:start], stops(tok),
                                 full_length=len(ids)))
    assert set(problems) == {"truncated_all"}


def test_labels_must_be_the_input_ids_unshifted(tok):
    ids, labels = prefix_labels(tok)
    shifted = labels[1:] + [-100]
    assert "labels_shifted" in dict(judge_labels(tok, CHAT, "assistant", ids, shifted, stops(tok)))
    assert judge_labels(tok, CHAT, "assistant", ids, labels[:-1], stops(tok))[0][0] == "render_error"


def test_helpers():
    assert runs([False, True, True, False, True]) == [(1, 3), (4, 5)]
    assert verify_turns(CHAT, "", [], [], "assistant") == []  # nothing located, nothing judged


def test_a_row_filling_max_length_is_taken_as_cut_when_its_full_length_is_unknown(tok):
    ids, labels = prefix_labels(tok)
    cut = len(ids) - 3
    problems = dict(judge_labels(tok, CHAT, "assistant", ids[:cut], labels[:cut], stops(tok),
                                 max_length=cut))
    assert "stop_untrained" not in problems and "a longer row" in problems["truncated_part"]
    assert "truncated_part" not in dict(judge_labels(tok, CHAT, "assistant", ids, labels, stops(tok),
                                                     max_length=len(ids) + 1))
