"""The trainer-beside-engine table (tests/benchmarks/trainer_table.py), read from JUnit XML as
pytest writes it, and the step's peak by source line (peak_sources.py). Opt-in, the real runs:
the tiny example as a TRL config and as the engine's recipe (FTREADY_TRAINER_TABLE=1, ~1 min),
plus SmolLM2-135M as a TRL config where FTREADY_SMOLLM2_DIR names its model folder (~2 min
more on two cores)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.benchmarks.peak_sources import measured
from tests.benchmarks.trainer_table import figures, main, smollm2_config, table

ROOT = Path(__file__).resolve().parents[2]

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="trl-sft.yaml" name="model.step_memory" time="3.1"><properties>
 <property name="peak_tensor_bytes[bytes]" value="51679648"/><property name="step_seconds[s]" value="0.18"/>
 <property name="step_tokens[tokens]" value="512"/><property name="engine_peak_bytes[bytes]" value="10784008"/>
 <property name="engine_step_tokens[tokens]" value="512"/><property name="engine_step_seconds[s]" value="0.017"/>
 <property name="pipeline" value="trl"/><property name="step_trainer" value="trl SFTTrainer"/></properties>
</testcase>
<testcase classname="trl-sft.yaml" name="model.overfit" time="9"><properties>
 <property name="overfit_steps[steps]" value="63"/><property name="overfit_final_loss[nats]" value="0.0947"/>
 <property name="engine_overfit_steps[steps]" value="68"/><property name="engine_overfit_final_loss[nats]" value="0.0968"/>
 <property name="pipeline" value="trl"/><property name="step_trainer" value="trl SFTTrainer"/></properties>
</testcase>
<testcase classname="trl-sft.yaml" name="lifecycle.resume" time="9"><properties>
 <property name="resume_max_loss_difference[nats]" value="0.0"/></properties></testcase>
<testcase classname="trl-sft.yaml" name="model.forecast_error" time="1"><properties>
 <property name="forecast_error[share]" value="-0.0002"/>
 <property name="forecast_path" value="trl SFTTrainer on cpu: TRL's fused LM head"/></properties></testcase>
<testcase classname="recipe.toml" name="model.step_memory" time="1"><properties>
 <property name="peak_device_reserved[bytes]" value="2000000"/><property name="step_tokens[tokens]" value="512"/>
 <property name="pipeline" value="builtin"/><property name="step_trainer" value="pytest-ftready engine"/></properties>
</testcase>
<testcase classname="recipe.toml" name="lifecycle.resume" time="0"><skipped message="no"/></testcase>
<testcase classname="recipe.toml" name="data.masking" time="0"/>
</testsuite></testsuites>"""


def test_the_table_sets_a_trainers_run_beside_the_engines_from_junit(tmp_path):
    junit = tmp_path / "run.xml"
    junit.write_text(JUNIT)
    trl, engine = figures(junit)
    assert (trl.config, trl.step_trainer, trl.step_peak_bytes, trl.engine_step_peak_bytes) == (
        "trl-sft.yaml", "trl SFTTrainer", 51679648, 10784008)
    assert (trl.overfit_steps, trl.engine_overfit_steps, trl.forecast_error) == (63, 68, -0.0002)
    assert trl.outcomes["model.forecast_error"] == "passed" and trl.resume == "passed (max loss difference 0.0)"
    assert not engine.own_step and engine.step_peak_bytes == 2000000  # the allocator's peak where there is one
    assert engine.resume == "skipped" and "data.masking" not in engine.outcomes
    text = table([trl, engine]).splitlines()
    assert "| trl SFTTrainer | 51.68 MB | 10.78 MB | 4.79x | 512 | 512 |" in text[2]
    assert text[2].endswith("| -0.0% | trl SFTTrainer on cpu: TRL's fused LM head | - |")
    assert "| pytest-ftready engine | 2.00 MB | = | = | 512 | = |" in text[3]
    assert text[3].endswith("| lifecycle.resume skipped |")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("FTREADY_TRAINER_TABLE") != "1",
                    reason="opt-in: set FTREADY_TRAINER_TABLE=1 (and FTREADY_SMOLLM2_DIR=<SmolLM2-135M model folder> "
                           "for the 135M row); runs the model checks in fresh pytest processes")
def test_trls_run_beside_the_engines_on_the_tiny_model_and_smollm2(tmp_path, tiny_example, capsys):
    pytest.importorskip("trl")
    for name in ("trl-sft.yaml", "ftready.toml"):
        shutil.copy(ROOT / "examples" / "tiny" / name, tiny_example / name)
    configs = [tiny_example / "trl-sft.yaml", tiny_example / "recipe.toml"]
    smol = os.environ.get("FTREADY_SMOLLM2_DIR")
    if smol:
        configs.append(smollm2_config(Path(smol), tmp_path / "smollm2", rows=100))
    assert main(["run", *map(str, configs), "--out", str(tmp_path / "junit"), "--json", str(tmp_path / "f.json")]) == 0
    print(capsys.readouterr().out)  # the table, for the log (-s)
    rows = {row["config"]: row for row in json.loads((tmp_path / "f.json").read_text())}
    tiny = rows["tiny-trl-sft"]
    assert tiny["step_trainer"] == "trl SFTTrainer" and tiny["step_peak_bytes"] and tiny["engine_step_peak_bytes"]
    assert tiny["step_tokens"] == tiny["engine_step_tokens"]  # the same worst-case micro-batch
    assert tiny["outcomes"]["model.overfit"] == "passed" and tiny["resume"].startswith("passed")
    assert rows["tiny-recipe"]["step_trainer"] == "pytest-ftready engine"
    if smol:
        big = rows["smollm2-trl-sft"]
        assert big["step_tokens"] == big["engine_step_tokens"] == 2 * 128 and big["engine_overfit_steps"]


def test_peak_sources_account_for_every_byte_of_the_engines_peak(make_state):
    from pytest_ftready.engine.memory import TensorBytes

    track = TensorBytes.track
    step, sources = measured(make_state(), "engine_step", top=10_000)
    assert TensorBytes.track is track  # the counting is undone after the block
    assert sum(nbytes for nbytes, _ in sources) == step.peak_bytes - step.breakdown.weights_bytes
    assert any("ForCausalLMLoss" in where for _, where in sources)  # the loss over the full logits, named
