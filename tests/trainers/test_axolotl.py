"""Axolotl's own preprocessing and run: an Axolotl config's rows are tokenized and labelled by
Axolotl's prompt strategy (data.masking judges those labels), and its step, overfit and resume go
through the Trainer Axolotl builds (real Axolotl, the real tiny model), beside the engine's; planted
differences are caught naming Axolotl. Runs where axolotl is installed (its own environment:
.ci/run builds one); skipped elsewhere, saying so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail, Skip

from ..conftest import (assert_own_overfit, assert_own_resume_exact, copy_example, resume_failure_without,
                        state_for, values)
from ..helpers import assert_green, bundled_examples, run_as_written

pytest.importorskip("axolotl", reason="Axolotl's own pipeline needs axolotl, installed in an environment of its own "
                                      "(.ci/run builds one)")

ROOT = Path(__file__).resolve().parents[2]


def axolotl_state(folder: Path, model_dir: Path, machine, checks_data: str = "", **edits: str):
    """The tiny example's Axolotl config in ``folder``, its keys edited (``key="value"``, added
    when absent); ``checks_data`` lines go into ftready.toml's [data] table."""
    copy_example(folder, model_dir)
    for name in ("axolotl.yml", "ftready.toml"):
        shutil.copy(ROOT / "examples" / "tiny" / name, folder / name)
    side = folder / "ftready.toml"
    side.write_text(side.read_text().replace("[data]\n", f"[data]\n{checks_data}", 1))
    config = folder / "axolotl.yml"
    text = config.read_text()
    for key, value in edits.items():
        if f" {key}: " in text or f"\n{key}: " in text:  # a top-level or a dataset entry's key
            text = text.replace(f"{key}: ", f"{key}: {value}  # was: ", 1)
        else:
            text += f"{key}: {value}\n"
    config.write_text(text)
    return state_for(config, folder / "arts", machine)


@pytest.fixture(scope="module")
def axolotl_run(tmp_path_factory, tiny_model_dir, real_machine):
    """One Axolotl config's state for the module: its facts (Axolotl's step, overfit, resume) computed once."""
    return axolotl_state(tmp_path_factory.mktemp("axolotl") / "tiny", tiny_model_dir, real_machine)


def test_an_axolotl_config_checks_the_labels_axolotl_makes(axolotl_run, run_check):
    got = values(run_check(axolotl_run, "data.masking"))
    assert (got["pipeline"], got["step_trainer"]) == ("axolotl", "axolotl AxolotlTrainer")
    assert got["trained_span_method"] == "Axolotl chat_template"
    assert 0 < got["trained_token_share"] < 0.5


def test_an_axolotl_config_runs_the_step_in_axolotls_trainer_beside_the_engines(axolotl_run, run_check):
    from pytest_ftready.trainers.hf import trainer_warnings

    with trainer_warnings():  # Axolotl's own imports warn (TRL's experimental modules)
        from axolotl.core.trainers.base import AxolotlTrainer

    assert AxolotlTrainer.__name__ == axolotl_run.trainer.step_trainer.split()[-1]  # the class Axolotl builds
    got = values(run_check(axolotl_run, "model.step_memory"))
    assert axolotl_run.step.trainer == got["step_trainer"] != axolotl_run.engine_step.trainer
    assert got["peak_tensor_bytes"] > 0 and got["engine_peak_bytes"] > 0 and got["peak_vs_engine"] > 0
    # Axolotl pads the longest rows (79 tokens) to a multiple of 64: sequence_len 128, as the engine's worst case
    assert got["step_tokens"] == got["engine_step_tokens"] == 4 * 128
    team = axolotl_run.recipe.source.parent
    assert not (team / "last_run_prepared").exists() and not (team / "runs").exists()  # nothing in the team's paths


def test_axolotls_patches_of_the_model_class_are_undone_after_its_run(axolotl_run, run_check):
    from transformers.models.llama.modeling_llama import LlamaAttention

    run_check(axolotl_run, "model.step_memory")
    # Axolotl's LoRA kernels replaced LlamaAttention.forward during the run (and marked it _original_forward)
    assert not hasattr(LlamaAttention, "_original_forward")
    assert LlamaAttention.forward.__module__ == "transformers.models.llama.modeling_llama"


def test_axolotls_overfit_reaches_the_threshold_and_reports_the_engines_beside_it(axolotl_run, run_check):
    assert_own_overfit(axolotl_run, run_check, "axolotl AxolotlTrainer")


def test_axolotls_own_resume_in_a_fresh_process_gives_the_same_losses(axolotl_run, run_check):
    assert_own_resume_exact(axolotl_run, run_check)  # from its own checkpoint


