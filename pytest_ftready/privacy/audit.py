"""Plain logic of the privacy checks: the model's license, effective file access, scanning
files for secrets and personal data, and whether backup files look encrypted."""

from __future__ import annotations

import json
import math
import os
import re
import stat
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from ..data.rows import Row, chunks
from .prefilter import candidate_lines, may_hold
from .scan import Finding, active_kinds, across_parts, iter_strings, joined_parts, scan_text

Learn = Callable[[str, str], None]  # (value, kind): told each finding's value, e.g. the output gate


# ---- license -------------------------------------------------------------------------------
def card_license(text: str) -> Optional[str]:
    """The license a model card (README.md) declares in its YAML front matter."""
    m = re.match(r"^---\s*\n(.*?)\n---", text, re.S)
    if not m:
        return None
    front = m.group(1)
    found = re.search(r"^license:\s*['\"]?([^'\"\n]+)", front, re.M)
    license_ = found.group(1).strip().lower() if found else None
    name = re.search(r"^license_name:\s*['\"]?([^'\"\n]+)", front, re.M)
    if license_ == "other" and name:
        return name.group(1).strip().lower()
    return license_


def model_license(recipe) -> tuple[Optional[str], str]:
    """(license, where it came from)."""
    if recipe.model.license:
        return recipe.model.license.lower(), "the recipe's [model] license"
    if recipe.model.path:
        readme = Path(recipe.model.path) / "README.md"
        if readme.is_file():
            found = card_license(readme.read_text(encoding="utf-8", errors="replace"))
            if found:
                return found, "README.md front matter"
        config = Path(recipe.model.path) / "config.json"
        if config.is_file():
            found = json.loads(config.read_text(encoding="utf-8")).get("license")
            if found:
                return str(found).lower(), "config.json"
        return None, f"{recipe.model.path} (no README.md license, no config.json license)"
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(recipe.model.id, "README.md", revision=recipe.model.revision)
        return card_license(Path(path).read_text(encoding="utf-8", errors="replace")), "the hub model card"
    except Exception as exc:  # offline, gated or missing card: report why
        return None, f"the hub model card could not be read ({type(exc).__name__})"


# ---- effective access ------------------------------------------------------------------------
@dataclass(frozen=True)
class Exposure:
    path: Path
    mode: int
    who: str  # "group" | "others" | "group and others"

    def describe(self) -> str:
        return (f"{self.path} (mode {stat.S_IMODE(self.mode):04o}) is reachable by {self.who}: "
                f"chmod go-rwx {self.path}  (or chmod 700 on a folder above it)")


def exposure(path: Path) -> Optional[Exposure]:
    """Whether group or others can read/write ``path``: its own bits, and every parent folder
    traversable by them (a 0644 file inside a 0700 folder is private)."""
    path = Path(path).absolute()
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    who = []
    for cls, rw, x in (("group", stat.S_IRGRP | stat.S_IWGRP, stat.S_IXGRP | stat.S_IXOTH),
                       ("others", stat.S_IROTH | stat.S_IWOTH, stat.S_IXOTH)):
        if mode & rw and all(_mode(parent) & x for parent in path.parents):
            who.append(cls)
    return Exposure(path, mode, " and ".join(who)) if who else None


def _mode(path: Path) -> int:
    try:
        return path.stat().st_mode
    except OSError:
        return 0


class Walk:
    """The paths under ``roots``: each root itself and, for a folder, everything inside it, with
    no limit. Iterate it once; afterwards ``missing`` holds the roots that do not exist and
    ``unreadable`` the folders that could not be listed (with why), so that a check says what it
    did not see instead of passing on it."""

    def __init__(self, roots: Iterable[Path]):
        self.roots = [Path(root) for root in roots]
        self.missing: list[Path] = []
        self.unreadable: list[str] = []

    def __iter__(self) -> Iterator[Path]:
        for root in self.roots:
            if not root.exists():
                self.missing.append(root)
                continue
            yield root
            if root.is_dir():
                for dirpath, dirnames, filenames in os.walk(root, onerror=self._unreadable):
                    for name in dirnames + filenames:
                        yield Path(dirpath) / name

    def _unreadable(self, error: OSError) -> None:
        self.unreadable.append(f"{error.filename} ({error.strerror or type(error).__name__})")


