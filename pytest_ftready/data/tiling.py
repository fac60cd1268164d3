"""Tokenizations whose offsets need not all become Python objects.

A byte-level BPE tokenizer (GPT-2, Llama 3, Qwen, SmolLM, Mistral's tekken...) writes every
byte of its text as one character of its vocabulary, so each token covers the bytes of its
vocabulary entry and the tokens tile the text's UTF-8 bytes in order: on ASCII text each byte
is one character; elsewhere a token's characters are those of its first and last bytes (two
tokens share a character whose bytes they split, as the backend's offsets say too). Where the
pipeline is such (its parts read once from the backend: no normalizer but the Unicode forms,
the identity on a text already in them; byte-level pre-tokenization that adds no prefix space,
splits that drop no character; BPE without dropout, affixes or byte fallback; no post-processor
that trims offsets) and a text's tokens' widths sum to its length in bytes, each token's start
and end are read from the running sums of the widths (``columns``): the encoder asks the
backend for no offset at all (``encode_batch_fast``), and finds the tokens of a character span
by bisection.

A SentencePiece-style BPE (Llama 2, Mistral, Phi-3, Gemma...) writes a space as ``▁`` and
prepends one ``▁`` to each stretch of text between added tokens (a ``Prepend`` normalizer before
a ``Replace`` of spaces) or to the text's start only (a ``Metaspace`` pre-tokenizer, prepend
scheme "first", not before a space): a piece's width is its UTF-8 bytes, a ``▁`` one byte, a
byte-fallback token ``<0xXX>`` one byte, and a stretch's first token starts with the prepended
``▁``, of no byte; alone, that token holds the stretch's first character as the backend's
offsets say (``SentencePiece``). A text holding ``▁`` (a space once replaced) or ``<0x`` (a
piece's text) is not read from widths.

Everything else, and the first batches of every encoder as a check of this reasoning (the
columns against the offsets themselves, ASCII and other texts each), goes through the offsets.

Imports nothing of the package; no torch (numpy, for texts that are not ASCII).
"""

from __future__ import annotations

import array
import bisect
import itertools
import json
import unicodedata
from typing import Any, Optional, Sequence

NO_WIDTH = -(1 << 40)  # a token whose width in bytes is not known: a sum with it never matches
NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})  # the identity on a text already in that form
ASCII, UTF8 = "ascii", "utf-8"  # the kinds of text read from widths, each checked against real offsets
SPLITS = frozenset({"Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"})  # never drop characters
PROCESSORS = frozenset({"TemplateProcessing", "BertProcessing"})  # add tokens, move no offset
METASPACE = "\u2581"  # ▁: a SentencePiece-style vocabulary's space


class SentencePiece:
    """How a SentencePiece-style pipeline prepends its ``▁`` (``scheme``): to every stretch between
    added tokens ("each"), to the text's start ("first") or never ("never"); ``lead``: each id's width when its
    first ``▁`` is the prepended one (NO_WIDTH for a piece not starting with ``▁``); ``added``:
    the ids of the added tokens, which end a stretch."""

    __slots__ = ("scheme", "lead", "added", "_array", "_mask")

    def __init__(self, scheme: str, lead: list[int], added: frozenset[int]) -> None:
        self.scheme, self.lead, self.added, self._array, self._mask = scheme, lead, added, None, None

    def array(self):
        """``lead`` as a numpy array (made when first asked for)."""
        if self._array is None:
            import numpy

            self._array = numpy.array(self.lead, dtype=numpy.int64)
        return self._array

    def mask(self):
        """Per id of ``lead``, whether it is an added token (a numpy array, made when first asked for)."""
        if self._mask is None:
            import numpy

            self._mask = numpy.zeros(len(self.lead), dtype=bool)
            self._mask[[i for i in self.added if i < len(self.lead)]] = True
        return self._mask

    def starts(self, text: str, ids: list[int]) -> list[int]:
        """The tokens of ``ids`` (of ``text``) that start with the prepended ``▁``: those that
        are no added token and follow one or start the text."""
        added = self.added
        if self.scheme == "never" or not ids:
            return []
        if self.scheme == "first":  # Metaspace's: the text's start, when it is no added token nor a space
            return [0] if ids[0] not in added and not text.startswith(" ") else []
        # the tokens after an added one (read without a Python loop over the tokens)
        after = itertools.compress(itertools.count(1), map(added.__contains__, ids))
        out = [0] if ids[0] not in added else []
        out += [n for n in after if n < len(ids) and ids[n] not in added]
        return out


