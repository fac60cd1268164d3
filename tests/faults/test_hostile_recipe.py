"""Hostile and careless recipes, one test each: every case ends in a one-line RecipeError that
names the file and the key, says what was expected and what to write, and quotes no more of a
value than a line holds. Unit-level (the recipe loader), no model."""

from __future__ import annotations

import os
import socket

import pytest

from pytest_ftready.recipe.schema import MAX_NAME_CHARS, RecipeError

from pytest_ftready.recipe import load_recipe

MODEL = '[model]\nid = "org/m"\nrevision = "' + "a" * 40 + '"\n'
GOOD_DATA = '[data]\ntrain = ["data/train.jsonl"]\n'


def _recipe(folder, text: str):
    (folder / "data").mkdir(exist_ok=True)
    (folder / "data" / "train.jsonl").write_text('{"text": "hello"}\n')
    path = folder / "recipe.toml"
    path.write_text(text)
    return path


def _symlink_loop(folder):
    (folder / "data" / "a.jsonl").symlink_to(folder / "data" / "b.jsonl")
    (folder / "data" / "b.jsonl").symlink_to(folder / "data" / "a.jsonl")


def _fifo_train(folder):
    os.mkfifo(folder / "data" / "fifo.jsonl")


def _fifo_template(folder):
    os.mkfifo(folder / "chat.jinja")


def _fifo_recipe(folder):
    os.mkfifo(folder / "recipe.toml")


def _socket_recipe(folder):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "recipe.toml"))
    sock.close()


def _folder_recipe(folder):
    (folder / "recipe.toml").mkdir()


def _big_recipe(folder):
    (folder / "recipe.toml").write_bytes(b"# " + b"x" * (2 << 20) + b"\n")


def _binary_recipe(folder):
    (folder / "recipe.toml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")


def _only_folders_match(folder):
    (folder / "data" / "shards.jsonl").mkdir()


# (id, recipe text, or None when ``setup`` writes recipe.toml itself, setup, words the error must hold)
CASES = [
    ("train-symlink-loop", MODEL + '[data]\ntrain = ["data/a.jsonl"]\n', _symlink_loop,
     ["[data] train", "'data/a.jsonl' cannot be resolved", "Symlink loop", "point it at the real file"]),
    ("train-glob-matches-nothing", MODEL + '[data]\ntrain = ["data/many/*.jsonl"]\n', None,
     ["[data] train", "the pattern 'data/many/*.jsonl' matches no file", "fix the pattern"]),
    ("train-glob-matches-only-folders", MODEL + '[data]\ntrain = ["data/*.jsonl", "data/s*"]\n', _only_folders_match,
     ["the pattern 'data/s*' matches no file"]),
    ("name-10-MB", 'name = "' + "n" * 10_000_000 + '"\n' + MODEL + GOOD_DATA, None,
     ["holds 10,000,121 bytes, more than the 1,048,576 a recipe may: pass the recipe.toml"]),
    ("name-100k-chars", 'name = "' + "n" * 100_000 + '"\n' + MODEL + GOOD_DATA, None,
     ["name: expected at most 100 characters (it names the artifacts folder), got 100,000: write a short name"]),
    ("name-101-chars", f'name = "{"n" * (MAX_NAME_CHARS + 1)}"\n' + MODEL + GOOD_DATA, None,
     ["name: expected at most 100 characters", "got 101"]),
    ("name-path-traversal", 'name = "../../etc"\n' + MODEL + GOOD_DATA, None,
     ["name: expected letters, digits, '.', '_' or '-', got '../../etc' (str)"]),
    ("name-with-slash", 'name = "team/bot"\n' + MODEL + GOOD_DATA, None, ["name: expected letters, digits"]),
    ("name-empty", 'name = ""\n' + MODEL + GOOD_DATA, None, ["name: expected letters, digits", "got '' (str)"]),
    ("name-not-a-string", "name = 7\n" + MODEL + GOOD_DATA, None, ["name: expected letters", "got 7 (int)"]),
    ("name-newline-escape", 'name = "a\\nb"\n' + MODEL + GOOD_DATA, None, ["name: expected letters", "got 'a\\nb' (str)"]),
    ("string-over-limit", MODEL.replace('[model]\n', '[model]\nlicense = "' + "l" * 5000 + '"\n') + GOOD_DATA, None,
     ["[model] license: expected at most 4,096 characters", "(5,002 characters in all) (str)"]),
    ("train-name-too-long", MODEL + '[data]\ntrain = ["' + "t" * 300 + '.jsonl"]\n', None,
     ["[data] train", "cannot be looked up (File name too long)", "(308 characters in all)"]),
    ("train-nul-escape", MODEL + '[data]\ntrain = ["data/tr\\u0000ain.jsonl"]\n', None,
     ["[data] train", "cannot be looked up (embedded null byte)"]),
    ("train-unknown-home", MODEL + '[data]\ntrain = ["~no-such-user-ftready/train.jsonl"]\n', None,
     ["[data] train", "cannot be resolved"]),
    ("train-missing", MODEL + '[data]\ntrain = ["data/gone.jsonl"]\n', None,
     ["[data] train: 'data/gone.jsonl' does not exist (looked for", "fix the path"]),
    ("train-empty-list", MODEL + "[data]\ntrain = []\n", None, ["[data] train: expected at least one file"]),
    ("train-a-number", MODEL + "[data]\ntrain = 3\n", None, ["[data] train: expected a list of path strings, got 3 (int)"]),
    ("train-missing-key", MODEL + "[data]\nformat = \"messages\"\n", None, ["[data] train: missing"]),
    ("train-is-a-fifo", MODEL + '[data]\ntrain = ["data/fifo.jsonl"]\n', _fifo_train,
     ["[data] train: 'data/fifo.jsonl' is not a regular file (a FIFO, socket or device)"]),
    ("train-is-dev-zero", MODEL + '[data]\ntrain = ["/dev/zero"]\n', None, ["[data] train: '/dev/zero' is not a regular file"]),
    ("chat-template-is-a-fifo", MODEL + GOOD_DATA.replace("\n", '\nchat_template = "chat.jinja"\n', 1), _fifo_template,
     ["[data] chat_template: 'chat.jinja' is not a regular file"]),
    ("lockfile-is-dev-urandom", MODEL + GOOD_DATA + '[pins]\nlockfile = "/dev/urandom"\n', None,
     ["[pins] lockfile: '/dev/urandom' is not a regular file"]),
    ("recipe-is-a-fifo", None, _fifo_recipe, ["is not a regular file (a FIFO, socket or device)"]),
    ("recipe-is-a-socket", None, _socket_recipe, ["is not a regular file"]),
    ("recipe-is-a-folder", None, _folder_recipe, ["is a folder; pass --ftready=PATH to a recipe.toml file"]),
    ("recipe-2-MiB", None, _big_recipe, ["holds 2,097,155 bytes, more than the 1,048,576 a recipe may"]),
    ("recipe-binary", None, _binary_recipe, ["cannot be read", "utf-8"]),
    ("recipe-surrogate-escape", 'name = "\\ud800"\n' + MODEL + GOOD_DATA, None,
     ["not valid TOML", "not a Unicode scalar value"]),
    ("micro-batch-zero", MODEL + GOOD_DATA + "[training]\nmicro_batch_size = 0\n", None,
     ["[training] micro_batch_size: expected a positive integer, got 0"]),
    ("micro-batch-float", MODEL + GOOD_DATA + "[training]\nmicro_batch_size = 2.5\n", None,
     ["[training] micro_batch_size: expected a positive integer, got 2.5 (float)"]),
    ("learning-rate-nan", MODEL + GOOD_DATA + "[training]\nlearning_rate = nan\n", None,
     ["[training] learning_rate: expected a finite number, got nan"]),
    ("max-length-bool", MODEL + GOOD_DATA.replace("\n", "\nmax_length = true\n", 1), None,
     ["[data] max_length: expected a positive integer, got True (bool)"]),
    ("dropout-over-one", MODEL + GOOD_DATA + "[adapter]\ndropout = 1.5\n", None,
     ["[adapter] dropout: expected a share between 0 and 1"]),
    ("unknown-key-10k-chars", MODEL + GOOD_DATA + "[training]\n" + "k" * 10_000 + " = 1\n", None,
     ["characters in all): unknown key; valid keys: activation_offloading, compile"]),
    ("skip-a-number", MODEL + GOOD_DATA + "[checks]\nskip = 5\n", None, ["[checks] skip: expected check ids with reasons"]),
    ("control-chars-in-key", MODEL + GOOD_DATA + '[training]\n"a\\u001b[31mred" = 1\n', None,
     ["unknown key", "\\x1b[31mred"]),
]