def walk(paths: Iterable[Path]) -> Walk:
    """The paths themselves and, for folders, everything inside (``Walk``)."""
    return Walk(paths)


# ---- scanning --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Located:
    file: str
    line: int
    field: str
    finding: Finding

    def describe(self) -> str:
        return f"{Path(self.file).name}:{self.line} {self.field}: {self.finding.where()}"


def scan_file(path: Path, categories: frozenset[str], learn: Optional[Learn] = None,
              read: Optional[Callable[[int], None]] = None) -> Iterator[Located]:
    """JSONL rows field by field (a line that is not JSON is scanned as text); other text line by
    line; parquet/csv/JSON arrays row by row, in batches as the data pass reads them. Binary
    files are passed over. ``learn(value, kind)`` is told each value found (the output gate),
    which ``Located`` never carries; ``read(n)`` of the bytes done (progress)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if _whole_file(path):
        for chunk in chunks([path]):
            for item in chunk.items():
                if isinstance(item, Row):
                    yield from _scan_value(str(path), item.line, item.data, categories, learn=learn)
            if read is not None:
                read(chunk.size)
        return
    with open(path, "rb") as handle:
        for number, line in candidate_lines(handle, read=read):
            yield from _scan_line(str(path), suffix, number, line, categories, learn)


def _scan_line(file: str, suffix: str, number: int, line: str, categories, learn: Optional[Learn]) -> Iterator[Located]:
    json_text = suffix in (".jsonl", ".ndjson", ".json")
    # two text parts: their joined text may hold what no part does; a line that is a candidate for
    # them alone is scanned in them alone
    if json_text and line.count('"text"') > 1 and not may_hold(line):
        value = _json(line)
        if value is not None:
            yield from _scan_joined(file, number, value, categories, learn)
            return
    kinds = active_kinds(line)  # once per line: a superset for every field in it
    escaped = "\\u" in line  # \u0040 is an @ only once decoded: kinds from each decoded string
    if not kinds and not escaped:
        return
    value = _json(line) if json_text else None
    if value is not None:
        yield from _scan_value(file, number, value, categories, None if escaped else kinds, learn)
        return
    yield from _scan_value(file, number, line, categories, kinds, learn, field="text")


def _json(line: str):
    """The line's JSON value; None when it is not JSON."""
    try:
        return json.loads(line)
    except ValueError:
        return None


def _scan_value(file: str, line: int, value, categories, kinds=None, learn: Optional[Learn] = None,
                field: str = "") -> Iterator[Located]:
    """Every field a template renders (``iter_strings``), and the text of each list of text parts
    joined as the template joins them (``_scan_joined``)."""
    for path, text in iter_strings(value):
        for finding in scan_text(text, categories, kinds):
            if learn is not None:
                learn(text[finding.start:finding.end], finding.kind)
            yield Located(file, line, field or path, finding)
    yield from _scan_joined(file, line, value, categories, learn)


def _scan_joined(file: str, line: int, value, categories, learn: Optional[Learn] = None) -> Iterator[Located]:
    """What lies across the parts of each list of text parts, in their joined text (``across_parts``)."""
    for path, text, cuts in joined_parts(value):
        for finding in (across_parts(text, cuts, categories) if may_hold(text) else ()):
            if learn is not None:
                learn(text[finding.start:finding.end], finding.kind)
            yield Located(file, line, path, finding)


def _starts_with(path: Path, prefix: bytes) -> bool:
    with open(path, "rb") as handle:
        return handle.read(64).lstrip().startswith(prefix)


def is_binary(path: Path) -> bool:
    """A NUL byte in the first 8 KiB (how git and grep tell binary files)."""
    with open(path, "rb") as handle:
        return b"\0" in handle.read(8192)


