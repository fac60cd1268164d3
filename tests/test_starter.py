"""ftready-init: a commented starting recipe for a team's model and data, or a trainer
config's side file, every value it could not read marked."""

from __future__ import annotations

import shutil

import pytest

from pytest_ftready.recipe.schema import RecipeError

from pytest_ftready.recipe import load_recipe
from pytest_ftready.starter import FILL_IN, main, parse_setting
from tests.conftest import EXAMPLE

KNOWN = ["--license", "apache-2.0", "--rights", "generated", "--set", "training.learning_rate=1e-2",
         "--set", 'privacy.backups={ path = "backups", encrypted = true }', "--set", "privacy.retention_days=90"]


def test_a_starting_recipe_for_the_tiny_model_is_valid_and_marks_what_it_could_not_read(tiny_example, monkeypatch):
    monkeypatch.chdir(tiny_example)
    assert main(["--model", "model", "--data", "data/train.jsonl", "-o", "mine.toml"]) == 0
    text = (tiny_example / "mine.toml").read_text()
    marked = {line.split("=")[0].strip() for line in text.splitlines() if f"# {FILL_IN}" in line}
    assert marked == {"license", "rights", "licenses", "backups", "retention_days"}
    assert 'dtype = "float32"   # from config.json dtype' in text  # read from the model folder
    assert 'format = "messages"   # from the first row of train.jsonl' in text
    assert "# micro_batch_size = 1   # examples per forward pass" in text  # defaults as comments
    recipe = load_recipe(tiny_example / "mine.toml")  # valid as written
    assert 'path = "model"' in text and recipe.data.max_length == 512
    assert main(["--model", "model", "--data", "data/train.jsonl", "-o", "mine.toml"]) == 1  # never overwrites

    assert main(["--model", "model", "--data", "data/train.jsonl", "-o", "known.toml", *KNOWN]) == 0
    known = load_recipe(tiny_example / "known.toml")
    assert f"# {FILL_IN}" not in (tiny_example / "known.toml").read_text()
    assert known.training.learning_rate == 1e-2 and known.privacy.backups["encrypted"] is True
    assert list(known.privacy.licenses) == ["apache-2.0"] and known.model.license == "apache-2.0"


def test_a_hub_model_gets_its_revision_marked_and_never_touches_the_hub(tiny_example, monkeypatch, capsys):
    monkeypatch.chdir(tiny_example)
    assert main(["--model", "org/some-model", "--data", "data/train.jsonl", "-o", "hub.toml"]) == 0
    assert "wrote hub.toml: 6 value(s) marked FILL IN" in capsys.readouterr().out
    text = (tiny_example / "hub.toml").read_text()
    assert 'id = "org/some-model"' in text and f'revision = ""   # {FILL_IN}: the 40-hex commit' in text
    with pytest.raises(RecipeError, match="revision"):  # not runnable until the marked values are written
        load_recipe(tiny_example / "hub.toml")


def test_a_trainer_config_gets_its_side_file(tiny_example, tmp_path, monkeypatch):
    for name in ("trl-sft.yaml",):
        shutil.copy(EXAMPLE / name, tiny_example / name)
    monkeypatch.chdir(tiny_example)
    assert main(["--from", "trl-sft.yaml", "--license", "apache-2.0", "--rights", "ours"]) == 0
    side = (tiny_example / "trl-sft.ftready.toml").read_text()
    assert 'license = "apache-2.0"' in side and 'rights = "ours"' in side and "# overfit_steps = 200" in side
    recipe = load_recipe(tiny_example / "trl-sft.yaml")  # the side file is applied over the translation
    assert recipe.data.rights == "ours" and list(recipe.privacy.licenses) == ["apache-2.0"]


HUB_CONFIG = "model_name_or_path: org/some-model\ndataset_name: org/some-chats\nuse_peft: true\n"


def test_a_config_naming_what_is_not_here_gets_a_side_file_asking_for_each_of_them(tiny_example, monkeypatch, capsys):
    """A hub model without a commit and hub data (or a model folder of the author's): the side
    file marks each key it must give, it is not runnable until they are written, and it is once they are."""
    monkeypatch.chdir(tiny_example)
    (tiny_example / "hub.yaml").write_text(HUB_CONFIG)
    assert main(["--from", "hub.yaml"]) == 0
    assert "wrote hub.ftready.toml: 5 value(s) marked FILL IN" in capsys.readouterr().out
    side = (tiny_example / "hub.ftready.toml").read_text()
    assert f'# revision = ""   # {FILL_IN}: the hub commit' in side
    assert f'# train = ["path/to/train.jsonl"]   # {FILL_IN}: a local copy of the rows' in side
    with pytest.raises(RecipeError) as info:  # nothing stood in for them in what was written
        load_recipe(tiny_example / "hub.yaml")
    assert info.value.where in ("[data] train", "[model] revision")
    side = side.replace('# revision = ""', 'revision = "' + "a" * 40 + '"')
    (tiny_example / "hub.ftready.toml").write_text(side.replace('# train = ["path/to/train.jsonl"]',
                                                                'train = ["data/train.jsonl"]'))
    recipe = load_recipe(tiny_example / "hub.yaml")
    assert recipe.model.revision == "a" * 40 and [p.name for p in recipe.data.train] == ["train.jsonl"]

    (tiny_example / "mine.yaml").write_text(HUB_CONFIG)
    assert main(["--from", "mine.yaml", "--revision", "b" * 40]) == 0  # --revision is written
    assert f'revision = "{"b" * 40}"' in (tiny_example / "mine.ftready.toml").read_text()

    (tiny_example / "far.yaml").write_text(HUB_CONFIG.replace("org/some-model", "/workspace/models/llama-3-8b"))
    assert main(["--from", "far.yaml"]) == 0
    far = (tiny_example / "far.ftready.toml").read_text()
    assert f'# path = "path/to/your/copy"   # {FILL_IN}: the config names a model folder' in far and "revision" not in far


def test_a_mistyped_key_says_what_it_meant():
    with pytest.raises(ValueError, match="did you mean training.learning_rate"):
        parse_setting("training.learnin_rate=1")
    assert parse_setting("data.format=text") == (("data", "format"), "text")  # a bare word is a string
    assert parse_setting("checks.skip={ \"stack.mlx\" = \"no mac\" }")[1] == {"stack.mlx": "no mac"}
