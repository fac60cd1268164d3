"""Sustained checks: a fake NVML that heats up and throttles (the real NvmlSource and sampler
reading fake numbers), synthetic throughput series, and the CPU short mode for real."""

from __future__ import annotations

import json
import types

import pytest

from pytest_ftready.engine import sustained_run
from pytest_ftready.engine.sustained_run import SERIES, Step, SustainedRun, throughput_drop, windows
from pytest_ftready.outcomes import Fail
from pytest_ftready.machine.telemetry import NvmlSource, Sampler, decode_reasons
from tests import fakes
from tests.helpers import outcomes


class HeatingNvml:
    """pynvml's functions, with a GPU that heats from 60 C by 1 C per reading and throttles
    (SwThermalSlowdown + HwThermalSlowdown, clocks falling) from 85 C."""

    def __init__(self, heating=True):
        self.readings = 0
        self.heating = heating

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("gpu", index)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        self.readings += 1
        return 60 + self.readings if self.heating else 65

    def _hot(self):
        return self.heating and 60 + self.readings >= 85

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return (1980 - (300 if self._hot() else 0)) if kind == 1 else 2619

    def nvmlDeviceGetPowerUsage(self, handle):
        return 650_000

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=99)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=60 * fakes.GiB)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return 0x20 | 0x40 if self._hot() else 0x0


def synthetic(rates_per_window: list[float], window_s: float = 30.0, steps_per_window: int = 10):
    """Steps whose throughput per window follows ``rates_per_window`` (positions/s)."""
    steps, t = [], 0.0
    for rate in rates_per_window:
        for _ in range(steps_per_window):
            seconds = window_s / steps_per_window
            t += seconds
            steps.append(Step(t - 1e-9, seconds, int(rate * seconds), int(rate * seconds)))
    return steps


def test_windows_and_drop():
    assert windows(synthetic([1000, 1000, 1000]), 30.0) == pytest.approx([1000, 1000, 1000])
    drop, best = throughput_drop([1000, 1200, 1100, 1000, 900, 840])
    assert best == 1 and drop == pytest.approx(0.3)
    assert decode_reasons(0x20 | 0x40 | 0x1) == ["GpuIdle", "SwThermalSlowdown", "HwThermalSlowdown"]


@pytest.fixture
def gpu_state(make_state, monkeypatch):
    """The tiny recipe on a described H100 whose telemetry comes from a fake NVML module, and
    whose training loop is replaced by a synthetic series (the thing under test is the check)."""
    def make(rates, heating=True, **edits):
        state = make_state(machine=fakes.nvidia(), **({"max_throughput_drop": "0.10", "window_seconds": "30"} | edits))
        nvml = HeatingNvml(heating)
        state.run.telemetry_factory = lambda device, machine: ([NvmlSource(0, nvml=nvml)], [])

        def fake_run(recipe, examples, pad_id, device, shared_base, warmup_s, total_s, window_s, sources, missing,
                     progress=None):
            with Sampler(sources, interval_s=3600) as sampler:
                for _ in range(30):
                    sampler.sample()
            for i, (_, reading) in enumerate(sampler.samples):  # spread the readings over the run
                sampler.samples[i] = (i * 10.0, reading)
            steps = synthetic(rates)
            return SustainedRun(steps, windows(steps, window_s), list(sampler.samples), list(missing), 146_000,
                                sampler.overhead_share, {m: sampler.series(m) for m in SERIES if sampler.series(m)})

        monkeypatch.setattr(sustained_run, "run_sustained", fake_run)
        monkeypatch.setattr(type(state), "device", property(lambda self: types.SimpleNamespace(
            kind="cuda", torch_device="cpu", is_accelerator=True, missing="", name="H100")))
        return state
    return make