def scan_files(paths: Iterable[Path], categories: frozenset[str], learn: Optional[Learn] = None,
               progress: Optional[Callable[[str], None]] = None, workers: Optional[int] = None,
               part_bytes: Optional[int] = None) -> tuple[list[Located], int, float]:
    """(findings, bytes scanned, seconds); ``progress`` gets a line now and then on a long scan.
    ``workers``: processes to scan in (--ftready-workers; default: one per CPU from
    PARALLEL_MIN_BYTES["scan"] of files, where workers pay off). The findings, their order and
    the values told to ``learn`` are the same for 1 or N workers. ``part_bytes``: a worker's
    share of a text file (PART_BYTES; smaller in tests)."""
    from ..data.meter import Meter
    from ..data.passes import workers_for

    start = time.perf_counter()
    files = [Path(p) for p in paths if Path(p).is_file()]
    scanned = sum(path.stat().st_size for path in files)
    meter = Meter("privacy scan:", scanned, progress)
    count = workers_for(workers, files, encoding=False, work="scan")
    parts = list(scan_parts(files, part_bytes)) if count > 1 else []
    if len(parts) > 1:
        found = _scan_in_workers(parts, categories, learn, min(count, len(parts)), meter)
    else:
        found = [located for path in files for located in scan_file(path, categories, learn, read=meter.update)]
    return found, scanned, time.perf_counter() - start


def _scan_in_workers(parts: list, categories: frozenset[str], learn: Optional[Learn], workers: int,
                     meter) -> list[Located]:
    """The parts scanned in worker processes; their findings numbered and ``learn`` told their
    values here, in file order, as one process does."""
    from ..data.passes import in_order

    found: list[Located] = []
    lines_before: dict = {}  # file -> lines in its parts done so far (they arrive in file order)

    def done(result: tuple, size: int) -> None:
        file, lines, located = result
        offset = lines_before.get(file, 0)
        for item, value in located:
            if learn is not None:
                learn(value, item.finding.kind)
            found.append(replace(item, line=item.line + offset) if offset else item)
        lines_before[file] = offset + lines
        meter.update(size)

    in_order(((_scan_part, (part, categories), part.size) for part in parts), workers, done,
             "scanning the files for secrets and personal data",
             remedy=f"each holds up to {PART_BYTES >> 20} MiB of a file at a time: free some memory, or run with "
                    f"--ftready-workers=1 to scan in one process")
    return found


@dataclass(frozen=True)
class ScanPart:
    """Bytes ``start`` to ``end`` of a file, cut just after a newline; ``end`` None: the whole
    file, read as ``scan_file`` reads it (a table)."""

    path: Path
    start: int = 0
    end: Optional[int] = None

    @property
    def size(self) -> int:
        return (self.path.stat().st_size if self.end is None else self.end) - self.start


PART_BYTES = 16 << 20  # a worker's share of a text file


def scan_parts(files: Iterable[Path], part_bytes: Optional[int] = None) -> Iterator[ScanPart]:
    """The files as parts for worker processes: a text file (JSONL and others) as byte ranges
    each ending just after a newline (only the bytes around each cut are read here); a table
    (parquet, csv, a JSON array) whole."""
    part_bytes = part_bytes or PART_BYTES
    for path in files:
        if _whole_file(path):
            yield ScanPart(path)
            continue
        size = path.stat().st_size
        with open(path, "rb") as handle:
            start = 0
            while start < size:
                end = _line_end_from(handle, start + part_bytes, size)
                yield ScanPart(path, start, end)
                start = end


def _line_end_from(handle, at: int, size: int) -> int:
    """The offset just after the first newline at or after ``at`` (the file's size if none)."""
    handle.seek(min(at, size))
    while at < size:
        block = handle.read(1 << 16)
        found = block.find(b"\n")
        if found >= 0:
            return at + found + 1
        at += len(block)
    return size


def _whole_file(path: Path) -> bool:
    suffix = path.suffix.lower()
    return suffix in (".parquet", ".csv") or (suffix == ".json" and _starts_with(path, b"["))


