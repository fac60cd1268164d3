"""What the data checks and the training facts keep of a dataset, made in one streaming pass:
counts, the token lengths as compact arrays, the first places of every problem kind, and
bounded samples (the first rows, the first trainable examples, the longest ones). Memory
depends on those bounds, not on the number of rows.

A digest is made per chunk of rows (``digest_chunk``) and the digests of consecutive chunks
merge (``DataDigest.merge``) into exactly the digest one pass over everything makes: the same
counts, places, order of kinds and samples, whichever process made each chunk.

Imports nothing of torch; the encoding is a callable handed in (the pipeline's)."""

from __future__ import annotations

import gc
import hashlib
import heapq
from array import array
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Optional, Sequence

from .layouts import read_sample
from .specials import KIND as SPECIALS, literal_specials
from .rows import Chunk, RowProblem

FINGERPRINT_MOD = 2**64
LISTED = 10  # places kept per problem kind, and unusable rows listed


# rows (with their samples) -> their Encoded, in order; None: a pass that only reads rows
Encode = Optional[Callable[[list], list]]


@dataclass(frozen=True)
class Plan:
    """How rows are read, and how much of them a digest keeps."""

    format: str
    train_on: str
    roles: tuple = ()  # ([data] roles).items()
    sample: int = 8  # encoded rows kept for views: the first ones, and the first with problems
    keep_rows: int = 256  # usable rows kept (data.loader times the encoding on them)
    keep_first: int = 256  # trainable examples kept from the start (overfit, resume, sustained)
    keep_longest: int = 8  # the longest trainable examples kept (the worst-case batch)
    reserved: tuple = ()  # special tokens an encoded row must not hold as text (data.specials.reserved_tokens)

    def narrowed(self, done: "DataDigest") -> "Plan":
        """The plan for a chunk after ``done``: samples that ``done`` already filled need not be
        kept again (an upper bound: chunks between them may fill them too)."""
        return replace(self, sample=max(0, self.sample - min(len(done.head), len(done.with_problems))),
                       keep_rows=max(0, self.keep_rows - len(done.usable_rows)),
                       keep_first=max(0, self.keep_first - len(done.first_trainable)))


@dataclass
class Places:
    """How often a problem kind occurs, and its first LISTED places (where, detail)."""

    count: int = 0
    first: list = field(default_factory=list)

    def add(self, where: str, detail: str) -> None:
        self.count += 1
        if len(self.first) < LISTED:
            self.first.append((where, detail))

    def merge(self, other: "Places") -> None:
        self.count += other.count
        self.first.extend(other.first[: LISTED - len(self.first)])


