"""The output gate: every text the plugin writes (check messages, JUnit properties,
benchmark extra_info, artifact files, the report, the terminal summary) passes through the
session's one ``Gate``, which knows every secret and personal datum the session has found
(by the privacy scan, by the row-level redaction of the data checks, and by its own
pattern scan of each text it lets through) and writes a redaction marker instead.

A value learned once is refused everywhere afterwards, also in its escaped forms (JSON,
HTML/XML) and line by line (a PEM block re-wrapped or shown one line at a time)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..privacy.redaction import bare_secret, finding_values, redact_text
from ..files import json_safe, os_error_advice, write_private
from ..outcomes import Fail

MIN_LINE_CHARS = 8  # a line of a multi-line value this long is refused on its own


class Gate:
    def __init__(self) -> None:
        self._values: dict[str, str] = {}  # value (and its escaped forms, its lines) -> kind

    @property
    def known(self) -> int:
        """How many distinct forms of finding values the gate refuses."""
        return len(self._values)

    def learn(self, values: Mapping[str, str]) -> None:
        """Remember finding values (value -> kind) so that no output carries them."""
        for value, kind in values.items():
            self.learn_one(value, kind)

    def learn_one(self, value: str, kind: str) -> None:
        if not value or value in self._values:
            return
        forms = set()
        for plain in {value, bare_secret(kind, value)}:
            forms |= {plain, html.escape(plain), json.dumps(plain)[1:-1], plain.replace("\n", "&#10;")}
        forms |= {line.strip() for line in value.splitlines() if len(line.strip()) >= MIN_LINE_CHARS}
        for form in forms:
            self._values.setdefault(form, kind)

    def values(self) -> Mapping[str, str]:
        return dict(self._values)

    def text(self, text: str) -> str:
        """``text`` safe to write: findings in it are learned and replaced, and so is every
        value learned before."""
        found = finding_values(text)
        if found:
            self.learn(found)
        return redact_text(text, self._values) if self._values else text

    def value(self, value: Any) -> Any:
        """A JSON-like value with every string in it (keys too) passed through ``text``."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.value(k) if isinstance(k, str) else k: self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.value(v) for v in value)
        return value

    def write(self, path: Path, data: str | bytes) -> Path:
        """The artifact writer: atomic, owner-only, and text through the gate. Bytes that
        decode as UTF-8 text are gated as text; other bytes (weights, tensors) as they are.
        A folder that cannot be written (read-only, disk full) is a ``Fail`` naming the path;
        no partial file is left."""
        if isinstance(data, bytes):
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError:
                pass
        return self._store(path, self.text(data) if isinstance(data, str) else data)

    def write_json(self, path: Path, payload: Any) -> Path:
        """``payload`` as JSON, every string in it gated (``value``) before it is encoded. The
        encoded text is not gated again as a whole: a pattern scan over it would read the digits
        of a number (a float's 11 decimals as a national id) as a finding and write a marker into
        the middle of the number, leaving a file no JSON reader accepts."""
        return self._store(path, json.dumps(json_safe(self.value(payload)), indent=2, sort_keys=True) + "\n")

    @staticmethod
    def _store(path: Path, data: str | bytes) -> Path:
        try:
            return write_private(path, data)
        except OSError as exc:
            raise Fail(f"cannot write {path}: {exc.strerror or exc}; {os_error_advice(exc)}") from None

    def guard_report(self, report) -> None:
        """A pytest test report's properties, captured output and text failure, gated in place
        (what every reporter reads: terminal, JUnit, xdist)."""
        report.user_properties = [(name, self.value(value)) for name, value in report.user_properties]
        report.sections = [(title, self.text(text)) for title, text in report.sections]
        if isinstance(report.longrepr, str):
            report.longrepr = self.text(report.longrepr)
        elif isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            report.longrepr = (*report.longrepr[:2], self.text(str(report.longrepr[2])))
        elif report.longrepr is not None:  # a traceback: kept as it is unless it quotes a finding
            text = str(report.longrepr)
            clean = self.text(text)
            if clean != text:
                report.longrepr = clean

    def lines(self, lines: Iterable[str]) -> list[str]:
        return [self.text(line) for line in lines]
