"""forecast.trace: the step's peak memory forecast from the config alone, against the real step
measured on this CPU (the engine's own step, live tensor bytes), for the tiny recipe and its
lever variants, the chunked loss and the optimizer in the backward; an 8B-shaped QLoRA config
with no weights; the modelled optimizers and loss kernels; a target it does not fit."""

from __future__ import annotations

import math
import time

import pytest

from pytest_ftready.forecast.levers import with_changes
from pytest_ftready.forecast.storage import quantized_storage_bytes
from pytest_ftready.forecast.trace import (ConfigUnavailable, error_share, forecast, forecast_config,
                                           measured_step_peak)
from pytest_ftready.units import human_bytes
from tests.forecasting import TOLERANCE, error_table


def test_tiny_forecast_is_within_ten_percent_of_the_measured_cpu_step(make_state):
    rows = error_table(make_state())
    assert len(rows) == 5
    for name, predicted, measured, error in rows:
        assert abs(error) <= TOLERANCE, (name, predicted, measured, error)
    by_name = {name: predicted for name, predicted, _, _ in rows}
    # the levers move the forecast the way they move the real step
    assert by_name["checkpointing=on"] < by_name["recipe"]
    assert by_name["micro_batch=1"] < by_name["micro_batch=4"]
    assert by_name["max_length=64"] < by_name["recipe"]


def test_breakdown_of_a_full_fine_tune_holds_gradients_and_adam_state(make_state):
    state = make_state()
    recipe = with_changes(state.recipe, [("adapter", "method", "none")])
    f = forecast(recipe)
    params = f.parameters
    assert f.trainable_parameters == params and f.frozen_parameters == 0
    assert f.gradient_bytes == 4 * params  # float32, every parameter, live through the backward's peak
    assert f.optimizer_state_bytes >= 2 * 4 * params  # AdamW: exp_avg + exp_avg_sq (+ step counters)
    assert f.activation_bytes > 0 and f.peak_phase == "backward of a later micro-batch"  # accumulation 2
    measured = measured_step_peak(state, recipe, "cpu", count_tensors=True)
    assert abs(error_share(f.peak_bytes, measured)) <= TOLERANCE


def test_forecast_error_check_records_the_error_against_the_real_step(make_state, run_check):
    ctx = run_check(make_state(), "model.forecast_error")
    names = {m.name: m for m in ctx.measured}
    assert names["forecast_peak"].estimate and not names["measured_peak"].estimate
    assert abs(names["forecast_error"].value) <= TOLERANCE
    assert names["measured_peak_method"].value == "weights + live tensor bytes"


