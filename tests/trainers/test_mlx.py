"""mlx-lm's own run, on MLX for real (its CPU backend here: ``pip install "mlx[cpu]" "mlx-lm[cpu]"``):
an mlx-lm LoRA config's rows are labelled by mlx-lm's own dataset classes, its step, overfit and
resume go through mlx-lm's tuner, and lifecycle.generate compares the adapters reloaded and the
model ``mlx_lm fuse`` writes with the trained model. Planted causes fail their checks naming
them. Runs where mlx and mlx-lm import (.ci/run builds their environment); skipped elsewhere,
saying so."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail

from ..conftest import copy_example, state_for, values

pytest.importorskip("mlx.core", reason='mlx-lm\'s own run needs mlx with its Python bindings: pip install "mlx[cpu]" '
                                       '"mlx-lm[cpu]" (Linux) or mlx-lm (a Mac); .ci/run builds that environment')
pytest.importorskip("mlx_lm", reason='mlx-lm\'s own run needs mlx-lm: pip install "mlx-lm[cpu]"')

STEP_TRAINER = "mlx-lm tuner.trainer"
# The tiny example's run as an mlx-lm config: Adam at 3e-3 (mlx's Adam has no bias correction, so its
# first steps are about 3x larger than torch's; 1e-2 oscillates at a loss of ~4 on the tiny model).
CONFIG = {"model": "model", "train": "true", "data": "mlxdata", "fine_tune_type": "lora", "num_layers": "-1",
          "batch_size": "4", "iters": "100", "learning_rate": "3e-3", "max_seq_length": "128", "mask_prompt": "true",
          "lora_parameters": "{rank: 8, scale: 4.0, dropout: 0.0}", "adapter_path": "adapters", "seed": "42"}
SIDE = """[model]
license = "apache-2.0"
[data]
sample = 4
[checks]
overfit_examples = 4
overfit_steps = 150
overfit_loss = 0.1
resume_steps = 4
[privacy]
licenses = ["apache-2.0"]
"""


def mlx_folder(folder: Path, model_dir: Path, side: str = SIDE, rows: list | None = None, **edits) -> Path:
    """The tiny example as an mlx-lm config (lora_config.yaml, its data folder with train.jsonl
    and valid.jsonl, a side lora_config.ftready.toml), ``edits`` over its keys."""
    copy_example(folder, model_dir)
    data = folder / "mlxdata"
    data.mkdir()
    lines = (folder / "data" / "train.jsonl").read_text().splitlines()
    if rows is not None:
        lines = [json.dumps(row) for row in rows]
    (data / "train.jsonl").write_text("\n".join(lines) + "\n")
    (data / "valid.jsonl").write_text("\n".join(lines[:8]) + "\n")
    config = folder / "lora_config.yaml"
    config.write_text("".join(f"{key}: {value}\n" for key, value in {**CONFIG, **edits}.items()))
    (folder / "lora_config.ftready.toml").write_text(side)
    return config


@pytest.fixture(scope="module")
def mlx_state(tmp_path_factory, tiny_model_dir, real_machine):
    """One mlx-lm config's state for the module: its pipeline, step, overfit and resume run once."""
    config = mlx_folder(tmp_path_factory.mktemp("mlx") / "tiny", tiny_model_dir)
    return state_for(config, config.parent.parent / "arts", real_machine)


def test_an_mlx_config_selects_mlx_lm_on_mlxs_cpu_backend(mlx_state):
    assert mlx_state.trainer.step_trainer == STEP_TRAINER
    assert mlx_state.device.kind == "mlx" and not mlx_state.device.missing


def test_stack_mlx_passes_for_the_tiny_llama(mlx_state, run_check):
    got = values(run_check(mlx_state, "stack.mlx"))
    assert got["model_type"] == "llama"