def test_a_30_percent_sag_with_thermal_throttling_fails_both_checks(gpu_state, run_check):
    state = gpu_state([1000, 1000, 950, 900, 800, 700])
    with pytest.raises(Fail, match=r"throughput fell 30% from 1,000 tokens/s \(window 1\) to 700 tokens/s \(last of 6\)"
                                   r".*coincides with SwThermalSlowdown throttling from \d+ s"):
        run_check(state, "sustained.throughput")
    with pytest.raises(Fail) as info:
        run_check(state, "sustained.thermal")
    hottest = max(value for _, value in state.series["sustained.throughput"]["temperature_c"])
    assert hottest > 87  # heating from 61 C by 1 C a reading
    assert f"the GPU reached {hottest:.0f} C (limit max_temperature_c 87)" in str(info.value)
    assert "SwThermalSlowdown from" in str(info.value) and "HwThermalSlowdown from" in str(info.value)
    assert state.series["sustained.throughput"]["temperature_c"][0][1] == 61


def test_throttling_under_the_temperature_limit_fails_on_the_throttling_alone(gpu_state, run_check):
    state = gpu_state([1000] * 10, max_throughput_drop="0.10\nmax_temperature_c = 99")  # ~92 C: under the limit, throttled from 85 C
    run_check(state, "sustained.throughput")
    with pytest.raises(Fail) as info:
        run_check(state, "sustained.thermal")
    assert str(info.value).startswith("clocks were throttled: SwThermalSlowdown from")
    assert "the GPU reached" not in str(info.value)


def test_hot_gpu_over_its_limit_fails_thermal_with_the_time(gpu_state, run_check, edit_recipe, tiny_example):
    state = gpu_state([1000] * 10)
    run_check(state, "sustained.throughput")
    with pytest.raises(Fail, match=r"the GPU reached 92 C \(limit max_temperature_c 87\), above the limit from \d+ s"):
        run_check(state, "sustained.thermal")


def test_a_steady_cool_run_passes(gpu_state, run_check):
    state = gpu_state([1000, 990, 1010, 1000, 995, 1005], heating=False)
    measured = {m.name: m.value for m in run_check(state, "sustained.throughput").measured}
    assert measured["throughput_drop"] < 0.02 and measured["telemetry_missing"] == "none"
    run_check(state, "sustained.thermal")


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_cpu_short_mode_runs_sustained_and_the_sweep(pytester, tiny_example):
    recipe = tiny_example / "recipe.toml"
    pytester.runpytest_subprocess(f"--ftready={recipe}", "-m", "nightly", "--ftready-cpu-short",
                                  "--benchmark-json=bench.json", "--junitxml=out.xml", "--ftready-artifacts=arts")
    result = outcomes(pytester.path / "out.xml")
    assert result["sustained.throughput"][0] == "passed", result["sustained.throughput"]
    assert result["sustained.thermal"][0] == "skipped" and "GPU telemetry: none on cpu" in result["sustained.thermal"][1]
    assert result["levers.sweep[recipe]"][0] == "passed"
    bench = json.loads((pytester.path / "bench.json").read_text())
    group = [b for b in bench["benchmarks"] if b["group"] == "levers.sweep tiny"]
    assert {b["name"] for b in group} >= {"levers.sweep[recipe]", "levers.sweep[checkpointing=on]", "levers.sweep[attn=eager]"}
    own = next(b for b in group if b["name"] == "levers.sweep[recipe]")
    assert own["extra_info"]["is_recipe_setting"] is True and own["extra_info"]["tokens_per_s[tokens/s]"] > 0
    series = json.loads((pytester.path / "arts" / "tiny" / "series-partial.json").read_text())
    assert len(series["sustained.throughput"]["tokens_per_s_windows"]) >= 2
    assert series["sustained.throughput"]["cpu_percent"]


def test_nightly_is_deselected_and_accelerator_checks_skip_without_short_mode(pytester, tiny_example):
    recipe = tiny_example / "recipe.toml"
    result = pytester.runpytest_subprocess(f"--ftready={recipe}", "--collect-only", "-q")
    collected = [line for line in result.stdout.lines if "::" in line]
    assert collected and not [line for line in collected if "sustained" in line or "levers.sweep" in line]
    assert "nightly checks deselected (levers.sweep, sustained.thermal, sustained.throughput)" in result.stdout.str()
    pytester.runpytest_subprocess(f"--ftready={recipe}", "-m", "nightly", "-k", "sustained", "--junitxml=out.xml")
    result = outcomes(pytester.path / "out.xml")
    assert result["sustained.throughput"][0] == "skipped"
    assert "or --ftready-cpu-short to try it on the CPU" in result["sustained.throughput"][1]
