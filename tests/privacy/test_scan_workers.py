"""The privacy scan in worker processes: text files in byte ranges cut just after a newline
(numbered as text mode numbers them, bare carriage returns included), tables whole; the
findings (places, fields, order) and the values told to ``learn`` are exactly those of one
process. Small parts (``part_bytes``) make many cuts in small files."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from pytest_ftready.privacy import audit
from pytest_ftready.privacy.audit import scan_files, scan_parts
from pytest_ftready.data.passes import PassFailed
from tests import planted
from tests.helpers import fails
from tests.benchmarks.corpus import write_corpus

ALL = frozenset({"secrets", "pii"})
PART = 16 * 1024
EMAIL = planted.PII["email"]
KEY = planted.SECRETS["aws_access_key_id"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("scan-workers")
    corpus = folder / "chat.jsonl"
    write_corpus(corpus, 600, plant_every=20)
    crlf = folder / "crlf.jsonl"
    crlf.write_bytes(corpus.read_bytes()[:120_000].replace(b"\n", b"\r\n") + json.dumps({"text": EMAIL}).encode())
    # bare CRs (text mode counts each as a line end) and a value on every line, so every cut has
    # a finding just before and just after it
    bare = folder / "notes.txt"
    bare.write_bytes(b"".join(b"note %d\r%s\r\n%s\n" % (k, EMAIL.encode(), b"x" * 700 + b" " + KEY.encode())
                              for k in range(120)))
    nul = folder / "dump.txt"  # NUL bytes (a binary-looking file is scanned as text all the same)
    nul.write_bytes(b"".join(b"\0\0\x01 row %d %s\0\n" % (k, EMAIL.encode()) + b"\0" * 900 + b"\n" for k in range(80)))
    table = folder / "table.csv"
    table.write_text("prompt,completion\n" + "".join(f"hi {k},write to {EMAIL}\n" for k in range(40)), encoding="utf-8")
    long_line = folder / "long.jsonl"  # one line longer than a part
    long_line.write_text(json.dumps({"text": "a " * 20_000 + "key " + KEY}) + "\n" + "{}\n" * 10, encoding="utf-8")
    return [corpus, crlf, bare, nul, table, long_line]


@pytest.fixture(scope="module")
def one_process(files):
    told: list = []
    found, size, _ = scan_files(files, ALL, learn=lambda value, kind: told.append((value, kind)), workers=1)
    return found, size, told


def test_parts_cut_text_files_at_line_ends_and_keep_tables_whole(files):
    parts = list(scan_parts(files, PART))
    for path in files:
        mine = [p for p in parts if p.path == path]
        if path.suffix == ".csv":
            assert [(p.start, p.end) for p in mine] == [(0, None)]
            continue
        data = path.read_bytes()
        assert mine[0].start == 0 and mine[-1].end == len(data)
        assert all(a.end == b.start for a, b in zip(mine, mine[1:]))
        assert all(data[p.end - 1:p.end] == b"\n" for p in mine[:-1])
    assert len([p for p in parts if p.path == files[0]]) > 10
    long_line = files[-1].read_bytes()  # a line longer than a part is not split
    assert [p.end for p in parts if p.path == files[-1]][0] == long_line.index(b"\n") + 1


def test_workers_find_what_one_process_finds_in_the_same_order(files, one_process):
    one, size_one, told_one = one_process
    told_two: list = []
    two, size_two, _ = scan_files(files, ALL, learn=lambda value, kind: told_two.append((value, kind)), workers=2,
                                  part_bytes=PART)
    assert len(one) > 300 and {f.file for f in one} == {str(f) for f in files}
    assert two == one and told_two == told_one and size_two == size_one


def test_line_numbers_are_text_mode_lines(files, one_process):
    """Every line of notes.txt as text mode reads it (bare CRs split lines) holds one value:
    the numbers are 1..N with no gap, across every cut."""
    one = one_process[0]
    bare, nul = files[2], files[3]
    with open(bare, encoding="utf-8") as handle:
        text_lines = handle.readlines()
    assert len(text_lines) == 360
    kinds_by_line = [(f.line, f.finding.kind) for f in one if f.file == str(bare)]
    expected = [(3 * k + 2, "email") for k in range(120)]
    expected = sorted(expected + [(3 * k + 3, "aws_access_key_id") for k in range(120)])
    assert kinds_by_line == expected
    assert [f.line for f in one if f.file == str(nul)] == [2 * k + 1 for k in range(80)]
    assert [f.line for f in one if f.file == str(files[4])] == list(range(1, 41))  # table rows


class DyingPath(type(Path())):
    """A path whose opening kills a worker process as an out-of-memory kill would."""

    def __fspath__(self) -> str:
        if multiprocessing.parent_process() is not None:
            os._exit(9)
        return super().__fspath__()


def test_a_worker_that_dies_is_one_clear_failure(files, monkeypatch):
    real = scan_parts

    def parts(paths, part_bytes=None):
        for part in real(paths, part_bytes):
            yield audit.ScanPart(DyingPath(part.path), part.start, part.end) if part.start > 0 else part

    monkeypatch.setattr(audit, "scan_parts", parts)
    with pytest.raises(PassFailed, match=r"worker process scanning the files for secrets and personal data died "
                                         r".* run with --ftready-workers=1"):
        scan_files(files[:1], ALL, workers=2, part_bytes=PART)


def test_a_dying_scan_worker_fails_the_privacy_checks_in_one_line(make_state, run_check, monkeypatch):
    real = scan_parts

    def parts(paths, part_bytes=None):  # the tiny example's data in small parts, the second one deadly
        for part in real(paths, 512):
            yield audit.ScanPart(DyingPath(part.path), part.start, part.end) if part.start > 0 else part

    monkeypatch.setattr(audit, "scan_parts", parts)
    state = make_state()
    state.run.data_workers = 2
    fails(run_check, state, "privacy.secrets", "a worker process scanning the files for secrets and personal data died",
          "run with --ftready-workers=1")


def test_one_part_or_one_worker_scans_in_this_process(files, monkeypatch):
    def no_workers(*args, **kwargs):
        raise AssertionError("no worker process for a single part")

    monkeypatch.setattr(audit, "_scan_in_workers", no_workers)
    assert scan_files(files[4:5], ALL, workers=2)[0]  # a table: one part
    assert scan_files(files[:1], ALL, workers=2)[0]  # smaller than a part


@pytest.mark.parametrize("read_size", [1, 2, 3, 7])
def test_line_ends_are_counted_as_text_mode_counts_them_whatever_the_reads(tmp_path, read_size):
    """A CRLF split between two reads is one line end; a bare CR is one."""
    data = b"a\r\nb\rc\r\r\nd\n\re\r\n"
    path = tmp_path / "crs.txt"
    path.write_bytes(data)
    with open(path, "rb") as handle:
        piece = audit._Range(handle, len(data))
        while piece.read(read_size):
            pass
    with open(path, encoding="utf-8") as handle:
        assert piece.lines == len(handle.readlines()) == 7


def test_workers_start_by_themselves_only_for_large_files(tmp_path):
    """Two scan workers take ~0.7 s to start: by themselves they start from 512 MiB, not from
    the 256 MiB of a read-only data pass."""
    from pytest_ftready.data.passes import PARALLEL_MIN_BYTES, PER_WORKER_BYTES, cpu_count, workers_for

    def sized(name: str, size: int) -> Path:
        path = tmp_path / name
        with open(path, "wb") as handle:  # sparse: only the size counts
            handle.truncate(size)
        return path

    middle = sized("middle.jsonl", 300 << 20)
    large = sized("large.jsonl", PARALLEL_MIN_BYTES["scan"])
    assert workers_for(None, [middle], False, work="scan") == 1
    assert workers_for(None, [middle], False) == min(cpu_count(), (300 << 20) // PER_WORKER_BYTES)
    assert workers_for(None, [large], False, work="scan") == min(cpu_count(), PARALLEL_MIN_BYTES["scan"] // PER_WORKER_BYTES)
    assert workers_for(3, [middle], False, work="scan") == 3
