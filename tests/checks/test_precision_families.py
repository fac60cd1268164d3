"""stack.precision against the model's own training dtype: float16 on a bfloat16-trained model of a
family known to overflow it (the compute facts' sourced fp16_overflow rows) fails, naming the
model type, its config dtype, the source and the remedy; another family is measured as a risk."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from pytest_ftready.machine.compat import load
from pytest_ftready.machine.compatibility import fp16_overflow_row, training_dtype
from tests import fakes
from tests.conftest import values
from tests.helpers import fails, private_model


@pytest.fixture
def with_config(tiny_example, make_state):
    """``with_config(machine, **config_changes)``: the tiny recipe in float16, its model's config.json changed."""
    model = private_model(tiny_example)

    def make(machine, **changes):
        config = json.loads((model / "config.json").read_text()) | changes
        (model / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
        return make_state(machine=machine, dtype='"float16"')
    return make


def test_fp16_on_a_bf16_trained_gemma2_fails_with_bfloat16_where_the_gpu_has_it(with_config, run_check):
    state = with_config(fakes.nvidia(name="NVIDIA A100-SXM4-80GB", cc=(8, 0)), model_type="gemma2", dtype="bfloat16")
    message = fails(run_check, state, "stack.precision", 'dtype = "float16" on model_type gemma2',
                    "config.json says it was trained in bfloat16", "Gemma 2/3", "transformers #36822",
                    'use dtype = "bfloat16" (native on this device)')
    assert "float32" not in message.split("; use ")[-1]


def test_fp16_on_a_bf16_trained_qwen2_on_a_t4_says_float32(with_config, run_check):
    state = with_config(fakes.nvidia(name="Tesla T4", cc=(7, 5)), model_type="qwen2", dtype="bfloat16")
    fails(run_check, state, "stack.precision", "model_type qwen2", "QwenLM/Qwen3 #868",
          'use dtype = "float32" (bfloat16 is not native here: Tesla T4', "needs compute capability 8.0")


def test_the_older_torch_dtype_key_and_a_nested_text_config_are_read(with_config, run_check):
    state = with_config(fakes.nvidia(), model_type="gemma3", dtype=None,
                        text_config={"model_type": "gemma3_text", "torch_dtype": "bfloat16"})
    fails(run_check, state, "stack.precision", "model_type gemma3/gemma3_text", "Gemma 2/3")


def test_a_mixture_of_experts_is_known_by_its_expert_count(with_config, run_check):
    state = with_config(fakes.nvidia(), dtype="bfloat16", num_local_experts=8)
    fails(run_check, state, "stack.precision", "model_type llama", "mixture of experts", "unsloth PR #5074")


def test_another_bf16_trained_family_in_fp16_is_measured_not_failed(with_config, run_check):
    got = values(run_check(with_config(fakes.nvidia(), dtype="bfloat16"), "stack.precision"))
    assert got["model_config_dtype"] == "bfloat16"
    assert "model_type llama was trained in bfloat16" in got["fp16_overflow_risk"]
    assert "fp16_overflow_family" not in got


def test_fp16_on_a_float32_trained_model_of_such_a_family_passes(with_config, run_check):
    got = values(run_check(with_config(fakes.nvidia(), model_type="qwen2", dtype="float32"), "stack.precision"))
    assert got["model_config_dtype"] == "float32" and "fp16_overflow_risk" not in got


def test_bfloat16_on_an_overflowing_family_passes(tiny_example, make_state, run_check):
    model = private_model(tiny_example)
    config = json.loads((model / "config.json").read_text()) | {"model_type": "gemma2", "dtype": "bfloat16"}
    (model / "config.json").write_text(json.dumps(config))
    run_check(make_state(machine=fakes.nvidia(), dtype='"bfloat16"'), "stack.precision")


def test_every_family_row_names_a_source_and_ships_as_package_data():
    facts = load("compute")
    assert {row["family"] for row in facts["fp16_overflow"]} >= {"Gemma 2/3", "Qwen2/Qwen3", "mixture of experts"}
    for row in facts["fp16_overflow"]:
        assert facts["sources"][row["source"]], row
    assert resources.files("pytest_ftready.machine.compat").joinpath("compute.toml").is_file()
    assert training_dtype({"torch_dtype": "torch.bfloat16"}) == "bfloat16"
    assert fp16_overflow_row({"model_type": "llama", "num_local_experts": 1}) is None
