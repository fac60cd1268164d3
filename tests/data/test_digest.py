"""The streaming data pass (data/rows.chunks, data/digest, data/passes): chunks number lines as
one read does, digests of chunks merge into the digest of everything, worker processes give
the same digest as one process, and what is kept stays within its bounds."""

from __future__ import annotations

import dataclasses
import json
import os
from types import SimpleNamespace

import pytest

from pytest_ftready.data import meter, passes, rows as rows_module
from pytest_ftready.data.digest import Plan, row_fingerprint
from pytest_ftready.data.layouts import read_sample
from pytest_ftready.data.encoded import BLOCKING
from pytest_ftready.data.encoding import Encoder, stop_token_ids
from pytest_ftready.data.passes import PassFailed, run_pass
from pytest_ftready.data.rows import chunks, read_rows
from tests.benchmarks.corpus import write_corpus

PLAN = Plan(format="auto", train_on="assistant", sample=3, keep_rows=7, keep_first=5, keep_longest=4)
BAD = [b'{"messages": "caf\xe9"}', b"{not json", b'{"text": ""}', b"[1, 2]"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """~1,000 chat rows (long ones are truncated at max_length 64), broken lines among them,
    a second file in another layout, a BOM and CRLF line ends."""
    folder = tmp_path_factory.mktemp("digest")
    first = folder / "chat.jsonl"
    write_corpus(first, 1000, seed=7)
    lines = first.read_bytes().splitlines()
    for k, bad in enumerate(BAD):
        lines.insert(200 * (k + 1), bad)
    first.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(lines) + b"\r\n")
    second = folder / "plain.jsonl"
    second.write_text("".join(json.dumps({"prompt": f"Q{i}: " + "word " * (i % 90), "completion": f"A{i}."}) + "\n"
                              for i in range(300)))
    return [first, second]


