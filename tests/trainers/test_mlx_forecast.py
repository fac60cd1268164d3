"""mlx-lm's step forecast from config.json (forecast/mlx.py): its parts move as MLX's levers
say (pure arithmetic, no mlx needed), and where mlx runs, model.forecast_error holds it against
the peak ``mx.get_peak_memory()`` measured of mlx-lm's own step on the tiny model."""

from __future__ import annotations

import importlib.util

import pytest

from pytest_ftready.forecast.mlx import forecast, padded_length

from ..conftest import state_for, values

LLAMA = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "intermediate_size": 1536,
         "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True,
         "torch_dtype": "float32"}  # SmolLM2-135M's shape
ARGS = {"num_layers": -1, "lora_parameters": {"rank": 8}, "max_seq_length": 2048, "optimizer": "adam"}


def test_the_length_is_mlx_lms_padding():
    assert [padded_length(n, 2048) for n in (1, 32, 33, 69)] == [33, 33, 65, 97]
    assert padded_length(5000, 2048) == 2048


def test_each_mlx_lever_lowers_its_part():
    base = forecast(LLAMA, ARGS, 4, 500)
    assert base.weights_bytes == pytest.approx(134.5e6 * 4, rel=0.01)  # 135M float32 weights
    assert forecast(LLAMA, ARGS, 2, 500).activation_bytes == pytest.approx(base.activation_bytes / 2, rel=0.01)
    assert forecast(LLAMA, {**ARGS, "grad_checkpoint": True}, 4, 500).activation_bytes < base.activation_bytes / 2
    fewer = forecast(LLAMA, {**ARGS, "num_layers": 8}, 4, 500)
    assert fewer.trainable_bytes == pytest.approx(base.trainable_bytes * 8 / 30) and fewer.activation_bytes < base.activation_bytes
    quantized = forecast({**LLAMA, "quantization": {"bits": 4, "group_size": 64}}, ARGS, 4, 500)
    assert quantized.weights_bytes < base.weights_bytes / 6  # 4.5 bits a weight against 32
    assert forecast(LLAMA, {**ARGS, "optimizer": "sgd"}, 4, 500).optimizer_state_bytes == 0
    full = forecast(LLAMA, {**ARGS, "fine_tune_type": "full"}, 4, 500)
    assert full.trainable_bytes > 40 * base.trainable_bytes and full.peak_bytes > base.peak_bytes


@pytest.mark.skipif(importlib.util.find_spec("mlx_lm") is None, reason='the forecast is held against mlx-lm\'s '
                    'own step where mlx runs: pip install "mlx[cpu]" "mlx-lm[cpu]"')
def test_forecast_error_holds_the_mlx_forecast_against_mlx_lms_measured_peak(tmp_path, tiny_model_dir, real_machine,
                                                                               run_check):
    from .test_mlx import mlx_folder

    state = state_for(mlx_folder(tmp_path / "tiny", tiny_model_dir), tmp_path / "arts", real_machine)
    got = values(run_check(state, "model.forecast_error"))
    assert got["measured_step_trainer"] == "mlx-lm tuner.trainer"
    assert got["measured_peak_method"] == "mx.get_peak_memory" and got["measured_peak"] == state.step.peak_bytes
    assert abs(got["forecast_error"]) <= 0.10


def test_ftready_forecast_judges_an_mlx_config_against_a_macs_memory(tmp_path):
    """``ftready-forecast lora_config.yaml --target "M1 8GB"``: mlx-lm's step at the config's batch
    and max_seq_length against what MLX may use of the Mac's unified memory."""
    import json

    from pytest_ftready.forecast.mlx import forecast_text
    from pytest_ftready.machine.targets import resolve_target
    from pytest_ftready.recipe import load_recipe

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(LLAMA))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    config = tmp_path / "lora_config.yaml"
    config.write_text("model: model\ndata: data\nnum_layers: -1\nbatch_size: 2\nmax_seq_length: 1024\n"
                      "lora_parameters: {rank: 8, scale: 2.0, dropout: 0.0}\n")
    recipe = load_recipe(config)
    text, fits = forecast_text(recipe, resolve_target("M1 8GB"))
    assert fits is False and "mlx-lm step" in text and "does NOT fit" in text
    assert forecast_text(recipe, resolve_target("M3 Max 128GB"))[1] is True
    config.write_text(config.read_text() + "grad_checkpoint: true\n")
    lighter, _ = forecast_text(load_recipe(config), None)
    assert lighter != text
