"""Model and lifecycle checks, in-process on the real tiny model, with the sabotages users
really commit: learning rate 0, labels all -100, resume bugs, an unmerged save, a device
that is too small."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_ftready.outcomes import Fail
from pytest_ftready.data.encoding import IGNORE_INDEX

MiB = 1024 ** 2


def test_step_memory_records_peaks_and_hands_the_step_on(make_state, run_check):
    state = make_state()
    ctx = run_check(state, "model.step_memory")
    names = {m.name: m for m in ctx.measured}
    assert names["peak_tensor_bytes"].value > names["weights"].value > 0
    assert names["peak_host_step"].unit == "bytes" and names["optimizer_state"].value > 0
    assert names["activations_and_workspace"].estimate
    step = state.step
    assert step.tokens_per_step == 4 * 128 and step.tokens_per_s > 0
    assert step.peak_bytes == names["peak_tensor_bytes"].value  # the check reports the fact it asked for


def test_step_that_exceeds_the_device_fails_with_lever_advice(make_state, real_machine, run_check):
    small = dataclasses.replace(real_machine, host=dataclasses.replace(real_machine.host, memory_total_bytes=4 * MiB))
    state = make_state(machine=small)
    with pytest.raises(Fail) as info:
        run_check(state, "model.step_memory")
    message = str(info.value)
    assert "the worst-case step needs" in message and "less the 10% memory_headroom" in message
    assert "activation checkpointing: [training] gradient_checkpointing = true" in message
    assert "micro_batch_size = 2, gradient_accumulation_steps = 4" in message
    # the one lever model: traced by the forecast (the tiny config is here), offload estimated
    assert "8-bit optimizer" in message and "(traced)" in message and "(estimate)" in message


def test_overfit_passes_and_generate_reloads_the_same_model(make_state, run_check):
    state = make_state()
    run_check(state, "model.overfit")
    losses = state.series["model.overfit"]["loss"]
    assert losses[-1] <= 0.1 < losses[0]
    run_check(state, "lifecycle.generate")
    assert state.overfit.greedy_ids[-1] in state.encoder.stop_ids


@pytest.mark.faults_slow  # a whole overfit that cannot learn: CI's second line (pytest tests -m "slow or faults_slow")
def test_learning_rate_zero_fails_overfit(make_state, run_check):
    state = make_state(learning_rate="0.0")
    with pytest.raises(Fail, match="no trainable parameter changed in 200 steps .learning_rate = 0.0."):
        run_check(state, "model.overfit")


def test_labels_all_ignored_fail_overfit_with_a_non_finite_loss(make_state, run_check):
    state = make_state()
    state.trainable_examples = [dataclasses.replace(e, labels=(IGNORE_INDEX,) * e.length)
                                for e in state.trainable_examples]
    with pytest.raises(Fail, match=r"loss is nan at step 1 of the overfit: a batch with no supervised token \(labels all -100\)"):
        run_check(state, "model.overfit")


def test_merged_model_saved_without_the_adapter_fails_generate(make_state, monkeypatch, run_check):
    from pytest_ftready.engine import generate

    state = make_state()
    run_check(state, "model.overfit")
    monkeypatch.setattr(generate, "merge_and_save", lambda peft_model, folder: peft_model.unload().save_pretrained(folder))
    with pytest.raises(Fail, match=r"^pytest-ftready engine: the reloaded merged generates .* but the in-memory trained "
                       r"model generated .*: the saved artifact is not the trained model "
                       r"\(was the adapter merged before saving\?\)$"):
        run_check(state, "lifecycle.generate")


def test_a_trainers_own_reload_is_judged_after_the_engines_naming_its_cause(make_state, monkeypatch, run_check):
    """Trainer.reloaded_outputs is the one way a trainer's saves reach lifecycle.generate (Unsloth adds
    its own reload and merge to the engine's): each is held against the trained model, its cause said."""
    from pytest_ftready.trainers.base import Reloaded

    state = make_state()
    run_check(state, "model.overfit")
    engines, judged = state.trainer.reloaded_outputs, []

    def own(inputs, result):
        judged.extend(engines(inputs, result))
        return [*judged, Reloaded("merged model (its own save)", (5,), "it saved float16 weights")]

    monkeypatch.setattr(state.trainer, "reloaded_outputs", own)
    with pytest.raises(Fail) as info:
        run_check(state, "lifecycle.generate")
    assert [output.name for output in judged] == ["reloaded adapter", "reloaded merged"]  # the engine's, passed
    assert str(info.value).startswith("pytest-ftready engine: the merged model (its own save) generates ")
    assert str(info.value).endswith("the saved artifact is not the trained model (it saved float16 weights)")


