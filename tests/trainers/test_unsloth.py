"""Unsloth's own run: an Unsloth recipe on the tiny model runs data.masking (Unsloth's
train_on_responses_only masks), model.step_memory, model.overfit, lifecycle.generate and
lifecycle.resume through Unsloth (real Unsloth, its CPU mode), each beside the engine's; the
planted Unsloth mistakes fail the check that should catch them, naming Unsloth and the cause.

Runs in Unsloth's own environment (.ci/run: CPU torch, torchvision removed, UNSLOTH_FORCE_CPU=1);
skipped elsewhere. Unsloth is imported by the fixtures, not at collection, so the other trainers'
tests in the same environment run on TRL as Unsloth left it unimported."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail
from pytest_ftready.trainers.unsloth import unsloth_api

from ..conftest import assert_own_overfit, assert_own_resume_exact, copy_example, state_for, values

if importlib.util.find_spec("unsloth") is None:
    pytest.skip("Unsloth's own run needs unsloth (its own environment: pip install unsloth with the CPU torch, "
                "pip uninstall -y torchvision, UNSLOTH_FORCE_CPU=1; .ci/run builds it)", allow_module_level=True)

CHATML_PARTS = {"instruction_part": "<|im_start|>user\\n", "response_part": "<|im_start|>assistant\\n"}


def unsloth_recipe(folder: Path, model_dir: Path, data: str = "", **unsloth: str) -> Path:
    """The tiny example as an Unsloth recipe: [data] pipeline = "unsloth", ChatML's parts unless
    ``unsloth`` says otherwise; ``data`` more [data] lines."""
    copy_example(folder, model_dir)
    recipe = folder / "recipe.toml"
    table = "".join(f'{key} = "{value}"\n' for key, value in {**CHATML_PARTS, **unsloth}.items())
    recipe.write_text(recipe.read_text().replace("packing = false\n", f'packing = false\npipeline = "unsloth"\n{data}')
                      + f"\n[unsloth]\n{table}")
    return recipe


@pytest.fixture(scope="module")
def unsloth_state(tmp_path_factory, tiny_model_dir, real_machine):
    """One Unsloth recipe's state for the module: Unsloth's step, overfit and resume computed once."""
    unsloth_api()  # imported as the checks import it

    folder = tmp_path_factory.mktemp("unsloth")
    return state_for(unsloth_recipe(folder / "tiny", tiny_model_dir), folder / "arts", real_machine)


def planted(tmp_path, model_dir, machine, data: str = "", **unsloth: str):
    unsloth_api()
    return state_for(unsloth_recipe(tmp_path / "tiny", model_dir, data, **unsloth), tmp_path / "arts", machine)


def failure(state, run_check, check: str) -> str:
    """``check``'s failure message on ``state``."""
    with pytest.raises(Fail) as info:
        run_check(state, check)
    return str(info.value)


def test_masking_judges_the_labels_unsloths_train_on_responses_only_makes(unsloth_state, run_check):
    from pytest_ftready.data.rows import read_rows

    got = values(run_check(unsloth_state, "data.masking"))
    assert got["pipeline"] == "unsloth" and got["trained_span_method"] == "Unsloth train_on_responses_only"
    assert 0 < got["trained_token_share"] < 1
    example = unsloth_state.pipeline.encode(read_rows(unsloth_state.recipe.data.train)[0][:1])[0]
    own = unsloth_api()[2](None, instruction_part="<|im_start|>user\n", response_part="<|im_start|>assistant\n",
                                  tokenizer=unsloth_state.tokenizer, return_function=True)
    assert list(example.labels) == own({"input_ids": [list(example.input_ids)]})["labels"][0]  # Unsloth's own labels
    assert any(label != -100 for label in example.labels) and not example.problems


def test_the_step_is_unsloths_trainer_beside_the_engines(unsloth_state, run_check):
    got = values(run_check(unsloth_state, "model.step_memory"))
    assert got["step_trainer"] == "unsloth SFTTrainer" != unsloth_state.engine_step.trainer
    assert got["peak_tensor_bytes"] > 0 and got["engine_peak_bytes"] > 0
    # Unsloth's collator (train_on_responses_only's DataCollatorForSeq2Seq) pads to the longest row, not max_length
    assert 0 < got["step_tokens"] <= got["engine_step_tokens"] == 4 * 128


def test_unsloths_overfit_reaches_the_threshold_and_its_saves_generate_the_same(unsloth_state, run_check,
                                                                               monkeypatch):
    trainer, judged = unsloth_state.trainer, []
    reloaded = trainer.reloaded_outputs
    monkeypatch.setattr(trainer, "reloaded_outputs", lambda *args: judged.extend(reloaded(*args)) or judged)
    assert_own_overfit(unsloth_state, run_check, "unsloth SFTTrainer")  # then lifecycle.generate from the adapter
    assert [output.name for output in judged] == [  # what lifecycle.generate judged: the engine's reload, Unsloth's
        "reloaded adapter", "reloaded merged", "adapter reloaded by FastLanguageModel.from_pretrained",
        "merged_16bit model (save_pretrained_merged)"]
    merged = unsloth_state.scratch / "unsloth-merged-16bit"  # save_pretrained_merged's model, reloaded by Unsloth
    assert json.loads((merged / "config.json").read_text())["dtype"] in ("bfloat16", "float16")


def test_unsloths_own_resume_in_a_fresh_process_gives_the_same_losses(unsloth_state, run_check):
    assert_own_resume_exact(unsloth_state, run_check)
    assert unsloth_state.resume_run.trainer == "unsloth SFTTrainer"


# ---- planted Unsloth mistakes -------------------------------------------------------------------
@pytest.mark.parametrize("part, value, expected", [
    # every label -100: the run trains nothing
    ("response_part", "### Response:\\n", ["Unsloth train_on_responses_only would train on 0 tokens",
                                           "response_part '### Response:\\n' does not occur in the rendered row, so "
                                           "every label is -100"]),
    # nothing masked after the first response: the user turns train
    ("instruction_part", "### Instruction:\\n", ["instruction_part '### Instruction:\\n' does not occur in the rendered "
                                                 "row, so nothing after the first response is masked (user turns train)"]),
])
def test_a_part_absent_from_the_rendered_template_fails_masking_naming_it(tmp_path, tiny_model_dir, real_machine,
                                                                         run_check, part, value, expected):
    message = failure(planted(tmp_path, tiny_model_dir, real_machine, **{part: value}), run_check, "data.masking")
    assert all(said in message for said in expected), message


def test_a_get_chat_template_name_other_than_the_models_own_fails_the_template_check(tmp_path, tiny_model_dir,
                                                                                   real_machine, run_check):
    # Qwen 2.5's ChatML adds its own system prompt: the parts still match, the format is not the model's
    state = planted(tmp_path, tiny_model_dir, real_machine, chat_template="qwen-2.5")
    message = failure(state, run_check, "data.template")
    assert "Unsloth's get_chat_template('qwen-2.5') renders this row differently from the model's own chat " \
           "template" in message
    run_check(state, "data.masking")  # its masks are right: only the template is wrong


def test_an_unknown_get_chat_template_name_fails_naming_unsloths_names(tmp_path, tiny_model_dir, real_machine,
                                                                       run_check):
    state = planted(tmp_path, tiny_model_dir, real_machine, chat_template="qwen2-5")
    message = failure(state, run_check, "data.masking")
    assert "Unsloth's get_chat_template knows no template 'qwen2-5'; did you mean " in message


def test_an_end_of_turn_outside_the_trained_part_fails_masking(tmp_path, tiny_model_dir, real_machine, run_check):
    """A model whose EOS is </s> while its template ends turns with <|im_end|>, and an instruction part
    that starts at the end of the assistant's turn: Unsloth's span stops before <|im_end|>."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "</s>"}))
    recipe = unsloth_recipe(tmp_path / "tiny", model, 'stop_tokens = ["<|im_end|>"]\n',
                            instruction_part="<|im_end|>\\n<|im_start|>user\\n")
    unsloth_api()
    state = state_for(recipe, tmp_path / "arts", real_machine)
    message = failure(state, run_check, "data.masking")
    assert "Unsloth train_on_responses_only" in message and "stop_untrained" in message


def test_a_merged_16bit_model_generating_otherwise_than_the_adapter_fails_naming_unsloth(
        tmp_path, tiny_model_dir, real_machine, run_check, monkeypatch):
    """save_pretrained_merged writing the base without the adapter (planted in Unsloth's CPU merge)."""
    import copy

    import unsloth_zoo.cpu.loader as loader

    def merged_without_the_adapter(model, save_method):
        import torch

        return copy.deepcopy(model).unload().to(torch.bfloat16), False

    monkeypatch.setattr(loader, "_merged_copy", merged_without_the_adapter)
    state = planted(tmp_path, tiny_model_dir, real_machine)
    run_check(state, "model.overfit")  # the overfit itself is fine: what Unsloth saved of it is not
    message = failure(state, run_check, "lifecycle.generate")
    assert message.startswith("unsloth SFTTrainer: the merged_16bit model (save_pretrained_merged) generates ")
    assert "the saved artifact is not the trained model (save_pretrained_merged wrote bfloat16 weights" in message


# ---- a team's Unsloth notebook through the pytest_ftready_trainer hook ----------------------------
RUNS_THE_TRAINER = ("model.step_memory", "model.overfit", "lifecycle.resume", "lifecycle.generate")


def test_the_unsloth_notebook_template_is_what_step_overfit_resume_and_generate_run(tmp_path, tiny_model_dir):
    """conftest_templates/unsloth_notebook.py as a team's conftest.py beside the tiny example, its
    notebook's learning rate raised for a 146k-parameter model; pytest run as a user runs it."""
    from tests.helpers import outcomes, properties
    from tests.plugin.full_run import run_pytest

    template = (Path(__file__).resolve().parents[2] / "conftest_templates" / "unsloth_notebook.py").read_text()
    assert template.count("learning_rate=2e-4") == 1
    folder = copy_example(tmp_path / "tiny", tiny_model_dir)
    (folder / "conftest.py").write_text(template.replace("learning_rate=2e-4", "learning_rate=1e-2"))
    result = run_pytest(folder, "-k", " or ".join(RUNS_THE_TRAINER), "--junitxml=out.xml")
    assert (folder / "out.xml").is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    found = outcomes(folder / "out.xml")
    assert {check: found[check][0] for check in RUNS_THE_TRAINER} == dict.fromkeys(RUNS_THE_TRAINER, "passed"), \
        {check: found.get(check) for check in RUNS_THE_TRAINER}
    for check in RUNS_THE_TRAINER:
        assert properties(folder / "out.xml", check)["step_trainer"] == "conftest SFTTrainer"
    resume = properties(folder / "out.xml", "lifecycle.resume")  # the notebook's Trainer resumed in a fresh process
    assert resume["resumed_steps[steps]"] == "2" and float(resume["resume_max_loss_difference[nats]"]) == 0