class Widths:
    """Each token id's width in UTF-8 bytes (``table``; NO_WIDTH where it has none that is
    fixed), the Unicode forms the tokenizer's normalizer applies (``forms``): a text in all
    of them is what the tokenizer tokenizes, and for a SentencePiece-style pipeline how it
    prepends its ``▁`` (``pieces``)."""

    __slots__ = ("table", "forms", "pieces", "_array")

    def __init__(self, table: list[int], forms: tuple[str, ...] = (),
                 pieces: Optional[SentencePiece] = None) -> None:
        self.table, self.forms, self.pieces, self._array = table, forms, pieces, None

    def array(self):
        """``table`` as a numpy array (made when first asked for)."""
        if self._array is None:
            import numpy

            self._array = numpy.array(self.table, dtype=numpy.int64)
        return self._array

    def kind(self, text: str) -> Optional[str]:
        """ASCII or UTF8 when the tokens of ``text`` may tile it, None when they cannot (the
        normalizer would change it)."""
        if self.pieces is not None:  # a "▁" is read as a space; "<0x" may be a byte token's text
            if "<0x" in text:
                return None
            return ASCII if text.isascii() else (None if "\u2581" in text else UTF8)
        if text.isascii():
            return ASCII
        return UTF8 if all(unicodedata.is_normalized(form, text) for form in self.forms) else None  # type: ignore[arg-type]


