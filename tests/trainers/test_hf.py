"""The cause of a resume difference, told from a transformers.Trainer's step logs and checkpoint."""

from __future__ import annotations

from pytest_ftready.trainers.hf import CHECKPOINT_PARTS, StepLog, resume_difference

STRAIGHT = [StepLog(1, 9.7, 0.01, 450), StepLog(2, 9.6, 0.0075, 792), StepLog(3, 8.68, 0.005, 1200),
            StepLog(4, 8.93, 0.0025, 1584)]


def full_checkpoint(tmp_path):
    for name, _ in CHECKPOINT_PARTS:
        (tmp_path / name).write_text("x")
    return tmp_path


def test_equal_steps_after_the_resume_are_no_difference(tmp_path):
    resumed = [StepLog(3, 8.68, 0.005, 408), StepLog(4, 8.93, 0.0025, 792)]  # the token count starts again
    assert resume_difference(STRAIGHT, resumed, full_checkpoint(tmp_path), exact=True) == ""


def test_a_restarted_schedule_is_named_with_both_learning_rates(tmp_path):
    resumed = [StepLog(3, 8.71, 0.01, 408), StepLog(4, 8.95, 0.0075, 792)]
    said = resume_difference(STRAIGHT, resumed, full_checkpoint(tmp_path), exact=True)
    assert said.startswith("step 3 after the resume at step 2: loss 8.710000, uninterrupted 8.680000")
    assert "the scheduler state: learning rate 0.01 at step 3 after the resume, 0.005 uninterrupted" in said
    assert "data order" not in said


def test_other_rows_after_the_resume_are_named_as_the_data_order(tmp_path):
    resumed = [StepLog(3, 8.9, 0.005, 380), StepLog(4, 8.93, 0.0025, 792)]
    said = resume_difference(STRAIGHT, resumed, full_checkpoint(tmp_path), exact=True)
    assert "the data order: step 3 trained 380 tokens after the resume, 408 uninterrupted" in said


def test_a_missing_part_of_the_checkpoint_is_named(tmp_path):
    checkpoint = full_checkpoint(tmp_path)
    (checkpoint / "optimizer.pt").unlink()
    resumed = [StepLog(3, 8.75, 0.005, 408), StepLog(4, 8.99, 0.0025, 792)]
    said = resume_difference(STRAIGHT, resumed, checkpoint, exact=True)
    assert "the checkpoint lacks the optimizer state (optimizer.pt)" in said


def test_nothing_told_apart_names_the_optimizer_state_or_an_rng(tmp_path):
    resumed = [StepLog(3, 8.75, 0.005, 408), StepLog(4, 8.99, 0.0025, 792)]
    said = resume_difference(STRAIGHT, resumed, full_checkpoint(tmp_path), exact=True)
    assert said.endswith("cause: the optimizer state or an RNG (dropout, sampling): the learning rates and the "
                         "tokens per step match")


def test_on_an_accelerator_last_bit_differences_pass(tmp_path):
    resumed = [StepLog(3, 8.680001, 0.005, 408), StepLog(4, 8.93, 0.0025, 792)]
    assert resume_difference(STRAIGHT, resumed, full_checkpoint(tmp_path), exact=False) == ""
    assert resume_difference(STRAIGHT, resumed, full_checkpoint(tmp_path), exact=True)


def test_every_recipe_optimizer_has_a_transformers_name_for_trls_run():
    from transformers.training_args import OptimizerNames

    from pytest_ftready.recipe.schema import SCHEMA
    from pytest_ftready.trainers.trl import OPTIM

    names = {o.value for o in OptimizerNames}
    for choice in SCHEMA["training"]["optimizer"].choices:  # a recipe optimizer TRL's run cannot name is a KeyError
        assert OPTIM[choice] in names, choice


def test_the_step_log_reads_each_trainers_token_count():
    from types import SimpleNamespace

    from pytest_ftready.trainers.hf import step_logger

    logger = step_logger()
    for step, logs in ((1, {"loss": 9.4, "learning_rate": 0.01, "num_tokens": 450.0}),  # TRL
                       (2, {"loss": 8.6, "learning_rate": 0.0075, "tokens/trainable": 156, "tokens/total": 1536}),  # Axolotl
                       (3, {"loss": 8.1, "learning_rate": 0.005})):  # neither
        logger.on_log(None, SimpleNamespace(global_step=step), SimpleNamespace(should_training_stop=False), logs)
    assert [log.tokens for log in logger.logs] == [450.0, 156.0, None]
