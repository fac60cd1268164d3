"""Scale benchmark (issue 15), marker ``scale``, deselected unless ``-m scale``: a generated
chat JSONL of FTREADY_SCALE_ROWS rows (default 200k, ~140 MB; 1M rows ~700 MB documented),
then the privacy scan, the manifest hash and the data checks (format, masking, lengths) over
all of it. Rows/s, MB/s, peak RSS and the issue's ratios land in the benchmark JSON
(``extra_info``); nothing asserts a time. Run:
``FTREADY_SCALE_ROWS=1000000 pytest tests/benchmarks/test_scale.py -m scale --benchmark-json=scale.json``."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time

import pytest

from tests.benchmarks.corpus import write_corpus

ROWS = int(os.environ.get("FTREADY_SCALE_ROWS", "200000"))
ALL = frozenset({"secrets", "pii"})
pytestmark = pytest.mark.scale


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("scale") / "chat.jsonl"
    return path, write_corpus(path, ROWS)


@pytest.mark.benchmark(group="scale: privacy scan")
def test_scan_throughput(benchmark, big_corpus):
    from pytest_ftready.data import prefilter, scan
    from pytest_ftready.data.audit import scan_files

    path, info = big_corpus
    found, scanned, _ = benchmark.pedantic(lambda: scan_files([path], ALL), rounds=1, iterations=1)
    seconds = benchmark.stats.stats.median
    # one combined Python regex over the same kinds, on the first 4 MB (it is ~100x slower)
    with open(path, encoding="utf-8") as handle:
        sample = handle.read(4_000_000)
    combined = re.compile("|".join(f"(?P<{k}>{scan._scoped(p)})" for k, p in scan._PATTERNS))
    start = time.perf_counter()
    for _ in combined.finditer(sample):
        pass
    regex_mb_s = len(sample.encode()) / 1e6 / (time.perf_counter() - start)
    mb_s = scanned / 1e6 / seconds
    benchmark.extra_info.update(rows=ROWS, bytes=scanned, engine=prefilter.engine()[0], mb_per_s=round(mb_s, 1),
                                rows_per_s=round(ROWS / seconds), combined_regex_mb_per_s=round(regex_mb_s, 2),
                                ratio_vs_combined_regex=round(mb_s / regex_mb_s, 1), peak_rss_mb=round(_peak_rss_mb()))
    kinds = {f.finding.kind for f in found}
    assert kinds >= set(info["planted"]), set(info["planted"]) - kinds


@pytest.mark.benchmark(group="scale: manifest hash")
def test_manifest_hash_against_sha256sum(benchmark, big_corpus):
    from pytest_ftready.data.manifest import file_entry

    path, info = big_corpus
    entry = benchmark.pedantic(lambda: file_entry(path, path.parent), rounds=1, iterations=1)
    start = time.perf_counter()
    out = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True).stdout
    tool = time.perf_counter() - start
    benchmark.extra_info.update(bytes=info["bytes"], mb_per_s=round(info["bytes"] / 1e6 / benchmark.stats.stats.median),
                                ratio_vs_sha256sum=round(tool / benchmark.stats.stats.median, 2))
    assert entry.sha256 == out.split()[0] and entry.rows == ROWS


@pytest.mark.benchmark(group="scale: data checks")
def test_data_checks_throughput(benchmark, big_corpus, tiny_model_dir):
    """Reading, layout problems, encoding with masks and verification, lengths: the work of
    data.format + data.masking + data.lengths, next to a plain script's pass (apply_chat_template
    with the assistant mask, then labels from the mask)."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from pytest_ftready.data.encoding import Encoder, stop_token_ids
    from pytest_ftready.data.layouts import row_problems
    from pytest_ftready.data.rows import read_rows
    from pytest_ftready.units import percentile

    path, info = big_corpus
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = SimpleNamespace(format="messages", train_on="assistant", max_length=128, add_special_tokens=False)
    encoder = Encoder(tok, data, stop_token_ids(tok))
    rss_before = _peak_rss_mb()

    def checks():
        rows, problems = read_rows([path])
        good = [r for r in rows if not row_problems(r, "messages", "assistant")]
        lengths = [encoder.encode(r).full_length for r in good]
        return len(rows), percentile(lengths, 0.95)

    count, p95 = benchmark.pedantic(checks, rounds=1, iterations=1)
    seconds = benchmark.stats.stats.median
    rows, _ = read_rows([path])
    sample = [r.data["messages"] for r in rows[:min(len(rows), 20_000)]]
    del rows
    start, labelled = time.perf_counter(), 0
    for messages in sample:  # the plain script: template, assistant mask, labels
        out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        labels = [t if m else -100 for t, m in zip(out["input_ids"], out["assistant_masks"])]
        labelled += len(labels)
    plain_rows_s = len(sample) / (time.perf_counter() - start)
    benchmark.extra_info.update(rows=ROWS, rows_per_s=round(count / seconds), mb_per_s=round(info["bytes"] / 1e6 / seconds, 2),
                                peak_rss_mb=round(_peak_rss_mb()), peak_rss_before_mb=round(rss_before),
                                plain_template_rows_per_s=round(plain_rows_s),
                                ratio_vs_plain_template=round(count / seconds / plain_rows_s, 2))
    assert count == ROWS and p95 > 0 and labelled > 0
