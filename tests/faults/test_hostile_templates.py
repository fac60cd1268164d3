"""Hostile and careless chat templates and rows the template cannot show, one test each: a
template that raises for some rows, one that drops tool calls, one that loops past Jinja's
limit, one that does not parse, one that renders nothing. Each ends as a failed check naming
rows and what to do, and the checks that go on without those rows record them as left out.
In-process on the tiny example; the data checks need the tokenizer only."""

from __future__ import annotations

import json

import pytest

from pytest_ftready.tiny import CHATML, example_rows, write_jsonl

WEATHER_CALL = {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "today's weather",
                                                  "parameters": {"type": "object", "properties": {}}}}
RAISES_ON_BOOM = ("{% for message in messages %}{% if 'boom' in message['content'] %}"
                  "{{ raise_exception('this template cannot render boom') }}{% endif %}{% endfor %}" + CHATML)
# CHATML that also renders the tools and each assistant turn's tool calls (inside the trained span)
RENDERS_TOOLS = CHATML.replace(
    "{{ bos_token }}", "{{ bos_token }}{% if tools %}{% for t in tools %}{{ t['function']['name'] }} {% endfor %}{% endif %}"
).replace("{{ message['content'] + '<|im_end|>' }}",
          "{{ message['content'] }}{% for c in message.get('tool_calls') or [] %} {{ c['function']['name'] }}"
          "({{ c['function']['arguments'] }}){% endfor %}{{ '<|im_end|>' }}")


def _with_template(tiny_example, edit_recipe, template: str):
    (tiny_example / "chat.jinja").write_text(template)
    edit_recipe(tiny_example / "recipe.toml", sample='4\nchat_template = "chat.jinja"')


def _rows(tiny_example, change) -> list[dict]:
    rows = example_rows()
    for i, row in enumerate(rows):
        change(i, row)
    write_jsonl(tiny_example / "data" / "train.jsonl", rows)
    return rows


def _measured(ctx) -> dict:
    return {m.name: m.value for m in ctx.measured}


def test_template_raising_for_some_rows_fails_template_and_the_others_count_them_left_out(
        make_state, run_check, fails, tiny_example, edit_recipe):
    def boom(i, row):
        if i % 3 == 0:
            row["messages"][-2]["content"] += " boom"
    _rows(tiny_example, boom)
    _with_template(tiny_example, edit_recipe, RAISES_ON_BOOM)
    state = make_state()
    message = fails(state, "data.template")
    assert message.startswith("chat template problems in 17 place(s):")
    assert "render_error in 17 row(s): template failed: this template cannot render boom [train.jsonl:1, train.jsonl:4" in message
    for check in ("data.masking", "data.lengths"):  # they judge the 33 rows that render, and say so
        measured = _measured(run_check(state, check))
        assert measured["rows_left_out"] == 17 and measured["rows_unrendered"] == 17, check
    assert len(state.digest.full_lengths) == 33 and min(state.digest.full_lengths) > 0  # no zero lengths counted


def test_tool_calls_the_template_drops_fail_template_saying_they_will_never_be_trained(make_state, fails, tiny_example):
    def tools(i, row):
        if i % 5 == 0:
            row["tools"] = [WEATHER_TOOL]
            row["messages"][-1]["tool_calls"] = [WEATHER_CALL]
    _rows(tiny_example, tools)
    message = fails(make_state(), "data.template")  # the tiny ChatML template shows neither tools nor calls
    assert ("tool_calls_dropped in 10 row(s): the chat template drops the tool_calls of messages[4] (get_weather): "
            "these tool calls will never be trained [train.jsonl:1, train.jsonl:6") in message
    assert "tools_dropped in 10 row(s): the chat template drops the row's tools (get_weather)" in message
    assert "Fix: use a chat template that renders tool_calls" in message