ARCHITECTURES = {  # small random models of other families: (config extras, LoRA targets, dtype)
    "qwen2": ({}, ["q_proj", "v_proj"], "float32"),
    "mistral": ({}, ["q_proj", "v_proj"], "float32"),
    "gemma": ({}, ["q_proj", "v_proj"], "float32"),
    "qwen3": ({}, ["q_proj", "v_proj"], "float32"),
    "phi3": ({"pad_token_id": 0}, ["qkv_proj"], "float32"),
    "gpt_neox": ({}, ["query_key_value"], "float32"),
    # MoE experts run through grouped_mm, whose fake kernel takes bfloat16 only (float32: TraceError)
    "qwen2_moe": ({"moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "num_experts": 4,
                   "num_experts_per_tok": 2}, ["q_proj", "v_proj"], "bfloat16"),
}


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_other_architectures_forecast_within_ten_percent(model_type, tmp_path, real_machine):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.session.state import RunState

    extras, targets, dtype = ARCHITECTURES[model_type]
    config = AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1000, **extras)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")
    (tmp_path / "t.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "r.toml").write_text(f'''[model]
path = "model"
dtype = "{dtype}"
[data]
train = ["t.jsonl"]
format = "text"
train_on = "all"
max_length = 64
[adapter]
r = 4
target_modules = {targets!r}
[training]
micro_batch_size = 2
'''.replace("'", '"'))
    recipe = load_recipe(tmp_path / "r.toml")
    state = RunState(artifacts_root=tmp_path / "arts", machine_factory=lambda: real_machine).recipe_state(recipe)
    predicted = forecast(recipe).peak_bytes
    measured = measured_step_peak(state, recipe, "cpu", count_tensors=True)
    print(f"\n{model_type}: forecast {human_bytes(predicted)}, measured {human_bytes(measured)}, "
          f"error {error_share(predicted, measured):+.1%}")
    assert abs(error_share(predicted, measured)) <= TOLERANCE


def test_a_kernel_the_architecture_lacks_is_a_trace_error_naming_it(tmp_path):
    from transformers import AutoConfig

    from pytest_ftready.forecast.trace import TraceError
    from pytest_ftready.recipe import load_recipe

    AutoConfig.for_model("gemma2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=1000).save_pretrained(tmp_path / "model")
    (tmp_path / "t.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "r.toml").write_text('[model]\npath = "model"\nattn_implementation = "sdpa"\n[data]\n'
                                     'train = ["t.jsonl"]\nformat = "text"\ntrain_on = "all"\n')
    with pytest.raises(TraceError, match="gemma2 cannot be built with dtype bfloat16 and attn_implementation sdpa"):
        forecast(load_recipe(tmp_path / "r.toml"))


LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0,
                tie_word_embeddings=False, rms_norm_eps=1e-5)
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture
def llama_8b_recipe(tmp_path):
    """A Llama-3.1-8B-shaped config.json (no weights) and a QLoRA recipe at 2048 tokens."""
    from transformers import LlamaConfig

    from pytest_ftready.recipe import load_recipe

    LlamaConfig(**LLAMA_8B).save_pretrained(tmp_path / "model")
    assert not list((tmp_path / "model").glob("*.safetensors"))
    (tmp_path / "train.jsonl").write_text('{"text": "hello"}\n')
    (tmp_path / "recipe.toml").write_text(f'''name = "llama8b-qlora"
[model]
path = "model"
dtype = "bfloat16"
quantization = "4bit"
[data]
train = ["train.jsonl"]
format = "text"
train_on = "all"
max_length = 2048
[adapter]
r = 16
alpha = 32
target_modules = {ALL_LINEAR!r}
[training]
micro_batch_size = 1
gradient_accumulation_steps = 1
gradient_checkpointing = true
[hardware]
target = "RTX 4090"
'''.replace("'", '"'))
    return load_recipe(tmp_path / "recipe.toml")


@pytest.mark.benchmark(group="forecast: Llama-3.1-8B-shaped config, QLoRA, 2048 tokens, no weights")
@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_8b_qlora_forecast_weights_equal_parameters_times_storage_bytes(llama_8b_recipe, benchmark):
    import torch
    from transformers import AutoModelForCausalLM

    started = time.perf_counter()
    # one round: its time lands in the benchmark JSON (the issue wants < 30 s; no assertion on it)
    f = benchmark.pedantic(forecast, args=(llama_8b_recipe,), rounds=1, iterations=1)
    print(f"\n8B QLoRA 2048 tokens: forecast in {time.perf_counter() - started:.1f} s (build {f.build_seconds:.1f} s, "
          f"trace {f.trace_seconds:.1f} s); peak {human_bytes(f.peak_bytes)} {f.categories()}")
    # the expected figure, from the config's own shapes: 4-bit linears (not the output head) at
    # nf4 + double-quant storage; the rest float32 (QLoRA preparation upcasts it); LoRA in float32
    config = forecast_config(llama_8b_recipe)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    quantized = stored = lora = 0
    for name, module in plain.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            n = module.in_features * module.out_features
            quantized += n
            blocks = math.ceil(n / 64)
            stored += math.ceil(n / 2) + blocks + 4 * math.ceil(blocks / 256) + 16 * 4 + 4
            if name.rsplit(".", 1)[-1] in ALL_LINEAR:
                lora += 16 * (module.in_features + module.out_features)
    total = sum(p.numel() for p in plain.parameters())
    extras = sum(b.numel() * b.element_size() for b in plain.buffers())
    extras += sum(v.numel() * v.element_size() for m in plain.modules() for v in vars(m).values()
                  if isinstance(v, torch.Tensor))
    assert total == 8_030_261_248 and f.parameters == total  # Llama-3.1-8B's parameter count
    assert f.quantized_parameters == quantized
    assert f.trainable_parameters == lora
    assert f.weights_bytes == stored + 4 * (total - quantized) + 4 * lora + extras
    assert quantized_storage_bytes(4096 * 4096, 4096, "4bit") == 4096 * 4096 // 2 + 4096 * 4096 // 64 + 4 * 1024 + 68
    assert any("storage format" in note for note in f.notes)
    assert f.peak_bytes > f.weights_bytes + f.activation_bytes > f.weights_bytes


def test_target_that_fits_passes_and_records_the_breakdown(make_state, run_check):
    ctx = run_check(make_state(memory_headroom='0.10\ntarget = "RTX 4090"'), "model.memory_forecast")
    names = {m.name: m for m in ctx.measured}
    for category in ("weights", "gradients", "optimizer_state", "activations", "temporaries"):
        assert names[f"forecast_{category}"].estimate and names[f"forecast_{category}"].unit == "bytes"
    assert names["forecast_need"].value <= names["forecast_usable"].value
    assert names["forecast_target"].value == "RTX 4090"


def test_unknown_target_fails_naming_the_key(make_state, run_check):
    from pytest_ftready.outcomes import Fail

    with pytest.raises(Fail, match=r"\[hardware\] target: 'GTX 9000' is neither a size"):
        run_check(make_state(memory_headroom='0.10\ntarget = "GTX 9000"'), "model.memory_forecast")


def test_hub_model_offline_skips_naming_what_it_needs(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from pytest_ftready.recipe import load_recipe

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    (tmp_path / "t.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "r.toml").write_text('[model]\nid = "meta-llama/Llama-3.1-8B"\nrevision = "' + "a" * 40 + '"\n'
                                     '[data]\ntrain = ["t.jsonl"]\nformat = "text"\ntrain_on = "all"\n')
    with pytest.raises(ConfigUnavailable, match=r"config.json of meta-llama/Llama-3.1-8B@a{40} is not cached"):
        forecast_config(load_recipe(tmp_path / "r.toml"))


def test_hub_model_reads_only_config_json_from_the_cache_at_the_pinned_revision(tmp_path, monkeypatch,
                                                                                  tiny_model_dir):
    import shutil

    import huggingface_hub.constants

    from pytest_ftready.recipe import load_recipe

    revision = "b" * 40
    snapshot = tmp_path / "hub" / "models--team--tiny" / "snapshots" / revision
    snapshot.mkdir(parents=True)
    shutil.copy(tiny_model_dir / "config.json", snapshot / "config.json")  # no weights in the cache
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    (tmp_path / "t.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "r.toml").write_text(f'[model]\nid = "team/tiny"\nrevision = "{revision}"\ndtype = "float32"\n'
                                     '[data]\ntrain = ["t.jsonl"]\nformat = "text"\ntrain_on = "all"\n'
                                     'max_length = 32\n')
    recipe = load_recipe(tmp_path / "r.toml")
    assert forecast_config(recipe).hidden_size == 64
    f = forecast(recipe)
    assert f.parameters == 146_240 and f.activation_bytes > 0


def test_max_length_beyond_the_models_positions_is_said(make_state):
    f = forecast(with_changes(make_state().recipe, [("data", "max_length", 1024)]))
    assert any("max_length 1024 exceeds the model's max_position_embeddings 512" in note for note in f.notes)
