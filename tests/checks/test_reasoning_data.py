"""Reasoning data through the data checks on the tiny example with Qwen 3.5's real template
(tests/data/templates/): the reasoning written in the assistant content passes data.template
and data.masking, and masking.html draws the "<think>" the inference prompt holds apart."""

from __future__ import annotations

from pathlib import Path

from pytest_ftready.tiny import example_rows, write_jsonl
from tests.faults.test_hostile_templates import _with_template

QWEN35 = (Path(__file__).parents[1] / "data" / "templates" / "Qwen3.5-4B.jinja").read_text()


def test_reasoning_in_content_passes_masking_with_the_prompts_think_shown_apart(
        make_state, run_check, tiny_example, edit_recipe):
    rows = example_rows()
    for row in rows:
        answer = row["messages"][-1]
        answer["content"] = f"<think>\nThe answer is short.\n</think>\n\n{answer['content']}"
    write_jsonl(tiny_example / "data" / "train.jsonl", rows)
    edit_recipe(tiny_example / "recipe.toml", train_on='"last_assistant"')
    _with_template(tiny_example, edit_recipe, QWEN35)
    state = make_state()
    run_check(state, "data.template")
    ctx = run_check(state, "data.masking")
    assert not state.digest.places(["assistant_untrained", "history_rewritten", "prompt_not_prefix"])
    page = Path(dict(ctx.user_properties)["masking_report"]).read_text()
    assert "<span class='tok p'>&lt;think&gt;</span>" in page
