"""Conformance of the trainer-config importers with their key tables (recipe/importers/keys):
every row is exercised by the configs in conformance/, every key ends in its row's class, and a
config whose only difference is one key gives a different recipe or a different note."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pytest_ftready.recipe.importers import IMPORTERS
from pytest_ftready.recipe.importers.table import load_table
from pytest_ftready.recipe.schema import SCHEMA, RecipeError
from pytest_ftready.recipe import load_recipe

CONFORMANCE = Path(__file__).parent / "conformance"
BASES = {"axolotl": "base.yml", "llamafactory": "base.yaml", "trl": "base.yaml"}
ROW = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
# Keys whose conformance value reads the same as the base config's, with why.
SAME_AS_BASE = {
    ("axolotl", "float32"): "the base config's bf16: false already means float32 weights",
    ("axolotl", "sdp_attention"): "sdpa is also what the base config's unset attn_implementation means",
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Each trainer's conformance folder copied beside a model folder and local chat rows."""
    out = {}
    for trainer in BASES:
        folder = tmp_path_factory.mktemp(trainer)
        shutil.copytree(CONFORMANCE / trainer, folder, dirs_exist_ok=True)
        (folder / "model").mkdir()
        (folder / "data").mkdir()
        (folder / "data" / "train.jsonl").write_text(json.dumps(ROW) + "\n")
        (folder / "data" / "dataset_info.json").write_text(json.dumps({"chats": {
            "file_name": "train.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
        out[trainer] = folder
    return out


def variant(folder: Path, trainer: str, extra: dict) -> Path:
    config = {**yaml.safe_load((folder / BASES[trainer]).read_text()), **extra}
    path = folder / f"variant{Path(BASES[trainer]).suffix}"
    path.write_text(yaml.safe_dump(config))
    return path


def seen(recipe) -> tuple:
    """What a user sees of a recipe: its tables, the notes and the keys listed as not checked."""
    tables = {k: v for k, v in recipe.to_dict().items() if k not in ("translation", "source", "name")}
    origin = recipe.origin
    return json.dumps(tables, sort_keys=True, default=str), sorted(origin.caveats), sorted(origin.not_checked)


@pytest.mark.parametrize("trainer", sorted(BASES))
def test_every_row_of_the_table_is_exercised_by_the_conformance_configs(trainer):
    written = set(yaml.safe_load((CONFORMANCE / trainer / "keys.yml").read_text()))
    written |= set(yaml.safe_load((CONFORMANCE / trainer / BASES[trainer]).read_text()))
    missing = [name for row in load_table(trainer).rows for name in (*row.names, *row.aliases)
               if not (any(k.startswith(name) for k in written) if row.prefix else name in written)]
    assert missing == []


@pytest.mark.parametrize("trainer", sorted(BASES))
def test_each_key_alone_changes_the_recipe_or_a_note_and_ends_in_its_rows_class(trainer, folders):
    folder, table = folders[trainer], load_table(trainer)
    base = seen(load_recipe(variant(folder, trainer, {})))
    assert load_recipe(variant(folder, trainer, {})).origin.unknown == ()
    problems = []
    for key, value in yaml.safe_load((CONFORMANCE / trainer / "keys.yml").read_text()).items():
        row = table.row(key)
        try:
            recipe = load_recipe(variant(folder, trainer, {key: value}))
        except RecipeError as exc:
            if row.cls != "refused" or exc.where != key or "\n" in str(exc):
                problems.append(f"{key}: {exc}")
            continue
        if row.cls == "refused":
            problems.append(f"{key}: a refused key imported")
            continue
        if dict(recipe.origin.classes).get(key) != row.cls:
            problems.append(f"{key}: class {dict(recipe.origin.classes).get(key)}, row says {row.cls}")
        if seen(recipe) == base and (trainer, key) not in SAME_AS_BASE:
            problems.append(f"{key}={value!r}: same recipe and notes as without it")
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("trainer", sorted(BASES))
def test_the_tables_name_real_recipe_keys_and_handlers(trainer):
    handlers = IMPORTERS[trainer].HANDLERS
    names = []
    for row in load_table(trainer).rows:
        names += [*row.names, *row.aliases]
        assert row.source.startswith("https://"), row.names
        if row.recipe:
            table, _, key = row.recipe.partition(".")
            assert key in SCHEMA[table], row.names
        if row.how:
            assert row.how in handlers, row.names
    assert len(names) == len(set(names))  # one row per key