@pytest.fixture(scope="module")
def encoder(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = SimpleNamespace(format="auto", train_on="assistant", max_length=64, add_special_tokens=False, roles={})
    return Encoder(tok, data, stop_token_ids(tok))


@pytest.fixture(scope="module")
def whole(corpus, encoder):
    """The digest of one chunk holding everything."""
    return run_pass(corpus, PLAN, encoder=encoder, chunk_bytes=1 << 30)


def normal(digest) -> dict:
    """Every field of a digest; the heap of the longest examples in a fixed order."""
    fields = dict(vars(digest))
    fields["longest"] = sorted((item.entry for item in digest.longest), key=lambda entry: entry[:2])
    return fields


def test_chunks_number_every_line_as_one_read_does(corpus, monkeypatch):
    whole = [list(chunk.items()) for chunk in chunks(corpus, 1 << 30)]
    whole = [item for part in whole for item in part]
    rows, problems = read_rows(corpus)
    assert len(rows) + len(problems) == len(whole) == 1304 and rows[0].data["messages"]  # the BOM is gone
    assert [(p.line, p.kind) for p in problems] == [(201, "encoding"), (401, "malformed")]
    monkeypatch.setattr(rows_module, "MAX_LINE_BYTES", 300)  # long lines cross chunk ends as "too_long"
    small = [item for chunk in chunks(corpus, 97) for item in chunk.items()]
    again = [item for chunk in chunks(corpus, 1 << 30) for item in chunk.items()]
    assert small == again
    assert [i.line for i in small] == [i.line for i in whole]
    assert any(getattr(i, "kind", "") == "too_long" for i in small)


def test_the_digest_of_chunks_is_the_digest_of_everything(corpus, encoder, whole):
    one = whole
    many = run_pass(corpus, PLAN, encoder=encoder, chunk_bytes=4096)
    assert normal(one) == normal(many)
    assert one.total == 1304 and one.bad_count == 4 and one.encoded == 1300
    assert [b[1] for b in one.bad] == [201, 401, 601, 801]  # text "" and a list are unusable rows
    assert one.count("truncated_part") > 10 and len(one.problems["truncated_part"].first) == 10
    assert set(one.layouts) == {"messages", "prompt_completion"}


def test_what_is_kept_is_bounded_and_holds_the_longest_of_all(corpus, encoder, whole):
    digest = whole
    read = [(row, read_sample(row, PLAN.format, PLAN.train_on)) for row in read_rows(corpus)[0]]
    everything = [encoder.encode(row, sample) for row, (sample, problems) in read if not problems]
    assert len(everything) == digest.encoded and list(digest.full_lengths) == [e.full_length for e in everything]
    assert (len(digest.head), len(digest.with_problems), len(digest.usable_rows)) == (3, 3, 7)
    trainable = digest.training_examples()
    assert trainable[:5] == digest.first_trainable and len(trainable) <= 5 + 4
    trains = [e for e in everything if e.trained and not any(kind in BLOCKING for kind, _ in e.problems)]
    assert trainable[:5] == trains[:5]
    by_length = sorted(trains, key=lambda e: e.length, reverse=True)
    longest = sorted(trainable, key=lambda e: e.length, reverse=True)[:4]
    assert [e.length for e in longest] == [e.length for e in by_length[:4]]
    assert len(digest.trainable_lengths) == digest.trainable
    # the fingerprint covers every token and label of every row
    changed = dataclasses.replace(trains[-1], labels=(-100,) * trains[-1].length)
    assert row_fingerprint(changed) != row_fingerprint(trains[-1])
    assert sum(map(row_fingerprint, everything)) % 2**64 == digest.fingerprint


def test_worker_processes_give_the_same_digest(corpus, encoder, whole):
    one = whole
    two = run_pass(corpus, PLAN, encoder=encoder, workers=2, chunk_bytes=16384)
    assert normal(one) == normal(two)
    read_one = run_pass(corpus, PLAN, workers=1, chunk_bytes=16384)
    read_two = run_pass(corpus, PLAN, workers=2, chunk_bytes=16384)
    assert normal(read_one) == normal(read_two) and not read_two.encoding and read_two.bad_count == 4


class DyingEncoder:
    """Dies in the worker as an out-of-memory kill would."""

    def encode_many(self, pairs):
        os._exit(9)


def test_a_worker_that_dies_is_one_clear_failure(corpus):
    with pytest.raises(PassFailed, match=r"died .* run with --ftready-workers=1"):
        run_pass(corpus, PLAN, encoder=DyingEncoder(), workers=2, chunk_bytes=16384)


def test_a_long_pass_reports_rows_per_second_and_an_eta(corpus, encoder, monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(meter, "QUIET_SECONDS", -1.0)
    run_pass(corpus, PLAN, encoder=encoder, chunk_bytes=65536, progress=lines.append)
    assert len(lines) > 3 and all("rows/s, ETA" in line for line in lines)
    assert lines[-1].startswith("data: encoded 1,304 rows (100% of ")


def test_csv_rows_are_strings_and_a_ragged_row_is_named(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text('prompt,completion\n"Hi, there",Hello.\n2,3\nonly one\n"a","b","c"\n', encoding="utf-8")
    rows, problems = read_rows([path])
    assert [(r.line, r.data) for r in rows] == [(1, {"prompt": "Hi, there", "completion": "Hello."}),
                                                (2, {"prompt": "2", "completion": "3"})]
    assert [(p.line, p.detail) for p in problems] == [
        (3, "has fewer fields than the header names (2): quote fields that hold commas"),
        (4, "has more fields than the header names (2): quote fields that hold commas")]


def test_parquet_is_read_in_batches_numbered_across_them(tmp_path, monkeypatch):
    import pandas

    monkeypatch.setattr(rows_module, "BATCH_ROWS", 3)
    path = tmp_path / "train.parquet"
    pandas.DataFrame([{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(8)]).to_parquet(path)
    parts = list(chunks([path]))
    assert [len(part.rows) for part in parts] == [3, 3, 2]
    rows, _ = read_rows([path])
    assert [(r.line, r.data["prompt"]) for r in rows] == [(i + 1, f"q{i}") for i in range(8)]


def test_the_scan_reads_csv_and_parquet_rows_as_the_data_pass_does(tmp_path):
    import pandas

    from pytest_ftready.privacy.audit import scan_file
    from tests import planted

    card, email = planted.CARD, planted.PII["email"]
    (tmp_path / "train.csv").write_text(f"prompt,completion\nhello,hi\n\"pay with {card}\",ok\n", encoding="utf-8")
    pandas.DataFrame([{"prompt": "a", "completion": "b"}, {"prompt": f"mail {email}", "completion": "c"}]).to_parquet(
        tmp_path / "train.parquet")
    found = [(f.line, f.finding.kind) for name in ("train.csv", "train.parquet")
             for f in scan_file(tmp_path / name, frozenset({"pii"}))]
    assert found == [(2, "payment_card"), (2, "email")]


def test_the_recipe_state_passes_its_worker_count_and_gets_the_same_facts(make_state, run_check, monkeypatch):
    pools = []
    real = passes._in_workers
    monkeypatch.setattr(passes, "_in_workers", lambda *args: pools.append(args[4]) or real(*args))
    one, two = make_state(), make_state()
    two.run.data_workers = 2
    masking = [{m.name: m.value for m in run_check(state, "data.masking").measured} for state in (one, two)]
    assert masking[0] == masking[1] and masking[0]["encoded_fingerprint"] != f"{0:016x}"
    assert one.trainable_examples == two.trainable_examples and one.length_p95 == two.length_p95
    assert pools == [2]  # the tiny data alone is read in one process; two's pass ran in 2 workers


def test_a_json_array_is_read_element_by_element_across_pieces(tmp_path, monkeypatch):
    elements = [{"prompt": f"q{i} \u00e9\u4e2d", "completion": [i, 1.5e3, None, True, "a]b,c"]} for i in range(40)]
    path = tmp_path / "train.json"
    path.write_text(" \n[ " + ",\n ".join(json.dumps(e, ensure_ascii=False) for e in elements) + " ]\n", encoding="utf-8")
    monkeypatch.setattr(rows_module, "_CHUNK", 7)  # elements, numbers and separators cut between pieces
    monkeypatch.setattr(rows_module, "BATCH_ROWS", 16)
    rows, problems = read_rows([path])
    assert [r.data for r in rows] == elements and [r.line for r in rows] == list(range(1, 41)) and not problems
    assert [len(chunk.rows) for chunk in chunks([path])] == [16, 16, 8]
    path.write_text('[{"text": "a"}, {"text": 12345}, {"text": oops}, {"text": "never read"}]', encoding="utf-8")
    rows, problems = read_rows([path])
    assert [r.data["text"] for r in rows] == ["a", 12345]
    assert [(p.line, p.kind) for p in problems] == [(3, "malformed")] and "not valid JSON" in problems[0].detail


def test_workers_never_run_the_starting_script_again(corpus, tmp_path):
    """A script without an ``if __name__ == "__main__"`` guard starts the pass once: the
    spawned workers do not import it again."""
    import subprocess
    import sys

    script = tmp_path / "no_guard.py"
    script.write_text("from pytest_ftready.data.digest import Plan\n"
                      "from pytest_ftready.data.passes import run_pass\n"
                      "print('script ran', flush=True)\n"
                      f"digest = run_pass({[str(p) for p in corpus]!r}, Plan('auto', 'assistant'), workers=2, "
                      "chunk_bytes=65536)\n"
                      "print('rows', digest.total)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.stdout.splitlines() == ["script ran", "rows 1304"], done.stdout + done.stderr


def test_a_long_scan_reports_its_bytes_rate_and_eta(corpus, monkeypatch):
    from pytest_ftready.privacy import prefilter
    from pytest_ftready.privacy.audit import scan_files

    lines: list[str] = []
    monkeypatch.setattr(meter, "QUIET_SECONDS", -1.0)
    monkeypatch.setattr(prefilter, "CHUNK", 65536)
    found, scanned, _ = scan_files(corpus, frozenset({"secrets", "pii"}), progress=lines.append)
    assert found and len(lines) > 5 and all(line.startswith("privacy scan: ") and "MB/s, ETA" in line for line in lines)
    assert f"of {lines[-1].split(' of ')[1].split(' (')[0]} (100%)" in lines[-1]  # every byte done


class SlowEncoder:
    """Leaves its worker's pid in a folder, then takes its time."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def encode_many(self, pairs):
        import pathlib
        import time

        pathlib.Path(self.folder, str(os.getpid())).touch()
        time.sleep(60)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc (Linux)")
def test_workers_end_with_a_killed_main_process(corpus, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    pids = tmp_path / "pids"
    pids.mkdir()
    script = ("import sys; from pytest_ftready.data.digest import Plan; from pytest_ftready.data.passes import run_pass; "
              "from tests.data.test_digest import SlowEncoder; "
              f"run_pass({[str(p) for p in corpus]!r}, Plan('auto', 'assistant'), encoder=SlowEncoder({str(pids)!r}), "
              "workers=2, chunk_bytes=65536)")
    main = subprocess.Popen([sys.executable, "-c", script], cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()})
    deadline = time.monotonic() + 60
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    workers = [int(p.name) for p in pids.iterdir()]
    assert len(workers) == 2
    main.send_signal(signal.SIGKILL)
    main.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_the_worker_count_follows_the_cpus_and_the_size_of_the_data(tmp_path, monkeypatch):
    from pytest_ftready.data.passes import workers_for

    monkeypatch.setattr(passes, "cpu_count", lambda: 64)
    data = tmp_path / "train.jsonl"
    with data.open("wb") as handle:
        handle.truncate(40 * 2**20)  # 40 MiB: workers pay off, ten with 4 MiB each
    assert (workers_for(None, [data], True), workers_for(None, [data], False), workers_for(3, [data], True)) == (10, 1, 3)
    monkeypatch.setattr(passes, "cpu_count", lambda: 2)
    assert workers_for(None, [data], True) == 2
    data.write_text('{"text": "a"}\n')
    assert workers_for(None, [data], True) == 1


def test_a_rows_place_names_its_own_file_however_many_files_came_before():
    from pathlib import Path

    from pytest_ftready.data.rows import Row, RowProblem

    files = ["/data/a/train.jsonl", "rel/dir/other.csv", "plain.jsonl", "/data/b/train.jsonl"] * 2
    for line, file in enumerate(files, 1):
        assert Row(file, line, {}).where == f"{Path(file).name}:{line}"
        assert RowProblem(file, line, "k", "d").where == f"{Path(file).name}:{line}"


def test_a_kind_counts_once_per_row_with_every_detail_of_that_row():
    """A row whose two turns are trained wrongly is one row in "wrong_role_trained in N row(s)",
    listed once, its two details kept (the list used to repeat the row once per turn)."""
    from pytest_ftready.data.digest import DataDigest
    from pytest_ftready.data.encoding import Encoded

    def row(line: int):
        return SimpleNamespace(where=f"train.jsonl:{line}", data={})

    digest = DataDigest(PLAN)
    two = (("wrong_role_trained", "3 tokens of user turn 1"), ("wrong_role_trained", "2 tokens of user turn 3"),
           ("stop_untrained", "turn 2 ends untrained"))
    digest.add_encoded(Encoded(row(1), (1, 2), (1, 2), "test", 2, 2, two))
    digest.add_encoded(Encoded(row(2), (1, 2), (1, 2), "test", 2, 2, two[:1]))
    places = digest.problems["wrong_role_trained"]
    assert places.count == 2 and [where for where, _ in places.first] == ["train.jsonl:1", "train.jsonl:2"]
    assert places.first[0][1] == "3 tokens of user turn 1; 2 tokens of user turn 3"
    assert digest.problems["stop_untrained"].count == 1


def test_the_cycle_collector_is_off_while_a_chunk_is_encoded_and_on_after_even_when_it_fails(tmp_path):
    import gc

    from pytest_ftready.data.digest import digest_chunk

    path = tmp_path / "chat.jsonl"
    write_corpus(path, 20)
    chunk = next(chunks([path]))
    seen = []

    def encode(pairs):
        seen.append(gc.isenabled())
        raise RuntimeError("boom")

    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="boom"):
        digest_chunk(chunk, Plan(format="messages", train_on="assistant"), encode)
    assert seen == [False] and gc.isenabled()
    gc.disable()  # a caller that had it off keeps it off
    try:
        digest_chunk(chunk, Plan(format="messages", train_on="assistant"))
        assert not gc.isenabled()
    finally:
        gc.enable()
