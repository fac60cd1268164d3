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
        if suffix in (".jsonl", ".ndjson") or (suffix == ".json" and _looks_like_jsonl(path)):
            for line_no, line in _lines(path):
                try:
                    rows.append(Row(str(path), line_no, json.loads(line)))
                except json.JSONDecodeError as exc:
                    problems.append(RowProblem(str(path), line_no, "malformed", f"not valid JSON ({exc.msg} at column {exc.colno})"))
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


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield number, line

