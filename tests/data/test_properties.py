"""Property-based tests (hypothesis): generated recipes and generated rows. Whatever the
input, the recipe loader raises only RecipeError, one line naming the key; the row reader
never raises and accounts for every line, each problem naming its line."""

from __future__ import annotations

import json
import math
import shutil
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_ftready.data.layouts import row_problems
from pytest_ftready.data.rows import read_rows
from pytest_ftready.recipe.schema import SCHEMA, RecipeError, parse_recipe

ROOT = Path(__file__).resolve().parents[2]
TRIED = {"recipes": 0, "recipes_valid": 0, "recipe_texts": 0, "row_files": 0, "rows": 0, "row_problems": 0}
PROPERTY = settings(max_examples=1500, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# ---- a small TOML writer for generated values ----------------------------------------------
def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON escapes are TOML basic-string escapes (a lone surrogate is not: TOML error)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_text(recipe: dict) -> str:
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in recipe.items() if not isinstance(v, dict)]
    for table, keys in recipe.items():
        if isinstance(keys, dict):
            lines.append(f"[{json.dumps(table)}]")
            lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


WORDS = st.sampled_from(["", "lora", "none", "messages", "text", "assistant", "all", "completion", "4bit", "model",
                         "data/train.jsonl", "sdpa", "adamw", "cosine", "secrets", "pii", "auto", "cpu", "x" * 300,
                         "model.step_memory", "q_proj", "float16", "../..", "~", "\n"])
SCALARS = (st.booleans() | st.integers(min_value=-2**63, max_value=2**63 - 1) | st.floats() | st.text(max_size=12)
           | WORDS)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8) | WORDS, inner, max_size=3), max_leaves=6)
KEYS = [(table, key) for table, keys in SCHEMA.items() for key in keys]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The tiny example's recipe as a dict, in a folder where its paths exist."""
    folder = tmp_path_factory.mktemp("recipe")
    (folder / "model").mkdir()
    (folder / "data").mkdir()
    (folder / "data" / "train.jsonl").write_text("{}\n")
    shutil.copy(ROOT / "examples" / "tiny" / "data" / "MANIFEST.json", folder / "data" / "MANIFEST.json")
    recipe = tomllib.loads((ROOT / "examples" / "tiny" / "recipe.toml").read_text())
    parse_recipe(toml_text(recipe), folder / "recipe.toml")  # the base itself is valid
    return folder, recipe


MUTATION = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(KEYS), VALUES),
    st.tuples(st.just("delete"), st.sampled_from(KEYS), st.none()),
    st.tuples(st.just("unknown key"), st.sampled_from(KEYS), st.text(min_size=1, max_size=10)),
    st.tuples(st.just("table scalar"), st.sampled_from(KEYS), SCALARS),
)


@PROPERTY
@given(mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_generated_recipes_fail_only_with_a_one_line_error_naming_a_key(base, mutations):
    folder, recipe = base
    recipe = {k: dict(v) if isinstance(v, dict) else v for k, v in recipe.items()}
    touched = set()
    for action, (table, key), value in mutations:
        keys = recipe.setdefault(table, {})
        if not isinstance(keys, dict):
            continue
        if action == "set":
            keys[key] = value
        elif action == "delete":
            keys.pop(key, None)
        elif action == "unknown key":
            keys[value] = 1
        else:
            recipe[table] = value
        touched |= {table, key, value if action == "unknown key" else key}
    TRIED["recipes"] += 1
    try:
        parsed = parse_recipe(toml_text(recipe), folder / "recipe.toml")
        TRIED["recipes_valid"] += 1
        for table in SCHEMA:  # a number that passes is a finite one
            for value in getattr(parsed, table).values():
                assert not (isinstance(value, float) and not math.isfinite(value)), (table, value)
    except RecipeError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"Invalid recipe {folder / 'recipe.toml'}")
        if not exc.message.startswith("not valid TOML"):
            assert exc.where, message  # names the table / key
            assert any(str(t) in exc.where for t in touched) or exc.where.startswith(("[model]", "[data]")), message


@PROPERTY
@given(text=st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_any_text_is_a_recipe_or_a_recipe_error(base, text):
    folder, _ = base
    TRIED["recipe_texts"] += 1
    try:
        parse_recipe(text, folder / "recipe.toml")
    except RecipeError as exc:
        assert "\n" not in str(exc)


# ---- rows --------------------------------------------------------------------------------------
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)
MESSAGES = st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "bot", 3]), "content": JSON | st.text(max_size=8)}),
    max_size=4)})
LINES = st.lists(
    st.one_of(
        JSON.map(lambda v: json.dumps(v).encode()),
        MESSAGES.map(lambda v: json.dumps(v, ensure_ascii=False).encode()),
        st.binary(max_size=40).filter(lambda b: b"\n" not in b),
        st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),
        st.sampled_from([b"", b"   ", b"\r", b"\xef\xbb\xbf{}", b'{"a": "\xff"}', b"{", b'"str"', b"null"]),
    ), max_size=12)


@PROPERTY
@given(lines=LINES, crlf=st.booleans())
@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_generated_rows_never_raise_and_every_line_is_accounted_for(tmp_path, lines, crlf):
    path = tmp_path / "train.jsonl"
    path.write_bytes((b"\r\n" if crlf else b"\n").join(lines))
    TRIED["row_files"] += 1
    TRIED["rows"] += len(lines)
    rows, problems = read_rows([path])
    TRIED["row_problems"] += len(problems)
    if not lines or path.stat().st_size == 0:
        assert rows == [] and [(p.line, p.kind) for p in problems] == [(0, "unreadable")]
        return
    seen = sorted([r.line for r in rows] + [p.line for p in problems])
    assert seen == sorted(i for i, raw in enumerate(lines, start=1) if _not_blank(i, raw))  # each once
    for problem in problems:
        assert problem.where == f"train.jsonl:{problem.line}" and problem.detail and "\n" not in problem.detail
    for row in rows:
        assert isinstance(row_problems(row, "messages", "assistant"), list)
        assert isinstance(row_problems(row, "prompt_completion", "completion"), list)
        assert isinstance(row_problems(row, "auto", "assistant"), list)


def _not_blank(number: int, raw: bytes) -> bool:
    if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8").strip() != ""
    except UnicodeDecodeError:
        return True  # reported as an encoding problem


def test_report_how_many_inputs_were_tried():
    """Runs last in this module: the counts go to the terminal with -s (and the closing note)."""
    print(f"\nhypothesis inputs tried: {TRIED}")
    assert TRIED["recipes"] == 0 or TRIED["recipes"] >= 1000
