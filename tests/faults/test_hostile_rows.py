"""Hostile and careless training files, one test each: odd files (FIFOs, sockets, devices,
links), odd bytes (surrogates, NULs, other encodings, compressed data) and odd shapes. Each file
is read as data.format reads it (rows, then each row's layout); every row ends usable or with a
problem that names its file and line, and nothing raises. Unit-level (the row reader), no model."""

from __future__ import annotations

import gzip
import json
import os
import socket

import pytest

from pytest_ftready.data.layouts import read_sample
from pytest_ftready.data.rows import read_rows

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
GOOD = json.dumps(CHAT)


def verdicts(path) -> list[tuple[str, str]]:
    """(file:line, "ok" or the problem) for every row and every problem, in line order."""
    rows, problems = read_rows([path])
    out = [(p.where, p.detail) for p in problems]
    for row in rows:
        _, found = read_sample(row, "auto", "assistant")
        out.append((row.where, "; ".join(found) or "ok"))
    return sorted(out, key=lambda pair: int(pair[0].rsplit(":", 1)[1]))


def lines(*items: str) -> bytes:
    return "\n".join(items).encode() + b"\n"


def fifo(path):
    os.mkfifo(path)


def unix_socket(path):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()


def link_to(target):
    return lambda path: path.symlink_to(target)


def loop(path):
    other = path.with_name("other.jsonl")
    path.symlink_to(other)
    other.symlink_to(path)


def raw(data: bytes):
    return lambda path: path.write_bytes(data)


def surrogate_in(message_content: str):
    row = {"messages": [{"role": "user", "content": message_content}, {"role": "assistant", "content": "ok"}]}
    return raw(lines(GOOD, json.dumps(row)))  # json.dumps writes a lone surrogate as its \\ud... escape


def parquet_garbage(path):
    path.write_bytes(b"PAR1" + os.urandom(64) + b"PAR1")


NOT_REGULAR = "is not a regular file (a FIFO, socket or device): write the rows to a file on disk"
SURROGATE = "a \\ud800-\\udfff escape without its pair (a lone surrogate) is not Unicode text: fix the escape"
ENCODING = "not valid UTF-8"

