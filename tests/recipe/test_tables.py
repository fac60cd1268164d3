"""recipe/tables.py, the tables' types, agrees with SCHEMA: the file is what the generator writes
from this checkout's SCHEMA, and a parsed recipe's tables are instances of its classes with the
types it declares."""

from __future__ import annotations

import typing
from pathlib import Path

from pytest_ftready.recipe import schema, tables, write_tables


def test_tables_py_is_what_schema_generates():
    written = Path(tables.__file__).read_text()
    assert written == write_tables.render(), (
        f"recipe/tables.py disagrees with recipe/schema.py's SCHEMA: regenerate it with `{write_tables.COMMAND}`")


def test_every_table_and_key_is_declared_with_its_kinds_type(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"text": "hello"}\n')
    recipe = schema.parse_recipe('[model]\npath = "."\n[data]\ntrain = ["train.jsonl"]\n', tmp_path / "r.toml")
    recipe_hints = typing.get_type_hints(schema.Recipe)
    for table, keys in schema.SCHEMA.items():
        declared = tables.TABLE_TYPES[table]
        assert recipe_hints[table] is declared
        value = getattr(recipe, table)
        assert isinstance(value, declared)
        hints = typing.get_type_hints(declared)
        assert set(hints) == set(keys), table
        for name, key in keys.items():
            hint = hints[name]
            if key.kind == "choice":
                assert typing.get_args(hint) == key.choices, (table, name)
                assert getattr(value, name) in key.choices
            elif key.kind in ("str", "bool", "int", "float", "share"):
                assert isinstance(getattr(value, name), hint), (table, name, hint)
