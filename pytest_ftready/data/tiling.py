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
by bisection. Everything else, and the first batches of every encoder as a check of this
reasoning (the columns against the offsets themselves, ASCII and other texts each), goes
through the offsets.

Imports nothing of the package; no torch (numpy, for texts that are not ASCII).
"""

from __future__ import annotations

import bisect
import itertools
import json
import unicodedata
from typing import Optional

NO_WIDTH = -(1 << 40)  # a token whose width in bytes is not known: a sum with it never matches
NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})  # the identity on a text already in that form
ASCII, UTF8 = "ascii", "utf-8"  # the kinds of text read from widths, each checked against real offsets
SPLITS = frozenset({"Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"})  # never drop characters
PROCESSORS = frozenset({"TemplateProcessing", "BertProcessing"})  # add tokens, move no offset


class Widths:
    """Each token id's width in UTF-8 bytes (``table``; NO_WIDTH where it has none that is
    fixed), and the Unicode forms the tokenizer's normalizer applies (``forms``): a text in all
    of them is what the tokenizer tokenizes."""

    __slots__ = ("table", "forms", "_array")

    def __init__(self, table: list[int], forms: tuple[str, ...] = ()) -> None:
        self.table, self.forms, self._array = table, forms, None

    def array(self):
        """``table`` as a numpy array (made when first asked for)."""
        if self._array is None:
            import numpy

            self._array = numpy.array(self.table, dtype=numpy.int64)
        return self._array

    def kind(self, text: str) -> Optional[str]:
        """ASCII or UTF8 when the tokens of ``text`` may tile it, None when they cannot (the
        normalizer would change it)."""
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
        forms = _forms(normalizer)
        if not (forms is not None and _pre_ok(pre) and _post_ok(post) and type(model).__name__ == "BPE"
                and not model.dropout and not model.continuing_subword_prefix and not model.end_of_word_suffix
                and not model.byte_fallback):  # byte tokens of one character would share it
            return None
        vocab = backend.get_vocab(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()
        own = {index: len(token) for token, index in backend.get_vocab(with_added_tokens=False).items()}
        unknown = model.unk_token
    except Exception:  # another tokenizers: parts it cannot describe
        return None
    table = [NO_WIDTH] * (max(vocab.values(), default=-1) + 1)
    for token, index in vocab.items():
        table[index] = len(token) or NO_WIDTH  # one vocabulary character per byte
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
        if index < len(table):
            table[index] = width if fixed else NO_WIDTH
    if unknown in vocab:  # stands for characters missing from the vocabulary, any number of them (fuse_unk)
        table[vocab[unknown]] = NO_WIDTH
    return Widths(table, forms)


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
    if kind == ASCII:
        try:
            ends = list(itertools.accumulate(map(table.table.__getitem__, ids)))
        except IndexError:  # an id beyond the vocabulary
            return None
        if (ends[-1] if ends else 0) != len(text):
            return None
        return [0, *ends[:-1]] if ends else [], ends
    if kind is None or not ids:
        return None
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return None
    import numpy

    index = numpy.array(ids, dtype=numpy.int64)
    array = table.array()
    if index.max() >= len(array):  # an id beyond the vocabulary
        return None
    last = numpy.cumsum(array[index]) - 1  # each token's last byte
    if last[-1] != len(data) - 1:
        return None
    # each byte's character: the running count of the bytes that start one (not 0b10xxxxxx)
    char = numpy.cumsum((numpy.frombuffer(data, numpy.uint8) & 0xC0) != 0x80) - 1
    first = numpy.concatenate(([0], last[:-1] + 1))
    return char[first].tolist(), (char[last] + 1).tolist()


def holder(ends: list[int], char: int) -> Optional[int]:
    """The token that holds character ``char`` of a tiled text (``ends``: its tokens' ends), as
    ``Encoding.char_to_token`` answers: the first of two that share it, None outside the text."""
    at = bisect.bisect_right(ends, char)
    return at if 0 <= char and at < len(ends) else None


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
