"""--ftready-baseline and --benchmark-compare: a figure worse than last night's fails its check."""

from __future__ import annotations

import json
import re

import pytest

from pytest_ftready.units import format_value
from tests.helpers import outcomes

PEAK = re.compile(r"(peak_\w+) rose [\d.]+%, worse than max_regression\.peak_device_bytes 10%: (.+) before, (.+) now")


def peak_figures(artifacts):
    """name -> the peak-memory figure of model.step_memory, formatted as the failure quotes it."""
    payload = json.loads((artifacts / "tiny" / "measurements-partial.json").read_text())  # -k runs: partial
    return {e["name"]: format_value(e["value"], e["unit"]) for e in payload
            if e["check"] == "model.step_memory" and e["name"].startswith("peak_") and e["unit"] == "bytes"}


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_a_larger_micro_batch_fails_step_memory_against_last_nights_figures(pytester, tiny_example, edit_recipe):
    recipe = f"--ftready={tiny_example / 'recipe.toml'}"
    # this shared CPU's step time varies several-fold under load; peak memory does not
    edit_recipe(tiny_example / "recipe.toml", max_regression="{ peak_device_bytes = 0.10, tokens_per_s = 0.95 }")
    first = pytester.runpytest_subprocess(recipe, "-k", "step_memory", "--ftready-artifacts=night1",
                                          "--benchmark-autosave")
    first.assert_outcomes(passed=1)
    edit_recipe(tiny_example / "recipe.toml", micro_batch_size="8")

    second = pytester.runpytest_subprocess(recipe, "-k", "step_memory", "--ftready-artifacts=night2",
                                           "--ftready-baseline=night1/tiny/measurements.json", "--junitxml=out.xml")
    state, message = outcomes(pytester.path / "out.xml")["model.step_memory"]
    assert state == "failed", message
    name, before, after = PEAK.search(message).groups()
    assert before == peak_figures(pytester.path / "night1")[name]
    assert after == peak_figures(pytester.path / "night2")[name]
    # night1 was a -k run: with no full run there, its partial figures are the baseline, and the line says so
    assert "night1/tiny/measurements-partial.json" in message
    second.stdout.fnmatch_lines(["ftready baseline *measurements-partial.json (tiny: a partial run's figures *): "
                                 "* figure(s) compared, 1 regressed"])

    # pytest-benchmark's own comparison: the autosaved run carries the measurements under "ftready"
    third = pytester.runpytest_subprocess(recipe, "-k", "step_memory", "--ftready-artifacts=night3",
                                          "--benchmark-compare", "--junitxml=out3.xml")
    state, message = outcomes(pytester.path / "out3.xml")["model.step_memory"]
    assert state == "failed" and PEAK.search(message), message
    third.stdout.fnmatch_lines(["ftready baseline *.benchmarks*0001_*.json: * figure(s) compared, 1 regressed"])


def test_a_missing_baseline_is_a_usage_error_naming_it(pytester, tiny_example):
    result = pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "--ftready-baseline=gone.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*ftready baseline {pytester.path / 'gone.json'} not found*"])

