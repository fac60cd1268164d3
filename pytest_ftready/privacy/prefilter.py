"""Which lines of a file can hold a secret or personal datum, found over the raw bytes by one
multi-pattern pass; only those lines are decoded, parsed and validated (scan.py).

Each pattern here is a loose superset of its kind in scan.py (and a line of two or more text
parts is always one: their joined text may hold what no part does), written for the bytes as they lie
in a JSONL file: no word boundaries or look-arounds, JSON escapes allowed where a kind allows
whitespace or quotes. Where bytes may stand for something else after decoding, the line is
always a candidate: any ``\\u`` escape, any non-ASCII digit (Python's ``\\d`` takes them) and the
four non-ASCII letters that Python's case-insensitive matching folds onto ASCII (ſ K İ ı).
The engine is RE2 where google-re2 is installed (``pip install pytest-ftready[scan]``; ~200 MB/s
here), else Hyperscan (~180 MB/s), else Python's ``re`` pattern by pattern (~3 MB/s, no faster than
scanning every line); ``engine()[0]`` names the one in use."""

from __future__ import annotations

import functools
import io
import re
import sys
from typing import Callable, Iterator, Optional

_D = "[0-9]"
_H = "[0-9A-Fa-f]"
# whitespace Python's \s takes on one line, a non-ASCII byte (U+00A0 ...), or a JSON escape/quote
_GAP = r"(?:[\t\x0b\x0c\r \x1c-\x1f\x80-\xff\"']|\\[nrtfb\"'/\\])*"
LOOSE = [  # (kind, pattern over bytes, case-insensitive)
    ("private_key", r"-----BEGIN", False),
    ("jwt", r"eyJ[A-Za-z0-9_-]{8}", False),
    ("aws_access_key_id", r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}", False),
    ("gcp_api_key", r"AIza[0-9A-Za-z_-]{35}", False),
    ("github_token", r"gh[pousr]_[A-Za-z0-9]{36}|github_pat_", False),
    ("gitlab_token", r"glpat-", False),
    ("slack_webhook", r"hooks\.slack\.com", False),
    ("slack_token", r"xox[abposr]-", False),
    ("huggingface_token", r"hf_[A-Za-z]{34}", False),
    ("openai_key", r"sk-[A-Za-z0-9_-]{20}", False),  # anthropic's sk-ant- keys too
    ("stripe_key", r"[sr]k_live_", False),
    ("azure_storage_key", r"AccountKey=|AZURE_[A-Z_]*KEY", False),
    ("aws_secret_access_key", r"aws_?secret_?access_?key", True),
    ("assigned_secret", r"(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|client[_-]?secret"
                        r"|auth[_-]?token|private[_-]?key)" + _GAP + "[=:]", True),
    ("email", r"[A-Za-z0-9._%+-]@[A-Za-z0-9.-]+\.[A-Za-z]{2}", False),
    ("iban", rf"[A-Z]{{2}}{_D}{{2}} ?[A-Z0-9]{{4}} ?[A-Z0-9]{{4}}", False),
    ("payment_card", rf"{_D}(?:[ -]?{_D}){{12}}", False),
    ("national_id", rf"{_D}{{3}}-{_D}{{2}}-{_D}{{4}}|{_D}{{3}}\.{_D}{{3}}\.{_D}{{3}}-{_D}{{2}}|{_D}{{7}}-?[A-Z]"
                    rf"|{_D}{{4}} {_D}{{4}} {_D}{{4}}|{_D}{{11}}", False),
    ("phone", rf"\+{_D}(?:[ .()-]{{0,3}}{_D}){{7}}|\({_D}{{3}}\) ?{_D}{{3}}-{_D}{{4}}", False),
    ("ip_address", rf"{_D}{{1,3}}\.{_D}{{1,3}}\.{_D}{{1,3}}\.{_D}|{_H}{{1,4}}:{_H}{{1,4}}:{_H}{{0,4}}:", False),
    # two text parts on a line: a value split across them is only whole once they are joined (scan.joined_parts)
    ("text_parts", r'"text" *: *"[^\n]*"text" *: *"', False),
]


def _always() -> str:
    """Bytes that make a line a candidate whatever follows: escapes, non-ASCII digits, folds."""
    # str.isdecimal is what Python's \d tests (category Nd), at half the cost of unicodedata: each
    # worker process of a parallel scan compiles the engine at its start
    chars = list(filter(str.isdecimal, map(chr, range(0x80, sys.maxunicode + 1))))
    chars += ["\u017f", "\u212a", "\u0130", "\u0131"]
    literals = sorted({c.encode("utf-8") for c in chars})
    return r"\\u|" + "|".join(re.escape(b).decode("latin-1") for b in literals)


