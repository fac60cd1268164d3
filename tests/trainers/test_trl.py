"""TRL's own run: a TRL config's step, overfit and resume go through TRL's SFTTrainer (real TRL,
the real tiny model), beside the engine's; planted differences are caught naming TRL."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail
from pytest_ftready.tiny import CHATML
from pytest_ftready.trainers.trl import MIN_TRL

from ..conftest import (assert_own_overfit, assert_own_resume_exact, copy_example, resume_failure_without,
                        state_for, values)

pytest.importorskip("trl", minversion=MIN_TRL, reason=f"TRL's own run needs trl >= {MIN_TRL} "
                                                      "(pip install 'pytest-ftready[trl]')")

ROOT = Path(__file__).resolve().parents[2]
# The end-of-turn token outside the generation span: TRL accepts it, and never trains the stop.
STOP_OUTSIDE = CHATML.replace("{{ message['content'] + '<|im_end|>' }}{% endgeneration %}",
                              "{{ message['content'] }}{% endgeneration %}{{ '<|im_end|>' }}")


def trl_folder(folder: Path, model_dir: Path, extra: str = "") -> Path:
    """The tiny example's TRL config (+ ftready.toml) in ``folder``, with ``extra`` YAML lines."""
    copy_example(folder, model_dir)
    for name in ("trl-sft.yaml", "ftready.toml"):
        shutil.copy(ROOT / "examples" / "tiny" / name, folder / name)
    config = folder / "trl-sft.yaml"
    config.write_text(config.read_text() + extra)
    return config


@pytest.fixture(scope="module")
def trl_state(tmp_path_factory, tiny_model_dir, real_machine):
    """One TRL config's state for the module: its facts (TRL's step, overfit, resume) computed once."""
    folder = tmp_path_factory.mktemp("trl")
    return state_for(trl_folder(folder / "tiny", tiny_model_dir), folder / "arts", real_machine)


def test_a_trl_config_runs_the_step_in_trls_trainer_beside_the_engines(trl_state, run_check):
    ctx = run_check(trl_state, "model.step_memory")
    got = values(ctx)
    assert got["pipeline"] == "trl" and got["step_trainer"] == "trl SFTTrainer"
    assert trl_state.step.trainer == got["step_trainer"] != trl_state.engine_step.trainer
    assert got["peak_tensor_bytes"] > 0 and got["engine_peak_bytes"] > 0
    # the same worst-case micro-batch: TRL's collator pads the longest rows to max_length, as the engine does
    assert got["step_tokens"] == got["engine_step_tokens"] == 4 * 128


def test_the_forecast_of_trls_own_step_is_within_the_bar_and_names_its_path(trl_state, run_check):
    from pytest_ftready.forecast.trace import error_share, forecast
    from pytest_ftready.forecast.trainers import Step, trl_loss_kind

    got = values(run_check(trl_state, "model.forecast_error"))  # passes: TRL's own step is what it forecasts
    assert got["measured_step_trainer"] == "trl SFTTrainer" and got["measured_peak"] == trl_state.step.peak_bytes
    assert abs(got["forecast_error"]) <= 0.10
    assert got["forecast_error"] == pytest.approx((got["forecast_peak"] - got["measured_peak"]) / got["measured_peak"])
    assert got["forecast_path"].startswith("trl SFTTrainer on cpu: TRL's ")
    assert got["forecast_path"].endswith(", bfloat16 autocast")  # TRL's default over the config's float32 weights
    if trl_loss_kind() == "fused":  # the engine's step, which the forecast modelled before, is far from TRL's
        assert "TRL's fused LM head, torch fallback (traced)" in got["forecast_path"]
        engine = forecast(trl_state.recipe, step=Step("builtin", "cpu"))
        assert abs(error_share(engine.peak_bytes, got["measured_peak"])) > 0.5  # TRL's LM-head tile alone is 33 MB


def test_trls_overfit_reaches_the_threshold_and_reports_the_engines_beside_it(trl_state, run_check):
    assert_own_overfit(trl_state, run_check, "trl SFTTrainer")


@pytest.mark.slow  # TRL trains, then resumes in a fresh process: CI's second line (pytest tests -m "slow or faults_slow")
def test_trls_own_resume_in_a_fresh_process_gives_the_same_losses(trl_state, run_check):
    assert_own_resume_exact(trl_state, run_check)  # from its own checkpoint


@pytest.mark.slow  # a second TRL train and resume: CI's second line (pytest tests -m "slow or faults_slow")
def test_a_resume_losing_the_scheduler_state_fails_naming_it(tmp_path, tiny_model_dir, real_machine, run_check):
    state = state_for(trl_folder(tmp_path / "tiny", tiny_model_dir), tmp_path / "arts", real_machine)
    message = resume_failure_without(state, run_check, "scheduler.pt")
    assert message.startswith("trl SFTTrainer: step ")
    assert "the scheduler state (scheduler.pt)" in message and "learning rate" in message


@pytest.mark.slow  # a second TRL config's step: CI's second line (pytest tests -m "slow or faults_slow")
def test_a_collator_padding_longer_than_the_engines_shows_both_step_memories(tmp_path, tiny_model_dir, real_machine,
                                                                               run_check):
    config = trl_folder(tmp_path / "tiny", tiny_model_dir, "pad_to_multiple_of: 512\n")
    got = values(run_check(state_for(config, tmp_path / "arts", real_machine), "model.step_memory"))
    assert got["step_tokens"] == 4 * 512 > got["engine_step_tokens"]
    assert got["peak_tensor_bytes"] > got["engine_peak_bytes"] and got["peak_vs_engine"] > 1


def test_a_template_whose_masks_trl_builds_wrong_fails_masking_naming_trl(tmp_path, tiny_model_dir, real_machine,
                                                                         run_check):
    config = trl_folder(tmp_path / "tiny", tiny_model_dir, "chat_template_path: stop-outside.jinja\n")
    (config.parent / "stop-outside.jinja").write_text(STOP_OUTSIDE)
    state = state_for(config, tmp_path / "arts", real_machine)
    with pytest.raises(Fail) as info:
        run_check(state, "data.masking")
    assert "TRL SFTTrainer" in str(info.value) and "stop_untrained" in str(info.value)