def test_data_masking_judges_the_labels_mlx_lms_chat_dataset_makes(mlx_state, run_check):
    got = values(run_check(mlx_state, "data.masking"))
    assert (got["pipeline"], got["step_trainer"]) == ("mlx", STEP_TRAINER)
    assert got["trained_span_method"] == "mlx-lm ChatDataset mask_prompt"
    assert 0 < got["trained_token_share"] < 0.5  # the last answer of each row, not the prompt


def test_the_step_is_mlx_lms_own_its_peak_as_mlx_counts_it(mlx_state, run_check):
    got = values(run_check(mlx_state, "model.step_memory"))
    assert got["step_trainer"] == STEP_TRAINER and mlx_state.step.trainer == STEP_TRAINER
    step = mlx_state.step
    b = step.breakdown
    assert step.peak_bytes > b.weights_bytes + b.gradient_bytes + b.optimizer_state_bytes > 0
    assert b.optimizer_state_bytes >= 2 * b.trainable_bytes  # Adam's two moments per adapter weight
    assert got["device_capacity"] == mlx_state.machine.host.memory_total_bytes  # the CPU backend: host RAM
    assert got["engine_peak_bytes"] > 0  # the engine's torch step of the same recipe beside it


def test_mlx_lms_overfit_reaches_the_target_and_the_fused_model_generates_the_same(mlx_state, run_check):
    got = values(run_check(mlx_state, "model.overfit"))
    assert got["step_trainer"] == STEP_TRAINER
    assert got["overfit_final_loss"] <= 0.1 < got["overfit_first_loss"]
    run_check(mlx_state, "lifecycle.generate")  # adapters on a fresh base and mlx_lm fuse's model, each greedy
    folder = Path(mlx_state.overfit.adapter_dir)
    assert (folder / "adapters.safetensors").is_file() and (folder.parent / "mlx-fused" / "config.json").is_file()


def test_mlx_lms_resume_restores_the_adapters_only_and_the_check_says_what_is_lost(mlx_state, run_check):
    with pytest.raises(Fail) as info:
        run_check(mlx_state, "lifecycle.resume")
    said = str(info.value)
    assert said.startswith(f"{STEP_TRAINER}: ")
    assert "restores the adapter weights only" in said and "optimizer state" in said and "permutation" in said
    assert mlx_state.saved_run.checkpoint.name == "0000002_adapters.safetensors"


def test_where_nothing_unrestored_matters_mlx_lms_resume_equals_the_straight_run(tmp_path, tiny_model_dir,
                                                                                 real_machine, run_check):
    """SGD keeps no state, the learning rate is constant and every batch is the same rows: what
    mlx-lm does not restore changes nothing, and the check passes (it is not a fixed failure)."""
    row = {"messages": [{"role": "user", "content": "What is red?"}, {"role": "assistant", "content": "A colour."}]}
    config = mlx_folder(tmp_path / "tiny", tiny_model_dir, rows=[row] * 40, optimizer="sgd")
    state = state_for(config, tmp_path / "arts", real_machine)
    got = values(run_check(state, "lifecycle.resume"))
    assert got["resume_max_loss_difference"] == 0.0 and got["resumed_steps"] == 2


# ---- planted causes -------------------------------------------------------------------------------
def test_planted_mask_prompt_false_on_an_assistant_only_recipe_fails_data_masking(tmp_path, tiny_model_dir,
                                                                                   real_machine, run_check):
    side = SIDE.replace("[data]\n", "[data]\ntrain_on = \"assistant\"\n")  # the team means assistant-only
    config = mlx_folder(tmp_path / "tiny", tiny_model_dir, side=side, mask_prompt="false")
    state = state_for(config, tmp_path / "arts", real_machine)
    with pytest.raises(Fail) as info:
        run_check(state, "data.masking")
    assert "mlx" in str(info.value)


