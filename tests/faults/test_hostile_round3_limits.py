"""Hostile rows and templates, round three (issue 47's hangs and unclear messages): a row of
thousands of turns costs what its first max_length tokens cost (or, past MAX_MESSAGES, is named
unusable), a template's loops are bounded per render, and a .json file holding one object, a
max_length that cuts every response and nested lists as content each get a message saying what
they are and what to do. In-process on copies of the tiny example; each case is bounded by the
limits under test (renders counted, range steps counted), never by wall time."""

from __future__ import annotations

import json

import pytest

from pytest_ftready.data.layouts import MAX_MESSAGES
from pytest_ftready.data.rendering import MAX_RANGE_STEPS, Renderer
from pytest_ftready.tiny import CHATML

USER = {"role": "user", "content": "What does kalo do with the red?"}
ANSWER = {"role": "assistant", "content": "Kalo paints the red."}
GOOD = {"messages": [USER, ANSWER]}


def write_rows(example, *rows) -> None:
    """The training file: four good rows, then ``rows`` (lines 5, 6, ...)."""
    (example / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [GOOD] * 4 + list(rows)))


def long_chat(turns: int) -> dict:
    """A conversation of ``turns`` user/assistant pairs (2 x turns messages)."""
    messages = []
    for i in range(turns):
        messages += [{"role": "user", "content": f"What does kalo do {i}?"},
                     {"role": "assistant", "content": f"Kalo paints {i}."}]
    return {"messages": messages}


@pytest.fixture
def rendered(monkeypatch):
    """The messages each render of the run is given, in order (every render of the encoder goes
    through Renderer's two paths)."""
    counts: list[int] = []
    for name in ("_direct", "_slow"):
        original = getattr(Renderer, name)

        def counted(self, messages, *args, _original=original, **kwargs):
            counts.append(len(messages))
            return _original(self, messages, *args, **kwargs)
        monkeypatch.setattr(Renderer, name, counted)
    return counts