def test_a_resume_losing_the_scheduler_state_fails_naming_it(tmp_path, tiny_model_dir, real_machine, run_check):
    state = axolotl_state(tmp_path / "tiny", tiny_model_dir, real_machine)
    message = resume_failure_without(state, run_check, "scheduler.pt")
    assert message.startswith("axolotl AxolotlTrainer: step ")
    assert "the scheduler state (scheduler.pt)" in message and "learning rate" in message


def test_a_collator_padding_to_sequence_len_beyond_the_engines_shows_both_step_memories(tmp_path, tiny_model_dir,
                                                                                      real_machine, run_check):
    # The team checks at the 128 tokens its rows need; Axolotl pads every batch to sequence_len 512
    state = axolotl_state(tmp_path / "tiny", tiny_model_dir, real_machine, checks_data="max_length = 128\n",
                          pad_to_sequence_len="true", sequence_len="512")
    got = values(run_check(state, "model.step_memory"))
    assert got["step_tokens"] == 4 * 512 > got["engine_step_tokens"] == 4 * 128
    assert got["peak_tensor_bytes"] > got["engine_peak_bytes"] and got["peak_vs_engine"] > 1


def test_the_forecast_of_axolotls_own_step_is_within_the_bar_and_pads_as_its_collator(axolotl_run, run_check):
    from pytest_ftready.forecast.trace import forecast_config
    from pytest_ftready.forecast.trainers import Step, resolve

    got = values(run_check(axolotl_run, "model.forecast_error"))
    assert got["measured_step_trainer"] == "axolotl AxolotlTrainer" and abs(got["forecast_error"]) <= 0.10
    assert got["forecast_path"].startswith("axolotl AxolotlTrainer on cpu: the model's loss, rows padded to 128")
    # the worst case as the forecast pads it is the micro-batch Axolotl's own collator built (79-token rows -> 128)
    worst = resolve(axolotl_run.recipe, Step("axolotl", "cpu"), forecast_config(axolotl_run.recipe))
    assert worst.rows * worst.row_tokens == axolotl_run.step.tokens_per_step


def test_the_forecast_pads_to_sequence_len_where_axolotls_collator_does(tmp_path, tiny_model_dir, real_machine,
                                                                         run_check):
    from pytest_ftready.forecast.trace import forecast_config
    from pytest_ftready.forecast.trainers import Step, resolve

    state = axolotl_state(tmp_path / "tiny", tiny_model_dir, real_machine, checks_data="max_length = 100\n",
                          pad_to_sequence_len="true", sequence_len="160")
    worst = resolve(state.recipe, Step("axolotl", "cpu"), forecast_config(state.recipe))
    assert worst.row_tokens == 192 and worst.rows * worst.row_tokens == state.step.tokens_per_step  # 160 -> 192
    assert abs(values(run_check(state, "model.forecast_error"))["forecast_error"]) <= 0.10


def test_the_axolotl_example_is_green_with_every_check_that_runs_here(tmp_path, tiny_model_dir):
    examples = bundled_examples(tmp_path / "examples", tiny_model_dir)
    # the README's line for Axolotl's environment (its anyio plugin warns under filterwarnings = error)
    done, found = run_as_written(examples / "tiny", "pytest --ftready=axolotl.yml -p no:anyio",
                                 env={"AXOLOTL_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1", "WANDB_DISABLED": "true"})
    assert_green(done, found)
    assert all(found[check][0] == "passed" for check in ("model.step_memory", "model.forecast_error", "model.overfit",
                                                          "lifecycle.resume"))


def test_a_config_whose_masks_axolotl_builds_wrong_fails_masking_naming_axolotl(tmp_path, tiny_model_dir, real_machine,
                                                                               run_check):
    state = axolotl_state(tmp_path / "tiny", tiny_model_dir, real_machine, train_on_eos="none")
    with pytest.raises(Fail) as info:
        run_check(state, "data.masking")
    message = str(info.value)
    assert message.startswith("labels made by Axolotl chat_template:") and "stop_untrained" in message


def test_a_step_axolotl_cannot_run_on_a_cpu_skips_naming_what_it_needs(tmp_path, tiny_model_dir, real_machine,
                                                                       run_check):
    state = axolotl_state(tmp_path / "tiny", tiny_model_dir, real_machine, sdp_attention="false",
                          flash_attention="true")
    if state.device.is_accelerator:
        pytest.skip(f"{state.device.name} is an accelerator: flash attention may run there")
    with pytest.raises(Skip) as info:
        run_check(state, "model.step_memory")
    assert "Axolotl cannot run this config's step" in str(info.value) and "flash-attn on a CUDA GPU" in str(info.value)