@pytest.fixture
def resumable(make_state, tmp_path):
    """A recipe with dropout (so the RNG matters), its straight losses and a half-way checkpoint."""
    from pytest_ftready.engine.checkpoint import straight_and_half

    state = make_state(dropout="0.1")
    folder = tmp_path / "ckpt"
    saved = straight_and_half(state.recipe, state.trainable_examples, state.tokenizer.pad_token_id, "cpu",
                              state.shared_base, folder, 4)
    assert saved.checkpoint_bytes > 0 and saved.folder == folder
    return state, folder, saved.straight_losses


def resume(state, folder, **sabotage):
    from pytest_ftready.engine.checkpoint import resume_and_train

    return resume_and_train(state.recipe, state.model, folder, 2, "cpu", state.tokenizer.pad_token_id, 4, **sabotage)


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_resume_is_exact_in_process_and_in_a_fresh_process(resumable):
    from dataclasses import asdict

    from pytest_ftready.engine.checkpoint import compare_losses
    from pytest_ftready.trainers import worker
    from pytest_ftready.trainers.base import ResumeRequest

    state, folder, straight = resumable
    assert resume(state, folder) == straight[2:]
    request = ResumeRequest(str(state.recipe.source), str(folder), str(folder), 4, asdict(state.device))
    resumed = [loss for _, loss, _, _ in worker.run("builtin", request)["logs"]]
    assert compare_losses(straight[2:], resumed, exact=True) == ""


@pytest.mark.parametrize("sabotage", [{"restore_rng": False}, {"scheduler_first": False}], ids=["rng", "scheduler-order"])
def test_resume_bugs_change_the_loss_and_are_named(resumable, sabotage):
    from pytest_ftready.engine.checkpoint import compare_losses

    state, folder, straight = resumable
    difference = compare_losses(straight[2:], resume(state, folder, **sabotage), exact=True)
    assert "after the resume" in difference and "scheduler is built before the optimizer state" in difference


def test_checkpoint_missing_a_piece_of_state_is_named(resumable):
    import torch

    from pytest_ftready.engine.checkpoint import STATE_FILE, MissingState, load_state

    _, folder, _ = resumable
    saved = torch.load(folder / STATE_FILE, weights_only=True)
    del saved["rng"]["numpy"]
    torch.save(saved, folder / STATE_FILE)
    with pytest.raises(MissingState, match="rng.numpy"):
        load_state(folder)


def test_packing_that_leaks_across_examples_fails(make_state, monkeypatch, run_check):
    from tests.planted import leaky_attention

    state = make_state(packing="true")
    state.model.set_attn_implementation(leaky_attention())
    with pytest.raises(Fail, match="lets packed examples attend across their boundaries"):
        run_check(state, "data.packing")
    state.model.set_attn_implementation("eager")
    ctx = run_check(state, "data.packing")
    assert {m.name: m.value for m in ctx.measured}["packing_max_loss_difference"] < 1e-4


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_a_failure_stops_the_whole_chain_below_it(pytester, tiny_example, edit_recipe):
    from tests.helpers import outcomes

    recipe = edit_recipe(tiny_example / "recipe.toml", target_modules='["query"]')
    result = pytester.runpytest_subprocess(f"--ftready={recipe}", "-k", "model or lifecycle or headroom",
                                           "--junitxml=out.xml")
    found = outcomes(pytester.path / "out.xml")
    assert found["model.step_memory"][0] == "failed"
    assert "target_modules ['query'] match no module of this model" in found["model.step_memory"][1]
    for dependent in ("model.overfit", "lifecycle.resume", "lifecycle.generate", "headroom.time"):
        assert found[dependent] == ("skipped", found[dependent][1]) and "model.step_memory failed" in found[dependent][1], dependent
    assert "During handling of the above exception" not in result.stdout.str()  # shown once, not chained
