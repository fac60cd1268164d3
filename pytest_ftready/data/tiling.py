"""Tokenizations whose offsets need not all become Python objects.

A byte-level BPE tokenizer (GPT-2, Llama 3, Qwen, SmolLM, Mistral's tekken...) writes every
byte of its text as one character of its vocabulary; on ASCII text each byte is one character,
so each token covers exactly the characters of its bytes and the tokens tile the text in order,
none without characters: what ``encoding._in_order`` finds by looking at every token's offsets,
a third of a chat row's time. Where the pipeline is such (its parts read once from the backend:
no normalizer but the Unicode forms, the identity on ASCII; byte-level pre-tokenization that
adds no prefix space, splits that drop no character; BPE without dropout, affixes or byte fallback; no
post-processor that trims offsets) and a text is ASCII with its tokens' widths summing to its
length, the encoder reads the few offsets it needs from the backend by bisection (``Column``).
Everything else, and the first batch of every encoder as a check of this reasoning, goes
through the offsets themselves.

Imports nothing of the package; no torch.
"""

from __future__ import annotations

import bisect
import json
from typing import Optional

NO_WIDTH = -(1 << 40)  # a token whose width in ASCII text is not known: a sum with it never matches
NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})  # the identity on ASCII text
SPLITS = frozenset({"Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"})  # never drop characters
PROCESSORS = frozenset({"TemplateProcessing", "BertProcessing"})  # add tokens, move no offset


def widths(backend) -> Optional[list[int]]:
    """Each token id's width in characters of ASCII text (NO_WIDTH where it has none that is
    fixed), or None when ``backend`` (a ``tokenizers.Tokenizer``) is not a pipeline whose tokens
    tile ASCII text."""
    try:
        normalizer, pre, post = (_spec(part) for part in (backend.normalizer, backend.pre_tokenizer,
                                                            backend.post_processor))
        model = backend.model
        if not (_normalizer_ok(normalizer) and _pre_ok(pre) and _post_ok(post) and type(model).__name__ == "BPE"
                and not model.dropout and not model.continuing_subword_prefix and not model.end_of_word_suffix
                and not model.byte_fallback):  # byte tokens of one character would share it
            return None
        vocab = backend.get_vocab(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()
    except Exception:  # another tokenizers: parts it cannot describe
        return None
    table = [NO_WIDTH] * (max(vocab.values(), default=-1) + 1)
    for token, index in vocab.items():
        table[index] = len(token)  # one vocabulary character per byte
    for index, token in added.items():  # matched in the text as they are; lstrip/rstrip take spaces too
        fixed = token.content and not (token.lstrip or token.rstrip or token.single_word)
        if index < len(table):
            table[index] = len(token.content) if fixed else NO_WIDTH
    return table


def tiles(table: Optional[list[int]], text: str, ids: list[int]) -> bool:
    """Whether the tokens ``ids`` of ``text`` tile it (``table``: ``widths`` of the tokenizer)."""
    if table is None or not text.isascii():
        return False
    try:
        return sum(map(table.__getitem__, ids)) == len(text)
    except IndexError:  # an id beyond the vocabulary
        return False


class Column:
    """The start (``side`` 0) or end (1) character of each of the ``size`` tokens of a backend
    ``Encoding`` that tiles its text of ``length`` characters, read from the backend one token at a
    time: a sorted sequence for ``bisect_left`` / ``bisect_right`` below, which answer from the
    one token that holds a character."""

    __slots__ = ("encoding", "side", "size", "length")

    def __init__(self, encoding, side: int, size: int, length: int) -> None:
        self.encoding, self.side, self.size, self.length = encoding, side, size, length

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.size:
            raise IndexError(index)
        return self.encoding.token_to_chars(index)[self.side]

    def holder(self, char: int) -> Optional[int]:
        """The token that holds character ``char`` (every character of a tiled text has one)."""
        return self.encoding.char_to_token(char) if 0 <= char < self.length else None


def bisect_left(column, x: int, lo: int = 0, hi: Optional[int] = None) -> int:
    """``bisect.bisect_left(column, x, lo, hi)``: for a ``Column`` of starts, the tokens that start
    before ``x`` are those before the token holding ``x``, and that token when it starts before."""
    hi = len(column) if hi is None else hi
    if not (isinstance(column, Column) and column.side == 0):
        return bisect.bisect_left(column, x, lo, hi)
    token = column.holder(x)
    if token is not None:
        at = token + (column[token] < x)
    elif x <= 0 or x >= column.length:
        at = 0 if x <= 0 else column.size
    else:  # a character no token holds
        return bisect.bisect_left(column, x, lo, hi)
    return min(max(at, lo), hi)


def bisect_right(column, x: int, lo: int = 0, hi: Optional[int] = None) -> int:
    """``bisect.bisect_right(column, x, lo, hi)``: for a ``Column`` of ends, the tokens that end at
    or before ``x`` are those before the token holding ``x``."""
    hi = len(column) if hi is None else hi
    if not (isinstance(column, Column) and column.side == 1):
        return bisect.bisect_right(column, x, lo, hi)
    token = column.holder(x)
    if token is not None:
        at = token
    elif x < 0 or x >= column.length:
        at = 0 if x < 0 else column.size
    else:  # a character no token holds
        return bisect.bisect_right(column, x, lo, hi)
    return min(max(at, lo), hi)


def _spec(part) -> Optional[dict]:
    return None if part is None else json.loads(part.__getstate__())


def _normalizer_ok(spec: Optional[dict]) -> bool:
    if spec is None:
        return True
    if spec.get("type") == "Sequence":
        return all(map(_normalizer_ok, spec.get("normalizers", ())))
    return spec.get("type") in NORMALIZERS


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
