"""Data checks through the plugin: broken rows, broken templates, prerequisites, packing."""

from __future__ import annotations

import json

from tests.data.test_encoding import CHATML_EOS_OUTSIDE
from tests.helpers import outcomes


def test_bad_rows_fail_data_format_and_skip_what_depends_on_it(pytester, tiny_example):
    data = tiny_example / "data" / "train.jsonl"
    lines = data.read_text().splitlines()
    lines[2] = '{"messages": [{"role": "user", "content": "dangling"'
    lines[5] = json.dumps({"messages": [{"role": "user", "content": "no answer here"}]})
    data.write_text("\n".join(lines) + "\n")
    pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "-k", "data.format or data.masking",
                                  "--junitxml=out.xml")
    result = outcomes(pytester.path / "out.xml")
    state, message = result["data.format"]
    assert state == "failed"
    assert "2 of 50 rows are unusable" in message
    assert "malformed in 1 row(s): not valid JSON" in message and "train.jsonl:3" in message
    assert "no assistant turn in 1 row(s)" in message and "train.jsonl:6" in message
    assert result["data.masking"] == ("skipped", result["data.masking"][1])
    assert "data.format failed; fix correctness before measuring this" in result["data.masking"][1]


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


def test_packing_with_sdpa_matches_unpacked(pytester, tiny_example, edit_recipe):
    recipe = edit_recipe(tiny_example / "recipe.toml", packing="true")
    pytester.runpytest_subprocess(f"--ftready={recipe}", "-k", "packing or masking", "--junitxml=out.xml")
    result = outcomes(pytester.path / "out.xml")
    assert result["data.packing"][0] == "passed", result["data.packing"]
