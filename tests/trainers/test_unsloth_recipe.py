"""An Unsloth recipe without Unsloth: its keys, their refusals, the trainer it selects and what
stack.known_bugs is told; none of it imports unsloth (the default suite has none)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pytest_ftready.recipe.schema import RecipeError, parse_recipe

BASE = """
[model]
path = "{model}"
[data]
train = ["{train}"]
format = "messages"
{data}
"""
PARTS = '[unsloth]\ninstruction_part = "<|im_start|>user\\n"\nresponse_part = "<|im_start|>assistant\\n"\n'


@pytest.fixture
def recipe_text(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text("{}\n")

    def text(data: str = 'pipeline = "unsloth"', tables: str = PARTS) -> str:
        return BASE.format(model=tmp_path / "model", train=tmp_path / "train.jsonl", data=data) + tables

    return text


def refusal(text: str) -> str:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "recipe.toml")
    return str(info.value)


def test_an_unsloth_recipe_reads_its_parts_and_template_name(recipe_text):
    recipe = parse_recipe(recipe_text(tables=PARTS + 'chat_template = "vicuna old"\n'), "recipe.toml")
    assert recipe.data.pipeline == "unsloth" and recipe.unsloth.chat_template == "vicuna old"
    assert recipe.unsloth.response_part == "<|im_start|>assistant\n"
    assert parse_recipe(recipe_text(data='pipeline = "unsloth"\ntrain_on = "all"', tables=""),
                        "recipe.toml").unsloth.response_part == ""


@pytest.mark.parametrize("data, tables, expected", [
    ('pipeline = "trl"', PARTS, "[unsloth] instruction_part: applies to Unsloth's own run: write [data] pipeline = "
                                "\"unsloth\", or remove the [unsloth] table"),
    ('pipeline = "unsloth"', "", "[unsloth] response_part: missing: with train_on = \"assistant\" Unsloth masks "
                                 "through train_on_responses_only"),
    ('pipeline = "unsloth"', '[unsloth]\nresponse_part = "<|im_start|>assistant\\n"\n',
     "[unsloth] instruction_part: missing: Unsloth's train_on_responses_only takes response_part and "
     "instruction_part together"),
    ('pipeline = "unsloth"\ntrain_on = "last_assistant"', PARTS, "[data] train_on: Unsloth's train_on_responses_only "
                                                                 "trains every assistant turn, not the last one only"),
    ('pipeline = "unsloth"\ntrain_on = "all"', PARTS, "[unsloth] response_part: train_on = \"all\" trains every "
                                                      "token, so train_on_responses_only would not run"),
    ('pipeline = "unsloth"\npacking = true', PARTS, "[data] packing: Unsloth's train_on_responses_only masks "
                                                    "unpacked rows"),
    ('pipeline = "unsloth"', PARTS + 'chat_template = "{{ messages }}"\n',
     "[unsloth] chat_template: expected a name from unsloth.chat_templates.CHAT_TEMPLATES"),
    ('pipeline = "unslot"', "", "[data] pipeline"),
])
def test_bad_unsloth_settings_are_refused_saying_what_to_write(recipe_text, data, tables, expected):
    message = refusal(recipe_text(data, tables))
    assert expected in message, message


def test_the_recipe_names_unsloth_to_the_trainer_layer_and_to_known_bugs(recipe_text):
    from pytest_ftready.machine.known_bugs import TRAINER_NAMES, Situation, judge, parse_bugs, recipe_trainer
    from pytest_ftready.trainers import select_trainer

    recipe = parse_recipe(recipe_text(), "recipe.toml")
    trainer = select_trainer(recipe)
    assert (trainer.name, trainer.step_trainer, trainer.label) == ("unsloth", "unsloth SFTTrainer", "Unsloth")
    assert recipe_trainer(recipe) == "unsloth" and TRAINER_NAMES["unsloth"] == "Unsloth"
    assert recipe_trainer(parse_recipe(recipe_text("", ""), "recipe.toml")) is None  # "auto" names no trainer
    bug, = parse_bugs({"bug": [{"id": "b", "package": "trl", "affected": "<2", "what": "w", "fixed": "2",
                                "workaround": "", "link": "https://example.org", "title": "t",
                                "when": {"trainers": ["trl"]}}]})
    # a row of TRL's alone does not apply to an Unsloth recipe (no longer assumed for a native recipe)
    assert judge(bug, Situation(packages={"trl": "1.0"}, trainer=recipe_trainer(recipe))).state == "no"
    assert judge(bug, Situation(packages={"trl": "1.0"})).notes[0].startswith("assuming you train with TRL")


def test_importing_the_plugin_and_the_trainer_layer_imports_no_unsloth_or_torch():
    code = ("import sys, pytest_ftready.plugin, pytest_ftready.trainers, pytest_ftready.trainers.unsloth; "
            "print(sorted(m for m in ('unsloth', 'unsloth_zoo', 'torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr
