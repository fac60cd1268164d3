"""Empty reasoning blocks trained (issue 42, item 5), on Qwen 3.5's real template
(tests/data/templates/): a row without reasoning renders ``<think>\\n\\n</think>\\n\\n`` into its
last assistant turn, and the ``\\n</think>`` after the inference prompt's ``<think>\\n`` carries
loss. data.masking counts those rows and names them; with ``[data] train_empty_reasoning =
false`` it fails on them. History rewritten between the training render and the inference render
(data.template's ``history_rewritten``) is counted in data.masking's measurements and page too.
Qwen3's template (the whole empty block trained) and Seed-OSS's (its own ``<seed:think>`` tags,
read from the template) are held at the encoder."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail
from pytest_ftready.tiny import example_rows, write_jsonl
from tests.data.test_real_families import tokenizers  # noqa: F401  (tiny BPE; llama.cpp's too where set)
from tests.faults.test_hostile_templates import _measured, _with_template
from tests.recipe.test_importer_conformance import folders  # noqa: F401  (a LLaMA-Factory config beside a model)

QWEN35 = (Path(__file__).parents[1] / "data" / "templates" / "Qwen3.5-4B.jinja").read_text()
COUNT_LINE = "rows training an empty reasoning block: {} row(s)"
REWRITTEN_LINE = "rows whose earlier turns (their reasoning) render differently at inference: {} row(s)"


def _qwen35_rows(tiny_example, edit_recipe, reasoned=lambda i: False, **edits) -> list[dict]:
    """The tiny example's rows under Qwen 3.5's template; rows ``reasoned(i)`` reason in their last answer."""
    rows = example_rows()
    for i, row in enumerate(rows):
        if reasoned(i):
            answer = row["messages"][-1]
            answer["content"] = f"<think>\nThe answer is short.\n</think>\n\n{answer['content']}"
    write_jsonl(tiny_example / "data" / "train.jsonl", rows)
    edit_recipe(tiny_example / "recipe.toml", **edits)
    _with_template(tiny_example, edit_recipe, QWEN35)
    return rows


def _masking(state):
    """data.masking's context and its failure (None when it passes): measurements either way."""
    from pytest_ftready.checks.registry import REGISTRY
    from pytest_ftready.session.context import CheckContext

    ctx = CheckContext(state, REGISTRY["data.masking"])
    try:
        with ctx.running():
            REGISTRY["data.masking"].body(ctx)
    except Fail as failed:
        return ctx, str(failed)
    return ctx, None


def _page(ctx) -> str:
    return Path(dict(ctx.user_properties)["masking_report"]).read_text()


def test_empty_blocks_are_counted_and_named_and_pass_by_default(make_state, tiny_example, edit_recipe):
    rows = _qwen35_rows(tiny_example, edit_recipe, train_on='"last_assistant"')
    ctx, failed = _masking(make_state())
    assert failed is None  # train_empty_reasoning defaults to true: measured, not judged
    measured = _measured(ctx)
    assert measured["empty_reasoning_rows"] == len(rows) == 50
    assert measured["history_rewritten_rows"] == 0  # last_assistant: trained as served
    page = _page(ctx)
    assert COUNT_LINE.format(50) in page and REWRITTEN_LINE.format(0) in page
    last = f"messages[{len(rows[0]['messages']) - 1}]"
    assert (f"empty_reasoning_trained: 1 empty reasoning block(s) (&lt;think&gt;…&lt;/think&gt; with only whitespace "
            f"between) carry loss in the trained tokens of {last}") in page


def test_setting_off_fails_naming_the_rows_without_reasoning_and_the_setting(make_state, tiny_example, edit_recipe):
    _qwen35_rows(tiny_example, edit_recipe, reasoned=lambda i: i % 2 == 0,
                 train_on='"last_assistant"\ntrain_empty_reasoning = false')
    ctx, failed = _masking(make_state())
    assert failed is not None
    assert _measured(ctx)["empty_reasoning_rows"] == 25  # the rows that reason train no empty block
    assert "empty_reasoning_trained in 25 row(s)" in failed
    places = failed.split("empty_reasoning_trained in 25 row(s)")[1].split("\n")[0]
    assert "[train.jsonl:2, train.jsonl:4, " in places and "train.jsonl:1," not in places and "and 15 more]" in places
    assert "[data] train_empty_reasoning = false" in failed and "set train_empty_reasoning = true" in failed
    assert "enable_thinking: false" in failed  # the trainer setting that masks the block
    assert COUNT_LINE.format(25) in _page(ctx)


