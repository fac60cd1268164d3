"""Tokenizations whose offsets need not all become Python objects.

A byte-level BPE tokenizer (GPT-2, Llama 3, Qwen, SmolLM, Mistral's tekken...) writes every
byte of its text as one character of its vocabulary; on ASCII text each byte is one character,
so each token covers exactly the characters of its bytes and the tokens tile the text in order,
none without characters: what ``encoding._in_order`` finds by looking at every token's offsets,
a third of a chat row's time. Where the pipeline is such (its parts read once from the backend:
no normalizer but the Unicode forms, the identity on ASCII; byte-level pre-tokenization that
adds no prefix space, splits that drop no character; BPE without dropout, affixes or byte fallback; no
post-processor that trims offsets) and a text is ASCII with its tokens' widths summing to its
length, each token's start and end are the running sums of the widths (``columns``): the
encoder asks the backend for no offset at all (``encode_batch_fast``), and finds the tokens of a
character span by bisection. Everything else, and the first batches of every encoder as a check
of this reasoning (the sums against the offsets themselves), goes through the offsets.

Imports nothing of the package; no torch.
"""

from __future__ import annotations

import bisect
import itertools
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
        unknown = model.unk_token
    except Exception:  # another tokenizers: parts it cannot describe
        return None
    table = [NO_WIDTH] * (max(vocab.values(), default=-1) + 1)
    for token, index in vocab.items():
        table[index] = len(token) or NO_WIDTH  # one vocabulary character per byte
    for index, token in added.items():  # matched in the text as they are; lstrip/rstrip take spaces too
        fixed = token.content and not (token.lstrip or token.rstrip or token.single_word)
        if index < len(table):
            table[index] = len(token.content) if fixed else NO_WIDTH
    if unknown in vocab:  # stands for characters missing from the vocabulary, any number of them (fuse_unk)
        table[vocab[unknown]] = NO_WIDTH
    return table


def columns(table: Optional[list[int]], text: str, ids: list[int]) -> Optional[tuple[list[int], list[int]]]:
    """The (starts, ends) of the tokens ``ids`` of ``text`` when they tile it, read from their
    widths (``table``: ``widths`` of the tokenizer) without asking the backend for an offset;
    else None."""
    if table is None or not text.isascii():
        return None
    try:
        ends = list(itertools.accumulate(map(table.__getitem__, ids)))
    except IndexError:  # an id beyond the vocabulary
        return None
    if (ends[-1] if ends else 0) != len(text):
        return None
    return [0, *ends[:-1]] if ends else [], ends


def holder(ends: list[int], char: int) -> Optional[int]:
    """The token that holds character ``char`` of a tiled text (``ends``: its tokens' ends), as
    ``Encoding.char_to_token`` answers: None outside the text."""
    at = bisect.bisect_right(ends, char)
    return at if 0 <= char and at < len(ends) else None


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