def _scan_part(part: ScanPart, categories: frozenset[str]) -> tuple[str, int, list[tuple[Located, str]]]:
    """A worker's (file, lines, [(finding, value)]) for ``part``: each finding numbered from the
    part's first line, with its value for the main process's ``learn`` (no output carries it);
    ``lines``: the line ends in the part as text mode counts them (a bare CR is one too)."""
    values: list[str] = []

    def keep(value: str, kind: str) -> None:
        values.append(value)

    if part.end is None:
        return str(part.path), 0, [(located, values[-1]) for located in scan_file(part.path, categories, keep)]
    suffix = part.path.suffix.lower()
    with open(part.path, "rb") as handle:
        handle.seek(part.start)
        piece = _Range(handle, part.end - part.start)
        # _scan_value tells ``keep`` each value just before it yields its finding
        found = [(located, values[-1]) for number, line in candidate_lines(piece)
                 for located in _scan_line(str(part.path), suffix, number, line, categories, keep)]
    return str(part.path), piece.lines, found


class _Range:
    """``size`` bytes of a binary file from where it stands, read in place (no copy of the
    part), counting the line ends read as text mode counts them (a bare CR is one too; a part
    ends just after a newline, so no CRLF is split)."""

    def __init__(self, handle, size: int):
        self.handle, self.left, self.lines = handle, size, 0
        self.cr_last = False  # the block before ended with a CR (a CRLF across two reads is one line end)

    def read(self, n: int) -> bytes:
        block = self.handle.read(min(n, self.left))
        self.left -= len(block)
        self.lines += block.count(b"\n") - (self.cr_last and block.startswith(b"\n"))
        if b"\r" in block:
            self.lines += block.count(b"\r") - block.count(b"\r\n")
        self.cr_last = block.endswith(b"\r")
        return block


@dataclass(frozen=True)
class ScanResult:
    findings: list  # [Located], every category
    allowlisted: frozenset  # fingerprints the team accepted
    bytes_scanned: int
    seconds: float
    files: int
    binary_files: int = 0  # files with a NUL byte in their first 8 KiB (scanned as text all the same)
    not_scanned: tuple = ()  # "path: why" for each root or entry that could not be scanned


def scan_paths(roots: Iterable[Path], categories: frozenset[str], allowlist: Path | str | None,
               learn: Optional[Learn] = None,
               progress: Optional[Callable[[str], None]] = None, workers: Optional[int] = None) -> ScanResult:
    """Scan every file under ``roots`` once for every category; the allowlist read alongside.
    ``learn`` receives each finding's value (the output gate), which no result carries. What
    could not be scanned (a root that does not exist, a FIFO or socket, a folder that cannot
    be listed) is named in ``not_scanned``, never silently left out. ``workers``: as ``scan_files``."""
    from .scan import load_allowlist

    paths = walk(roots)
    files, not_scanned = [], []
    for path in paths:
        if path.is_file():
            files.append(path)
        elif not path.is_dir():
            not_scanned.append(f"{path}: not a regular file or folder (a FIFO, socket or device cannot be scanned)")
    not_scanned += [f"{path}: does not exist" for path in paths.missing]
    not_scanned += [f"{folder}: could not be listed" for folder in paths.unreadable]
    found, scanned, seconds = scan_files(files, categories, learn=learn, progress=progress, workers=workers)
    return ScanResult(found, load_allowlist(allowlist), scanned, seconds, len(files),
                      sum(1 for path in files if is_binary(path)), tuple(not_scanned))


# ---- backups -------------------------------------------------------------------------------
ENCRYPTED_MAGIC = (b"age-encryption.org/", b"-----BEGIN AGE ENCRYPTED", b"-----BEGIN PGP MESSAGE", b"Salted__")
PLAIN_MAGIC = (b"PK\x03\x04", b"\x1f\x8b", b"(\xb5/\xfd", b"\xfd7zXZ", b"PAR1", b"BZh", b"SQLite format 3")


def looks_encrypted(path: Path) -> bool:
    """Known encryption headers, or bytes as random as ciphertext that are no known container."""
    with open(path, "rb") as handle:
        head = handle.read(65536)
    if not head:
        return False
    if head.startswith(ENCRYPTED_MAGIC):
        return True
    if head.startswith(PLAIN_MAGIC):
        return False
    counts = Counter(head)
    entropy = -sum(c / len(head) * math.log2(c / len(head)) for c in counts.values())
    return entropy > 7.5 and len(head) >= 1024