def test_setting_off_passes_when_every_row_reasons(make_state, tiny_example, edit_recipe):
    _qwen35_rows(tiny_example, edit_recipe, reasoned=lambda i: True,
                 train_on='"last_assistant"\ntrain_empty_reasoning = false')
    ctx, failed = _masking(make_state())
    assert failed is None
    assert _measured(ctx)["empty_reasoning_rows"] == 0
    assert COUNT_LINE.format(0) in _page(ctx)


def test_history_rewritten_between_training_and_inference_renders_is_counted(make_state, tiny_example, edit_recipe):
    """Every assistant turn trained: an earlier turn renders its (empty) reasoning up to itself, and
    none once the next question follows, as at inference; those rows are counted and shown."""
    rows = _qwen35_rows(tiny_example, edit_recipe)  # train_on = "assistant"
    several = sum(1 for row in rows if sum(m["role"] == "assistant" for m in row["messages"]) > 1)
    assert several > 0
    ctx, _ = _masking(make_state())
    measured = _measured(ctx)
    assert measured["history_rewritten_rows"] == several
    assert REWRITTEN_LINE.format(several) in _page(ctx)


# ---- the encoder and the trainers' labels, on the template's own tags ------------------------
# (on the tiny BPE with Qwen's special tokens, and on llama.cpp's Qwen 3.5 vocabulary where
# FTREADY_REAL_TOKENIZERS names it: tests/data/templates/SOURCES.md)
PLAIN = [{"role": "user", "content": "How many comets?"}, {"role": "assistant", "content": "Two comets."}]




def _empty_problems(problems) -> list[str]:
    return [detail for kind, detail in problems if kind == "empty_reasoning_trained"]


@pytest.mark.parametrize("tags", [("<think>", "</think>"), ("<seed:think>", "</seed:think>")],
                         ids=["think", "template's own"])
def test_the_templates_own_reasoning_tags_are_found_and_trainers_labels_judged_alike(tokenizers, tags):
    """The tags between which the template puts reasoning_content are read from the template (a
    Seed-OSS-style ``<seed:think>``); a trainer's labels (judge_labels) get the same verdict."""
    from pytest_ftready.data.layouts import read_sample
    from pytest_ftready.data.verify import judge_labels
    from tests.data.test_real_families import encode, encoder

    template = QWEN35.replace("<think>", tags[0]).replace("</think>", tags[1])
    enc = encoder(tokenizers, "qwen35", template)
    encoded = encode(enc, PLAIN)
    [detail] = _empty_problems(encoded.problems)
    assert detail.startswith("1 empty reasoning block(s) (") and f"{tags[0]}…{tags[1]}" in detail
    assert "of messages[1]" in detail
    sample = read_sample(encoded.row, "messages", "last_assistant")[0]
    judged = judge_labels(enc.tok, sample, "last_assistant", encoded.input_ids, encoded.labels, enc.stop_ids)
    assert _empty_problems(judged) == [detail]
    reasoned = [PLAIN[0], {"role": "assistant", "reasoning_content": "Count them.", "content": "Two comets."}]
    assert _empty_problems(encode(enc, reasoned).problems) == []  # a block with reasoning in it trains rightly


def test_an_empty_block_the_inference_prompt_holds_is_not_trained_so_not_counted(tokenizers):
    """The template's enable_thinking=false branch (the empty block written into the generation
    prompt, as LLaMA-Factory's enable_thinking: false masks it): no token of it carries loss."""
    from tests.data.test_real_families import encode, encoder

    branch = "{%- if enable_thinking is defined and enable_thinking is false %}"
    assert branch in QWEN35
    enc = encoder(tokenizers, "qwen35", QWEN35.replace(branch, "{%- if true %}"))
    encoded = encode(enc, PLAIN)
    assert encoded.problems == ()
    assert enc.tok.decode([t for t, label in zip(encoded.input_ids, encoded.labels) if label != -100]) \
        == "Two comets.<|im_end|>"


