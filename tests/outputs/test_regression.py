"""The regression gate's logic: baselines in each format, kinds and directions, thresholds."""

from __future__ import annotations

import json

import pytest

from pytest_ftready.kinds import KINDS, kind_of, thresholds
from pytest_ftready.outputs.measurements import Measurement, measurements_payload
from pytest_ftready.outputs.regression import BaselineError, RegressionGate, compare, load_baseline


def m(name, value, unit, check="model.step_memory", case="", estimate=False):
    return Measurement(recipe="tiny", check=check, name=name, value=value, unit=unit, estimate=estimate, case=case)


BEFORE = [m("peak_tensor_bytes", 1000, "bytes"), m("step_tokens_per_s", 200.0, "tokens/s"),
          m("disk_free", 10_000, "bytes", check="headroom.disk"), m("host_peak_method", "rss", ""),
          m("peak_memory", 500, "bytes", check="levers.sweep", case="micro_batch=8"),
          m("peak_memory", 300, "bytes", check="levers.sweep", case="micro_batch=2"),
          m("activations_and_workspace", 10, "bytes", estimate=True)]


@pytest.fixture
def baseline_file(tmp_path):
    path = tmp_path / "measurements.json"
    path.write_text(json.dumps(measurements_payload(BEFORE)))
    return path


def test_every_kind_has_a_direction_and_catches_its_names():
    assert {k.better for k in KINDS} <= {"lower", "higher"}
    assert kind_of("peak_device_reserved", "bytes").name == "peak_device_bytes"
    assert kind_of("peak_tensor_bytes", "bytes").name == "peak_device_bytes"
    assert kind_of("tokens_per_s_median", "tokens/s").better == "higher"
    assert kind_of("disk_free", "bytes") is None  # the machine's state, not the recipe's behaviour
    assert kind_of("peak_tensor_bytes", "s") is None  # the unit must match too


def test_recipe_thresholds_override_the_defaults():
    assert thresholds({}) == {"peak_device_bytes": 0.10, "tokens_per_s": 0.10, "checkpoint_bytes": 0.10}
    chosen = thresholds({"tokens_per_s": 0.5, "peak_host_bytes": 0.2})
    assert chosen["tokens_per_s"] == 0.5 and chosen["peak_host_bytes"] == 0.2 and chosen["peak_device_bytes"] == 0.10


def test_worse_past_the_threshold_regresses_in_the_kinds_direction(baseline_file):
    baseline = load_baseline(baseline_file)
    now = [m("peak_tensor_bytes", 1200, "bytes"), m("step_tokens_per_s", 150.0, "tokens/s"),
           m("disk_free", 1, "bytes", check="headroom.disk")]
    found = compare(baseline, now, thresholds({}))
    assert [(r.name, r.before, r.after) for r in found] == [("peak_tensor_bytes", 1000, 1200),
                                                             ("step_tokens_per_s", 200.0, 150.0)]
    assert found[0].change == pytest.approx(0.2) and found[1].change == pytest.approx(0.25)
    assert "rose 20.0%" in found[0].text() and "1000 B before, 1.17 KiB now" in found[0].text()
    assert "fell 25.0%" in found[1].text() and "max_regression.tokens_per_s 10%" in found[1].text()
    better = [m("peak_tensor_bytes", 500, "bytes"), m("step_tokens_per_s", 900.0, "tokens/s")]
    assert compare(baseline, better, thresholds({})) == []  # improvements never fail
    within = [m("peak_tensor_bytes", 1099, "bytes"), m("step_tokens_per_s", 181.0, "tokens/s")]
    assert compare(baseline, within, thresholds({})) == []


def test_variants_of_a_parametrized_check_compare_with_their_own_figures(baseline_file):
    now = [m("peak_memory", 520, "bytes", check="levers.sweep", case="micro_batch=8"),
           m("peak_memory", 520, "bytes", check="levers.sweep", case="micro_batch=2")]
    found = compare(load_baseline(baseline_file), now, thresholds({}))
    assert [(r.check_id, r.before) for r in found] == [("levers.sweep[micro_batch=2]", 300)]


def test_estimates_text_and_unnamed_kinds_are_never_gated(baseline_file):
    now = [m("activations_and_workspace", 1000, "bytes", estimate=True), m("host_peak_method", "tracemalloc", ""),
           m("peak_host_step", 10**9, "bytes")]
    assert compare(load_baseline(baseline_file), now, thresholds({})) == []
    assert compare(load_baseline(baseline_file), [m("peak_tensor_bytes", 1200, "bytes")], {"tokens_per_s": 0.1}) == []


