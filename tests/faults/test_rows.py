"""Fault: broken training files. data.format names each bad place (file:line), reads the
rest, holds no more than one bounded line in memory, and never shows a traceback."""

from __future__ import annotations

import json
import tracemalloc

from pytest_ftready.data.rows import MAX_LINE_BYTES, read_rows

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
LINE = json.dumps(GOOD)


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_every_broken_line_is_named_and_the_good_ones_are_read(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    data = _write(tmp_path / "train.jsonl", b"\n".join([
        b"\xef\xbb\xbf" + LINE.encode(),  # 1: a byte-order mark: read
        LINE.encode() + b"\r",  # 2: CRLF: read
        b'{"messages": "caf\xe9"}',  # 3: Latin-1, not UTF-8
        deep.encode(),  # 4: nested deeper than the parser goes
        b"[1, 2, 3]",  # 5: not an object (data.format's shape check)
        b'{"n": ' + b"9" * 5000 + b"}",  # 6: an integer Python refuses to convert
        b"{not json",  # 7
        b"",  # 8: blank: ignored
        LINE.encode(),  # 9
    ]) + b"\n")
    rows, problems = read_rows([data])
    assert [r.line for r in rows] == [1, 2, 5, 9] and rows[0].data == GOOD
    found = {p.line: (p.kind, p.detail) for p in problems}
    assert found[3] == ("encoding", "not valid UTF-8 (byte 18 of the line): re-encode the file as UTF-8")
    assert found[4] == ("malformed", "JSON nested too deeply to parse")
    assert found[6][0] == "malformed" and "4300" in found[6][1]
    assert found[7][0] == "malformed" and set(found) == {3, 4, 6, 7}


def test_a_50_mb_line_is_reported_without_holding_it(tmp_path):
    huge = tmp_path / "train.jsonl"
    with huge.open("wb") as handle:
        handle.write(LINE.encode() + b"\n")
        handle.write(b'{"text": "' + b"a" * (50 * 2**20) + b'"}\n')
        handle.write(LINE.encode() + b"\n")
    tracemalloc.start()
    rows, problems = read_rows([huge])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [r.line for r in rows] == [1, 3]
    assert [(p.line, p.kind) for p in problems] == [(2, "too_long")] and "52,428,813 bytes" in problems[0].detail
    assert peak < 2 * MAX_LINE_BYTES + 4 * 2**20  # bounded by the line limit, not by the 50 MB line


def test_empty_file_folder_and_missing_file_are_named(tmp_path):
    empty = _write(tmp_path / "empty.jsonl", b"")
    folder = tmp_path / "shards.jsonl"
    folder.mkdir()
    rows, problems = read_rows([empty, folder, tmp_path / "gone.jsonl"])
    assert rows == []
    assert [(p.where, p.detail) for p in problems] == [
        ("empty.jsonl:0", "is empty: it holds no rows"),
        ("shards.jsonl:0", "is a folder, not a file: list the files inside it in [data] train"),
        ("gone.jsonl:0", "does not exist")]


def test_data_format_reports_each_fault_by_file_and_line(make_state, fails, tiny_example):
    data = tiny_example / "data" / "train.jsonl"
    lines = data.read_bytes().splitlines()
    lines[2] = b'{"messages": "caf\xe9"}'
    lines[4] = b"[" * 50_000 + b"]" * 50_000
    lines[6] = b'"just a string"'
    data.write_bytes(b"\r\n".join(lines) + b"\r\n")
    empty = tiny_example / "data" / "empty.jsonl"
    empty.write_bytes(b"")
    state = make_state(train=f'["{data}", "{empty}"]')
    message = fails(state, "data.format")
    assert message.startswith(f"4 of {len(lines) + 1} rows are unusable")
    assert "train.jsonl:3: not valid UTF-8 (byte 18 of the line): re-encode the file as UTF-8" in message
    assert "train.jsonl:5: JSON nested too deeply to parse" in message
    assert "train.jsonl:7: expected a JSON object, got str" in message
    assert "empty.jsonl:0: is empty: it holds no rows" in message
    assert "Traceback" not in message
