"""LLaMA-Factory's own run: a LLaMA-Factory config's rows are tokenized and labelled by
LLaMA-Factory's template and supervised processor, and its step, overfit and resume go through
the CustomSeq2SeqTrainer its run_sft builds (real LLaMA-Factory, the real tiny model), beside the
engine's; planted differences are caught naming LLaMA-Factory. Runs where llamafactory imports
(its own environment: .ci/run builds one); skipped elsewhere, saying so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail, Skip

from ..conftest import (assert_own_overfit, assert_own_resume_exact, copy_example, resume_failure_without,
                        state_for, values)
from ..helpers import assert_green, bundled_examples, run_as_written

pytest.importorskip("llamafactory", reason="LLaMA-Factory's own run needs llamafactory, installed in an environment "
                                           "of its own (.ci/run builds one)")

ROOT = Path(__file__).resolve().parents[2]


def lf_folder(folder: Path, model_dir: Path, **edits) -> Path:
    """The tiny example's LLaMA-Factory config (+ ftready.toml, dataset_info.json) in ``folder``,
    with ``edits`` replacing (or adding) its keys."""
    copy_example(folder, model_dir)
    for name in ("llamafactory.yaml", "ftready.toml", "data/dataset_info.json"):
        shutil.copy(ROOT / "examples" / "tiny" / name, folder / name)
    config = folder / "llamafactory.yaml"
    lines = [line for line in config.read_text().splitlines() if line.split(":")[0] not in edits]
    config.write_text("\n".join(lines + [f"{key}: {value}" for key, value in edits.items()]) + "\n")
    return config


@pytest.fixture(scope="module")
def lf_state(tmp_path_factory, tiny_model_dir, real_machine):
    """One LLaMA-Factory config's state for the module: its pipeline, step, overfit and resume run once."""
    config = lf_folder(tmp_path_factory.mktemp("llamafactory") / "tiny", tiny_model_dir)
    return state_for(config, config.parent.parent / "arts", real_machine)


def test_a_llamafactory_config_checks_the_labels_llamafactory_makes(lf_state, run_check):
    got = values(run_check(lf_state, "data.masking"))
    assert (got["pipeline"], got["step_trainer"]) == ("llamafactory", "llamafactory CustomSeq2SeqTrainer")
    assert got["trained_span_method"] == "LLaMA-Factory template chatml"
    assert 0 < got["trained_token_share"] < 0.5
    team = lf_state.recipe.origin.source
    assert not (Path(team).parent / "runs").exists()  # nothing written to the team's output_dir


def test_a_llamafactory_config_runs_the_step_in_its_trainer_beside_the_engines(lf_state, run_check):
    got = values(run_check(lf_state, "model.step_memory"))
    assert (got["pipeline"], got["step_trainer"]) == ("llamafactory", "llamafactory CustomSeq2SeqTrainer")
    assert lf_state.step.trainer == got["step_trainer"] != lf_state.engine_step.trainer
    assert got["peak_tensor_bytes"] > 0 and got["engine_peak_bytes"] > 0
    # LLaMA-Factory pads a batch to its longest row (a multiple of 8); the engine's worst case to cutoff_len
    assert got["step_tokens"] % 8 == 0 and got["step_tokens"] <= got["engine_step_tokens"] == 4 * 128


def test_llamafactorys_overfit_reaches_the_threshold_beside_the_engines(lf_state, run_check):
    assert_own_overfit(lf_state, run_check, "llamafactory CustomSeq2SeqTrainer")


def test_llamafactorys_own_resume_in_a_fresh_process_gives_the_same_losses(lf_state, run_check):
    assert_own_resume_exact(lf_state, run_check)  # from its own checkpoint
    assert lf_state.saved_run.folder.is_relative_to(lf_state.scratch)
    assert all(log.tokens for log in lf_state.saved_run.logs)  # tokens per step logged: a data order can be named


def test_a_resume_losing_the_scheduler_state_fails_naming_it(tmp_path, tiny_model_dir, real_machine, run_check):
    state = state_for(lf_folder(tmp_path / "tiny", tiny_model_dir), tmp_path / "arts", real_machine)
    message = resume_failure_without(state, run_check, "scheduler.pt")
    assert message.startswith("llamafactory CustomSeq2SeqTrainer: step ")
    assert "the scheduler state (scheduler.pt)" in message and "learning rate" in message


def test_a_collator_padding_longer_than_the_engines_shows_both_step_memories(tmp_path, tiny_model_dir, real_machine,
                                                                               run_check):
    # The recipe says 64 tokens, the config's cutoff_len 128 rules LLaMA-Factory's run: its collator pads the
    # longest rows (78 tokens) to 80, the engine's worst case to 64.
    config = lf_folder(tmp_path / "tiny", tiny_model_dir)
    side = config.parent / "ftready.toml"
    side.write_text(side.read_text().replace("[data]\n", "[data]\nmax_length = 64\n"))
    got = values(run_check(state_for(config, tmp_path / "arts", real_machine), "model.step_memory"))
    assert got["engine_step_tokens"] == 4 * 64 < got["step_tokens"] == 4 * 80
    assert got["peak_tensor_bytes"] > got["engine_peak_bytes"] and got["peak_vs_engine"] > 1