@pytest.mark.parametrize("value", [False, True, None], ids=["false", "true", "unset"])
def test_llamafactory_enable_thinking_becomes_train_empty_reasoning(folders, value):
    """LLaMA-Factory's enable_thinking: false puts the empty block in the prompt (no loss); true,
    its default, in the response (data/template.py, ReasoningTemplate)."""
    from pytest_ftready.recipe import load_recipe
    from tests.recipe.test_importer_conformance import variant

    recipe = load_recipe(variant(folders["llamafactory"], "llamafactory",
                                 {} if value is None else {"enable_thinking": value}))
    assert recipe.data.train_empty_reasoning is (value is not False)


# ---- more real templates (tests/data/templates/SOURCES.md) ----------------------------------
TEMPLATES = Path(__file__).parents[1] / "data" / "templates"


def _real_encoder(file: str, eos: str, bos: str, specials=()):
    from types import SimpleNamespace

    from pytest_ftready.data.encoding import Encoder, stop_token_ids
    from pytest_ftready.tiny import build_tokenizer

    tok = build_tokenizer((TEMPLATES / file).read_text(), bos=bos, eos=eos)
    tok.add_tokens([bos, eos, *specials], special_tokens=True)
    data = SimpleNamespace(format="messages", train_on="last_assistant", max_length=512, add_special_tokens=False)
    return Encoder(tok, data, stop_token_ids(tok))


def test_qwen3_trains_the_whole_empty_block_and_it_is_counted():
    """Qwen3's template writes no <think> into the inference prompt: the whole empty block of an
    answer without reasoning carries loss (the case the trainers' trackers report)."""
    from tests.data.test_real_families import encode, trained_text

    enc = _real_encoder("Qwen3-0.6B.jinja", "<|im_end|>", "<|endoftext|>")
    encoded = encode(enc, PLAIN)
    assert trained_text(enc, encoded) == "<think>\n\n</think>\n\nTwo comets.<|im_end|>"
    assert [kind for kind, _ in encoded.problems] == ["empty_reasoning_trained"]
    reasoned = [PLAIN[0], {"role": "assistant", "reasoning_content": "Count them.", "content": "Two comets."}]
    assert encode(enc, reasoned).problems == ()


def test_seed_oss_tags_come_from_the_template_and_an_empty_block_in_the_content_is_counted():
    """Seed-OSS reasons between <seed:think> and </seed:think> (not <think>): read from where its
    template puts reasoning_content; a row whose content holds an empty such block trains it."""
    from tests.data.test_real_families import encode

    enc = _real_encoder("Seed-OSS.jinja", "<seed:eos>", "<seed:bos>", ("<seed:think>", "</seed:think>"))
    empty = [PLAIN[0], {"role": "assistant", "content": "<seed:think>\n</seed:think>\nTwo comets."}]
    [detail] = _empty_problems(encode(enc, empty).problems)
    assert "<seed:think>…</seed:think>" in detail and "of messages[1]" in detail
    full = [PLAIN[0], {"role": "assistant", "content": "<seed:think>Count them.</seed:think>\nTwo comets."}]
    assert _empty_problems(encode(enc, full).problems) == []
    assert encode(enc, PLAIN).problems == ()  # no reasoning, no block: this template writes none


def test_llamafactory_enable_thinking_false_says_which_labels_are_judged(folders):
    from pytest_ftready.recipe import load_recipe
    from tests.recipe.test_importer_conformance import variant

    recipe = load_recipe(variant(folders["llamafactory"], "llamafactory", {"enable_thinking": False}))
    (note,) = [text for text in recipe.origin.caveats if text.startswith("enable_thinking:")]
    assert "in the prompt" in note and "the model's Jinja template, which may train the block" in note
