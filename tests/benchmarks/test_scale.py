"""Scale benchmark (issue 15), marker ``scale``, deselected unless ``-m scale``: a generated
chat JSONL of FTREADY_SCALE_ROWS rows (default 200k, ~140 MB; 1M rows ~700 MB documented),
then the privacy scan, the manifest hash and the data checks (format, masking, lengths) over
all of it. Rows/s, MB/s, peak RSS and the issue's ratios land in the benchmark JSON
(``extra_info``); nothing asserts a time. Run:
``FTREADY_SCALE_ROWS=1000000 pytest tests/benchmarks/test_scale.py -m scale --benchmark-json=scale.json``.
FTREADY_SCALE_TEXT=typographic or cyrillic writes the rows' contents in those scripts
(``tests/benchmarks/corpus.py``)."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time

import pytest

from pytest_ftready.data.passes import cpu_count
from tests.benchmarks.corpus import write_corpus

ROWS = int(os.environ.get("FTREADY_SCALE_ROWS", "200000"))
TEXT = os.environ.get("FTREADY_SCALE_TEXT", "ascii")
ALL = frozenset({"secrets", "pii"})
pytestmark = [pytest.mark.scale, pytest.mark.timeout(4 * 3600)]  # a million rows take a while on one core


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("scale") / "chat.jsonl"
    return path, write_corpus(path, ROWS, text=TEXT)


@pytest.mark.benchmark(group="scale: privacy scan")
def test_scan_throughput(benchmark, big_corpus):
    from pytest_ftready.privacy import prefilter, scan
    from pytest_ftready.privacy.audit import scan_files

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


@pytest.mark.benchmark(group="scale: privacy scan in workers")
def test_scan_one_worker_against_two(benchmark, big_corpus):
    """The scan in one process and in two workers, interleaved, best of 3 each (the machine's
    other load hits both alike); the findings, their order and the learned values identical."""
    from pytest_ftready.privacy.audit import scan_files

    path, info = big_corpus
    best = {1: float("inf"), 2: float("inf")}
    results = {}
    for _ in range(3):
        for workers in (1, 2):
            told: list = []
            start = time.perf_counter()
            found, scanned, _ = scan_files([path], ALL, learn=lambda value, kind: told.append((value, kind)),
                                           workers=workers)
            best[workers] = min(best[workers], time.perf_counter() - start)
            results.setdefault(workers, (found, told))
            assert (found, told) == results[1]
    # the benchmark's own timing: one more two-worker run, checked as well
    again = benchmark.pedantic(lambda: scan_files([path], ALL, workers=2), rounds=1, iterations=1)
    assert again[0] == results[1][0]
    benchmark.extra_info.update(rows=ROWS, bytes=scanned, cpus=cpu_count(),
                                **{f"mb_per_s_{n}_workers": round(scanned / 1e6 / best[n], 1) for n in best},
                                speedup=round(best[1] / best[2], 2))
    kinds = {f.finding.kind for f in results[1][0]}
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


def _plain_rows_per_s(path, model_dir, rows: int = 20_000) -> float:
    """The issue's baseline on one core: a plain script rendering each row with
    ``apply_chat_template(..., return_assistant_tokens_mask=True)`` and building its labels."""
    import json

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    with open(path, encoding="utf-8") as handle:
        sample = [json.loads(line)["messages"] for _, line in zip(range(rows), handle)]
    start = time.perf_counter()
    for messages in sample:
        out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        [t if m else -100 for t, m in zip(out["input_ids"], out["assistant_masks"])]
    return len(sample) / (time.perf_counter() - start)


@pytest.fixture(scope="module")
def corpus_recipe(big_corpus, tiny_example):
    path, _ = big_corpus
    recipe = tiny_example / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('train = ["data/train.jsonl"]', f'train = ["{path}"]')
                      .replace('manifest = "data/MANIFEST.json"\n', ""))
    return recipe


@pytest.fixture(scope="module")
def tiny_example(tmp_path_factory, tiny_model_dir):
    from tests.conftest import copy_example

    return copy_example(tmp_path_factory.mktemp("scale-example") / "tiny", tiny_model_dir)


ONE_WORKER: dict = {}
PEAK_LAUNCHER = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:]); "
                 "print(f'PEAK_KB={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}', file=sys.stderr)")


@pytest.mark.parametrize("workers", [1, cpu_count()], ids=lambda n: f"{n}-workers")
@pytest.mark.benchmark(group="scale: data checks")
def test_data_checks_throughput(benchmark, big_corpus, corpus_recipe, tiny_model_dir, workers, tmp_path):
    """data.format + data.masking + data.lengths through pytest, as a user runs them, in a
    process of its own (its peak RSS is the largest of that process and its workers)."""
    path, info = big_corpus
    command = [sys.executable, "-m", "pytest", f"--ftready={corpus_recipe}", "-p", "no:cacheprovider", "-q",
               "-k", "data.format or data.masking or data.lengths", f"--ftready-workers={workers}",
               f"--ftready-artifacts={tmp_path / 'arts'}", f"--junitxml={tmp_path / 'out.xml'}"]

    def run():  # through a launcher that reports the peak RSS of this run's processes alone
        return subprocess.run([sys.executable, "-c", PEAK_LAUNCHER, *command], capture_output=True, text=True,
                              cwd=tmp_path)

    done = benchmark.pedantic(run, rounds=1, iterations=1)
    seconds = benchmark.stats.stats.median
    peak_mb = int(done.stderr.rsplit("PEAK_KB=", 1)[1]) / 1024
    plain = ONE_WORKER.setdefault("plain", _plain_rows_per_s(path, tiny_model_dir))
    rows_per_s = ROWS / seconds
    if workers == 1:
        ONE_WORKER["rows_per_s"] = rows_per_s
    benchmark.extra_info.update(rows=ROWS, text=TEXT, workers=workers, rows_per_s=round(rows_per_s),
                                mb_per_s=round(info["bytes"] / 1e6 / seconds, 2), peak_rss_mb=round(peak_mb),
                                plain_template_rows_per_s=round(plain),
                                ratio_vs_plain_template=round(rows_per_s / plain, 2),  # the figure
                                ratio_vs_plain_template_per_worker=round(rows_per_s / workers / plain, 2),
                                speedup_vs_one_worker=round(rows_per_s / ONE_WORKER.get("rows_per_s", rows_per_s), 2))
    # the three checks ran to a verdict (the generated rows are longer than max_length: data.masking may fail)
    import xml.etree.ElementTree as ET

    cases = {case.get("name"): [child.tag for child in case if child.tag in ("failure", "skipped", "error")]
             for case in ET.parse(tmp_path / "out.xml").iter("testcase")}
    assert cases["data.format"] == cases["data.lengths"] == [] and cases["data.masking"] in ([], ["failure"]), (
        done.stdout[-3000:] + done.stderr[-3000:])


IDENTITY_ROWS = int(os.environ.get("FTREADY_SCALE_IDENTITY_ROWS", "100000"))


def test_one_and_n_workers_give_identical_findings_masks_and_lengths(tmp_path, tiny_model_dir):
    """The issue's proof on the 100k corpus: every problem (kinds, counts, places, order), every
    length, and the fingerprint of every row's tokens and labels agree for 1 and N workers."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from pytest_ftready.data.digest import Plan
    from pytest_ftready.data.encoding import Encoder, stop_token_ids
    from pytest_ftready.data.passes import run_pass

    path = tmp_path / "chat.jsonl"
    write_corpus(path, IDENTITY_ROWS)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = SimpleNamespace(format="messages", train_on="assistant", max_length=128, add_special_tokens=False, roles={})
    encoder = Encoder(tok, data, stop_token_ids(tok))
    plan = Plan(format="messages", train_on="assistant")
    one = run_pass([path], plan, encoder=encoder, workers=1)
    many = run_pass([path], plan, encoder=encoder, workers=max(2, cpu_count()))
    assert one.encoded == IDENTITY_ROWS and one.problems
    for name in ("problems", "bad", "bad_count", "full_lengths", "lengths", "fingerprint", "head",
                 "with_problems", "first_trainable", "layouts", "methods"):
        assert getattr(one, name) == getattr(many, name), name
    assert one.training_examples() == many.training_examples()
