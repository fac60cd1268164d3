"""A hand-built run record: every section of the report and the CI summary has something to show."""

from __future__ import annotations

from pathlib import Path

from pytest_ftready.outputs.measurements import Measurement
from pytest_ftready.outputs.records import NIGHTLY_DEFAULT, NOT_SELECTED, CheckRow, RecipeRun
from pytest_ftready.outputs.regression import Regression


def m(check, name, value, unit, case="", estimate=False):
    return Measurement("demo", check, name, value, unit, estimate, case)


def sample_run(partial: bool = False) -> RecipeRun:
    checks = [
        CheckRow("repro.environment", "repro", "passed"),
        CheckRow("stack.driver", "stack", "skipped", "needs a CUDA/ROCm GPU or an Apple GPU: no NVIDIA driver"),
        CheckRow("data.format", "data", "passed"),
        CheckRow("data.masking", "data", "failed", "truncation cuts the response of 3 of 50 rows (6.0% > "
                 "max_truncated_share 5.0%)\nFix: raise [data] max_length (now 128) or shorten those rows"),
        CheckRow("data.lengths", "data", "passed"),
        CheckRow("model.step_memory", "model", "failed", "peak_tensor_bytes rose 91.6%, worse than "
                 "max_regression.peak_device_bytes 10%: 7.02 MiB before, 13.46 MiB now\n(baseline b.json)"),
        CheckRow("model.overfit", "model", "passed"),
        CheckRow("levers.sweep[recipe]", "levers", "passed"),
        CheckRow("levers.sweep[micro_batch=8]", "levers", "passed"),
        CheckRow("levers.sweep[attn=flash_attention_2]", "levers", "skipped", "not available on this device"),
        CheckRow("sustained.throughput", "sustained", "passed"),
        CheckRow("sustained.thermal", "sustained", "failed", "clocks were throttled: hw_thermal_slowdown from 42 s"),
        CheckRow("headroom.time", "headroom", "not run",
                 why_not=NOT_SELECTED if partial else NIGHTLY_DEFAULT),
    ]
    measurements = [
        m("data.lengths", "length_p95", 78.1, "tokens"), m("data.lengths", "truncation_rate", 0.06, "share"),
        m("data.masking", "trained_span_method", "generation-markers", ""),
        m("model.step_memory", "peak_tensor_bytes", 14_114_000, "bytes"),
        m("model.step_memory", "weights", 601_344, "bytes"),
        m("model.step_memory", "trainable_parameters", 16_384, "bytes"),
        m("model.step_memory", "optimizer_state", 32_800, "bytes"),
        m("model.step_memory", "activations_and_workspace", 13_463_472, "bytes", estimate=True),
        m("model.step_memory", "device_capacity", 25_276_514_304, "bytes"),
        m("model.step_memory", "step_tokens_per_s", 14_180.5, "tokens/s"),
        m("model.overfit", "overfit_final_loss", 0.0968, "nats"),
        m("levers.sweep", "peak_memory", 7_360_000, "bytes", case="recipe"),
        m("levers.sweep", "tokens_per_s", 10_460.0, "tokens/s", case="recipe"),
        m("levers.sweep", "peak_memory", 14_380_000, "bytes", case="micro_batch=8"),
        m("levers.sweep", "tokens_per_s", 10_200.0, "tokens/s", case="micro_batch=8"),
        m("levers.advice", "saves[activation checkpointing]", 3_355_443, "bytes", estimate=True),
        m("sustained.throughput", "tokens_per_s_median", 9856.0, "tokens/s"),
        m("sustained.throughput", "throughput_drop", 0.0859, "share"),
        m("sustained.throughput", "telemetry_missing", "none", ""),
        m("sustained.thermal", "max_temperature", 84.0, "C"),
        m("sustained.thermal", "throttle_reasons", "hw_thermal_slowdown from 42 s", ""),
    ]
    telemetry = {name: [[t, v] for t, v in zip(range(0, 100, 10), values)] for name, values in {
        "temperature_c": [60, 70, 78, 82, 84, 84, 83, 84, 84, 83],
        "sm_clock_mhz": [1980, 1980, 1980, 1980, 1800, 1700, 1700, 1710, 1700, 1700],
        "power_w": [280, 300, 305, 300, 290, 270, 260, 262, 260, 261]}.items()}
    series = {
        "data.lengths": {"lengths": [34, 36, 36, 41, 53, 62, 79, 80, 130, 140]},
        "data.masking": {"examples": [{"where": "train.jsonl:1", "length": 6, "trained": 3, "skipped_at": None,
                                       "skipped": 0, "problems": [["truncated_part", "response cut at 128 tokens"]],
                                       "tokens": [["<|im_start|>", False], ["user\n", False], ["Hi", False],
                                                  ["Hello", True], [" there", True], ["<|im_end|>", True]]}]},
        "model.overfit": {"loss": [6.9, 5.2, 3.1, 1.4, 0.6, 0.2, 0.09]},
        "sustained.throughput": {"tokens_per_s_windows": [10_100, 10_050, 9_900, 9_700, 9_300], **telemetry},
        "sustained.thermal": {"throttle_events": [["hw_thermal_slowdown", 42.0]]},
    }
    regression = Regression("demo", "model.step_memory", "", "peak_tensor_bytes", "bytes", "peak_device_bytes",
                            7_360_000.0, 14_114_000.0, 0.9177, 0.10)
    return RecipeRun(name="demo", checks=checks, measurements=measurements, series=series,
                     settings={"data": {"max_length": 128}, "hardware": {"memory_headroom": 0.10},
                               "checks": {"overfit_loss": 0.1, "max_temperature_c": 87.0}},
                     regressions=[regression], baseline=str(Path("nightly") / "measurements.json"),
                     environment={"os": "Linux 6.1", "python": "3.12.3", "gpus": [{"name": "NVIDIA L4", "index": 0}],
                                  "packages": {"torch": "2.5.1", "transformers": "4.46.0"}})