def test_the_forecast_of_llamafactorys_own_step_is_within_the_bar_and_pads_as_its_collator(lf_state, run_check):
    import math

    from pytest_ftready.trainers.base import worst_case_examples

    got = values(run_check(lf_state, "model.forecast_error"))
    assert got["measured_step_trainer"] == "llamafactory CustomSeq2SeqTrainer" and abs(got["forecast_error"]) <= 0.10
    assert got["forecast_path"] == ("llamafactory CustomSeq2SeqTrainer on cpu: the model's loss, rows padded to "
                                    f"{lf_state.step.tokens_per_step // 4}")
    # the forecast's padding rule, the longest row up to a multiple of 8, is what LLaMA-Factory's collator did
    longest = max(min(e.length, lf_state.recipe.data.max_length) for e in worst_case_examples(lf_state.run_inputs()))
    assert 4 * 8 * math.ceil(longest / 8) == lf_state.step.tokens_per_step


def test_the_llamafactory_example_is_green_with_every_check_that_runs_here(tmp_path, tiny_model_dir):
    examples = bundled_examples(tmp_path / "examples", tiny_model_dir)
    done, found = run_as_written(examples / "tiny", "pytest --ftready=llamafactory.yaml")
    assert_green(done, found)
    assert all(found[check][0] == "passed" for check in ("model.step_memory", "model.forecast_error", "model.overfit",
                                                          "lifecycle.resume"))


def test_a_template_not_matching_the_models_chat_format_fails_masking_naming_llamafactory(tmp_path, tiny_model_dir,
                                                                                         real_machine, run_check):
    # template: llama3 on a ChatML model: the trained turns end in the text <|eot_id|>, never the model's <|im_end|>
    config = lf_folder(tmp_path / "tiny", tiny_model_dir, template="llama3")
    with pytest.raises(Fail) as info:
        run_check(state_for(config, tmp_path / "arts", real_machine), "data.masking")
    message = str(info.value)
    assert message.startswith("labels made by LLaMA-Factory template llama3:") and "stop_untrained" in message
    assert "<|eot_id|>" in message


def test_a_deepspeed_config_skips_llamafactorys_own_step_saying_it_needs_the_launcher(tmp_path, tiny_model_dir,
                                                                                     real_machine, run_check):
    config = lf_folder(tmp_path / "tiny", tiny_model_dir, deepspeed="ds_z2.json")
    (config.parent / "ds_z2.json").write_text('{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}')
    state = state_for(config, tmp_path / "arts", real_machine)
    with pytest.raises(Skip, match=r"shards the run \(deepspeed\).*llamafactory-cli train on the GPU machine"):
        run_check(state, "model.step_memory")
    assert values(run_check(state, "data.masking"))["pipeline"] == "llamafactory"  # its preprocessing still judged


def test_a_row_llamafactory_drops_fails_masking_on_that_row_without_logging_it(tmp_path, tiny_model_dir, real_machine,
                                                                              run_check, capsys, caplog):
    import json

    config = lf_folder(tmp_path / "tiny", tiny_model_dir)
    turns = [{"role": "user", "content": "Hello zorbiquent?"}, {"role": "user", "content": "Still there?"},
             {"role": "assistant", "content": "Yes."}]  # two user turns in a row: its converter rejects the row
    with (config.parent / "data" / "train.jsonl").open("a") as rows:
        rows.write(json.dumps({"messages": turns}) + "\n")
    with pytest.raises(Fail) as info:
        run_check(state_for(config, tmp_path / "arts", real_machine), "data.masking")
    assert "LLaMA-Factory drops this row" in str(info.value) and "train.jsonl:51" in str(info.value)
    seen = capsys.readouterr()
    assert "zorbiquent" not in seen.out + seen.err + caplog.text


@pytest.mark.parametrize(("flag", "problem"), [("train_on_prompt", "wrong_role_trained"),
                                               ("mask_history", "assistant_untrained")])
def test_llamafactorys_own_label_flags_against_an_assistant_only_recipe_fail_masking(tmp_path, tiny_model_dir,
                                                                                    real_machine, run_check, flag,
                                                                                    problem):
    # ftready.toml says every assistant turn trains; the config's own flag makes LLaMA-Factory label otherwise
    config = lf_folder(tmp_path / "tiny", tiny_model_dir, **{flag: "true"})
    side = config.parent / "ftready.toml"
    side.write_text(side.read_text().replace("[data]\n", "[data]\ntrain_on = \"assistant\"\n"))
    with pytest.raises(Fail) as info:
        run_check(state_for(config, tmp_path / "arts", real_machine), "data.masking")
    message = str(info.value)
    assert message.startswith("labels made by LLaMA-Factory template chatml:") and problem in message


def test_under_packing_the_rows_are_cut_where_llamafactory_cuts_them(tmp_path, tiny_model_dir, real_machine):
    # packing: LLaMA-Factory encodes each row with cutoff_len - 1 tokens (its packed sequences then pad to cutoff_len)
    config = lf_folder(tmp_path / "tiny", tiny_model_dir, packing="true", cutoff_len="64")
    state = state_for(config, tmp_path / "arts", real_machine)
    assert max(len(e.input_ids) for e in state.training_examples()) == 63 < max(state.digest.full_lengths)
