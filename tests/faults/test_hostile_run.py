"""One whole pytest run over several hostile inputs at once (shared, to keep the suite fast): a
glob in [data] train, a lone-surrogate row, rows whose tool calls the template drops, and the
scratch folder of an earlier run killed with SIGKILL. Each ends as a clean verdict in the JUnit
XML, with no traceback, no false pass, and nothing left readable by others."""

from __future__ import annotations

import pytest

import json
import stat

from pytest_ftready.files import scratch_prefix
from pytest_ftready.tiny import example_rows, write_jsonl
from tests.faults.test_hostile_processes import _dead_pid
from tests.faults.test_hostile_templates import WEATHER_CALL, WEATHER_TOOL
from tests.helpers import outcomes, properties


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_hostile_inputs_in_one_run_each_end_in_a_clean_verdict(pytester, tiny_example):
    rows = example_rows()
    for i in range(0, 50, 10):
        rows[i]["tools"] = [WEATHER_TOOL]
        rows[i]["messages"][-1]["tool_calls"] = [WEATHER_CALL]
    rows[6]["messages"][-1]["content"] = "half an emoji \ud83d"  # written as its escape: a lone surrogate
    (tiny_example / "data" / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    write_jsonl(tiny_example / "data" / "more" / "b.jsonl", example_rows(3, seed=2))
    write_jsonl(tiny_example / "data" / "more" / "a.jsonl", example_rows(2, seed=3))
    recipe = tiny_example / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('train = ["data/train.jsonl"]',
                                                 'train = ["data/train.jsonl", "data/more/*.jsonl"]'))
    arts = pytester.path / "arts"
    stale = arts / "tiny" / f"{scratch_prefix(_dead_pid())}killed"  # a run killed with SIGKILL mid-resume left this
    (stale / "weights").mkdir(parents=True)
    for folder in (arts, arts / "tiny"):
        folder.chmod(0o700)  # as an earlier run of the plugin made them
    (stale / "weights" / "adapter_model.safetensors").write_bytes(b"weights")

    result = pytester.runpytest_subprocess(f"--ftready={recipe}", "-k", "data.format or data.template or data.masking "
                                           "or data.lengths", "--junitxml=out.xml", f"--ftready-artifacts={arts}")
    junit = pytester.path / "out.xml"
    got = outcomes(junit)
    assert result.ret == 1 and "Traceback" not in result.stdout.str()
    state, message = got["data.format"]
    assert state == "failed" and message.startswith("Failed: 1 of 55 rows are unusable")
    assert "train.jsonl:7: a \\ud800-\\udfff escape without its pair (a lone surrogate)" in message
    listed = properties(junit, "data.format")
    assert listed["train_files[files]"] == "3"
    assert listed["train_file_names"] == "data/train.jsonl, data/more/a.jsonl, data/more/b.jsonl"  # sorted, each named
    state, message = got["data.template"]
    assert state == "failed" and "these tool calls will never be trained [train.jsonl:1, train.jsonl:11" in message
    for check in ("data.masking", "data.lengths"):
        assert got[check][0] == "passed", got[check]
        assert properties(junit, check)["rows_left_out[rows]"] == "1"
    assert not stale.exists()  # removed by this run: its process is gone
    modes = {str(p.relative_to(arts)): stat.S_IMODE(p.stat().st_mode) for p in arts.rglob("*")}
    assert modes and all(mode == (0o700 if (arts / name).is_dir() else 0o600) for name, mode in modes.items()), modes
    assert json.loads((arts / "tiny" / "measurements-partial.json").read_text())  # this -k run's records, written whole
