"""Benchmarks (pytest-benchmark): what the checks cost next to the work they check.
Nothing here asserts a time; the figures land in --benchmark-json and the terminal table."""

from __future__ import annotations

import json
import random

import pytest

from pytest_ftready.data.layouts import row_problems
from pytest_ftready.data.rows import Row
from pytest_ftready.tiny import example_rows
from tests import planted
from tests.benchmarks.corpus import plain_labels

ROWS = 3_000  # tests/benchmarks/test_scale.py measures a million (-m scale)


@pytest.fixture(scope="module")
def chat_rows():
    base = example_rows(200, seed=3)
    return [Row("bench.jsonl", i + 1, base[i % len(base)]) for i in range(ROWS)]


@pytest.fixture(scope="module")
def encoder(tiny_model_dir):
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from pytest_ftready.data.encoding import Encoder, stop_token_ids

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = SimpleNamespace(format="messages", train_on="assistant", max_length=128, add_special_tokens=False)
    return Encoder(tok, data, stop_token_ids(tok))


@pytest.mark.benchmark(group=f"data checks vs apply_chat_template, {ROWS:,} rows")
def test_format_masking_lengths(benchmark, chat_rows, encoder):
    from pytest_ftready.units import percentile

    def checks():
        good = [r for r in chat_rows if not row_problems(r, "messages", "assistant")]
        # the masks, labels and their verification, as the data pass makes them (spliced renders)
        encoded = encoder.encode_many([(r, encoder.sample(r)) for r in good])
        lengths = [e.full_length for e in encoded]
        return encoded, (percentile(lengths, 0.5), percentile(lengths, 0.95), max(lengths))

    encoded, (p50, p95, top) = benchmark.pedantic(checks, rounds=1, iterations=1)
    benchmark.extra_info["rows"] = ROWS
    benchmark.extra_info["rows_per_s"] = ROWS / benchmark.stats.stats.median
    assert len(encoded) == ROWS and all(not e.problems for e in encoded) and p50 <= p95 <= top


@pytest.mark.benchmark(group=f"data checks vs apply_chat_template, {ROWS:,} rows")
def test_row_by_row_encoding(benchmark, chat_rows, encoder):
    """The encoder without splicing: each row rendered (with its turn prompts) and tokenized alone."""
    encoded = benchmark.pedantic(lambda: [encoder.encode(r) for r in chat_rows], rounds=1, iterations=1)
    benchmark.extra_info["rows"] = ROWS
    benchmark.extra_info["rows_per_s"] = ROWS / benchmark.stats.stats.median
    assert len(encoded) == ROWS and encoder.fast.splicer is not None


@pytest.mark.benchmark(group=f"data checks vs apply_chat_template, {ROWS:,} rows")
def test_plain_apply_chat_template_with_labels(benchmark, chat_rows, encoder):
    """The issue's baseline: a plain script rendering each row with its assistant mask and labels."""
    tok = encoder.tok

    def plain():
        return plain_labels(tok, chat_rows)

    ids = benchmark.pedantic(plain, rounds=1, iterations=1)
    benchmark.extra_info["rows"] = ROWS
    benchmark.extra_info["rows_per_s"] = ROWS / benchmark.stats.stats.median
    assert len(ids) == ROWS


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """~0.5 MB of chat JSONL with the planted values sprinkled in."""
    rng = random.Random(11)
    base = example_rows(300, seed=5)
    plants = planted.rows()
    lines = [json.dumps(row) + "\n" for row in plants]  # every kind at least once
    size = sum(map(len, lines))
    while size < 500_000:
        row = rng.choice(plants) if rng.random() < 0.02 else rng.choice(base)
        line = json.dumps(row) + "\n"
        lines.append(line)
        size += len(line)
    path = tmp_path_factory.mktemp("scan") / "corpus.jsonl"
    path.write_text("".join(lines))
    return path


@pytest.mark.benchmark(group="secret scanning, 0.5 MB of JSONL")
def test_scanner_speed(benchmark, corpus):
    from pytest_ftready.privacy.audit import scan_files

    found, scanned, _ = benchmark.pedantic(lambda: scan_files([corpus], frozenset({"secrets", "pii"})),
                                           rounds=3, iterations=1)
    benchmark.extra_info["mb_per_s"] = scanned / 1e6 / benchmark.stats.stats.median
    assert {f.finding.kind for f in found} >= set(planted.SECRETS) | set(planted.PII)


@pytest.mark.benchmark(group="secret scanning, 0.5 MB of JSONL")
def test_detect_secrets_speed(benchmark, corpus):
    from detect_secrets import SecretsCollection
    from detect_secrets.settings import default_settings

    def scan():
        secrets = SecretsCollection()
        with default_settings():
            secrets.scan_file(str(corpus))
        return secrets

    secrets = benchmark.pedantic(scan, rounds=1, iterations=1)
    benchmark.extra_info["mb_per_s"] = corpus.stat().st_size / 1e6 / benchmark.stats.stats.median
    assert len(list(secrets)) > 0
