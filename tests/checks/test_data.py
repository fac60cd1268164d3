"""Data checks through the plugin: broken rows, broken templates, prerequisites, packing."""

from __future__ import annotations

import json

import pytest

from tests.data.test_encoding import CHATML_EOS_OUTSIDE
from tests.helpers import outcomes, properties



@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_one_malformed_line_fails_data_format_and_the_other_data_checks_run_on_the_rest(pytester, tiny_example):
    data = tiny_example / "data" / "train.jsonl"
    lines = data.read_text().splitlines()
    lines[2] = '{"messages": [{"role": "user", "content": "dangling"'
    data.write_text("\n".join(lines) + "\n")
    pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "-k",
                                  "data.format or data.masking or data.template or data.lengths", "--junitxml=out.xml")
    result = outcomes(pytester.path / "out.xml")
    state, message = result["data.format"]
    assert state == "failed"
    assert "1 of 50 rows are unusable" in message and "train.jsonl:3: not valid JSON" in message
    for check in ("data.masking", "data.template", "data.lengths"):
        assert result[check][0] == "passed", (check, result[check])
        assert properties(pytester.path / "out.xml", check)["rows_left_out[rows]"] == "1"


def test_each_bad_row_is_listed_once_with_all_its_problems(make_state, run_check, tiny_example):
    from pytest_ftready.outcomes import Fail

    data = tiny_example / "data" / "train.jsonl"
    lines = data.read_text().splitlines()
    lines[5] = json.dumps({"messages": [{"role": "human", "content": ""}]})
    for i in range(20, 32):
        lines[i] = json.dumps({"prompt": "Q", "completion": ""})
    data.write_text("\n".join(lines) + "\n")
    state = make_state()
    with pytest.raises(Fail) as failed:
        run_check(state, "data.format")
    message = str(failed.value)
    assert message.startswith("13 of 50 rows are unusable for format = \"messages\":")
    [row6] = [line for line in message.splitlines() if line.startswith("train.jsonl:6")]
    assert "messages[0].role is 'human'" in row6 and "has empty content" in row6 and "no assistant turn" in row6
    assert "looks like format = \"prompt_completion\"" in message  # the misfiled rows say what they are
    assert message.splitlines()[-1] == "and 3 more rows"  # ten listed, in file order
    assert {m.name: m.value for m in state.run.measurements}["bad_rows"] == 13


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_eos_outside_the_trained_span_fails_masking_and_stops_the_expensive_checks(pytester, tiny_example, edit_recipe):
    (tiny_example / "broken.jinja").write_text(CHATML_EOS_OUTSIDE)
    recipe = edit_recipe(tiny_example / "recipe.toml", sample='4\nchat_template = "broken.jinja"')
    pytester.runpytest_subprocess(f"--ftready={recipe}", "--junitxml=out.xml")
    result = outcomes(pytester.path / "out.xml")
    state, message = result["data.masking"]
    assert state == "failed"
    assert "stop_untrained in 50 row(s)" in message and "the model never learns to stop" in message
    assert "[[" in message  # an example with its trained tokens marked
    for dependent in ("model.step_memory", "model.overfit", "lifecycle.resume"):
        assert result[dependent][0] == "skipped", dependent
    assert "data.masking failed" in result["model.step_memory"][1]
    assert result["data.template"][0] == "passed"
    assert (pytester.path / ".ftready" / "tiny" / "masking.html").is_file()


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_packing_with_sdpa_matches_unpacked(pytester, tiny_example, edit_recipe):
    recipe = edit_recipe(tiny_example / "recipe.toml", packing="true")
    pytester.runpytest_subprocess(f"--ftready={recipe}", "-k", "packing or masking", "--junitxml=out.xml")
    result = outcomes(pytester.path / "out.xml")
    assert result["data.packing"][0] == "passed", result["data.packing"]
