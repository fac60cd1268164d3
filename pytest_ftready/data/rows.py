"""Reading training rows with their provenance (file, line); their layouts are read in layouts.py.

Files are read in chunks (``chunks``), so a pass over a dataset of any size holds one chunk at
a time: JSONL in byte ranges cut at line ends (each named by its first line number), read
line by line so a malformed line is reported with its number and the other lines are still
read; csv row by row (every field a string); parquet in record batches; a JSON array element
by element. ``read_rows`` reads everything
at once, for small files and tests."""

from __future__ import annotations

import csv
import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Union

CHUNK_BYTES = 1 << 20  # a JSONL chunk: about a MiB of lines
BATCH_ROWS = 1000  # a chunk of a csv, parquet or JSON-array file


@functools.lru_cache(maxsize=256)
def file_name(file: str) -> str:
    """``Path(file).name``, built once per file rather than once per row (every row names its place)."""
    return Path(file).name


@dataclass(frozen=True)
class Row:
    file: str
    line: int  # 1-based line in a JSONL file; 1-based row number otherwise
    data: Any

    @property
    def where(self) -> str:
        return f"{file_name(self.file)}:{self.line}"


@dataclass(frozen=True)
class RowProblem:
    file: str
    line: int
    kind: str
    detail: str

    @property
    def where(self) -> str:
        return f"{file_name(self.file)}:{self.line}"


Item = Union[Row, RowProblem]


@dataclass(frozen=True)
class LineRange:
    """The lines of a JSONL file between two byte offsets that start lines; ``first_line`` is
    the number of the first. Small to send to a worker process, which reads the lines itself."""

    file: str
    start: int
    end: int
    first_line: int

    @property
    def size(self) -> int:
        return self.end - self.start

    def items(self) -> Iterator[Item]:
        path = Path(self.file)
        for line_no, line, problem in _lines(path, self.start, self.end, self.first_line):
            if problem:
                yield RowProblem(self.file, line_no, *problem)
            else:
                yield _parsed(self.file, line_no, line)


@dataclass(frozen=True)
class RowBatch:
    """Rows (and problems) already read, ``size`` bytes of their file."""

    rows: tuple
    size: int = 0

    def items(self) -> Iterator[Item]:
        return iter(self.rows)


Chunk = Union[LineRange, RowBatch]


def chunks(files, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Chunk]:
    """The training files as consecutive chunks, in file order and line order."""
    for file in files:
        path = Path(file)
        suffix = path.suffix.lower()
        unreadable = _unreadable(path)
        if unreadable:
            yield RowBatch((RowProblem(str(path), 0, "unreadable", unreadable),))
        elif suffix == ".json" and (spread := _spread_object(path)):
            yield RowBatch((RowProblem(str(path), 1, "malformed", spread),))
        elif suffix in (".jsonl", ".ndjson") or (suffix == ".json" and _looks_like_jsonl(path)):
            yield from _line_ranges(path, chunk_bytes)
        elif suffix in _TABLES:
            yield from _TABLES[suffix](path)
        else:
            yield RowBatch((RowProblem(str(path), 0, "unreadable",
                                       f"unsupported file type {suffix!r}; use .jsonl, .json, .parquet or .csv"),))


def read_rows(files) -> tuple[list[Row], list[RowProblem]]:
    """Every row and every problem of ``files``, in memory (small files, tests)."""
    rows: list[Row] = []
    problems: list[RowProblem] = []
    for chunk in chunks(files):
        for item in chunk.items():
            if isinstance(item, Row):
                rows.append(item)
            else:
                problems.append(item)
    return rows, problems