def widths(backend) -> Optional[Widths]:
    """The ``Widths`` of ``backend`` (a ``tokenizers.Tokenizer``), or None when it is not a
    pipeline whose tokens tile their text."""
    try:
        normalizer, pre, post = (_spec(part) for part in (backend.normalizer, backend.pre_tokenizer,
                                                            backend.post_processor))
        model = backend.model
        spm = _sentencepiece(normalizer, pre)
        forms = () if spm is not None else _forms(normalizer)
        if not (forms is not None and (spm is not None or _pre_ok(pre)) and _post_ok(post)
                and type(model).__name__ == "BPE" and not model.dropout and not model.continuing_subword_prefix
                and not model.end_of_word_suffix
                # byte-level: byte tokens of one character would share it; SentencePiece: read as bytes
                and (spm is not None or not model.byte_fallback)
                # special tokens tokenized as text: an id of theirs ends no stretch
                and not (spm is not None and backend.encode_special_tokens)):
            return None
        vocab = backend.get_vocab(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()
        own = {index: len(token) for token, index in backend.get_vocab(with_added_tokens=False).items()}
        unknown = model.unk_token
    except Exception:  # another tokenizers: parts it cannot describe
        return None
    table = [NO_WIDTH] * (max(vocab.values(), default=-1) + 1)
    lead = list(table) if spm is not None else []
    for token, index in vocab.items():
        if spm is None:
            table[index] = len(token) or NO_WIDTH  # one vocabulary character per byte
            continue
        # a ▁ (3 bytes) stands for a space (1)
        width = (1 if model.byte_fallback and _is_byte(token)
                 else len(token.encode("utf-8")) - 2 * token.count(METASPACE))
        table[index] = width or NO_WIDTH
        if token.startswith(METASPACE):
            lead[index] = width - 1
    for index, token in added.items():  # matched in the text as they are; lstrip/rstrip take spaces too
        content = token.content
        width = len(content.encode("utf-8", "surrogatepass"))
        fixed = (content and not (token.lstrip or token.rstrip or token.single_word)
                 # a normalized one is matched in the normalized text: as it is only when it is in those forms
                 and not (token.normalized
                          and not all(unicodedata.is_normalized(form, content)  # type: ignore[arg-type]
                                      for form in forms))
                 # an id the model's own vocabulary has too (a byte character): one width for both, or none
                 and own.get(index, width) == width)
        if spm == "each" and token.normalized:  # matched in the text with its ▁ and spaces replaced
            return None
        if index < len(table):
            table[index] = width if fixed else NO_WIDTH
            if lead:
                lead[index] = NO_WIDTH
    if unknown in vocab:  # stands for characters missing from the vocabulary, any number of them (fuse_unk)
        table[vocab[unknown]] = NO_WIDTH
        if lead:
            lead[vocab[unknown]] = NO_WIDTH
    pieces = None if spm is None else SentencePiece(spm, lead, frozenset(added))
    return Widths(table, forms, pieces)


def columns(table: Optional[Widths], text: str, ids: list[int],
            kind: Optional[str] = None) -> Optional[tuple[list[int], list[int]]]:
    """The (starts, ends) in characters of the tokens ``ids`` of ``text`` when they tile it, read
    from their widths (``table``: ``widths`` of the tokenizer) without asking the backend for an
    offset; else None. Starts and ends never go back; two tokens share a character whose bytes
    they split. ``kind``: ``table.kind(text)``, when the caller has it."""
    if table is None:
        return None
    if kind is None:
        kind = table.kind(text)
    pieces = table.pieces
    starts = pieces.starts(text, ids) if pieces is not None and kind is not None else []
    if kind == ASCII:
        try:
            sizes = list(map(table.table.__getitem__, ids))
            for n in starts:
                sizes[n] = pieces.lead[ids[n]]  # type: ignore[union-attr]
        except IndexError:  # an id beyond the vocabulary
            return None
        ends = list(itertools.accumulate(sizes))
        if (ends[-1] if ends else 0) != len(text):
            return None
        firsts = [0, *ends[:-1]] if ends else []
        for n in starts:
            if not sizes[n]:  # the prepended ▁ alone: it holds the stretch's first character
                if n + 1 == len(ids):
                    return None
                ends[n] = firsts[n] + 1
        return firsts, ends
    if kind is None or not ids:
        return None
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return None
    import numpy

    index = numpy.array(ids, dtype=numpy.int64)
    vocabulary = table.array()
    if index.max() >= len(vocabulary):  # an id beyond the vocabulary
        return None
    sizes = vocabulary[index]
    if starts:
        sizes[starts] = pieces.array()[index[starts]]  # type: ignore[union-attr]
    last = numpy.cumsum(sizes) - 1  # each token's last byte
    if last[-1] != len(data) - 1:
        return None
    # each byte's character: the running count of the bytes that start one (not 0b10xxxxxx)
    char = numpy.cumsum((numpy.frombuffer(data, numpy.uint8) & 0xC0) != 0x80) - 1
    first = numpy.concatenate(([0], last[:-1] + 1))
    alone = [n for n in starts if not sizes[n]]  # the prepended ▁ alone: it holds the stretch's first character
    if alone and alone[-1] + 1 == len(ids):
        return None
    firsts, ends = char[first], char[last] + 1
    ends[alone] = firsts[alone] + 1
    return firsts.tolist(), ends.tolist()


Columns = tuple[Sequence[int], Sequence[int]]  # the tokens' (starts, ends)


def columns_many(table: Widths, texts: list[str], given: Sequence[Optional[list[int]]],
                 kinds: list[Optional[str]]) -> list[Optional[Columns]]:
    """``[columns(table, text, i, kind) for text, i, kind in zip(texts, given, kinds)]`` for the
    texts of a kind (None for those of none: not read), read together: one numpy pass over all
    their tokens instead of a Python pass per text (their columns are ``array("q")``s, copied out
    of numpy's without a Python int per token); a lone text, or one of no tokens, alone."""
    out: list[Optional[Columns]] = [None] * len(texts)
    ids = [i or [] for i in given]  # those of no kind may be None
    data: dict[int, bytes] = {}  # the UTF-8 bytes of the texts of other than ASCII
    for n, (i, kind) in enumerate(zip(ids, kinds)):
        if kind == UTF8 and i:
            try:
                data[n] = texts[n].encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: not read (columns says None)
                pass
    together = [n for n, (i, kind) in enumerate(zip(ids, kinds)) if i and (kind == ASCII or n in data)]
    if len(together) < 2:
        together = []
    for n in sorted(set(range(len(texts))).difference(together)):
        if kinds[n] is not None:
            out[n] = columns(table, texts[n], ids[n], kinds[n])
    if not together:
        return out
    import numpy

    lengths = numpy.fromiter((len(ids[n]) for n in together), numpy.int64, len(together))
    flat = numpy.fromiter(itertools.chain.from_iterable(ids[n] for n in together), numpy.int64, int(lengths.sum()))
    vocabulary = table.array()
    if int(flat.max()) >= len(vocabulary):  # an id beyond the vocabulary: those rows have none
        for n in together:
            out[n] = columns(table, texts[n], ids[n], kinds[n])
        return out
    firsts_at = numpy.cumsum(lengths) - lengths  # each text's first token in ``flat``
    sizes = vocabulary[flat]
    pieces = table.pieces
    starts = None  # the tokens that start with a prepended ▁ (SentencePiece.starts of each text)
    if pieces is not None and pieces.scheme != "never":
        held = pieces.mask()[flat]
        if pieces.scheme == "first":
            leading = numpy.fromiter((not texts[n].startswith(" ") for n in together), bool, len(together))
            starts = firsts_at[leading & ~held[firsts_at]]
        else:  # after an added token, or a text's first
            after = numpy.empty_like(held)
            after[0], after[1:] = True, held[:-1]
            after[firsts_at] = True
            starts = numpy.flatnonzero(after & ~held)
        sizes[starts] = pieces.array()[flat[starts]]
    # a token of no fixed width: its text is not read from widths (a sum with NO_WIDTH never matches)
    unknown = sizes < 0
    sizes[unknown] = 0
    # each token's first byte and end in its text (in characters, for an ASCII text)
    ends = numpy.cumsum(sizes)
    ends -= numpy.repeat(ends[firsts_at] - sizes[firsts_at], lengths)  # each text's own running sum
    firsts = ends - sizes
    last_at = firsts_at + lengths - 1
    size = numpy.fromiter((len(data[n]) if n in data else len(texts[n]) for n in together), numpy.int64,
                          len(together))
    ok = ends[last_at] == size
    if unknown.any():
        ok &= numpy.add.reduceat(unknown, firsts_at) == 0
    if data:  # bytes to characters: each byte's character is the running count of the bytes that start one
        wide = numpy.fromiter((n in data for n in together), bool, len(together))
        blob = numpy.frombuffer(b"".join(data[n] for n in together if n in data), numpy.uint8)
        char = numpy.cumsum((blob & 0xC0) != 0x80) - 1
        at = numpy.cumsum(size[wide]) - size[wide]  # each such text's first byte in ``blob``
        tokens: Any = numpy.repeat(wide, lengths)  # the tokens of those texts
        base: Any = numpy.repeat(at, lengths[wide])
        before: Any = numpy.repeat(char[at], lengths[wide])  # the characters before each such text
        top = len(blob) - 1  # a text whose tokens do not cover it may point past its bytes (it is not ok)
        firsts[tokens] = char[numpy.clip(base + firsts[tokens], 0, top)] - before
        ends[tokens] = char[numpy.clip(base + ends[tokens] - 1, 0, top)] - before + 1
    if starts is not None:
        alone = starts[sizes[starts] == 0]  # the prepended ▁ alone: it holds the stretch's first character
        if alone.size:
            row = numpy.searchsorted(firsts_at, alone, side="right") - 1
            ok[row[alone == last_at[row]]] = False
            ends[alone] = firsts[alone] + 1
    all_firsts, all_ends = (array.array("q", column.astype(numpy.int64, copy=False).tobytes())
                            for column in (firsts, ends))
    for n, a, b, good in zip(together, firsts_at.tolist(), (last_at + 1).tolist(), ok.tolist()):
        out[n] = (all_firsts[a:b], all_ends[a:b]) if good else None
    return out


def holder(ends: Sequence[int], char: int) -> Optional[int]:
    """The token that holds character ``char`` of a tiled text (``ends``: its tokens' ends), as
    ``Encoding.char_to_token`` answers: the first of two that share it, None outside the text."""
    at = bisect.bisect_right(ends, char)
    return at if 0 <= char and at < len(ends) else None


def _is_byte(token: str) -> bool:
    """A byte-fallback token: ``<0xXX>``."""
    return len(token) == 6 and token.startswith("<0x") and token.endswith(">") and all(
        c in "0123456789ABCDEF" for c in token[3:5])


def _sentencepiece(normalizer: Optional[dict], pre: Optional[dict]) -> Optional[str]:
    """"each" for a Prepend("▁") and Replace(" ", "▁") normalizer with no pre-tokenizer, "first"
    for no normalizer and a Metaspace("▁") pre-tokenizer prepending to the text's start (or
    "never"), else None."""
    if normalizer is not None and pre is None and normalizer.get("type") == "Sequence":
        parts = sorted(normalizer.get("normalizers", ()), key=lambda p: p.get("type", ""))
        if ([p.get("type") for p in parts] == ["Prepend", "Replace"] and parts[0].get("prepend") == METASPACE
                and parts[1].get("pattern") == {"String": " "} and parts[1].get("content") == METASPACE):
            return "each"
        return None
    if normalizer is not None or pre is None or pre.get("type") != "Metaspace" or pre.get("replacement") != METASPACE:
        return None
    scheme = pre.get("prepend_scheme")
    return scheme if scheme in ("first", "never") else None  # "always": before every stretch but spaces


def _spec(part) -> Optional[dict]:
    return None if part is None else json.loads(part.__getstate__())


def _forms(spec: Optional[dict]) -> Optional[tuple[str, ...]]:
    """The Unicode forms a normalizer applies, in order (None: it does more than that)."""
    if spec is None:
        return ()
    if spec.get("type") == "Sequence":
        parts = [_forms(part) for part in spec.get("normalizers", ())]
        return None if None in parts else tuple(itertools.chain.from_iterable(p for p in parts if p is not None))
    return (spec["type"],) if spec.get("type") in NORMALIZERS else None


def _pre_ok(spec: Optional[dict]) -> bool:
    """Byte-level pre-tokenization (at least one ByteLevel), alone or after splits."""
    if spec is None:
        return False
    parts = spec.get("pretokenizers", ()) if spec.get("type") == "Sequence" else [spec]
    byte_level = [p for p in parts if p.get("type") == "ByteLevel"]
    others_ok = all(p.get("type") == "ByteLevel" or (p.get("type") == "Split" and p.get("behavior") in SPLITS)
                    or p.get("type") == "Digits" for p in parts)
    return bool(byte_level) and others_ok and not any(p.get("add_prefix_space") for p in byte_level)


def _post_ok(spec: Optional[dict]) -> bool:
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(map(_post_ok, spec.get("processors", ())))
    if kind in ("ByteLevel", "RobertaProcessing"):
        return not spec.get("trim_offsets", True)
    return kind in PROCESSORS
