"""Secrets that byte-level BPE splits over many tokens, planted in assistant turns, run as a
user would: every one is found, and no output channel carries any of them, whole or cut."""

from __future__ import annotations

import pytest

import json
import xml.etree.ElementTree as ET

from pytest_ftready.privacy.scan import fingerprint
from tests import planted


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_split_secrets_in_assistant_turns_leak_into_no_output(pytester, tiny_example, edit_recipe):
    data = tiny_example / "data" / "train.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    data.write_text("".join(json.dumps(r) + "\n" for r in planted.plant_in_assistant_turns(rows)))
    recipe = edit_recipe(tiny_example / "recipe.toml", sample="8")
    # the planted rows are truncated on purpose: let data.masking pass so the model checks
    # (and their benchmarks) run and write their outputs too
    recipe.write_text(recipe.read_text().replace("[checks]\n", "[checks]\nmax_truncated_share = 0.5\n"))
    arts = pytester.path / "arts"
    result = pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "-m", "not nightly",
                                           "--junitxml=out.xml", "--benchmark-json=bench.json",
                                           f"--ftready-artifacts={arts}", "-rA", "-v")
    terminal = result.stdout.str() + result.stderr.str()
    outcomes = {case.get("name"): "failed" if case.find("failure") is not None else "other"
                for case in ET.parse(pytester.path / "out.xml").iter("testcase")}
    assert outcomes["privacy.secrets"] == outcomes["privacy.pii"] == "failed"
    assert outcomes["model.step_memory"] == "other" and (pytester.path / "bench.json").is_file()
    for kind, (value, _) in planted.SPLIT.items():  # each planted value found, by its fingerprint
        assert fingerprint(kind, value) in terminal, f"{kind} was not found by the privacy scan"
    masking = (arts / "tiny" / "masking.html").read_text()
    for kind in planted.SPLIT:
        assert f"&lt;{kind} redacted&gt;" in masking, f"{kind} is not shown redacted in masking.html"
    assert (arts / "tiny" / "report.html").is_file()

    channels = {"stdout+stderr": terminal.encode()}
    for path in [pytester.path / "out.xml", pytester.path / "bench.json", *arts.rglob("*")]:
        if path.is_file():
            channels[str(path.relative_to(pytester.path))] = path.read_bytes()
    assert {'out.xml', 'bench.json', 'arts/tiny/masking.html', 'arts/tiny/report.html'} <= set(channels)
    leaks = [(needle, channel) for needle in planted.never_shown() for channel, content in channels.items()
             if needle.encode() in content]
    assert not leaks, f"{len(leaks)} leak(s), e.g. {leaks[0][0][:6]}... in {leaks[0][1]}"
