"""Hostile and careless configs, round three (issue 47): trainer configs, their side files, YAML
itself, and the recipe's numbers. Every case ends as one RecipeError line naming the file and the
key, saying what was expected and what to write: never a traceback, never a pytest INTERNALERROR.
Unit-level (the loader), no model, except one whole run that shows the report header's path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_ftready.recipe import RecipeError, load_recipe

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny"
CONFIGS = ("axolotl.yml", "llamafactory.yaml", "trl-sft.yaml")


@pytest.fixture
def configs(tmp_path) -> Path:
    """The tiny example's configs, side file and data (a model folder that only has to exist)."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    for name in (*CONFIGS, "ftready.toml", "recipe.toml"):
        shutil.copy(TINY / name, folder / name)
    (folder / "data").mkdir()
    for name in ("train.jsonl", "dataset_info.json", "MANIFEST.json"):
        shutil.copy(TINY / "data" / name, folder / "data" / name)
    (folder / "model").mkdir()
    return folder


def refused(path: Path) -> str:
    """The one line ``load_recipe`` refuses ``path`` with (a RecipeError, nothing else)."""
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    line = str(info.value)
    assert "\n" not in line and len(line) < 1000, line
    assert "Traceback" not in line
    return line


def edit(path: Path, old: str, new: str) -> Path:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new))
    return path


def append(path: Path, text: str) -> Path:
    path.write_text(path.read_text() + text)
    return path


def test_the_tiny_configs_still_load(configs):
    for name in CONFIGS:
        assert load_recipe(configs / name).origin is not None


