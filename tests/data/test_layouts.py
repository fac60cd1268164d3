"""Dataset layouts: each recognised from its fields, read into the encoder's message model,
and each broken row named by its field; per-message training flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_ftready.data.layouts import Chat, Plain, layout_of, read_sample, row_problems
from pytest_ftready.data.rows import Row
from pytest_ftready.tiny import LAYOUTS, layout_rows

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny"
QA = [{"role": "user", "content": "What does kalo do?"}, {"role": "assistant", "content": "Kalo paints."}]
TWO = QA + [{"role": "user", "content": "And then?"}, {"role": "assistant", "content": "Kalo rests."}]


def read(data, fmt="auto", train_on="assistant", roles=None):
    return read_sample(Row("f.jsonl", 4, data), fmt, train_on, roles)


def chat(data, **kw) -> Chat:
    sample, problems = read(data, **kw)
    assert problems == [] and isinstance(sample, Chat), problems
    return sample


@pytest.mark.parametrize("data, layout", [
    ({"messages": QA}, "messages"),
    ({"messages": [{"from": "human", "value": "hi"}]}, "sharegpt"),
    ({"conversations": []}, "sharegpt"),
    ({"prompt": "Q", "completion": "A"}, "prompt_completion"),
    ({"prompt": QA[:1], "completion": QA[1:]}, "prompt_completion"),
    ({"instruction": "Say hi", "input": "", "output": "hi"}, "alpaca"),
    ({"text": "the river"}, "text"),
    ({"question": "?"}, None),
    ([1, 2], None),
])
def test_layout_is_recognised_from_the_fields(data, layout):
    assert layout_of(data) == layout


def test_sharegpt_reads_into_the_message_model_with_the_usual_speaker_names():
    sample = chat({"system": "Be brief.", "conversations": [
        {"from": "human", "value": "Weather in Oslo?"},
        {"from": "function_call", "value": "{\"name\": \"weather\"}"},
        {"from": "observation", "value": "rain"}, {"from": "gpt", "value": "It rains."}]})
    assert [m["role"] for m in sample.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert [m["content"] for m in sample.messages][-2:] == ["rain", "It rains."]
    assert all("from" not in m and "value" not in m for m in sample.messages)
    assert sample.trained == (2, 4) and sample.labels[1] == "conversations[0]"


def test_sharegpt_unknown_speaker_is_named_and_roles_maps_it():
    data = {"conversations": [{"from": "person", "value": "hi"}, {"from": "bot", "value": "hello"}]}
    problems = read(data)[1]
    assert any("conversations[0].from is 'person'" in p and "[data] roles" in p for p in problems)
    sample = chat(data, roles={"person": "user", "bot": "assistant"})
    assert [m["role"] for m in sample.messages] == ["user", "assistant"]


def test_alpaca_becomes_user_and_assistant_turns_with_system_and_history():
    sample = chat({"system": "Be brief.", "instruction": "Translate.", "input": "hei", "output": "hi",
                   "history": [["Say one.", "One."]]})
    assert [(m["role"], m["content"]) for m in sample.messages] == [
        ("system", "Be brief."), ("user", "Say one."), ("assistant", "One."), ("user", "Translate.\nhei"),
        ("assistant", "hi")]
    assert sample.labels == ("system", "history[0][0]", "history[0][1]", "instruction", "output")
    assert sample.trained == (2, 4)
    assert chat({"system": "s", "instruction": "i", "output": "o", "history": [["a", "b"]]},
                train_on="last_assistant").trained == (4,)


def test_conversational_prompt_completion_trains_the_completion_only():
    prompt = [{"role": "system", "content": "Be brief."}] + TWO[:3]
    sample = chat({"prompt": prompt, "completion": TWO[3:]}, fmt="prompt_completion", train_on="completion")
    assert len(sample.messages) == 5 and sample.trained == (4,)  # not the assistant turn in the prompt
    assert sample.labels[4] == "completion[0]"
    assert chat({"prompt": prompt, "completion": TWO[3:]}, train_on="assistant").trained == (4,)


def test_string_prompt_completion_and_text_are_plain():
    sample, problems = read({"prompt": "Q:", "completion": " A"}, train_on="completion")
    assert problems == [] and sample == Plain("prompt_completion", "Q:", " A")
    sample, problems = read({"text": "the river"}, train_on="all")
    assert problems == [] and sample == Plain("text", "", "the river")


def test_tools_and_tool_calls_are_kept_for_the_template():
    data = {"messages": [QA[0], {"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "weather", "arguments": {"city": "Oslo"}}}]}, {"role": "tool", "content": "rain"},
        {"role": "assistant", "content": "It rains."}], "tools": json.dumps([{"type": "function"}])}
    sample = chat(data)
    assert sample.tools == ({"type": "function"},)
    assert sample.messages[1]["tool_calls"][0]["function"]["name"] == "weather"
    assert any("'tools' must be a list" in p for p in read({**data, "tools": {"a": 1}})[1])


@pytest.mark.parametrize("flag, mark", [({"weight": 0}, "weight: 0"), ({"training": False}, "training: false")])
def test_a_turn_marked_not_to_train_is_left_out_and_remembered(flag, mark):
    messages = [dict(TWO[0]), {**TWO[1], **flag}, *TWO[2:]]
    sample = chat({"messages": messages})
    assert sample.trained == (3,) and sample.marks[1] == mark
    assert all("weight" not in m and "training" not in m for m in sample.messages)  # the template sees no flag


@pytest.mark.parametrize("data, train_on, problem", [
    ({"messages": [QA[0], {**QA[1], "weight": 2}]}, "assistant", "messages[1].weight is 2; expected 0"),
    ({"messages": [{**QA[0], "training": True}, QA[1]]}, "assistant",
     "messages[0] (user) is marked to train; only assistant turns"),
    ({"messages": [QA[0], {**QA[1], "weight": 0}]}, "assistant", "every assistant turn is marked not to train"),
    ({"messages": [QA[0], {**QA[1], "weight": 0}]}, "all", "marked not to train (weight: 0) but train_on = \"all\""),
    ({"messages": QA}, "completion", "train_on = \"completion\" needs prompt/completion rows"),
    ({"messages": TWO[:3]}, "last_assistant", "does not end with an assistant turn"),
    ({"conversations": [{"from": "human", "value": "hi"}]}, "assistant", "has no assistant turn"),
    ({"instruction": "Say hi", "output": ""}, "assistant", "needs a non-empty string field 'output'"),
    ({"instruction": "i", "output": "o", "history": [["only one"]]}, "assistant", "'history' must be a list of"),
    ({"prompt": "Q", "completion": 3}, "completion", "needs a non-empty string field 'completion'"),
    ({"prompt": QA[:1], "completion": [{"role": "user", "content": "x"}]}, "completion",
     "the completion has no assistant message"),
    ({"text": ""}, "all", "needs a non-empty string field 'text'"),
    ({"text": "the river"}, "assistant", "a text row trains on every token"),
    ({"question": "?", "answer": "!"}, "assistant", "no known layout"),
])
def test_a_broken_row_names_its_field(data, train_on, problem):
    problems = row_problems(Row("f.jsonl", 4, data), "auto", train_on)
    assert any(problem in p for p in problems), problems


def test_a_named_format_says_what_the_row_looks_like():
    problems = row_problems(Row("f.jsonl", 1, {"conversations": [{"from": "human", "value": "hi"}]}), "messages",
                            "assistant")
    assert "needs a non-empty list field 'messages'" in problems[0]
    assert "looks like format = \"sharegpt\"" in problems[-1]


def test_unknown_layout_lists_the_fields_not_the_values():
    [problem] = row_problems(Row("f.jsonl", 1, {"question": "my password is hunter2"}), "auto", "assistant")
    assert "'question'" in problem and "hunter2" not in problem


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_example_file_is_what_tiny_writes_and_reads_cleanly(layout):
    path = EXAMPLE / "data" / "layouts" / f"{layout}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == layout_rows(layout)
    train_on = {"text": "all", "prompt_completion": "completion"}.get(layout, "assistant")
    assert [row_problems(Row(str(path), i, r), "auto", train_on) for i, r in enumerate(rows)] == [[]] * len(rows)


def test_keys_a_parquet_file_fills_with_none_are_absent(tmp_path):
    """Parquet (Arrow structs) gives every message every key some row sets: None there means
    absent, not a bad flag or an empty tool call."""
    import datasets

    from pytest_ftready.data.rows import read_rows

    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list([
        {"messages": [QA[0], {**QA[1], "weight": 1}]},
        {"messages": [QA[0], {"role": "assistant", "content": "Asking.", "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
            {"role": "tool", "content": "rain"}, QA[1]]}]).to_parquet(path)
    rows, problems = read_rows([path])
    assert problems == [] and rows[1].data["messages"][0]["weight"] is None  # what datasets hands over
    for row in rows:
        sample = chat(row.data)
        assert all(None not in m.values() for m in sample.messages)
    assert chat(rows[0].data).messages[1] == {"role": "assistant", "content": "Kalo paints."}