# (id, file name, how to make it, [(line, words of its verdict)])
CASES = [
    ("fifo", "train.jsonl", fifo, [(0, NOT_REGULAR)]),
    ("unix-socket", "train.jsonl", unix_socket, [(0, NOT_REGULAR)]),
    ("link-to-dev-null", "train.jsonl", link_to("/dev/null"), [(0, NOT_REGULAR)]),
    ("link-to-dev-zero", "train.jsonl", link_to("/dev/zero"), [(0, NOT_REGULAR)]),
    ("dangling-link", "train.jsonl", link_to("/nonexistent/ftready/train.jsonl"), [(0, "does not exist")]),
    ("symlink-loop", "train.jsonl", loop, [(0, "does not exist")]),
    ("link-to-a-good-file", "train.jsonl", None, [(1, "ok")]),
    ("lone-high-surrogate", "train.jsonl", surrogate_in("\ud800"), [(1, "ok"), (2, SURROGATE)]),
    ("lone-low-surrogate", "train.jsonl", surrogate_in("tail \udc00"), [(1, "ok"), (2, SURROGATE)]),
    ("reversed-surrogate-pair", "train.jsonl", surrogate_in("\ude00\ud83d"), [(1, "ok"), (2, SURROGATE)]),
    ("surrogate-in-a-key", "train.jsonl", raw(lines('{"messages": [], "\\udbff": 1}')), [(1, SURROGATE)]),
    ("surrogate-in-a-json-array", "train.json", raw(b'[{"text": "a"}, {"text": "\\ud800"}]'),
     [(1, "ok"), (2, SURROGATE)]),
    ("valid-surrogate-pair", "train.jsonl", surrogate_in("\U0001F600"), [(1, "ok"), (2, "ok")]),
    ("escaped-nul-in-content", "train.jsonl", surrogate_in("a\x00b"), [(1, "ok"), (2, "ok")]),
    ("raw-nul-byte-in-a-line", "train.jsonl", raw(lines(GOOD, '{"text": "a\x00b"}')),
     [(1, "ok"), (2, "not valid JSON (Invalid control character")]),
    ("utf-16-file", "train.jsonl", raw(GOOD.encode("utf-16")), [(1, ENCODING)]),
    ("cp1252-smart-quotes", "train.jsonl", raw(lines(GOOD) + '{"text": "\u201cquoted\u201d"}\n'.encode("cp1252")),
     [(1, "ok"), (2, ENCODING)]),
    ("gzip-bytes-named-jsonl", "train.jsonl", raw(gzip.compress(lines(GOOD) * 50, mtime=0).replace(b"\n", b"")),
     [(1, ENCODING)]),
    ("gzip-extension", "train.jsonl.gz", raw(gzip.compress(lines(GOOD))), [(0, "unsupported file type '.gz'")]),
    ("no-extension", "train", raw(lines(GOOD)), [(0, "unsupported file type ''")]),
    ("only-blank-lines", "train.jsonl", raw(b"\n \n\t\r\n" + b" " * (1 << 20) + b"\n"), []),
    ("cr-only-line-ends", "train.jsonl", raw((GOOD + "\r" + GOOD + "\r").encode()), [(1, "not valid JSON (Extra data")]),
    ("bom-on-a-later-line", "train.jsonl", raw(lines(GOOD) + b"\xef\xbb\xbf" + lines(GOOD)),
     [(1, "ok"), (2, "not valid JSON (Unexpected UTF-8 BOM")]),
    ("last-line-cut-mid-row", "train.jsonl", raw(lines(GOOD) + GOOD[:20].encode()), [(1, "ok"), (2, "not valid JSON")]),
    ("json-nan", "train.jsonl", raw(lines('{"text": NaN}')), [(1, "'text'")]),
    ("json-infinity-in-content", "train.jsonl",
     raw(lines('{"messages": [{"role": "user", "content": Infinity}, {"role": "assistant", "content": "x"}]}')),
     [(1, "messages[0] (user) has content of type float, not text")]),
    ("duplicate-keys-last-wins", "train.jsonl", raw(lines('{"messages": 1, "messages": ' + json.dumps(CHAT["messages"]) + "}")),
     [(1, "ok")]),
    ("row-is-a-string", "train.jsonl", raw(lines('"hello"')), [(1, "expected a JSON object, got str")]),
    ("row-is-null", "train.jsonl", raw(lines("null")), [(1, "expected a JSON object, got NoneType")]),
    ("unknown-role", "train.jsonl", raw(lines(GOOD.replace('"user"', '"hacker"'))),
     [(1, "messages[0].role is 'hacker'; expected one of")]),
    ("empty-message-list", "train.jsonl", raw(lines('{"messages": []}')), [(1, "needs a non-empty list field 'messages'")]),
    ("content-a-number", "train.jsonl", raw(lines(GOOD.replace('"hi"', "42"))),
     [(1, "messages[0] (user) has content of type int, not text")]),
    ("tool-calls-not-a-list", "train.jsonl",
     raw(lines(json.dumps({"messages": [{"role": "user", "content": "x"},
                                        {"role": "assistant", "content": "y", "tool_calls": "get_weather()"}]}))),
     [(1, "messages[1].tool_calls must be a list")]),
    ("tools-not-json", "train.jsonl", raw(lines(json.dumps({**CHAT, "tools": "{not json"}))),
     [(1, "'tools' is a string that is not valid JSON")]),
    ("bidi-and-zero-width-characters", "train.jsonl", surrogate_in("\u202eevil\u200b\u2066"), [(1, "ok"), (2, "ok")]),
    ("csv-ragged-row", "train.csv", raw(b"text,extra\nhello,1\nworld\n"), [(1, "ok"), (2, "fewer fields than the header")]),
    ("csv-nul-byte-kept-as-text", "train.csv", raw(b"text\nhel\x00lo\n"), [(1, "a text row trains on every token")]),
    ("csv-latin-1", "train.csv", raw("text\ncaf\u00e9\n".encode("latin-1")), [(1, "cannot read the csv here")]),
    ("parquet-garbage", "train.parquet", parquet_garbage, [(0, "ArrowInvalid")]),
    ("json-array-cut-short", "train.json", raw(b'[{"text": "a"}, {"text": "b'), [(1, "ok"), (2, "the rows after it are not read")]),
    ("json-array-of-numbers", "train.json", raw(b"[1, 2]"), [(1, "expected a JSON object, got int"),
                                                            (2, "expected a JSON object, got int")]),
    ("json-array-after-blank-lines", "train.json", raw(b"\n\n  [" + GOOD.encode() + b"]"), [(1, "ok")]),
    ("json-object-file", "train.json", raw(GOOD.encode()), [(1, "ok")]),
    ("deleted-before-reading", "train.jsonl", lambda path: None, [(0, "does not exist")]),
    ("truncated-to-zero", "train.jsonl", raw(b""), [(0, "is empty: it holds no rows")]),
]


@pytest.mark.parametrize("case, name, make, expected", CASES, ids=[c[0] for c in CASES])
def test_hostile_file_ends_in_a_verdict_per_row(tmp_path, case, name, make, expected):
    path = tmp_path / name
    if make is None:  # a link to a good file: read through the link
        target = tmp_path / "real.jsonl"
        target.write_bytes(lines(GOOD))
        path.symlink_to(target)
    else:
        make(path)
    got = verdicts(path)
    assert [where for where, _ in got] == [f"{name}:{line}" for line, _ in expected], got
    for (where, verdict), (_, words) in zip(got, expected):
        assert words in verdict, (where, verdict)
        assert "Traceback" not in verdict and "\n" not in verdict


def test_an_unreadable_file_is_named_not_a_traceback(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads every file: the permission case needs a non-root user")
    path = tmp_path / "train.jsonl"
    path.write_bytes(lines(GOOD))
    path.chmod(0)
    assert verdicts(path) == [("train.jsonl:0", "cannot be read by this user (permission denied): make it readable "
                                                "(chmod u+r) or copy it")]
