"""The three trainer-config examples run through the plugin offline, as a user runs them."""

from __future__ import annotations

import pytest

import json
import shutil
from pathlib import Path

from tests.helpers import outcomes

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny"


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_the_three_examples_run_offline_through_the_plugin(pytester, tiny_example):
    for name in ("trl-sft.yaml", "axolotl.yml", "llamafactory.yaml", "ftready.toml"):
        shutil.copy(TINY / name, tiny_example / name)
    shutil.copy(TINY / "data" / "dataset_info.json", tiny_example / "data" / "dataset_info.json")
    args = [f"--ftready={tiny_example / n}" for n in ("trl-sft.yaml", "axolotl.yml", "llamafactory.yaml")]
    result = pytester.runpytest_subprocess(*args, "-k", "data.format or data.masking or repro.config",
                                           "--junitxml=out.xml", "-p", "no:cacheprovider")
    found = outcomes(pytester.path / "out.xml")
    for recipe in ("trl-sft", "axolotl", "llamafactory"):
        for check in ("data.format", "data.masking", "repro.config"):
            assert found[f"{recipe}/{check}"][0] == "passed", (recipe, check, found[f"{recipe}/{check}"])
    header = result.stdout.str()
    assert "axolotl.yml read as Axolotl: base_model -> [model] path" in header
    assert "llamafactory.yaml not checked (4): do_train (the launcher's switch to train" in header
    assert "axolotl.yml not checked (1): logging_steps (logging, validation strictness" in header
    xml = (pytester.path / "out.xml").read_text()
    assert 'name="ftready_not_checked:trl-sft.yaml:report_to"' in xml
    assert 'name="ftready_not_checked:axolotl.yml:logging_steps"' in xml  # val_set_size: 0 is read: nothing evaluated
    assert 'name="ftready_caveat:llamafactory.yaml:1"' in xml
    config = json.loads(next((pytester.path / ".ftready").glob("trl-sft/config.json")).read_text())
    assert config["recipe"]["translation"]["format"] == "trl"
    quiet = pytester.runpytest(args[1], "-q", "-k", "data.format", "-p", "no:cacheprovider")  # in-process: cheap
    assert "axolotl.yml not checked (1): logging_steps" in quiet.stdout.str()  # -q hides the header, not this
