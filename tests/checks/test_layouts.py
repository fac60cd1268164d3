"""Every dataset layout of examples/tiny/layouts through the plugin on the tiny model: the data
checks pass on the example file, and a broken row appended to it is named by file and line
while the other data checks run on the rest. One pytest run for all layouts (two recipes each)."""

from __future__ import annotations

import pytest

import shutil

from pytest_ftready.tiny import LAYOUTS, layout_rows, write_jsonl
from tests.conftest import EXAMPLE
from tests.helpers import outcomes, properties

# One broken row per layout, and what data.format must say about it.
BROKEN = {
    "messages": ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "weight": 2}]},
                 "messages[1].weight is 2; expected 0 (not trained) or 1"),
    "sharegpt": ({"conversations": [{"from": "human", "value": "hi"}, {"from": "bot", "value": "x"}]},
                 "conversations[1].from is 'bot'"),
    "alpaca": ({"instruction": "Say hi.", "input": "", "output": ""}, "needs a non-empty string field 'output'"),
    "prompt_completion": ({"prompt": "Q: hi\nA:", "completion": 3}, "needs a non-empty string field 'completion'"),
    "conversational_prompt_completion": ({"prompt": [{"role": "user", "content": "hi"}],
                                          "completion": [{"role": "user", "content": "x"}]},
                                         "the completion has no assistant message to train on"),
    "text": ({"text": ""}, "needs a non-empty string field 'text'"),
}
CHECKS = ("data.format", "data.template", "data.masking")


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_every_layout_passes_the_data_checks_and_names_its_broken_row(pytester, tmp_path, tiny_model_dir):
    folder = tmp_path / "tiny"
    (folder / "layouts").mkdir(parents=True)
    (folder / "model").symlink_to(tiny_model_dir)
    args = []
    for layout in LAYOUTS:
        rows = layout_rows(layout)
        write_jsonl(folder / "data" / "layouts" / f"{layout}.jsonl", rows)
        write_jsonl(folder / "data" / "layouts" / f"{layout}-broken.jsonl", rows + [BROKEN[layout][0]])
        recipe = shutil.copy(EXAMPLE / "layouts" / f"{layout}.toml", folder / "layouts" / f"{layout}.toml")
        broken = folder / "layouts" / f"{layout}-broken.toml"
        broken.write_text(recipe.read_text().replace(f"/{layout}.jsonl", f"/{layout}-broken.jsonl"))
        args += [f"--ftready={recipe}", f"--ftready={broken}"]
    pytester.runpytest_subprocess(*args, "-k", " or ".join(CHECKS), "--junitxml=out.xml")
    junit = pytester.path / "out.xml"
    result = outcomes(junit)
    wrong = {}
    for layout in LAYOUTS:
        rows = len(layout_rows(layout))
        for check in CHECKS:
            if result[f"{layout}/{check}"][0] != "passed":
                wrong[f"{layout}/{check}"] = result[f"{layout}/{check}"]
        state, message = result[f"{layout}-broken/data.format"]
        expected = f"{layout}-broken.jsonl:{rows + 1}: {BROKEN[layout][1]}"
        if state != "failed" or f"1 of {rows + 1} rows are unusable" not in message or expected not in message:
            wrong[f"{layout}-broken/data.format"] = (state, message, expected)
        masking = result[f"{layout}-broken/data.masking"]
        left_out = properties(junit, f"{layout}-broken/data.masking").get("rows_left_out[rows]")
        if masking[0] != "passed" or left_out != "1":
            wrong[f"{layout}-broken/data.masking"] = masking
    assert wrong == {}