# ---- trainer configs and their side files: each malformed value named -------------------------
INFO = "data/dataset_info.json"
ENTRY = {"file_name": "train.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
         "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}


def _info(value):
    return lambda folder: (folder / INFO).write_text(json.dumps(value))


def _side(text):
    return lambda folder: (folder / "ftready.toml").write_text(text)


def _config(name, old, new):
    return lambda folder: edit(folder / name, old, new)


def _more(name, text):
    return lambda folder: append(folder / name, text)


FREEZE = "finetuning_type: freeze\nfreeze_trainable_layers: "
# (id, config, how to break it, words the one line must hold)
CONFIG_CASES = [
    ("dataset-info-a-list", "llamafactory.yaml", _info([ENTRY]),
     ["dataset_info.json holds a JSON list", "reads an object there"]),
    ("dataset-info-entry-a-list", "llamafactory.yaml", _info({"tiny_chats": [ENTRY]}),
     ["dataset_info.json tiny_chats: expected a mapping", "got list"]),
    ("dataset-info-columns-a-list", "llamafactory.yaml", _info({"tiny_chats": {**ENTRY, "columns": ["messages"]}}),
     ["dataset_info.json tiny_chats.columns: expected a mapping", "got list"]),
    ("dataset-info-tags-a-string", "llamafactory.yaml", _info({"tiny_chats": {**ENTRY, "tags": "role"}}),
     ["dataset_info.json tiny_chats.tags: expected a mapping", "got str"]),
    ("dataset-info-file-name-a-number", "llamafactory.yaml", _info({"tiny_chats": {**ENTRY, "file_name": 7}}),
     ["dataset_info.json tiny_chats.file_name: expected a file name", "got int"]),
    ("side-data-a-string", "axolotl.yml", _side('data = "data/train.jsonl"\n'),
     ["ftready.toml data: expected a table ([data] with its keys below it)", "write [data] on a line of its own"]),
    ("side-model-a-string", "trl-sft.yaml", _side('model = "model"\n'), ["ftready.toml model: expected a table"]),
    ("side-checks-a-list", "llamafactory.yaml", _side("checks = [1, 2]\n"), ["ftready.toml checks: expected a table"]),
    ("axolotl-warmup-ten", "axolotl.yml", _more("axolotl.yml", "warmup_steps: ten\n"),
     ["axolotl.yml warmup_steps: expected warm-up optimizer steps", "got 'ten'", "write a whole number"]),
    ("axolotl-warmup-negative", "axolotl.yml", _more("axolotl.yml", "warmup_steps: -5\n"),
     ["warmup_steps: expected warm-up optimizer steps (or a ratio between 0 and 1) between 0 and"]),
    ("axolotl-warmup-a-list", "axolotl.yml", _more("axolotl.yml", "warmup_steps: [1]\n"), ["warmup_steps", "got [1]"]),
    ("axolotl-save-steps-text", "axolotl.yml", _config("axolotl.yml", "save_steps: 50", "save_steps: often"),
     ["save_steps: expected optimizer steps between checkpoints", "got 'often'"]),
    ("deepspeed-stage-5", "axolotl.yml", _more("axolotl.yml", "deepspeed:\n  zero_optimization:\n    stage: 5\n"),
     ["deepspeed zero_optimization.stage: expected a DeepSpeed ZeRO stage between 0 and 3, got 5"]),
    ("deepspeed-stage-auto", "axolotl.yml", _more("axolotl.yml", "deepspeed:\n  zero_optimization:\n    stage: auto\n"),
     ["zero_optimization.stage: expected a DeepSpeed ZeRO stage, got 'auto'"]),
    ("deepspeed-zero-a-list", "axolotl.yml", _more("axolotl.yml", "deepspeed:\n  zero_optimization: [2]\n"),
     ["deepspeed zero_optimization: expected a mapping", "got list"]),
    ("deepspeed-file-stage-5", "axolotl.yml",
     lambda f: ((f / "ds.json").write_text('{"zero_optimization": {"stage": 5}}'),
                append(f / "axolotl.yml", "deepspeed: ds.json\n")),
     ["deepspeed zero_optimization.stage (in ds.json): expected a DeepSpeed ZeRO stage between 0 and 3, got 5"]),
    ("deepspeed-offload-a-string", "axolotl.yml",
     _more("axolotl.yml", "deepspeed:\n  zero_optimization:\n    stage: 7\n    offload_optimizer: cpu\n"),
     ["got 7"]),
    ("llamafactory-freeze-all", "llamafactory.yaml", _config("llamafactory.yaml", "finetuning_type: lora", FREEZE + "all"),
     ["llamafactory.yaml freeze_trainable_layers: expected a layer count", "got 'all'"]),
    ("llamafactory-freeze-zero", "llamafactory.yaml", _config("llamafactory.yaml", "finetuning_type: lora", FREEZE + "0"),
     ["freeze_trainable_layers: expected a layer count other than 0"]),
    ("axolotl-seed-2-to-the-32", "axolotl.yml", _config("axolotl.yml", "seed: 42", "seed: 4294967296"),
     ["[training] seed (from seed): expected at most 4,294,967,295 (numpy's range", "got 4,294,967,296"]),
    ("trl-seed-2-to-the-40", "trl-sft.yaml", _config("trl-sft.yaml", "seed: 42", f"seed: {2 ** 40}"),
     ["[training] seed", "expected at most 4,294,967,295"]),
    ("trl-max-length-2-to-the-63", "trl-sft.yaml", _config("trl-sft.yaml", "max_length: 128", f"max_length: {2 ** 63 - 1}"),
     ["[data] max_length (from max_length): expected at most 16,777,216 tokens"]),
    ("axolotl-epochs-1e300", "axolotl.yml", _config("axolotl.yml", "num_epochs: 3", "num_epochs: 1.0e+300"),
     ["[training] epochs (from num_epochs): expected at most 1,000,000.0 epochs"]),
    ("side-max-hours-1e300", "axolotl.yml", _config("ftready.toml", "max_hours = 1.0", "max_hours = 1e300"),
     ["[budget] max_hours (from ftready.toml [budget] max_hours): expected at most 87,600.0 hours"]),
    ("side-target-regex-broken", "trl-sft.yaml", _more("ftready.toml", '\n[adapter]\ntarget_regex = "(q_proj"\n'),
     ["[adapter] target_regex", "'(q_proj' is not a regular expression (missing ), unterminated subpattern"]),
]


@pytest.mark.parametrize("case, config, plant, words", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_a_malformed_config_value_is_one_line_naming_its_key(configs, case, config, plant, words):
    assert_refused_saying(configs, config, plant, words)


def assert_refused_saying(configs, config: str, plant, words: list) -> None:
    """``plant`` applied to the configs' folder, ``config`` is refused in one line holding each of ``words``."""
    plant(configs)
    line = refused(configs / config)
    for word in words:
        assert word in line, line


HANDLED_SHAPES = [  # a value of a shape a key's reader does not take: named with the key, never a traceback
    ("axolotl-lora-target-modules-a-number", "axolotl.yml", _config("axolotl.yml", "lora_target_modules: [q_proj, v_proj]",
                                                                     "lora_target_modules: -1"),
     ["axolotl.yml lora_target_modules: -1 (int) cannot be read as this key's value", "write it as the trainer documents it"]),
    ("trl-lora-target-modules-a-number", "trl-sft.yaml", _config("trl-sft.yaml", "lora_target_modules: [q_proj, v_proj]",
                                                                  "lora_target_modules: 7"),
     ["trl-sft.yaml lora_target_modules", "7 (int)"]),
    ("axolotl-special-tokens-a-number", "axolotl.yml", _more("axolotl.yml", "special_tokens: 3\n"),
     ["axolotl.yml special_tokens: 3 (int) cannot be read"]),
    ("llamafactory-lora-target-a-number", "llamafactory.yaml", _config("llamafactory.yaml", "lora_target: q_proj,v_proj",
                                                                        "lora_target: 5"),
     ["llamafactory.yaml lora_target", "5 (int)"]),
    ("llamafactory-dataset-a-number", "llamafactory.yaml", _config("llamafactory.yaml", "dataset: tiny_chats", "dataset: 5"),
     ["llamafactory.yaml dataset: expected dataset names of dataset_info.json", "got int"]),
    ("llamafactory-dataset-dir-a-list", "llamafactory.yaml", _config("llamafactory.yaml", "dataset_dir: data",
                                                                      "dataset_dir: [data]"),
     ["llamafactory.yaml dataset_dir: expected the folder holding dataset_info.json", "got list"]),
]


@pytest.mark.parametrize("case, config, plant, words", HANDLED_SHAPES, ids=[c[0] for c in HANDLED_SHAPES])
def test_a_value_of_a_shape_no_reader_takes_names_its_key(configs, case, config, plant, words):
    assert_refused_saying(configs, config, plant, words)


# ---- YAML itself: one loader with size and alias limits ---------------------------------------
def _laughs(levels: int = 9) -> str:
    lines = ['lol0: &lol0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_a_billion_laughs_alias_bomb_is_refused_naming_the_file(configs):
    path = append(configs / "axolotl.yml", _laughs())
    line = refused(path)
    assert f"{path}: its aliases (*name) expand to more than 4,194,304 values and characters (an alias bomb?)" in line


def test_a_few_aliases_as_teams_write_them_still_load(configs):
    path = configs / "axolotl.yml"
    text = path.read_text().replace("lora_target_modules: [q_proj, v_proj]", "lora_target_modules: &targets [q_proj, v_proj]")
    path.write_text(text + "lora_fan_in_fan_out: false\nextra_targets: *targets\n" + _laughs(3))
    recipe = load_recipe(path)
    assert list(recipe.adapter.target_modules) == ["q_proj", "v_proj"]


def test_an_alias_that_contains_itself_is_refused(configs):
    line = refused(append(configs / "trl-sft.yaml", "loop: &loop [1, *loop]\n"))
    assert "an alias (*name) at line" in line and "refers to a list or mapping that contains it" in line


def test_yaml_nested_deeper_than_python_follows_is_refused(configs):
    line = refused(append(configs / "trl-sft.yaml", "deep: " + "[" * 5000 + "]" * 5000 + "\n"))
    assert "nests its lists and mappings deeper than the reader can follow" in line


def test_a_config_larger_than_a_page_of_settings_is_refused_before_reading(configs):
    line = refused(append(configs / "axolotl.yml", "# " + "x" * (2 << 20) + "\n"))
    assert "more than the 1,048,576 a config may: pass the trainer's config, not a data or model file" in line


def test_a_config_that_is_a_folder_or_a_fifo_is_refused(configs):
    import os

    (configs / "folder.yaml").mkdir()
    assert "is a folder; pass the path of a YAML config file" in refused(configs / "folder.yaml")
    os.mkfifo(configs / "fifo.yaml")
    assert "not a regular file (a FIFO, socket or device)" in refused(configs / "fifo.yaml")


def test_an_alias_bomb_in_an_accelerate_config_is_refused_naming_it(configs):
    (configs / "accelerate.yaml").write_text("distributed_type: MULTI_GPU\n" + _laughs())
    line = refused(append(configs / "trl-sft.yaml", "accelerate_config: accelerate.yaml\n"))
    assert "accelerate.yaml: its aliases (*name) expand" in line


def test_an_alias_bomb_in_a_spectrum_file_is_refused_naming_it(configs):
    (configs / "spectrum.yaml").write_text("unfrozen_parameters: [a]\n" + _laughs())
    line = refused(append(configs / "trl-sft.yaml", "spectrum_config_path: spectrum.yaml\n"))
    assert "spectrum.yaml: its aliases (*name) expand" in line


# ---- the recipe's numbers: every one bounded where the schema reads it ----------------------------
BOUNDS = [  # (table, key, value as TOML, words)
    ("budget", "max_hours", "1e300", "[budget] max_hours: expected at most 87,600.0 hours (ten years), got 1e+300"),
    ("budget", "max_hours", "1e12", "[budget] max_hours: expected at most 87,600.0 hours"),
    ("training", "epochs", "1e300", "[training] epochs: expected at most 1,000,000.0 epochs"),
    ("data", "max_length", str(2 ** 63 - 1), "[data] max_length: expected at most 16,777,216 tokens (longer than any "
                                             "model's context), got 9,223,372,036,854,775,807"),
    ("training", "seed", str(2 ** 32), "[training] seed: expected at most 4,294,967,295 (numpy's range, which torch, "
                                       "python and numpy all take), got 4,294,967,296"),
    ("training", "micro_batch_size", str(2 ** 40), "[training] micro_batch_size: expected at most 1,048,576"),
    ("training", "gradient_accumulation_steps", str(2 ** 40), "[training] gradient_accumulation_steps: expected at most"),
    ("training", "learning_rate", "1e30", "[training] learning_rate: expected at most 1,000.0"),
    ("training", "save_steps", str(2 ** 62), "[training] save_steps: expected at most"),
    ("checks", "time_limit_s", "1e300", "[checks] time_limit_s: expected at most 10,000,000.0"),
    ("checks", "time_limits", '{ "lifecycle.resume" = 1e300 }', "[checks] time_limits: expected check ids with positive "
                                                                 "seconds up to 10,000,000"),
    ("checks", "max_regression", "{ tokens_per_s = inf }", "[checks] max_regression.tokens_per_s: expected a "
                                                           "non-negative share"),
    ("checks", "overfit_steps", str(2 ** 60), "[checks] overfit_steps: expected at most 1,048,576"),
    ("checks", "resume_steps", str(2 ** 60), "[checks] resume_steps: expected at most 65,536"),
    ("checks", "max_new_tokens", str(2 ** 60), "[checks] max_new_tokens: expected at most"),
    ("budget", "log_bytes", str(2 ** 62), "[budget] log_bytes: expected at most 9,007,199,254,740,992"),
    ("privacy", "retention_days", str(10 ** 9), "[privacy] retention_days: expected at most 36,600"),
    ("distributed", "timeout_s", "1e300", "[distributed] timeout_s: expected at most 10,000,000.0"),
    ("adapter", "r", str(2 ** 40), "[adapter] r: expected at most 65,536"),
    ("adapter", "target_regex", '"(q_proj"', "[adapter] target_regex: '(q_proj' is not a regular expression "
                                             "(missing ), unterminated subpattern at position 0)"),
    ("adapter", "target_regex", '"*proj"', "[adapter] target_regex: '*proj' is not a regular expression"),
    ("training", "trainable", '["layers.[0-"]', "[training] trainable: 'layers.[0-' is not a regular expression"),
]


@pytest.mark.parametrize("table, key, value, words", BOUNDS, ids=[f"{b[1]}={b[2][:20]}" for b in BOUNDS])
def test_a_number_no_run_means_is_refused_naming_the_key(configs, table, key, value, words):
    path = configs / "recipe.toml"
    text = "".join(line for line in path.read_text().splitlines(keepends=True) if not line.startswith(f"{key} ="))
    header = f"[{table}]\n"
    path.write_text(text.replace(header, f"{header}{key} = {value}\n") if header in text
                    else text + f"\n{header}{key} = {value}\n")
    line = refused(path)
    assert words in line, line


def test_the_bounds_leave_every_example_recipe_as_it_was():
    for path in sorted((TINY.parent).rglob("*.toml")):
        if "layouts" in path.parts or path.name == "ftready.toml":
            continue
        text = path.read_text()
        if "[data]" in text and "[model]" in text:
            from pytest_ftready.recipe.schema import parse_recipe, RecipeError as Error

            try:
                parse_recipe(text, path)
            except Error as exc:  # a missing local model or data file is not a bound
                assert "expected at most" not in str(exc) and "regular expression" not in str(exc), str(exc)


# ---- the report header and collection: a config that cannot be read is a clean error ------------------
def test_any_reader_error_ends_as_a_recipe_error_and_the_header_says_nothing(configs, tmp_path, monkeypatch):
    """The backstop under every reader's own messages (fault injected: every input found is named
    by its own reader): an error of a shape no reader expected is one RecipeError line naming the
    file, and the report header's translation lines (RunState.header_lines) skip it instead of
    raising into pytest (an INTERNALERROR that ended the session)."""
    from pytest_ftready.recipe.importers import axolotl
    from pytest_ftready.session.state import RunState

    def broken(builder):
        raise KeyError(5)

    monkeypatch.setattr(axolotl, "translate", broken)
    path = configs / "axolotl.yml"
    line = refused(path)
    assert line.startswith(f"Invalid recipe {path}: cannot be read: a value of a shape the reader does not expect "
                           "(KeyError: 5); check the file's keys")
    run = RunState(artifacts_root=tmp_path / "arts", machine_factory=lambda: None, recipe_paths=[path.resolve()])
    assert run.header_lines() == []


def test_a_whole_run_on_a_malformed_config_is_a_collection_error_not_internalerror(configs, pytester, monkeypatch):
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", f"{root}{__import__('os').pathsep}{__import__('os').environ.get('PYTHONPATH', '')}")
    config = append(configs / "axolotl.yml", "warmup_steps: ten\n")
    result = pytester.runpytest_subprocess(f"--ftready={config}", "-p", "no:cacheprovider")
    out = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in out and "Traceback" not in out, out[-3000:]
    assert result.ret == pytest.ExitCode.INTERRUPTED  # the collection error stops the session, as pytest words it
    assert f"Invalid recipe {config} warmup_steps: expected warm-up optimizer steps (or a ratio between 0 and 1), " \
           "got 'ten': write a whole number" in out


# ---- user paths: OS errors become advice, nothing half-written -------------------------------------
PSEUDO_PATHS = [  # (table line to add, words)
    ('[privacy]\nallowlist = "missing.txt"', "[privacy] allowlist: 'missing.txt' does not exist"),
    ('[privacy]\nallowlist = "data"', "[privacy] allowlist: ", ),
    ('[privacy]\nallowlist = "/proc/self/environ"', "[privacy] allowlist: '/proc/self/environ' lies in a pseudo file system"),
    ('[privacy]\nscan_paths = ["/proc/self/status"]', "[privacy] scan_paths: '/proc/self/status' lies in a pseudo file system"),
    ('[training]\noutput_dir = "/proc/self"', "[training] output_dir: '/proc/self' lies in a pseudo file system"),
    ('[data]\nmanifest = "/sys/kernel/manifest.json"', "[data] manifest: '/sys/kernel/manifest.json' lies in a pseudo file system"),
    ('[privacy]\nbackups = { path = "/proc/self/fd", encrypted = true }',
     "[privacy] backups path: '/proc/self/fd' lies in a pseudo file system"),
]


@pytest.mark.parametrize("line, words", PSEUDO_PATHS, ids=[p[0].split("\n")[1][:30] for p in PSEUDO_PATHS])
def test_a_recipe_path_into_a_pseudo_file_system_or_missing_is_refused(configs, line, words):
    table, _, entry = line.partition("\n")
    key = entry.split(" =")[0]
    path = configs / "recipe.toml"
    text = "".join(row for row in path.read_text().splitlines(keepends=True) if not row.startswith(f"{key} ="))
    path.write_text(text.replace(table + "\n", f"{table}\n{entry}\n"))
    refused_line = refused(path)
    assert words in refused_line, refused_line
    if key == "allowlist" and "data" in entry:
        assert "is a folder; point it at a text file of accepted fingerprints" in refused_line


def test_a_baseline_in_a_pseudo_file_system_is_a_usage_error(tmp_path):
    from pytest_ftready.outputs.regression import BaselineError, load_baseline

    for path in ("/proc", "/proc/self/status", "/sys/kernel"):
        with pytest.raises(BaselineError, match=r"lies in a pseudo file system \(/proc, /sys, /dev\), not a run's "
                                                r"figures; pass --ftready-baseline=PATH"):
            load_baseline(path)


def test_a_baseline_folder_that_cannot_be_searched_is_a_usage_error(tmp_path, monkeypatch):
    from pytest_ftready.outputs import regression

    def denied(folder):  # the OS error itself (root reads every folder here)
        raise PermissionError(13, "Permission denied", str(folder / "private"))

    monkeypatch.setattr(regression, "artifacts_files", denied)
    with pytest.raises(regression.BaselineError, match=r"cannot be searched: Permission denied .*private\); pass "
                                                        r"--ftready-baseline=PATH to a measurements.json"):
        regression.load_baseline(tmp_path)


def test_an_inline_template_where_dot_ftready_cannot_be_made_is_refused_naming_the_key(configs):
    (configs / ".ftready").write_text("a file where the folder goes")
    config = append(configs / "trl-sft.yaml", 'chat_template: "{% for m in messages %}{{ m.content }}{% endfor %}"\n')
    line = refused(config)
    assert "trl-sft.yaml chat_template: its inline chat template cannot be saved as" in line
    assert "write [data] chat_template = \"that.jinja\" in ftready.toml" in line
    assert (configs / ".ftready").read_text() == "a file where the folder goes"  # nothing of the user's changed


def test_an_inline_template_the_side_file_replaces_needs_no_writable_folder(configs):
    (configs / ".ftready").write_text("a file where the folder goes")
    (configs / "mine.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    edit(configs / "ftready.toml", "[data]\nsample = 4", "[data]\nsample = 4\nchat_template = \"mine.jinja\"")
    config = append(configs / "trl-sft.yaml", 'chat_template: "{% for m in messages %}{{ m.content }}{% endfor %}"\n')
    recipe = load_recipe(config)
    assert recipe.data.chat_template == configs / "mine.jinja"
    assert any("the side file's [data] chat_template is the one the checks render with" in c
               for c in recipe.origin.caveats)


def test_an_inline_template_is_saved_whole_and_private(configs):
    config = append(configs / "trl-sft.yaml", 'chat_template: "{% for m in messages %}{{ m.content }}{% endfor %}"\n')
    saved = Path(load_recipe(config).data.chat_template)
    assert saved.read_text() == "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert saved.stat().st_mode & 0o077 == 0
    assert sorted(p.name for p in saved.parent.iterdir()) == [saved.name]  # no temp file left


def test_write_user_file_turns_each_os_error_into_advice_and_leaves_nothing_half_written(tmp_path, monkeypatch):
    import errno
    import os

    from pytest_ftready import files
    from pytest_ftready.files import PathProblem, write_user_file

    (tmp_path / "folder.json").mkdir()
    with pytest.raises(PathProblem, match=r"cannot write .*folder.json \(\[data\] manifest\): Is a directory; a folder "
                                          r"stands where the file goes: move it, or point \[data\] manifest elsewhere"):
        write_user_file(tmp_path / "folder.json", "{}", "[data] manifest")
    (tmp_path / "file").write_text("x")
    with pytest.raises(PathProblem, match=r"Not a directory; a file stands where a folder is needed: move it, or "
                                          r"point -o elsewhere"):
        write_user_file(tmp_path / "file" / "recipe.toml", "x", "-o")
    (tmp_path / "old.toml").write_text("the user's recipe")

    def read_only(*args, **kwargs):  # the OS error itself: root writes through read-only modes here
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(files.os, "replace", read_only)
    with pytest.raises(PathProblem, match=r"Read-only file system; the file system is mounted read-only: point -o at "
                                          r"a writable disk"):
        write_user_file(tmp_path / "old.toml", "new", "-o")
    assert (tmp_path / "old.toml").read_text() == "the user's recipe"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder.json", "old.toml"]


def test_read_user_text_names_a_missing_pseudo_folder_or_binary_file(tmp_path):
    from pytest_ftready.files import PathProblem, read_user_text

    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00")
    for path, words in ((tmp_path / "missing", "no such file; write it, or fix the path"),
                        (Path("/proc/self/environ"), "lies in a pseudo file system"),
                        (tmp_path, "it is a folder; point it at a file"),
                        (tmp_path / "bin", "not UTF-8 text")):
        with pytest.raises(PathProblem) as info:
            read_user_text(path, "[privacy] allowlist")
        assert words in str(info.value) and "([privacy] allowlist)" in str(info.value)


# ---- commands -------------------------------------------------------------------------------------
def test_ftready_init_onto_a_folder_or_under_a_file_is_one_line(configs, monkeypatch, capsys):
    from pytest_ftready.starter import main

    monkeypatch.chdir(configs)
    (configs / "out").mkdir()
    args = ["--model", "model", "--data", "data/train.jsonl"]
    assert main([*args, "-o", "out", "--force"]) == 2
    assert "ftready-init: out is a folder; pass the recipe file's path, e.g. -o out/recipe.toml" in capsys.readouterr().out
    (configs / "plain").write_text("x")
    assert main([*args, "-o", "plain/recipe.toml"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("ftready-init: cannot write plain/recipe.toml (-o): Not a directory; a file stands where a "
                          "folder is needed") and out.count("\n") == 1
    assert (configs / "plain").read_text() == "x" and list((configs / "out").iterdir()) == []


def test_ftready_init_names_a_malformed_config_json(configs, monkeypatch, capsys):
    from pytest_ftready.starter import main

    monkeypatch.chdir(configs)
    (configs / "model" / "config.json").write_text("{not json")
    assert main(["--model", "model", "--data", "data/train.jsonl", "-o", "mine.toml"]) == 2
    out = capsys.readouterr().out
    assert "model/config.json cannot be read as JSON (Expecting property name" in out
    assert "fix or restore the model's config.json" in out and not (configs / "mine.toml").exists()


def test_ftready_manifest_write_where_the_manifest_is_a_folder_or_under_a_file(configs, capsys):
    from pytest_ftready.data.manifest import main

    manifest = configs / "data" / "MANIFEST.json"
    manifest.unlink()
    manifest.mkdir()
    assert main(["write", str(configs / "recipe.toml")]) == 2
    out = capsys.readouterr().out
    assert f"ftready-manifest: cannot write {manifest} ([data] manifest): Is a directory; a folder stands where the " \
           "file goes: move it, or point [data] manifest elsewhere" in out
    assert list(manifest.iterdir()) == [] and sorted(p.name for p in manifest.parent.iterdir()) == [
        "MANIFEST.json", "dataset_info.json", "train.jsonl"]  # no temp file left


def test_ftready_manifest_write_in_a_read_only_data_folder_leaves_the_old_manifest(configs, capsys, monkeypatch):
    import errno
    import os

    from pytest_ftready import files
    from pytest_ftready.data.manifest import main

    before = (configs / "data" / "MANIFEST.json").read_text()

    def denied(*args, **kwargs):  # the OS error itself: root writes through a read-only folder's mode here
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(files.tempfile, "mkstemp", denied)
    assert main(["write", str(configs / "recipe.toml")]) == 2
    assert "Permission denied; this user may not write there: fix the folder's permissions or point [data] manifest " \
           "at a folder you own" in capsys.readouterr().out
    assert (configs / "data" / "MANIFEST.json").read_text() == before


def _forecast_folder(configs, tiny_model_dir, edit) -> Path:
    """The tiny recipe over a model folder holding only an edited copy of the tiny model's config.json."""
    config = json.loads((tiny_model_dir / "config.json").read_text())
    edit(config)
    (configs / "model" / "config.json").write_text(json.dumps(config))
    return configs / "recipe.toml"


@pytest.mark.parametrize("edit, words", [
    (lambda c: c.update(vocab_size=0), "config.json vocab_size = 0: expected a positive whole number (the model's "
                                       "vocab size); fix config.json"),
    (lambda c: c.update(hidden_size=-64), "config.json hidden_size = -64: expected a positive whole number"),
    (lambda c: c.pop("num_hidden_layers"), "config.json lacks num_hidden_layers: the forecast would use LlamaConfig's "
                                           "default of 32, another model's size; write this model's num_hidden_layers"),
], ids=["vocab-0", "hidden-negative", "no-layers"])
def test_ftready_forecast_refuses_sizes_a_config_lacks_or_gives_as_nothing(configs, tiny_model_dir, capsys, edit, words):
    from pytest_ftready.forecast_command import main

    recipe = _forecast_folder(configs, tiny_model_dir, edit)
    assert main([str(recipe), "--no-levers"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.startswith("ftready-forecast: ") and "Traceback" not in err


@pytest.mark.parametrize("edit, words", [
    (None, "model/config.json cannot be read as a model config (OSError"),
    (lambda c: c.update(num_attention_heads=3), "The hidden size (64) is not a multiple of the number of attention "
                                                "heads (3).): fix or restore it"),
    (lambda c: c.update(hidden_size="64"), "Field 'hidden_size' expected int, got str"),
    (lambda c: c.update(model_type="nonexistent"), "has model type `nonexistent` but Transformers does not recognize"),
], ids=["not-json", "heads-not-dividing", "size-as-text", "unknown-model-type"])
def test_ftready_forecast_names_a_config_json_it_cannot_read(configs, tiny_model_dir, capsys, edit, words):
    from pytest_ftready.forecast_command import main

    if edit is None:
        (configs / "model" / "config.json").write_text("{not json")
    else:
        _forecast_folder(configs, tiny_model_dir, edit)
    assert main([str(configs / "recipe.toml"), "--no-levers"]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe not text", "([pins] lockfile): not UTF-8 text"),
    (b'[[package]]\nname = "torch"\nversion = ', "([pins] lockfile): a uv.lock / poetry.lock that is not valid TOML"),
], ids=["binary", "broken-toml"])
def test_a_lockfile_that_cannot_be_read_says_what_to_do(tmp_path, content, words):
    from pytest_ftready.files import PathProblem
    from pytest_ftready.machine.pins import read_lockfile

    (tmp_path / "uv.lock").write_bytes(content)
    with pytest.raises(PathProblem) as info:
        read_lockfile(tmp_path / "uv.lock")
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_lock_entry_without_a_name_is_left_out_not_a_key_error(tmp_path):
    from pytest_ftready.machine.pins import read_lockfile

    (tmp_path / "uv.lock").write_text('[[package]]\nversion = "1.0"\n\n[[package]]\nname = "torch"\nversion = "2.5.1"\n')
    assert read_lockfile(tmp_path / "uv.lock") == {"torch": "2.5.1"}


# ---- the resume rehearsal's length: bounded, the key named ----------------------------------------
def test_a_huge_accumulation_is_rehearsed_at_a_bounded_count_and_said(make_state, run_check, monkeypatch):
    """gradient_accumulation_steps = 10000 at micro-batch 1 made the rehearsal train 10,000
    micro-batches a step (274 s against 13 s): it now accumulates REHEARSAL_ACCUMULATION, in the
    session and in the fresh process alike, and the check says so naming the key."""
    from pytest_ftready.engine import checkpoint
    from pytest_ftready.trainers.base import REHEARSAL_ACCUMULATION, rehearsal_note

    counted = []
    real = checkpoint.next_batches

    def counting(order, examples, accumulation, pad_id):
        counted.append(accumulation)
        return real(order, examples, accumulation, pad_id)

    monkeypatch.setattr(checkpoint, "next_batches", counting)
    state = make_state(micro_batch_size="1", gradient_accumulation_steps="10000")
    ctx = run_check(state, "lifecycle.resume")
    assert set(counted) == {REHEARSAL_ACCUMULATION} and len(counted) == 6  # 4 straight + 2 saved (this process)
    measured = {m.name: m.value for m in state.run.measurements if m.check == "lifecycle.resume"}
    assert measured["rehearsal_accumulation"] == REHEARSAL_ACCUMULATION and measured["resumed_steps"] == 2
    assert rehearsal_note(ctx.recipe) == ("[training] gradient_accumulation_steps = 10,000: the rehearsal accumulates 8 "
                                          "micro-batches per step (what a resume restores is the same at any count)")
    assert state.recipe.training.gradient_accumulation_steps == 10000  # every other check sees the recipe's own


# ---- unclear messages made clear ------------------------------------------------------------------
def test_a_missing_dataset_info_json_is_named_in_the_no_training_file_line(configs):
    (configs / INFO).unlink()
    line = refused(configs / "llamafactory.yaml")
    assert "[data] train: no local training file in this config" in line
    assert f"{configs / INFO} not found (LLaMA-Factory reads the datasets' descriptions there)" in line


def test_environment_references_in_a_config_are_said_to_be_left_unexpanded(configs, monkeypatch):
    monkeypatch.setenv("MODEL_DIR", str(configs))
    line = refused(edit(configs / "axolotl.yml", "base_model: model", "base_model: ${MODEL_DIR}/model"))
    assert "axolotl.yml base_model: '${MODEL_DIR}/model' holds ${MODEL_DIR}, left unexpanded (YAML expands no " \
           "environment variables, nor do the checks)" in line
    edit(configs / "axolotl.yml", "base_model: ${MODEL_DIR}/model", "base_model: model\noutput_dir_note: $HOME/runs")
    recipe = load_recipe(configs / "axolotl.yml")
    assert any(c.startswith("output_dir_note: holds $HOME, left unexpanded") for c in recipe.origin.caveats)


@pytest.mark.parametrize("setting, words", [
    ("training.learning_rate=fast", "--set 'training.learning_rate=fast': expected a number, got 'fast' (str); the "
                                    "plugin would refuse the recipe the same way"),
    ("training.seed=99999999999", "expected at most 4,294,967,295"),
    ("data.max_length=-1", "expected a positive integer, got -1"),
    ("model.dtype=fp64", "expected one of float32, float16, bfloat16"),
], ids=["text-for-number", "seed-too-large", "negative", "unknown-choice"])
def test_ftready_init_set_of_a_bad_value_is_refused_before_writing(configs, monkeypatch, capsys, setting, words):
    from pytest_ftready.starter import main

    monkeypatch.chdir(configs)
    assert main(["--model", "model", "--data", "data/train.jsonl", "-o", "mine.toml", "--set", setting]) == 2
    assert words in capsys.readouterr().out
    assert not (configs / "mine.toml").exists()


def _subprocess_env(monkeypatch):
    import os

    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def test_a_recipe_named_with_pytest_id_characters_is_a_usage_error_saying_so(configs, pytester, monkeypatch):
    _subprocess_env(monkeypatch)
    odd = configs / "recipe[v2].toml"
    shutil.copy(configs / "recipe.toml", odd)
    result = pytester.runpytest_subprocess(f"--ftready={odd}", "-p", "no:cacheprovider")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "INTERNALERROR" not in out
    assert f"ftready: recipe {odd} (from --ftready) holds '::' or '[', which pytest reads as a test id, not a file: " \
           "rename the file" in out


def test_a_recipe_folder_from_the_environment_is_named_as_a_folder(configs, pytester, monkeypatch):
    _subprocess_env(monkeypatch)
    monkeypatch.setenv("FTREADY_RECIPE", f"{configs}/")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "INTERNALERROR" not in out
    assert f"ftready: recipe {configs} (from env FTREADY_RECIPE) is a folder; pass the recipe file in it, one of " \
           "axolotl.yml, ftready.toml, llamafactory.yaml, recipe.toml, trl-sft.yaml" in out


# ---- fuzzing, extended to trainer configs and side files -------------------------------------------
def _toml(value) -> str:
    """``value`` as a TOML literal (None has none: an empty string stands for it)."""
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if value != value else "inf" if value == float("inf") else "-inf" if value == -float("inf") else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml(v)}" for k, v in value.items()) + " }"


@pytest.mark.parametrize("config, trainer", [("axolotl.yml", "axolotl"), ("llamafactory.yaml", "llamafactory"),
                                             ("trl-sft.yaml", "trl")])
def test_fuzzed_trainer_config_values_load_or_are_one_line(configs, request, config, trainer):
    """Any key of the trainer's table (or of the example) given any value: a Recipe, or one
    RecipeError line naming the file, and never the loader's backstop (each key's reader words it)."""
    import yaml
    from hypothesis import strategies as st

    from pytest_ftready.recipe.importers.table import load_table

    from .test_fuzz import fuzzed, values

    original = yaml.safe_load((configs / config).read_text())
    keys = sorted({n for row in load_table(trainer).rows if not row.prefix for n in row.names} | set(original))

    def body(change):
        key, value = change
        try:
            text = yaml.safe_dump({**original, key: value})
        except yaml.YAMLError:
            return
        (configs / config).write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            load_recipe(configs / config)
        except RecipeError as exc:
            line = str(exc)
            assert "\n" not in line and (str(configs / config) in line or "ftready.toml" in line), line
            assert "shape the reader does not expect" not in line, line

    fuzzed(request, 40, st.tuples(st.sampled_from(keys), values), body)


def test_fuzzed_side_file_values_load_or_are_one_line(configs, request):
    from hypothesis import strategies as st

    from pytest_ftready.recipe.schema import SCHEMA

    from .test_fuzz import fuzzed, values

    keys = [(table, key) for table, entries in SCHEMA.items() for key in entries]
    original = (configs / "ftready.toml").read_text()

    def body(change):
        (table, key), value = change
        (configs / "ftready.toml").write_text(original + f"\n[{table}]\n{key} = {_toml(value)}\n"
                                              if f"[{table}]" not in original else
                                              original.replace(f"[{table}]\n", f"[{table}]\n{key} = {_toml(value)}\n"),
                                              encoding="utf-8", errors="surrogatepass")
        try:
            load_recipe(configs / "axolotl.yml")
        except RecipeError as exc:
            line = str(exc)
            assert "\n" not in line and "shape the reader does not expect" not in line, line

    fuzzed(request, 60, st.tuples(st.sampled_from(keys), values), body)


def test_the_forecast_reads_a_size_under_the_models_own_name(tmp_path):
    """GPT-2 writes num_hidden_layers as n_layer (its attribute_map): present, not lacking."""
    from transformers import GPT2Config

    from pytest_ftready.forecast.trace import TraceError, checked_sizes

    GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, bos_token_id=0, eos_token_id=0).save_pretrained(tmp_path)
    config = GPT2Config.from_pretrained(tmp_path)
    assert checked_sizes(config, tmp_path / "config.json") is config
    written = json.loads((tmp_path / "config.json").read_text())
    del written["n_layer"]
    (tmp_path / "config.json").write_text(json.dumps(written))
    with pytest.raises(TraceError, match=r"config.json lacks num_hidden_layers: the forecast would use GPT2Config's "
                                         r"default of 12"):
        checked_sizes(GPT2Config.from_pretrained(tmp_path), tmp_path / "config.json")