def test_planted_a_model_type_mlx_lm_lacks_fails_stack_mlx_naming_it(tmp_path, tiny_model_dir, real_machine,
                                                                     run_check):
    config = mlx_folder(tmp_path / "tiny", tiny_model_dir)
    model = tmp_path / "own-model"
    model.mkdir()
    for file in Path(tiny_model_dir).iterdir():
        (model / file.name).symlink_to(file)
    (model / "config.json").unlink()
    settings = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**settings, "model_type": "martian_lm"}))
    config.write_text(config.read_text().replace("model: model", f"model: {model}"))
    state = state_for(config, tmp_path / "arts", real_machine)
    with pytest.raises(Fail) as info:
        run_check(state, "stack.mlx")
    assert "martian_lm" in str(info.value)


def test_planted_a_peak_above_the_memory_given_fails_the_step_with_mlxs_levers(tmp_path, tiny_model_dir,
                                                                               real_machine, run_check):
    small = dataclasses.replace(real_machine, host=dataclasses.replace(real_machine.host,
                                                                       memory_total_bytes=4 << 20))
    config = mlx_folder(tmp_path / "tiny", tiny_model_dir)
    state = state_for(config, tmp_path / "arts", small)
    with pytest.raises(Fail) as info:
        run_check(state, "model.step_memory")
    said = str(info.value)
    assert "mx.get_peak_memory" in said and "MLX levers" in said
    for lever in ("batch_size 4 -> 2", "max_seq_length 128 -> 64", "grad_checkpoint: true", "num_layers",
                  "--q-bits 4"):
        assert lever in said, lever


# ---- the export ---------------------------------------------------------------------------------------
def with_export(state, fmt: str):
    """``state``'s recipe with ``[export] format = fmt``, its facts (the overfit) shared."""
    export = state.recipe.export.set("format", fmt)
    state.recipe = state.recipe.set("export", export)
    return state


def test_the_declared_export_runs_mlx_lm_fuse_and_the_gguf_reads_back(mlx_state, run_check):
    got = values(run_check(with_export(mlx_state, "gguf"), "lifecycle.mlx_export"))
    assert got["export_logit_difference"] <= 1e-3
    assert got["gguf_architecture"] == "llama" and got["gguf_tensors"] >= got["gguf_fused_weights_found"] > 0
    with_export(mlx_state, "none")


def test_planted_a_4bit_base_asked_for_gguf_fails_with_the_dequantize_command(tmp_path, tiny_model_dir,
                                                                              real_machine, run_check):
    import subprocess
    import sys

    quantized = tmp_path / "q4"
    subprocess.run([sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(tiny_model_dir), "--mlx-path",
                    str(quantized), "-q", "--q-bits", "4", "--q-group-size", "32"], check=True, capture_output=True)
    config = mlx_folder(tmp_path / "tiny", tiny_model_dir, side=SIDE + "[export]\nformat = \"gguf\"\n")
    config.write_text(config.read_text().replace("model: model", f"model: {quantized}"))
    state = state_for(config, tmp_path / "arts", real_machine)
    assert values(run_check(state, "stack.mlx"))["mlx_quantized_bits"] == 4  # mlx-lm loads the 4-bit base
    with pytest.raises(Fail) as info:
        run_check(state, "lifecycle.mlx_export")
    said = str(info.value)
    assert "4-bit" in said and "--dequantize --export-gguf" in said


def test_the_config_is_handed_to_mlx_lm_as_its_loader_reads_it(tmp_path, tiny_model_dir):
    """YAML 1.1 reads 1e-5 as text; mlx-lm's loader reads a float: the run is handed floats, in
    lr_schedule's arguments too, and mlx-lm builds that schedule."""
    from mlx_lm.tuner.utils import build_schedule

    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.trainers.mlx import mlx_config

    config = mlx_folder(tmp_path / "tiny", tiny_model_dir, learning_rate="2e-4",
                        lr_schedule="{name: cosine_decay, warmup: 2, arguments: [1e-3, 50]}")
    handed = mlx_config(load_recipe(config))
    assert handed["learning_rate"] == 2e-4 and handed["lr_schedule"]["arguments"] == [1e-3, 50]
    assert float(build_schedule(handed["lr_schedule"])(10)) > 0