def test_tool_calls_a_template_renders_pass(make_state, run_check, tiny_example, edit_recipe):
    def tools(i, row):
        if i % 5 == 0:
            row["tools"] = [WEATHER_TOOL]
            row["messages"][-1]["tool_calls"] = [WEATHER_CALL]
    _rows(tiny_example, tools)
    _with_template(tiny_example, edit_recipe, RENDERS_TOOLS)
    state = make_state()
    run_check(state, "data.template")
    assert not state.digest.places(["tool_calls_dropped", "tools_dropped"])


@pytest.mark.parametrize("template, words", [
    pytest.param("{% for i in range(10**9) %}x{% endfor %}" + CHATML,
                 "render_error in 50 row(s): template failed: Range too big", id="loop-past-jinja-range-limit"),
    pytest.param(CHATML + "{% if %}", "render_error in 50 row(s): template failed:", id="syntax-error"),
    pytest.param("{{ messages[0].nope.deeper }}" + CHATML, "render_error in 50 row(s): template failed:",
                 id="undefined-attribute"),
])
def test_template_failing_on_every_row_fails_template_naming_the_error(make_state, fails, tiny_example, edit_recipe,
                                                                       template, words):
    _with_template(tiny_example, edit_recipe, template)
    state = make_state()
    message = fails(state, "data.template")
    assert words in message and "Traceback" not in message
    assert "[train.jsonl:1, train.jsonl:2" in message
    assert state.digest.unrendered == 50 and state.digest.trainable == 0  # nothing of it would be trained
    assert fails(state, "data.lengths").startswith("no row renders to any token: nothing to measure (see data.template)")


def test_template_rendering_nothing_fails_masking_it_would_train_nothing(make_state, fails, tiny_example, edit_recipe):
    _with_template(tiny_example, edit_recipe, "{{ '' }}")
    message = fails(make_state(), "data.masking")
    assert message.startswith("labels made by prefix-diff:\nprefix-diff would train on 0 tokens of 50 rows: the loss would "
                              "look healthy and teach nothing")


def test_lone_surrogate_row_is_named_by_data_format_and_left_out_of_the_rest(make_state, run_check, fails, tiny_example):
    data = tiny_example / "data" / "train.jsonl"
    lines = data.read_text().splitlines()
    row = json.loads(lines[6])
    row["messages"][-1]["content"] = "half an emoji \ud83d"
    lines[6] = json.dumps(row)  # written as the escape "\ud83d", as a careless export does
    data.write_text("\n".join(lines) + "\n")
    state = make_state()
    message = fails(state, "data.format")
    assert message == ("1 of 50 rows are unusable for format = \"messages\":\ntrain.jsonl:7: a \\ud800-\\udfff escape "
                       "without its pair (a lone surrogate) is not Unicode text: fix the escape, or drop the row")
    for check in ("data.template", "data.masking", "data.lengths"):  # no TypeError from the tokenizer
        assert _measured(run_check(state, check))["rows_left_out"] == 1


def test_secrets_in_the_fields_of_broken_rows_leave_through_no_message(make_state, fails, tiny_example):
    from tests import planted

    token, key, openai = (planted.SECRETS[k] for k in ("github_token", "aws_access_key_id", "openai_key"))
    data = tiny_example / "data" / "train.jsonl"
    lines = data.read_text().splitlines()
    lines[1] = json.dumps({"messages": [{"role": token, "content": "hi"}, {"role": "assistant", "content": "x"}]})
    lines[2] = json.dumps({key: "a row whose field name is a key"})  # "fields found: ..." quotes field names
    lines[3] = '{"messages": [{"role": "user", "content": "' + openai + '"'  # malformed, the secret inside
    data.write_text("\n".join(lines) + "\n")
    state = make_state()
    shown = state.run.gate.text(fails(state, "data.format"))  # what the plugin prints: the message through its gate
    assert "train.jsonl:2: messages[0].role is '<github_token redacted>'" in shown
    assert "train.jsonl:3:" in shown and "train.jsonl:4: not valid JSON" in shown
    assert not any(secret in shown for secret in (token, key, openai))