@dataclass
class DataDigest:
    plan: Plan
    encoding: bool = False  # whether rows were encoded (else only read and shaped)
    # ---- reading: every row of every file
    rows: int = 0  # rows read (each a JSON value)
    read_problems: int = 0  # lines and files that gave no row
    bad_count: int = 0  # unusable rows, read problems included
    bad: list = field(default_factory=list)  # (file, line, [problems]): the LISTED first by (file, line)
    layouts: Counter = field(default_factory=Counter)
    usable_rows: list = field(default_factory=list)  # the first keep_rows usable rows
    # ---- encoding: every usable row
    encoded: int = 0
    unrendered: int = 0  # encoded rows the chat template failed on (a render_error): never trained
    methods: set = field(default_factory=set)
    full_lengths: array = field(default_factory=lambda: array("I"))  # tokens before truncation, per rendered row
    lengths: array = field(default_factory=lambda: array("I"))  # tokens after truncation, per rendered row
    trainable_lengths: array = field(default_factory=lambda: array("I"))
    trained_tokens: int = 0
    fingerprint: int = 0  # of every row's input_ids and labels, by its place: equal digests, equal masks
    problems: dict = field(default_factory=dict)  # kind -> Places, kinds in order of first occurrence
    first_with: dict = field(default_factory=dict)  # kind -> (row index, the first Encoded with it)
    head: list = field(default_factory=list)  # the first `sample` Encoded
    with_problems: list = field(default_factory=list)  # the first `sample` Encoded with any problem
    trainable: int = 0
    first_trainable: list = field(default_factory=list)  # the first keep_first trainable Encoded
    longest: list = field(default_factory=list)  # (-length, trainable index, Encoded): the keep_longest longest

    # ---- building -----------------------------------------------------------------------
    def add_unusable(self, file: str, line: int, problems: list) -> None:
        self.bad_count += 1
        entry = (file, line, problems)
        if len(self.bad) < LISTED or (file, line) < self.bad[-1][:2]:
            self.bad = heapq.nsmallest(LISTED, [*self.bad, entry], key=lambda b: b[:2])

    def add_encoded(self, e) -> None:
        plan = self.plan
        index = self.encoded
        self.encoded += 1
        self.methods.add(e.method)
        if e.full_length:  # a row the template could not render has no length to count
            self.full_lengths.append(e.full_length)
            self.lengths.append(e.length)
        trained = e.trained
        self.trained_tokens += trained
        self.fingerprint = (self.fingerprint + row_fingerprint(e)) % FINGERPRINT_MOD
        self.unrendered += any(kind == "render_error" for kind, _ in e.problems)
        details: dict[str, list[str]] = {}  # a kind counts once per row ("in N row(s)"), its details joined
        for kind, detail in e.problems:
            details.setdefault(kind, []).append(detail)
        for kind, said in details.items():
            self.problems.setdefault(kind, Places()).add(e.row.where, "; ".join(said))
            self.first_with.setdefault(kind, (index, e))
        if len(self.head) < plan.sample:
            self.head.append(e)
        if e.problems and len(self.with_problems) < plan.sample:
            self.with_problems.append(e)
        if e.trainable:
            if len(self.first_trainable) < plan.keep_first:
                self.first_trainable.append(e)
            entry = (-e.length, self.trainable, e)
            if len(self.longest) < plan.keep_longest:
                heapq.heappush(self.longest, _Longest(entry))
            elif _Longest(entry) > self.longest[0]:
                heapq.heapreplace(self.longest, _Longest(entry))
            self.trainable += 1
            self.trainable_lengths.append(e.length)

    def merge(self, other: "DataDigest") -> "DataDigest":
        """Append the digest of the chunk that follows this one's rows."""
        plan = self.plan
        self.encoding = self.encoding or other.encoding
        self.rows += other.rows
        self.read_problems += other.read_problems
        self.bad_count += other.bad_count
        self.bad = heapq.nsmallest(LISTED, [*self.bad, *other.bad], key=lambda b: b[:2])
        self.layouts.update(other.layouts)
        self.usable_rows.extend(other.usable_rows[: plan.keep_rows - len(self.usable_rows)])
        offset, trainable_offset = self.encoded, self.trainable
        self.encoded += other.encoded
        self.unrendered += other.unrendered
        self.methods |= other.methods
        self.full_lengths.extend(other.full_lengths)
        self.lengths.extend(other.lengths)
        self.trainable_lengths.extend(other.trainable_lengths)
        self.trained_tokens += other.trained_tokens
        self.fingerprint = (self.fingerprint + other.fingerprint) % FINGERPRINT_MOD
        for kind, places in other.problems.items():
            self.problems.setdefault(kind, Places()).merge(places)
        for kind, (index, e) in other.first_with.items():
            self.first_with.setdefault(kind, (index + offset, e))
        self.head.extend(other.head[: plan.sample - len(self.head)])
        self.with_problems.extend(other.with_problems[: plan.sample - len(self.with_problems)])
        self.first_trainable.extend(other.first_trainable[: plan.keep_first - len(self.first_trainable)])
        for item in other.longest:
            length, index, e = item.entry
            entry = _Longest((length, index + trainable_offset, e))
            if len(self.longest) < plan.keep_longest:
                heapq.heappush(self.longest, entry)
            elif entry > self.longest[0]:
                heapq.heapreplace(self.longest, entry)
        self.trainable += other.trainable
        return self

    # ---- reading it ---------------------------------------------------------------------
    @property
    def total(self) -> int:
        """Rows and unreadable places together: what "N of M rows" counts."""
        return self.rows + self.read_problems

    @property
    def total_tokens(self) -> int:
        return sum(self.lengths)

    def places(self, kinds: Iterable[str]) -> dict:
        """kind -> Places of the given kinds that occur, in order of first occurrence."""
        wanted = set(kinds)
        return {kind: places for kind, places in self.problems.items() if kind in wanted}

    def count(self, kind: str) -> int:
        return self.problems[kind].count if kind in self.problems else 0

    def first_example(self, kinds: Iterable[str]):
        """The first encoded row with a problem of one of ``kinds``; None when no row has one."""
        found = [self.first_with[k] for k in kinds if k in self.first_with]
        return min(found, key=lambda pair: pair[0])[1] if found else None

    def training_examples(self) -> list:
        """The trainable examples kept: the first ``keep_first`` in order, then the longest ones
        not among them (so a slice from the start and the longest of all are both there)."""
        head = self.first_trainable
        longest = sorted((item.entry for item in self.longest), key=lambda entry: entry[:2])
        extra = [e for _, index, e in longest if index >= len(head)]
        return head + extra


