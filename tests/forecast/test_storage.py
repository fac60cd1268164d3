"""forecast.trace with the levers real recipes use: what runs on a CPU (the chunked loss, the
optimizer in the backward) traced and compared with the real step here; what cannot (paged and
8-bit optimizers, Liger's and CCE's kernels, QLoRA preparation on 4-bit weights) modelled by
forecast.storage, each model said in the notes with its source."""

from __future__ import annotations

import pytest

from pytest_ftready.forecast.levers import with_changes
from pytest_ftready.forecast.trace import error_share, forecast, measured_step_peak
from tests.forecasting import TOLERANCE

# a full fine-tune of one short row: the gradients and the optimizer state are most of the peak
SHORT_FULL = [("adapter", "method", "none"), ("training", "gradient_accumulation_steps", 1),
              ("training", "micro_batch_size", 1), ("data", "max_length", 16)]


@pytest.fixture(scope="module")
def shared_state(tiny_model_dir, tmp_path_factory, real_machine):
    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.session.state import RunState
    from tests.conftest import copy_example

    folder = copy_example(tmp_path_factory.mktemp("storage") / "tiny", tiny_model_dir)
    run = RunState(artifacts_root=folder / "arts", machine_factory=lambda: real_machine)
    return run.recipe_state(load_recipe(folder / "recipe.toml"))


def test_optimizer_in_the_backward_holds_no_gradients_at_the_peak_and_matches_the_real_step(shared_state):
    plain = with_changes(shared_state.recipe, SHORT_FULL)
    in_backward = with_changes(plain, [("training", "optimizer_in_backward", True)])
    before, after = forecast(plain), forecast(in_backward)
    assert before.gradient_bytes > 0 and after.gradient_bytes == 0
    assert after.peak_bytes < before.peak_bytes
    for recipe, predicted in ((plain, before), (in_backward, after)):
        measured = measured_step_peak(shared_state, recipe, "cpu", count_tensors=True)
        assert abs(error_share(predicted.peak_bytes, measured)) <= TOLERANCE, recipe.training


def test_chunked_loss_holds_one_piece_of_logits_and_matches_the_real_step(shared_state):
    full = with_changes(shared_state.recipe, [("adapter", "method", "none")])
    chunked = with_changes(full, [("training", "loss", "chunked")])
    before, after = forecast(full), forecast(chunked)
    assert after.activation_bytes < before.activation_bytes and after.peak_bytes < before.peak_bytes
    assert any("loss chunked: logits of 8 pieces" in note for note in after.notes)
    measured = measured_step_peak(shared_state, chunked, "cpu", count_tensors=True)
    assert abs(error_share(after.peak_bytes, measured)) <= TOLERANCE


@pytest.mark.parametrize("loss", ["full", "chunked"])
def test_the_loss_in_the_compute_dtype_holds_no_float32_logits_and_matches_the_real_step(shared_state, loss):
    # litgpt's bfloat16 cross-entropy (the published anchors): a full fine-tune, loaded in bfloat16 for the variant
    upcast = with_changes(shared_state.recipe, [("adapter", "method", "none"), ("model", "dtype", "bfloat16"),
                                                ("training", "loss", loss)])
    compute = with_changes(upcast, [("training", "loss_dtype", "compute")])
    before, after = forecast(upcast), forecast(compute)
    assert after.peak_bytes < before.peak_bytes
    measured = measured_step_peak(shared_state, compute, "cpu", count_tensors=True)
    assert abs(error_share(after.peak_bytes, measured)) <= TOLERANCE


def test_paged_optimizers_keep_their_state_apart_from_the_peak(shared_state):
    from pytest_ftready.forecast.storage import PAGED_SOURCE

    plain = with_changes(shared_state.recipe, SHORT_FULL)
    by_name = {name: forecast(with_changes(plain, [("training", "optimizer", name)]))
               for name in ("adamw", "paged_adamw", "adamw_8bit", "paged_adamw_8bit")}
    assert by_name["paged_adamw"].optimizer_state_bytes == by_name["paged_adamw_8bit"].optimizer_state_bytes == 0
    # bitsandbytes' 32-bit state is AdamW's (2 x fp32 per weight); 8-bit is 2 x uint8 + absmax per 256
    assert by_name["paged_adamw"].paged_state_bytes == by_name["adamw"].optimizer_state_bytes
    assert by_name["paged_adamw_8bit"].paged_state_bytes == by_name["adamw_8bit"].optimizer_state_bytes
    assert by_name["adamw_8bit"].optimizer_state_bytes < by_name["adamw"].optimizer_state_bytes
    assert by_name["paged_adamw"].peak_bytes < by_name["adamw"].peak_bytes
    assert any(PAGED_SOURCE in note for note in by_name["paged_adamw"].notes)


def test_gpu_loss_kernels_are_modelled_with_their_source(shared_state):
    from pytest_ftready.forecast.storage import CCE_SOURCE, LIGER_SOURCE, modelled_loss_chunks

    full = forecast(shared_state.recipe)
    liger = forecast(with_changes(shared_state.recipe, [("training", "loss", "fused_linear")]))
    cce = forecast(with_changes(shared_state.recipe, [("training", "loss", "cut_cross_entropy")]))
    assert any(LIGER_SOURCE in note for note in liger.notes) and any(CCE_SOURCE in note for note in cce.notes)
    assert cce.peak_bytes <= liger.peak_bytes < full.peak_bytes
    # Liger's rule on Llama-3.1-8B at 2 x 2048 tokens: chunks of next_pow2(4096 / ceil(128256 / 4096)) = 128
    assert modelled_loss_chunks("fused_linear", 4096, 128256, 4096, 2048)[0] == 32


def test_qlora_preparation_keeps_unquantized_layers_in_float32_unless_off(shared_state):
    qlora = with_changes(shared_state.recipe, [("model", "quantization", "4bit"), ("model", "dtype", "bfloat16")])
    prepared, plain = forecast(qlora), forecast(with_changes(qlora, [("model", "kbit_preparation", "off")]))
    unquantized = prepared.parameters - prepared.quantized_parameters
    assert prepared.weights_bytes - plain.weights_bytes == 2 * unquantized  # bfloat16 -> float32
    assert prepared.activation_bytes > plain.activation_bytes  # float32 norms: float32 activations after them
    assert any("kbit_preparation" in note for note in prepared.notes)
    assert not any("kbit_preparation" in note for note in plain.notes)


def test_forecast_error_skips_where_the_loss_kernel_cannot_run(make_state, run_check):
    from pytest_ftready.outcomes import Skip

    state = make_state(optimizer='"adamw"\nloss = "fused_linear"')
    with pytest.raises(Skip, match=r'loss = "fused_linear" needs its Triton kernel on an NVIDIA GPU; this machine '
                                   r'trains on cpu'):
        run_check(state, "model.forecast_error")