def test_a_pytest_benchmark_run_and_a_folder_of_them_are_baselines(tmp_path):
    saved = tmp_path / ".benchmarks" / "Linux-CPython-3.12-64bit"
    saved.mkdir(parents=True)
    old = [m("peak_tensor_bytes", 100, "bytes")]
    (saved / "0001_old.json").write_text(json.dumps({"benchmarks": [], "ftready": measurements_payload(old)}))
    (saved / "0002_new.json").write_text(json.dumps({"benchmarks": [], "ftready": measurements_payload(BEFORE)}))
    baseline = load_baseline(tmp_path / ".benchmarks")
    assert baseline.source.name == "0002_new.json"
    assert baseline.get(m("peak_tensor_bytes", 0, "bytes")) == (1000.0, "bytes")


@pytest.mark.parametrize("content, expected", [
    (None, "not found; pass --ftready-baseline=PATH"),
    ("{not json", "cannot be read"),
    ('{"benchmarks": []}', "without an 'ftready' key"),
    ('"a string"', "expected a list of measurements"),
])
def test_an_unusable_baseline_names_its_path(tmp_path, content, expected):
    path = tmp_path / "base.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BaselineError, match=expected) as info:
        load_baseline(path)
    assert str(path) in str(info.value)


def test_a_folder_without_saved_runs_is_named(tmp_path):
    with pytest.raises(BaselineError, match=f"{tmp_path}: a folder without any"):
        load_baseline(tmp_path)


def test_the_gate_collects_regressions_and_counts_what_it_judged(baseline_file):
    gate = RegressionGate(load_baseline(baseline_file))
    assert gate.judge([m("peak_tensor_bytes", 1000, "bytes")], thresholds({})) == ""
    text = gate.judge([m("peak_tensor_bytes", 2000, "bytes"), m("step_tokens_per_s", 200.0, "tokens/s")],
                      thresholds({}))
    assert text.startswith("peak_tensor_bytes rose 100.0%") and str(baseline_file) in text
    assert gate.judged == 3 and [r.name for r in gate.found] == ["peak_tensor_bytes"]
    assert gate.summary().endswith("3 figure(s) compared, 1 regressed")


def write_run(folder, figures, partial=False):
    """A run's artifacts as sessionfinish writes them (measurements, series, environment)."""
    from pytest_ftready.outputs.measurements import write_figures

    folder.mkdir(parents=True, exist_ok=True)
    write_figures(folder, partial, figures, {"model.overfit": {"loss": [3.0, 1.0]}},
                  lambda path, payload: path.write_text(json.dumps(payload)))
    (folder / "environment.json").write_text("{}")


def test_a_partial_run_writes_beside_the_full_one_and_a_full_run_clears_it(tmp_path):
    folder = tmp_path / "tiny"
    write_run(folder, BEFORE)
    write_run(folder, [m("peak_tensor_bytes", 7, "bytes")], partial=True)
    assert len(json.loads((folder / "measurements.json").read_text())) == len(BEFORE)
    assert json.loads((folder / "measurements-partial.json").read_text())[0]["value"] == 7
    assert (folder / "series.json").is_file() and (folder / "series-partial.json").is_file()
    write_run(folder, BEFORE)
    assert not (folder / "measurements-partial.json").exists() and not (folder / "series-partial.json").exists()


def test_an_artifacts_folder_is_the_last_full_run_not_the_newest_file(tmp_path):
    write_run(tmp_path / "tiny", BEFORE)
    write_run(tmp_path / "tiny", [m("peak_tensor_bytes", 7, "bytes")], partial=True)  # pytest -k masking
    for given in (tmp_path / "tiny", tmp_path, tmp_path / "tiny" / "measurements.json"):
        baseline = load_baseline(given)
        assert baseline.get(m("peak_tensor_bytes", 0, "bytes")) == (1000.0, "bytes"), given
        assert "tiny: the last full run's figures" in baseline.note
    gate = RegressionGate(load_baseline(tmp_path))
    assert gate.summary().startswith(f"ftready baseline {tmp_path} (tiny: the last full run's figures)")


def test_without_a_full_run_the_partial_figures_are_the_baseline_and_it_says_so(tmp_path):
    write_run(tmp_path / "tiny", BEFORE, partial=True)
    baseline = load_baseline(tmp_path / "tiny" / "measurements.json")
    assert baseline.source.name == "measurements-partial.json"
    assert baseline.get(m("peak_tensor_bytes", 0, "bytes")) == (1000.0, "bytes")
    assert "partial run's figures" in baseline.note


def test_an_artifacts_root_merges_every_recipes_figures(tmp_path):
    write_run(tmp_path / "tiny", BEFORE)
    other = Measurement(recipe="other", check="model.step_memory", name="peak_tensor_bytes", value=50, unit="bytes")
    write_run(tmp_path / "other", [other])
    baseline = load_baseline(tmp_path)
    assert baseline.get(other) == (50.0, "bytes") and baseline.get(m("peak_tensor_bytes", 0, "bytes")) == (1000.0, "bytes")
