"""Hostile rows and thresholds, round three (issue 47's false passes): each case is run as the
check a user runs (on a copy of the tiny example) and must end as a failed check naming the row
and the field, never a pass over what was not judged. Values planted here never appear in a message."""

from __future__ import annotations

import json

import pytest

USER = {"role": "user", "content": "What does kalo do with the red?"}
ANSWER = {"role": "assistant", "content": "Kalo paints the red."}
GOOD = {"messages": [USER, ANSWER]}


def write_rows(example, *rows) -> None:
    """The training file: four good rows, then ``rows`` (lines 5, 6, ...)."""
    (example / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [GOOD] * 4 + list(rows)))


def chat(*messages, **fields) -> dict:
    return {"messages": list(messages), **fields}


def said(role: str, content, **fields) -> dict:
    return {"role": role, "content": content, **fields}


# ---- 1 and 2: content parts that are not text ---------------------------------------------------
MULTIMODAL = "drop those parts (or rows), or fine-tune them with a multimodal pipeline"

# (id, row, words the data.format message must hold)
PART_CASES = [
    ("assistant-image-only", chat(USER, said("assistant", [{"type": "image"}])),
     ["train.jsonl:5", "messages[1] (assistant) has no text part, only image part(s)", "train nothing", MULTIMODAL]),
    ("image-beside-user-text", chat(said("user", [{"type": "image"}, {"type": "text", "text": "What is it?"}]),
                                    said("assistant", "A cat.")),
     ["train.jsonl:5", "messages[0] (user) is multimodal", "image part(s) beside its text", MULTIMODAL]),
    ("audio-beside-assistant-text", chat(USER, said("assistant", [{"type": "text", "text": "Listen:"},
                                                                   {"type": "input_audio", "input_audio": {}}])),
     ["train.jsonl:5", "messages[1] (assistant) is multimodal", "input_audio part(s)"]),
    ("image-url-and-video", chat(said("user", [{"type": "image_url", "image_url": {"url": "x.png"}},
                                                {"type": "video"}, {"type": "text", "text": "Both?"}]), ANSWER),
     ["image_url, video part(s)"]),
    ("assistant-audio-only", chat(USER, said("assistant", [{"type": "audio"}, {"type": "audio"}])),
     ["messages[1] (assistant) has no text part, only audio part(s)"]),
    ("image-with-blank-text", chat(USER, said("assistant", [{"type": "text", "text": "  "}, {"type": "image"}])),
     ["messages[1] (assistant) has no text part, only image part(s)"]),
    ("text-part-without-text", chat(USER, said("assistant", [{"type": "text"}])),
     ["messages[1].content[0] is a text part without a 'text' string"]),
    ("text-parts-all-blank", chat(USER, said("assistant", [{"type": "text", "text": ""}, {"type": "text", "text": " "}])),
     ["messages[1] (assistant) has empty content (its text parts hold no text)"]),
    ("unknown-part-type", chat(USER, said("assistant", [{"type": "output_text", "text": "hi"}])),
     ["messages[1] (assistant) has no text part, only output_text part(s)"]),
    ("tool-call-turn-with-image", chat(USER, said("assistant", [{"type": "image"}], tool_calls=[
        {"type": "function", "function": {"name": "look", "arguments": {}}}])), ["only image part(s)"]),
    ("images-column", chat(said("user", "<image>What is it?"), said("assistant", "A cat."), images=["cat.png"]),
     ["the row is multimodal: its 'images' column(s) hold media", MULTIMODAL]),
    ("sharegpt-image-part", {"conversations": [{"from": "human", "value": [{"type": "image"},
                                                                            {"type": "text", "text": "What?"}]},
                                               {"from": "gpt", "value": "A cat."}]},
     ["conversations[0] (user) is multimodal"]),
    ("conversational-completion-image", {"prompt": [USER], "completion": [said("assistant", [{"type": "image"}])]},
     ["completion[0] (assistant) has no text part, only image part(s)"]),
    ("alpaca-with-audios", {"instruction": "Transcribe.", "output": "Hello.", "audios": ["a.wav"]},
     ["its 'audios' column(s) hold media"]),
]


@pytest.mark.parametrize("row, words", [c[1:] for c in PART_CASES], ids=[c[0] for c in PART_CASES])
def test_content_that_is_not_text_fails_data_format_naming_the_row(make_state, tiny_example, fails, row, words,
                                                                    edit_recipe):
    if "conversations" in row or "instruction" in row or "prompt" in row:
        edit_recipe(tiny_example / "recipe.toml", format='"auto"')
    write_rows(tiny_example, row)
    message = fails(make_state(), "data.format")
    assert "1 of 5 rows are unusable" in message
    for word in words:
        assert word in message


def test_text_parts_alone_stay_usable(make_state, tiny_example, run_check):
    write_rows(tiny_example, chat(said("user", [{"type": "text", "text": "What does kalo do?"}]),
                                  said("assistant", [{"type": "text", "text": "Kalo "}, {"type": "text", "text": "paints."}])))
    run_check(make_state(), "data.format")
