"""Chat templates that lose part of what training and inference need, through data.template on
the tiny example: Phi-3's GGUF template (no system branch) dropping the system messages, and a
template that ignores add_generation_prompt (issue 47), which lifecycle.generate used to blame on
the stop token. Each fails data.template naming the rows, what is lost and the template."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ftready.tiny import CHATML
from tests.faults.test_hostile_templates import _with_template

PHI3_GGUF = (Path(__file__).parents[1] / "data" / "templates" / "Phi-3-gguf.jinja").read_text()
IGNORES_GENERATION_PROMPT = CHATML.replace("{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}", "")


def test_a_template_without_a_system_branch_fails_template_naming_the_rows_and_the_role(
        make_state, run_check, fails, tiny_example, edit_recipe):
    run_check(make_state(), "data.template")  # the example's own template renders every message
    _with_template(tiny_example, edit_recipe, PHI3_GGUF)
    message = fails(make_state(), "data.template")
    # rows 1, 4, 7, ... of the example open with a system message
    assert ("message_dropped in 17 row(s): the chat template drops messages[0] (system): its content is nowhere "
            "in the rendered text [train.jsonl:1, train.jsonl:4, train.jsonl:7") in message
    assert "Fix: the chat template (recipe override chat.jinja) has no branch for the dropped role" in message


def test_a_template_ignoring_add_generation_prompt_fails_template_saying_the_header_is_missing(
        make_state, fails, tiny_example, edit_recipe):
    assert IGNORES_GENERATION_PROMPT != CHATML
    _with_template(tiny_example, edit_recipe, IGNORES_GENERATION_PROMPT)
    message = fails(make_state(), "data.template")
    assert ("generation_prompt_ignored in 50 row(s): the chat template ignores add_generation_prompt: the inference "
            "prompt before messages[2] lacks the assistant header ('<|im_start|>assistant\\n') that training puts "
            "before the response") in message
    assert ("Fix: the chat template (recipe override chat.jinja) must write the assistant header when "
            "add_generation_prompt is true") in message


@pytest.mark.slow  # an overfit run (about 12 s): CI's second line
def test_generate_blames_the_missing_header_not_the_stop_token(make_state, fails, tiny_example, edit_recipe):
    _with_template(tiny_example, edit_recipe, IGNORES_GENERATION_PROMPT)
    message = fails(make_state(), "lifecycle.generate")
    assert message.endswith("the inference prompt lacks the assistant header: the chat template ignores "
                            "add_generation_prompt (see data.template)")
    assert "the stop token is not trained" not in message