# ---- hang 1: a row of thousands of turns ------------------------------------------------------
@pytest.mark.parametrize("turns", [500, 2_000, MAX_MESSAGES // 2])
def test_row_of_many_turns_renders_only_its_leading_messages(make_state, run_check, fails, tiny_example, rendered,
                                                             turns):
    write_rows(tiny_example, long_chat(turns))
    state = make_state()
    run_check(state, "data.template")
    # the long row's renders: never more than a few hundred messages each, a few dozen of them
    # (the per-turn renders of all 2 x turns messages were quadratic: 24 s at 2,000 turns)
    assert max(rendered) <= 256 and sum(rendered) < 5_000, (max(rendered), sum(rendered), len(rendered))
    long = next(e for e in state.digest.with_problems if e.row.line == 5)
    assert long.cut and long.full_length > 128  # only its start is tokenized; the lengths are lower bounds
    message = fails(state, "data.masking")  # its responses after max_length are cut, and that is said
    assert "truncated_part" in message or "truncation cuts the response of 1 of 5 rows" in message


def test_row_past_the_message_limit_is_unusable_naming_row_and_limit(make_state, run_check, fails, tiny_example,
                                                                     rendered):
    write_rows(tiny_example, long_chat(MAX_MESSAGES // 2 + 1))
    state = make_state()
    message = fails(state, "data.format")
    assert (f"train.jsonl:5: holds {MAX_MESSAGES + 2:,} messages, more than the {MAX_MESSAGES:,} one row may hold "
            "(only its first max_length tokens would train): split the conversation into rows of fewer turns") in message
    run_check(state, "data.template")  # judged on the 4 others, the long row counted out and never rendered
    assert state.digest.encoded == 4 and max(rendered) <= 2


def test_row_at_the_message_limit_is_usable(make_state, run_check, tiny_example):
    write_rows(tiny_example, long_chat(MAX_MESSAGES // 2))
    state = make_state()
    run_check(state, "data.format")
    assert state.digest.encoded == 5


def test_long_row_whose_first_response_is_far_in_is_cut_after_it(make_state, fails, tiny_example, rendered):
    chat = long_chat(1)
    chat["messages"] = [{"role": "user", "content": f"Context line {i}."} for i in range(3_000)] + chat["messages"]
    write_rows(tiny_example, chat)
    state = make_state()
    message = fails(state, "data.masking")
    assert "truncated_all in 1 row(s): max_length 128 cuts the whole response" in message and "train.jsonl:5" in message
    assert max(rendered) <= 2 * 4_096  # the leading cut doubles until a trained turn is in it


def test_long_row_under_a_template_without_generation_blocks_is_cut_too(make_state, run_check, tiny_example,
                                                                         edit_recipe, rendered):
    (tiny_example / "chat.jinja").write_text(CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", ""))
    edit_recipe(tiny_example / "recipe.toml", sample='4\nchat_template = "chat.jinja"')
    write_rows(tiny_example, long_chat(2_000))
    state = make_state()
    run_check(state, "data.template")
    assert max(rendered) <= 256 and state.digest.methods == {"prefix-diff"}


def test_row_of_more_messages_than_max_length_is_cut_by_its_count(make_state, run_check, tiny_example, edit_recipe,
                                                                   rendered):
    # two characters a message: 10,000 of them render within the character budget of max_length
    # 64 (65 tokens of up to 19 characters), yet only the first 64 can be in the tokens
    _with_template(tiny_example, edit_recipe, "{% for m in messages %}{{ m['content'] + '\\n' }}{% endfor %}")
    edit_recipe(tiny_example / "recipe.toml", max_length="64")
    chat = {"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": "k"} for i in range(10_000)]}
    write_rows(tiny_example, chat)
    state = make_state()
    run_check(state, "data.template")
    assert max(rendered) <= 128, max(rendered)
    assert state.digest.encoded == 5


# ---- hang 2: a template's loops -----------------------------------------------------------------
NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def _with_template(tiny_example, edit_recipe, template: str) -> None:
    (tiny_example / "chat.jinja").write_text(template)
    edit_recipe(tiny_example / "recipe.toml", sample='4\nchat_template = "chat.jinja"')


@pytest.mark.parametrize("template", [
    pytest.param(NESTED + CHATML, id="nested-range-100000"),
    pytest.param("{% for i in range(1000) %}{% for j in range(1000) %}{{ '' }}{% endfor %}{% endfor %}" + CHATML,
                 id="nested-range-1000-each-allowed-together-not"),
    pytest.param("{% for m in messages %}{% for i in range(60000) %}{% endfor %}{% endfor %}" + CHATML,
                 id="range-per-message"),
    pytest.param("{% for i in (range(100000)|list) + (range(100000)|list) %}{% endfor %}" + CHATML,
                 id="ranges-made-lists"),
])
def test_template_looping_past_the_step_limit_fails_template_naming_template_and_limit(make_state, fails, tiny_example,
                                                                                        edit_recipe, template):
    _with_template(tiny_example, edit_recipe, template)
    write_rows(tiny_example)
    state = make_state()
    message = fails(state, "data.template")
    assert (f"render_error in 4 row(s): template failed: the template's loops took more than {MAX_RANGE_STEPS:,} "
            "range() steps in one render (nested range loops?)") in message
    assert "Fix: the chat template (recipe override chat.jinja) fails on those rows" in message
    assert state.digest.unrendered == 4


def test_template_using_range_within_the_limit_renders_as_before(make_state, run_check, tiny_example, edit_recipe):
    # range's length, reversal, slicing and membership behave as jinja's own
    _with_template(tiny_example, edit_recipe, "{% for i in range(3)|reverse %}{% endfor %}{% if 2 in range(4) and "
                   "range(10)|length == 10 and range(10)[2:4]|list == [2, 3] %}" + CHATML + "{% endif %}")
    write_rows(tiny_example)
    state = make_state()
    run_check(state, "data.template")
    assert state.digest.unrendered == 0 and state.digest.encoded == 4


def test_step_limit_holds_on_both_render_paths_and_each_render_has_its_own(tiny_model_dir):
    from transformers import AutoTokenizer

    from pytest_ftready.data.rendering import RenderLimit

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = "{% for i in range(60000) %}{% endfor %}" + CHATML
    for slow in (False, True):
        renderer = Renderer(tok)
        if slow:
            renderer.force_slow()
        for _ in range(3):  # 60,000 steps a render: each render starts with the whole budget
            assert renderer.render([USER, ANSWER]).endswith("Kalo paints the red.<|im_end|>\n")
    tok.chat_template = NESTED + CHATML
    for slow in (False, True):
        renderer = Renderer(tok)
        if slow:
            renderer.force_slow()
        with pytest.raises(RenderLimit):
            renderer.render([USER, ANSWER])
    # transformers' own apply_chat_template renders the same compiled template: bounded once the
    # plugin has bound it (as the special-token probe does before its render)
    tok.chat_template = "{% for i in range(60000) %}{% endfor %}{% for i in range(60000) %}{% endfor %}" + CHATML
    assert tok.apply_chat_template([USER, ANSWER], tokenize=False).endswith("<|im_end|>\n")
    with pytest.raises(RenderLimit):
        Renderer(tok).render([USER, ANSWER])
    with pytest.raises(RenderLimit):
        tok.apply_chat_template([USER, ANSWER], tokenize=False)
    with pytest.raises(RenderLimit):  # the render that tracks {% generation %} blocks too
        tok.apply_chat_template([USER, ANSWER], return_assistant_tokens_mask=True, return_dict=True)


# ---- unclear messages ---------------------------------------------------------------------------
def _json_file(example, edit_recipe, text: str) -> None:
    (example / "data" / "train.json").write_text(text)
    edit_recipe(example / "recipe.toml", train='["data/train.json"]')


@pytest.mark.parametrize("value", [
    pytest.param(GOOD, id="one-row-object"),
    pytest.param({"train": [GOOD, GOOD]}, id="dict-of-rows"),
    pytest.param({"data": {"messages": [USER, ANSWER]}}, id="nested-object"),
])
def test_json_file_holding_one_object_says_jsonl_or_array_is_expected(make_state, fails, tiny_example, edit_recipe,
                                                                      value):
    _json_file(tiny_example, edit_recipe, json.dumps(value, indent=2))
    message = fails(make_state(), "data.format")
    assert ("train.json:1: the file holds one JSON object spread over several lines, not rows: a training file holds "
            "JSON Lines (one row object per line) or, as .json, one array of row objects ([{...}, {...}]); write each "
            "row on a line of its own, or put the rows in a [ ] array") in message


def test_json_file_of_one_line_objects_and_of_an_array_still_read(make_state, run_check, tiny_example, edit_recipe):
    _json_file(tiny_example, edit_recipe, "\ufeff" + json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
    state = make_state()
    run_check(state, "data.format")
    assert state.rows.total == 2
    _json_file(tiny_example, edit_recipe, json.dumps([GOOD, GOOD, GOOD], indent=2))
    state = make_state()
    run_check(state, "data.format")
    assert state.rows.total == 3


def test_pretty_printed_rows_in_a_jsonl_file_say_one_object_per_line(make_state, fails, tiny_example):
    (tiny_example / "data" / "train.jsonl").write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD, indent=2) + "\n")
    message = fails(make_state(), "data.format")
    first = next(line for line in message.splitlines() if line.startswith("train.jsonl:2: "))
    assert first.startswith("train.jsonl:2: not valid JSON (Expecting property name enclosed in double quotes")
    assert first.endswith("; the line opens an object or array spread over several lines: a training file holds JSON "
                          "Lines (one row object per line) or, as .json, one array of row objects ([{...}, {...}])")


@pytest.mark.parametrize("max_length", ["1", "3"])
def test_max_length_below_every_response_fails_masking_blaming_max_length(make_state, fails, max_length):
    message = fails(make_state(max_length=max_length), "data.masking")
    assert f"truncated_all in 50 row(s): max_length {max_length} cuts the whole response" in message
    assert "raise [data] max_length past it" in message
    assert "markers_empty" not in message and "generation %} blocks mark no token" not in message


def test_max_length_below_responses_under_prefix_diff_blames_max_length(make_state, fails, tiny_example, edit_recipe):
    _with_template(tiny_example, edit_recipe,
                   CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", ""))
    message = fails(make_state(max_length="2"), "data.masking")
    assert "truncated_all in 50 row(s): max_length 2 cuts the whole response" in message
    assert "no_supervised" not in message


def nested(depth: int, inner="Kalo paints."):
    for _ in range(depth):
        inner = [inner]
    return inner


@pytest.mark.parametrize("content, words", [
    pytest.param(nested(50), "has content[0], a list in a list (lists nested 50 deep), where a "
                 "content part (an object) belongs", id="50-level-nested-list"),
    pytest.param(nested(2, {"type": "text", "text": "Kalo."}), "has content[0], a list in a list (lists nested 2 deep)",
                 id="parts-list-wrapped-twice"),
    pytest.param(["Kalo paints."], "has content[0] of type str where a content part (an object) belongs",
                 id="list-of-strings"),
    pytest.param([{"text": "Kalo paints."}], "has content[0], an object without a 'type'", id="part-without-type"),
    pytest.param({"text": "Kalo paints."}, "has content of type dict, not text", id="content-object"),
    pytest.param(42, "has content of type int, not text", id="content-number"),
])
def test_content_of_the_wrong_shape_is_named_for_what_it_is(make_state, fails, tiny_example, content, words):
    write_rows(tiny_example, {"messages": [USER, {"role": "assistant", "content": content}]})
    message = fails(make_state(), "data.format")
    assert f"train.jsonl:5: messages[1] (assistant) {words}" in message
    assert "empty content" not in message
    assert "(a string, or a list of {\"type\": \"text\", \"text\": ...} parts)" in message


@pytest.mark.parametrize("content", ["", "   ", []])
def test_content_that_is_only_empty_is_still_called_empty(make_state, fails, tiny_example, content):
    write_rows(tiny_example, {"messages": [USER, {"role": "assistant", "content": content}]})
    assert "train.jsonl:5: messages[1] (assistant) has empty content" in fails(make_state(), "data.format")