def total_bytes(files) -> int:
    return sum(Path(f).stat().st_size for f in files if Path(f).is_file())


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(value: Any) -> str:
    """The first string in ``value`` (keys too) holding half of a UTF-16 surrogate pair, as
    JSON's ``"\\ud800"`` escapes give; '' when none. No tokenizer can encode such text."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if LONE_SURROGATE.search(item):
                return item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return ""


def _surrogate_problem(file: str, line_no: int) -> RowProblem:
    return RowProblem(file, line_no, "encoding", "a \\ud800-\\udfff escape without its pair (a lone surrogate) is "
                      "not Unicode text: fix the escape, or drop the row")


def _parsed(file: str, line_no: int, line: str) -> Item:
    try:
        value = json.loads(line)
        # a valid UTF-8 line holds no surrogate character: only an escape can make one
        if "\\u" in line and lone_surrogate(value):
            return _surrogate_problem(file, line_no)
        return Row(file, line_no, value)
    except json.JSONDecodeError as exc:
        spread = SPREAD_HINT if line.strip() in ("{", "[") else ""
        return RowProblem(file, line_no, "malformed", f"not valid JSON ({exc.msg} at column {exc.colno}){spread}")
    except RecursionError:
        return RowProblem(file, line_no, "malformed", "JSON nested too deeply to parse")
    except ValueError as exc:  # e.g. an integer longer than Python converts
        return RowProblem(file, line_no, "malformed", f"not valid JSON ({exc})")


ROWS_EXPECTED = ("a training file holds JSON Lines (one row object per line) or, as .json, one array of row objects "
                 "([{...}, {...}])")
SPREAD_HINT = f"; the line opens an object or array spread over several lines: {ROWS_EXPECTED}"


def _spread_object(path: Path) -> str:
    """The problem of a .json file holding one JSON object spread over several lines (a pretty-printed
    row, or a dict of rows), "" otherwise: its first line alone is no JSON."""
    with path.open("rb") as handle:
        first = handle.readline(MAX_LINE_BYTES).removeprefix(b"\xef\xbb\xbf").strip()
    if not first.startswith(b"{") or len(first) >= MAX_LINE_BYTES - 2:  # a line too long is said as such
        return ""
    try:
        json.loads(first)
        return ""
    except UnicodeDecodeError:  # the rows say it, line by line
        return ""
    except ValueError:
        return (f"the file holds one JSON object spread over several lines, not rows: {ROWS_EXPECTED}; write each "
                "row on a line of its own, or put the rows in a [ ] array")


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
    if not path.is_file():  # read, a FIFO blocks or ends at once, a device never ends
        return ("is not a regular file (a FIFO, socket or device): write the rows to a file on disk and "
                "list that file in [data] train")
    if not os.access(path, os.R_OK):
        return "cannot be read by this user (permission denied): make it readable (chmod u+r) or copy it"
    if path.stat().st_size == 0:
        return "is empty: it holds no rows"
    return ""


def _line_ranges(path: Path, chunk_bytes: int) -> Iterator[LineRange]:
    """Byte ranges of about ``chunk_bytes``, each ending at a line end (or the end of the
    file), with the number of their first line; a long line is skipped over in bounded pieces."""
    with path.open("rb") as handle:
        start, first = 0, 1
        while block := handle.read(chunk_bytes):
            newlines = block.count(b"\n")
            if not block.endswith(b"\n"):
                while piece := handle.readline(_CHUNK):
                    if piece.endswith(b"\n"):
                        newlines += 1
                        break
            end = handle.tell()
            yield LineRange(str(path), start, end, first)
            start, first = end, first + newlines


def _lines(path: Path, start: int = 0, end: int | None = None, first: int = 1
           ) -> Iterator[tuple[int, str, tuple[str, str] | None]]:
    """(line number, text, problem) of each non-blank line from byte ``start`` (a line start,
    numbered ``first``) to ``end``, read in bounded memory: a line over MAX_LINE_BYTES or not
    valid UTF-8 comes with a (kind, detail) problem instead of its text. A byte-order mark and
    CRLF line ends are accepted."""
    with path.open("rb") as handle:
        handle.seek(start)
        at, number = start, first - 1
        while end is None or at < end:
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            at += len(raw)
            number += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                size = len(raw)
                while (chunk := handle.readline(_CHUNK)) and not chunk.endswith(b"\n"):
                    size += len(chunk)
                size += len(chunk)
                at += size - len(raw)
                yield number, "", ("too_long", f"the line holds {size:,} bytes, more than the "
                                                 f"{MAX_LINE_BYTES // 2**20} MiB a row may hold: split it or drop it")
                continue
            if at == len(raw) and raw.startswith(b"\xef\xbb\xbf"):  # the file's first line
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield number, "", ("encoding", f"not valid UTF-8 (byte {exc.start + 1} of the line): "
                                               "re-encode the file as UTF-8")
                continue
            if line.strip():
                yield number, line, None


# ---- csv, parquet, JSON arrays ---------------------------------------------------------------
def _batched(path: Path, rows: Iterator[Item], count_hint: int) -> Iterator[RowBatch]:
    """``rows`` in batches of BATCH_ROWS, each with its share of the file's size."""
    size = path.stat().st_size
    batch: list = []
    for item in rows:
        batch.append(item)
        if len(batch) == BATCH_ROWS:
            yield RowBatch(tuple(batch), size * BATCH_ROWS // max(count_hint, BATCH_ROWS))
            batch = []
    if batch:
        yield RowBatch(tuple(batch), size * len(batch) // max(count_hint, len(batch)))


def _unreadable_file(path: Path, exc: BaseException) -> RowProblem:
    return RowProblem(str(path), 0, "unreadable", f"{type(exc).__name__}: {exc}")


def _csv_rows(path: Path) -> Iterator[Item]:
    """Rows of a csv file with a header line: every field a string, as written."""
    csv.field_size_limit(MAX_LINE_BYTES)
    number = 0
    try:
        with path.open("r", encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            for number, record in enumerate(reader, start=1):
                if None in record or None in record.values():
                    fewer_or_more = "more" if None in record else "fewer"
                    yield RowProblem(str(path), number, "malformed", f"has {fewer_or_more} fields than the header "
                                     f"names ({len(reader.fieldnames or ())}): quote fields that hold commas")
                    continue
                yield Row(str(path), number, dict(record))
    except (UnicodeDecodeError, csv.Error) as exc:
        yield RowProblem(str(path), number + 1, "malformed", f"cannot read the csv here ({exc}); the rows after "
                         "it are not read: fix the file (UTF-8, one header line, quoted fields)")


def _csv(path: Path) -> Iterator[RowBatch]:
    return _batched(path, _csv_rows(path), max(1, path.stat().st_size // 512))


def _parquet(path: Path) -> Iterator[RowBatch]:
    try:
        import pyarrow.parquet as pq

        table = pq.ParquetFile(str(path))
        total = table.metadata.num_rows
        batches = table.iter_batches(batch_size=BATCH_ROWS)
        number = 0
        for batch in batches:
            rows = tuple(Row(str(path), number + i + 1, item) for i, item in enumerate(batch.to_pylist()))
            number += len(rows)
            yield RowBatch(rows, path.stat().st_size * len(rows) // max(total, 1))
    except Exception as exc:  # pyarrow raises many types for unreadable files
        yield RowBatch((_unreadable_file(path, exc),))


def _json_array_rows(path: Path) -> Iterator[Item]:
    """The elements of a file holding one JSON array, decoded one at a time from a bounded
    buffer; a malformed element (or one over MAX_LINE_BYTES) ends the file with a problem."""
    decoder = json.JSONDecoder()
    number = 0

    def problem(detail: str) -> RowProblem:
        return RowProblem(str(path), number + 1, "malformed", f"{detail}; the rows after it are not read")

    try:
        with path.open("r", encoding="utf-8-sig") as handle:
            buf, at, eof = "", 0, False

            def more() -> bool:
                nonlocal buf, at, eof
                chunk = "" if eof else handle.read(_CHUNK)
                eof = not chunk
                buf, at = buf[at:] + chunk, 0
                return bool(chunk)

            def skip_space() -> str:
                nonlocal at
                while True:
                    while at < len(buf) and buf[at] in " \t\r\n":
                        at += 1
                    if at < len(buf) or not more():
                        return buf[at] if at < len(buf) else ""

            if skip_space() != "[":
                yield problem("not a JSON array")
                return
            at += 1
            while skip_space() != "]":
                try:
                    value, end = decoder.raw_decode(buf, at)
                except RecursionError:
                    yield problem("JSON nested too deeply to parse")
                    return
                except ValueError as exc:
                    if len(buf) - at > MAX_LINE_BYTES:
                        yield RowProblem(str(path), number + 1, "too_long", f"an element longer than the "
                                         f"{MAX_LINE_BYTES // 2**20} MiB a row may hold; the rows after it "
                                         f"are not read")
                        return
                    if more():
                        continue  # the element goes on in the next piece of the file
                    yield problem(f"not valid JSON ({getattr(exc, 'msg', exc)})")
                    return
                if end == len(buf) and not eof and more():
                    continue  # a number or literal may go on: decode it again with what follows
                number += 1
                yield _surrogate_problem(str(path), number) if lone_surrogate(value) else Row(str(path), number, value)
                at = end
                separator = skip_space()
                if separator == ",":
                    at += 1
                elif separator != "]":
                    yield problem("expected ',' or ']' after the element")
                    return
    except UnicodeDecodeError as exc:
        yield problem(f"not valid UTF-8 ({exc.reason}): re-encode the file as UTF-8")


def _json_array(path: Path) -> Iterator[RowBatch]:
    return _batched(path, _json_array_rows(path), max(1, path.stat().st_size // 512))


_TABLES = {".csv": _csv, ".parquet": _parquet, ".json": _json_array}
