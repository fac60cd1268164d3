"""Reading training rows with their provenance (file, line); their layouts are read in layouts.py.

JSONL is read line by line so a malformed line is reported with its number and the other
lines are still read; JSON arrays, parquet and csv go through ``datasets`` (local files
only, nothing cached)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

@dataclass(frozen=True)
class Row:
    file: str
    line: int  # 1-based line in a JSONL file; 1-based row number otherwise
    data: Any

    @property
    def where(self) -> str:
        return f"{Path(self.file).name}:{self.line}"


@dataclass(frozen=True)
class RowProblem:
    file: str
    line: int
    kind: str
    detail: str

    @property
    def where(self) -> str:
        return f"{Path(self.file).name}:{self.line}"


def read_rows(files) -> tuple[list[Row], list[RowProblem]]:
    rows: list[Row] = []
    problems: list[RowProblem] = []
    for file in files:
        path = Path(file)
        suffix = path.suffix.lower()
        unreadable = _unreadable(path)
        if unreadable:
            problems.append(RowProblem(str(path), 0, "unreadable", unreadable))
        elif suffix in (".jsonl", ".ndjson") or (suffix == ".json" and _looks_like_jsonl(path)):
            for line_no, line, problem in _lines(path):
                if problem:
                    problems.append(RowProblem(str(path), line_no, *problem))
                    continue
                try:
                    rows.append(Row(str(path), line_no, json.loads(line)))
                except json.JSONDecodeError as exc:
                    problems.append(RowProblem(str(path), line_no, "malformed", f"not valid JSON ({exc.msg} at column {exc.colno})"))
                except RecursionError:
                    problems.append(RowProblem(str(path), line_no, "malformed", "JSON nested too deeply to parse"))
                except ValueError as exc:  # e.g. an integer longer than Python converts
                    problems.append(RowProblem(str(path), line_no, "malformed", f"not valid JSON ({exc})"))
        elif suffix in (".json", ".parquet", ".csv"):
            builder = {".json": "json", ".parquet": "parquet", ".csv": "csv"}[suffix]
            try:
                import datasets

                ds = datasets.load_dataset(builder, data_files=str(path), split="train", keep_in_memory=True)
            except Exception as exc:  # datasets raises many types for unreadable files
                problems.append(RowProblem(str(path), 0, "unreadable", f"{type(exc).__name__}: {exc}"))
                continue
            rows.extend(Row(str(path), i + 1, item) for i, item in enumerate(ds))
        else:
            problems.append(RowProblem(str(path), 0, "unreadable",
                                       f"unsupported file type {suffix!r}; use .jsonl, .json, .parquet or .csv"))
    return rows, problems


def _looks_like_jsonl(path: Path) -> bool:
    with path.open("rb") as handle:
        head = handle.read(64).lstrip()
    return not head.startswith(b"[")


MAX_LINE_BYTES = 16 * 1024 * 1024  # one row longer than this is reported, never held in memory
_CHUNK = 1024 * 1024


def _unreadable(path: Path) -> str:
    """Why ``path`` cannot be read as a training file; '' when it can."""
    if path.is_dir():
        return "is a folder, not a file: list the files inside it in [data] train"
    if not path.exists():
        return "does not exist"
    if path.stat().st_size == 0:
        return "is empty: it holds no rows"
    return ""


def _lines(path: Path) -> Iterator[tuple[int, str, tuple[str, str] | None]]:
    """(line number, text, problem) of each non-blank line, read in bounded memory: a line
    over MAX_LINE_BYTES or not valid UTF-8 comes with a (kind, detail) problem instead of
    its text. A byte-order mark and CRLF line ends are accepted."""
    with path.open("rb") as handle:
        number = 0
        while True:
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                size = len(raw)
                while (chunk := handle.readline(_CHUNK)) and not chunk.endswith(b"\n"):
                    size += len(chunk)
                size += len(chunk)
                yield number, "", ("too_long", f"the line holds {size:,} bytes, more than the "
                                                 f"{MAX_LINE_BYTES // 2**20} MiB a row may hold: split it or drop it")
                continue
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield number, "", ("encoding", f"not valid UTF-8 (byte {exc.start + 1} of the line): "
                                               "re-encode the file as UTF-8")
                continue
            if line.strip():
                yield number, line, None