PARTS = "text_parts"


def _patterns(parts: bool = True) -> list[tuple[str, bytes, bool]]:
    """The loose patterns as bytes; ``parts``: with the one that makes every line of text parts a candidate."""
    return ([(kind, p.encode("latin-1"), ci) for kind, p, ci in LOOSE if parts or kind != PARTS]
            + [("always", _always().encode("latin-1"), False)])


Finder = Callable[[bytes], list]  # buffer -> sorted offsets inside candidate lines


def _hyperscan(parts: bool = True) -> Finder:
    import hyperscan

    patterns = _patterns(parts)
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=[p for _, p, _ in patterns], ids=list(range(len(patterns))), elements=len(patterns),
               flags=[(hyperscan.HS_FLAG_CASELESS if ci else 0) for _, _, ci in patterns])

    def find(buf: bytes) -> list:
        ends: list = []
        db.scan(buf, match_event_handler=lambda _id, _from, to, _flags, _ctx: ends.append(to - 1))
        ends.sort()
        return ends
    return find


def _re2(parts: bool = True) -> Finder:
    import re2

    combined = re2.compile(b"|".join((b"(?i:%s)" if ci else b"(?:%s)") % p for _, p, ci in _patterns(parts)))

    def find(buf: bytes) -> list:
        ends, pos = [], 0
        while (m := combined.search(buf, pos)) is not None:
            ends.append(m.start())
            nl = buf.find(b"\n", m.start())
            if nl < 0:
                break
            pos = nl + 1
        return ends
    return find


def _python(parts: bool = True) -> Finder:
    """Python's backtracking ``re`` is slow on one big alternation: each pattern on its own
    (most start with a literal, which it searches fast), any non-ASCII byte a candidate."""
    patterns = [re.compile(p, re.I if ci else 0) for _, p, ci in _patterns(parts)[:-1]]
    patterns.append(re.compile(rb"\\u|[\x80-\xff]"))

    def find(buf: bytes) -> list:
        return sorted(m.start() for pattern in patterns for m in pattern.finditer(buf))
    return find


@functools.lru_cache(maxsize=None)
def engine(parts: bool = True) -> tuple[str, Finder]:
    """(name, finder) of the fastest engine installed; compiled once, on first use. ``parts``
    False: without the pattern for lines of text parts (``may_hold``)."""
    for name, make in (("re2", _re2), ("hyperscan", _hyperscan)):
        try:
            return name, make(parts)
        except ImportError:
            pass
    return "re", _python(parts)


def may_hold(text: str) -> bool:
    """Whether ``text`` (one line, or the joined text of its parts) may hold a finding: a line
    found a candidate only for its text parts is then scanned in those alone."""
    return bool(engine(parts=False)[1](text.encode("utf-8", "replace")))


CHUNK = 8 << 20


def candidate_lines(handle, find: Optional[Finder] = None, read: Optional[Callable[[int], None]] = None
                    ) -> Iterator[tuple[int, str]]:
    """(line number, line) for each line of a binary ``handle`` that may hold a finding, the
    line decoded and numbered as a text-mode file reads it (UTF-8, errors replaced, universal
    newlines). ``read(n)`` is told of each block of n bytes read (progress)."""
    find = find or engine()[1]
    number, rest = 0, b""
    while True:
        block = handle.read(CHUNK)
        if read is not None and block:
            read(len(block))
        buf = rest + block
        if not buf:
            return
        cut = buf.rfind(b"\n") + 1 if block else len(buf)
        if cut == 0:  # no line end yet: read on
            rest = buf
            continue
        buf, rest = buf[:cut], buf[cut:]
        if b"\r" in buf and buf.count(b"\r") != buf.count(b"\r\n"):  # bare CRs: lines as text mode splits them
            for line in io.StringIO(buf.decode("utf-8", "replace"), newline=None):
                number += 1
                yield number, line
        else:
            yield from _lines_at(buf, find(buf), number)
            number += buf.count(b"\n") + (0 if buf.endswith(b"\n") else 1)
        if not block:
            return


def _lines_at(buf: bytes, offsets: list, number: int) -> Iterator[tuple[int, str]]:
    counted, line_end = 0, -1
    for at in offsets:
        if at <= line_end:
            continue
        start = buf.rfind(b"\n", 0, at) + 1
        line_end = buf.find(b"\n", at)
        if line_end < 0:
            line_end = len(buf)
        number += buf.count(b"\n", counted, start)
        counted = start
        line = buf[start:line_end + 1].decode("utf-8", "replace")
        yield number + 1, line[:-2] + "\n" if line.endswith("\r\n") else line
