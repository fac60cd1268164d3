"""Fuzzing the recipe and the rows (hypothesis): whatever a recipe's tables hold, loading it
gives a Recipe or a one-line RecipeError; whatever bytes a training file holds, every line
becomes a row or a problem naming its line; every row the layout accepts is encoded without an
exception. Each test records how many inputs it tried (a user property ``fuzzed_inputs``, in JUnit XML)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_ftready.recipe.schema import SCHEMA, TOP_KEYS, RecipeError, parse_recipe, validate_recipe



SCALE = int(os.environ.get("FTREADY_FUZZ_SCALE", "1"))  # e.g. 20 for a long night's fuzzing


def fuzzed(request, examples: int, strategy, body) -> int:
    """Call ``body`` on ``examples`` (times FTREADY_FUZZ_SCALE) inputs drawn from ``strategy``,
    reproducibly, writing no example database into the checkout; the count tried is recorded
    as the test's ``fuzzed_inputs`` property and returned."""
    tried = []

    @settings(max_examples=examples * SCALE, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(value):
        tried.append(1)
        body(value)

    run()
    request.node.user_properties.append(("fuzzed_inputs", len(tried)))
    assert len(tried) >= examples * SCALE
    return len(tried)


ANY_CHAR = st.characters(exclude_categories=())  # surrogates and control characters too
KEYS = sorted({key for keys in SCHEMA.values() for key in keys})

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(ANY_CHAR, max_size=40),
                    st.sampled_from(["", "auto", "messages", "lora", "cpu", "train.jsonl", "data/*.jsonl", "~",
                                     "/dev/zero", "..", "a" * 5000]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(ANY_CHAR, max_size=8), inner, max_size=4)),
                      max_leaves=4)
tables = st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(ANY_CHAR, max_size=12)), values, max_size=4)
recipes = st.fixed_dictionaries(
    {"model": st.one_of(tables, st.just({"id": "org/model", "revision": "a" * 40})),
     "data": st.one_of(tables, st.builds(lambda t, extra: {"train": t, **extra},
                                         st.sampled_from(["train.jsonl", ["train.jsonl"], "*.jsonl", ["nope.jsonl"]]),
                                         tables))},
    optional={**{table: tables for table in SCHEMA if table not in ("model", "data")},
              **{key: values for key in TOP_KEYS}, "extra": values})


def _one_line(exc: RecipeError, path) -> None:
    message = str(exc)
    assert message.startswith(f"Invalid recipe {path}") and "\n" not in message and len(message) <= 4100, message[:300]


def _loads_or_one_line(load, path):
    def body(value):
        try:
            load(value, path)
        except RecipeError as exc:
            _one_line(exc, path)
    return body


def test_fuzzed_recipe_tables_give_a_recipe_or_one_line(tmp_path, request):
    (tmp_path / "train.jsonl").write_text('{"text": "x"}\n')
    fuzzed(request, 200, recipes, _loads_or_one_line(validate_recipe, tmp_path / "recipe.toml"))


def test_fuzzed_recipe_text_gives_a_recipe_or_one_line(tmp_path, request):
    lines = st.one_of(st.text(ANY_CHAR, max_size=60),
                      st.builds(lambda k, v: f"{k} = {json.dumps(v, ensure_ascii=False)}", st.sampled_from(KEYS),
                                st.one_of(st.text(max_size=20), st.integers(), st.booleans(), st.lists(st.text(max_size=5)))),
                      st.sampled_from(["[model]", "[data]", "[training]", "[[data]]", "[data.train]", 'train = ["a"]']))
    fuzzed(request, 200, st.lists(lines, max_size=8).map("\n".join), _loads_or_one_line(parse_recipe, tmp_path / "recipe.toml"))


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(ANY_CHAR, max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(ANY_CHAR, max_size=10), inner, max_size=4)),
    max_leaves=10)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool", "bot"]),
                                           "content": st.one_of(st.text(ANY_CHAR, max_size=30), json_values)}),
                    max_size=5)
row_lines = st.one_of(
    st.binary(max_size=60),  # any bytes
    json_values.map(lambda v: json.dumps(v).encode()),  # any JSON (lone surrogates as their escapes)
    st.builds(lambda m, tools: json.dumps({"messages": m, **({"tools": tools} if tools else {})}).encode(),
              messages, st.one_of(st.none(), json_values)),
)


def test_fuzzed_training_files_give_a_verdict_for_every_line(tmp_path, request):
    from tests.faults.test_hostile_rows import verdicts

    def read(drawn):
        rows, newline = drawn
        path = tmp_path / "train.jsonl"
        data = newline.join(rows) + newline
        path.write_bytes(data)
        got = verdicts(path)
        assert all(where.startswith("train.jsonl:") and "\n" not in verdict for where, verdict in got)
        lines_with_text = {i + 1 for i, line in enumerate(data.split(b"\n")) if line.strip()}
        assert {int(where.rsplit(":", 1)[1]) for where, _ in got} <= lines_with_text | ({0} if not data.strip() else set())

    fuzzed(request, 300, st.tuples(st.lists(row_lines, min_size=1, max_size=6), st.sampled_from([b"\n", b"\r\n"])), read)


@pytest.fixture(scope="module")
def tiny_encoder(tiny_model_dir):
    from transformers import AutoTokenizer

    from pytest_ftready.data.encoding import Encoder

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = SimpleNamespace(format="auto", train_on="assistant", max_length=64, add_special_tokens=False)
    return Encoder(tok, data, frozenset({tok.eos_token_id}))


def test_fuzzed_rows_the_layout_accepts_encode_without_an_exception(tiny_encoder, request):
    from pytest_ftready.data.layouts import read_sample
    from pytest_ftready.data.rows import _parsed
    from pytest_ftready.data.verify import IGNORE_INDEX

    encoded = []
    chats = st.builds(lambda m, tools: {"messages": [*m, {"role": "assistant", "content": "ok"}],
                                        **({"tools": tools} if tools else {})},
                      messages, st.one_of(st.none(), st.lists(st.dictionaries(st.sampled_from(["name", "type", "function"]),
                                                                              json_values, max_size=3), max_size=2)))
    plain = st.builds(lambda p, c: {"prompt": p, "completion": c}, st.text(ANY_CHAR, max_size=30),
                      st.text(ANY_CHAR, min_size=1, max_size=30))

    def encode(row):
        item = _parsed("train.jsonl", 1, json.dumps(row))  # as read from a file: lone surrogates are problems
        if not hasattr(item, "data"):
            return
        sample, problems = read_sample(item, "auto", "assistant")
        if problems:
            return
        e = tiny_encoder.encode(item, sample)
        assert all(label in (IGNORE_INDEX, token) for label, token in zip(e.labels, e.input_ids))
        encoded.append(e)

    fuzzed(request, 200, st.one_of(chats, plain), encode)
    assert len(encoded) >= 20 * SCALE  # many fuzzed rows really reached the tokenizer