@dataclass(frozen=True)
class _Longest:
    """Orders (-length, index, Encoded) so that the heap's smallest is the shortest, and among
    equally long ones the latest: what is dropped first when a longer example comes."""

    entry: tuple

    def __lt__(self, other: "_Longest") -> bool:
        (a, i, _), (b, j, _) = self.entry, other.entry
        return (-a, -i) < (-b, -j)

    def __gt__(self, other: "_Longest") -> bool:
        return other < self


def row_fingerprint(e) -> int:
    """A 64-bit hash of one encoded row's place, input_ids and labels. Summed over the rows (in
    any order, so chunks combine), it changes when any token or any label of any row does."""
    h = hashlib.blake2b(e.row.where.encode(), digest_size=8)
    h.update(array("q", e.input_ids).tobytes())
    h.update(array("q", e.labels).tobytes())
    return int.from_bytes(h.digest(), "little")


def digest_chunk(chunk: Chunk, plan: Plan, encode: Encode = None) -> DataDigest:
    """The digest of one chunk: every row read and shaped; with ``encode``, the usable ones
    encoded (``encode`` gets [(row, sample)] and returns their Encoded in order)."""
    with _collections_after():
        return _digest_chunk(chunk, plan, encode)


@contextmanager
def _collections_after():
    """Python's cycle collector off while a chunk is read and encoded, on again after it: a row's
    tokens and offsets are thousands of short-lived tuples that would start a collection every
    few rows (a tenth of the pass). The chunk bounds what waits for the collection after it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _digest_chunk(chunk: Chunk, plan: Plan, encode: Encode) -> DataDigest:
    digest = DataDigest(plan, encoding=encode is not None)
    usable: list = []
    roles = dict(plan.roles)
    for item in chunk.items():
        if isinstance(item, RowProblem):
            digest.read_problems += 1
            digest.add_unusable(item.file, item.line, [item.detail])
            continue
        digest.rows += 1
        sample, problems = read_sample(item, plan.format, plan.train_on, roles)
        if problems or sample is None:  # a row without a sample has problems
            digest.add_unusable(item.file, item.line, problems)
            continue
        digest.layouts[sample.layout] += 1
        usable.append((item, sample))
        if len(digest.usable_rows) < plan.keep_rows:
            digest.usable_rows.append(item)
    if encode is not None and usable:
        for e in marking(encode, plan.reserved)(usable):
            digest.add_encoded(e)
    return digest


def marking(encode: Callable[[list], list], reserved: tuple) -> Callable[[list], list]:
    """``encode`` (any pipeline's), with each row that holds one of the ``reserved`` special
    tokens as text given a blocking problem naming the message and the token (data.specials):
    whatever made its labels, such a row is never trained."""
    if not reserved:
        return encode

    def marked(pairs: list) -> list:
        samples = {row.where: sample for row, sample in pairs}
        out = []
        for e in encode(pairs):
            found = literal_specials(samples[e.row.where], reserved) if e.row.where in samples else []
            out.append(replace(e, problems=e.problems + tuple((SPECIALS, detail) for detail in found)) if found else e)
        return out
    return marked


def sorted_sample(values: Sequence[int], most: int) -> list[int]:
    """At most ``most`` of ``values``, evenly spaced through them sorted: their distribution
    (a histogram of it) without every value."""
    ordered = sorted(values)
    if len(ordered) <= most:
        return ordered
    step = len(ordered) / most
    return [ordered[int(i * step)] for i in range(most)]
