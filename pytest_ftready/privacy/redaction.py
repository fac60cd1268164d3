"""Redaction of a whole text before it is cut into pieces.

A tokenizer splits a secret over several tokens, and a mask report or an example shows
those tokens in several spans: redacting each span on its own lets every piece through.
So the values are found in the row's own strings and in the joined text of all pieces;
then every character of a value is replaced, whichever piece it falls in, and so is a
value cut short at either edge of the text (truncation at max_length)."""

from __future__ import annotations

import re
from typing import Iterable, Mapping, TypeVar

from .scan import iter_strings, joined_parts, scan_text

Tag = TypeVar("Tag")  # what a piece carries besides its text (e.g. trained or not)
MIN_EDGE_CHARS = 2  # a shorter cut-off fragment of a value tells nothing


def marker(kind: str) -> str:
    return f"<{kind} redacted>"


ASSIGNED_KINDS = frozenset({"aws_secret_access_key", "azure_storage_key", "assigned_secret"})
_ASSIGNMENT = re.compile(r"^[^=:]*[=:]\s*[\"']?")


def bare_secret(kind: str, value: str) -> str:
    """The secret of a finding matched with its name (``aws_secret_access_key = KEY``): KEY,
    which may later be shown alone; other values as they are."""
    return _ASSIGNMENT.sub("", value, count=1) if kind in ASSIGNED_KINDS else value


def finding_values(text: str) -> dict[str, str]:
    """value -> kind for every secret and personal datum in ``text``."""
    return {text[f.start:f.end]: f.kind for f in scan_text(text)}


def row_values(data) -> dict[str, str]:
    """value -> kind for every finding in every field of a row (a JSON-like value) a template renders,
    and in its text parts joined."""
    values: dict[str, str] = {}
    texts = [text for _, text in iter_strings(data)] + [text for _, text, _ in joined_parts(data)]
    for text in texts:
        for value, kind in finding_values(text).items():
            values[value] = values[bare_secret(kind, value)] = kind
    return values


def value_ranges(text: str, values: Mapping[str, str], edges: bool = True) -> list[tuple[int, int, str]]:
    """(start, end, kind) of what must not be shown: findings in ``text``, every occurrence of
    a known value, and (``edges``: ``text`` is a window cut out of a longer text) a known value
    cut short at the start or end of ``text``; merged."""
    found = [(f.start, f.end, f.kind) for f in scan_text(text)]
    for value, kind in values.items():
        if not value:
            continue
        at = text.find(value)
        while at >= 0:
            found.append((at, at + len(value), kind))
            at = text.find(value, at + 1)
        if not edges:
            continue
        head = _longest_edge(text, value, at_end=True)
        if head:
            found.append((len(text) - head, len(text), kind))
        tail = _longest_edge(text, value, at_end=False)
        if tail:
            found.append((0, tail, kind))
    merged: list[tuple[int, int, str]] = []
    for start, end, kind in sorted(found):
        if merged and start <= merged[-1][1]:
            last = merged[-1]
            merged[-1] = (last[0], max(last[1], end), last[2])
        else:
            merged.append((start, end, kind))
    return merged


def _longest_edge(text: str, value: str, at_end: bool) -> int:
    """Length of the longest proper prefix of ``value`` that ends ``text`` (at_end) or of the
    longest proper suffix that starts it."""
    for size in range(min(len(value) - 1, len(text)), MIN_EDGE_CHARS - 1, -1):
        if (text.endswith(value[:size]) if at_end else text.startswith(value[-size:])):
            return size
    return 0


def redact_text(text: str, values: Mapping[str, str] = {}, edges: bool = False) -> str:
    """``text`` with every range of ``value_ranges`` replaced by its marker."""
    return "".join(piece for piece, _ in redact_pieces([(text, None)], values, edges))


def redact_pieces(pieces: Iterable[tuple[str, Tag]], values: Mapping[str, str] = {},
                  edges: bool = True) -> list[tuple[str, Tag]]:
    """``[(text, tag)]`` (e.g. runs of trained / masked tokens) redacted as ONE text: a value
    that spans pieces is replaced by one marker, placed in the piece where it starts."""
    pieces = list(pieces)
    joined = "".join(text for text, _ in pieces)
    ranges = value_ranges(joined, values, edges)
    out: list[tuple[str, Tag]] = []
    offset, k = 0, 0
    for text, tag in pieces:
        start, end = offset, offset + len(text)
        parts, pos = [], start
        while pos < end:
            while k < len(ranges) and ranges[k][1] <= pos:
                k += 1
            if k == len(ranges) or ranges[k][0] >= end:
                parts.append(joined[pos:end])
                break
            r_start, r_end, kind = ranges[k]
            if r_start > pos:
                parts.append(joined[pos:r_start])
            if r_start >= start:  # the marker goes where the value starts
                parts.append(marker(kind))
            pos = min(r_end, end)
        out.append(("".join(parts), tag))
        offset = end
    return out