@pytest.mark.parametrize("case, text, setup, words", CASES, ids=[c[0] for c in CASES])
def test_hostile_recipe_is_one_clear_line(tmp_path, case, text, setup, words):
    path = tmp_path / "recipe.toml"
    if text is not None:
        path = _recipe(tmp_path, text)
    else:
        (tmp_path / "data").mkdir()
    if setup is not None:
        setup(tmp_path)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    message = str(info.value)
    assert message.startswith(f"Invalid recipe {path}") and "\n" not in message and len(message) < 1000, message[:2000]
    for word in words:
        assert word in message, message


def test_globs_in_train_are_sorted_each_file_once(tmp_path):
    path = _recipe(tmp_path, MODEL + '[data]\ntrain = ["data/many/**/*.jsonl", "data/many/s1.jsonl", "data/train.jsonl"]\n')
    many = tmp_path / "data" / "many"
    (many / "deeper").mkdir(parents=True)
    for name in ("s2.jsonl", "s10.jsonl", "s1.jsonl", "deeper/s0.jsonl", "notes.txt"):
        (many / name).write_text('{"text": "x"}\n')
    recipe = load_recipe(path)
    assert [str(p.relative_to(tmp_path / "data")) for p in recipe.data.train] == [
        "many/deeper/s0.jsonl", "many/s1.jsonl", "many/s10.jsonl", "many/s2.jsonl", "train.jsonl"]


def test_a_file_named_like_a_pattern_is_taken_as_it_is(tmp_path):
    path = _recipe(tmp_path, MODEL + '[data]\ntrain = ["data/train[1].jsonl"]\n')
    (tmp_path / "data" / "train[1].jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "data" / "train1.jsonl").write_text('{"text": "y"}\n')  # what the pattern would match
    assert [p.name for p in load_recipe(path).data.train] == ["train[1].jsonl"]


def test_a_10_mb_name_from_a_trainer_config_is_refused_in_one_short_line(tmp_path):
    from pytest_ftready.recipe.schema import validate_recipe

    (tmp_path / "train.jsonl").write_text('{"text": "x"}\n')
    raw = {"name": "n" * 10_000_000, "model": {"id": "org/m", "revision": "a" * 40}, "data": {"train": ["train.jsonl"]}}
    with pytest.raises(RecipeError) as info:  # importers validate TOML-shaped tables: no file size limit before it
        validate_recipe(raw, tmp_path / "axolotl.yml")
    assert str(info.value).endswith("name: expected at most 100 characters (it names the artifacts folder), "
                                    "got 10,000,000: write a short name")
