"""A SentencePiece-style tokenizer's normalizer applied before the backend (``Prenormal``).

Phi-3's, Llama 2's and Mistral's (v0.1-v0.3) tokenizers, as transformers saves them, normalize
each stretch of text between added tokens with a ``Prepend("▁")`` and a ``Replace(" ", "▁")``
(``tiling.SentencePiece`` scheme "each"). The backend keeps every byte's alignment through these
two steps, about a fifth of its time on chat text. The same text normalized here (split on the
added tokens by one regular expression, a ``▁`` put before each stretch, its spaces replaced)
and tokenized by the same model and added tokens with no normalizer gives the same ids, without
offsets (``encode_batch_fast``): the encoder's fast path reads the offsets from the token widths
anyway (``data/tiling.py``).

Only where every added token is matched in the raw text as it is: none normalized, none with
lstrip, rstrip or single_word, none holding a space or a ``▁`` (the normalized text would match
it where the raw one does not), none empty; the bare tokenizer's added tokens must get the
same ids. ``data/fast_encoding.py`` holds the ids against the real tokenizer's on the first batch
before using it, and never again once they differ.

Imports nothing of the package but ``tiling``; no torch.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from .tiling import METASPACE, Widths


class Prenormal:
    """``tokenize(texts)``: the backend's ``encode_batch_fast(texts, add_special_tokens=False)``
    ids, from the texts normalized here (``normalize``) and a backend of no normalizer (``bare``)."""

    __slots__ = ("bare", "source", "_contents", "_split")

    def __init__(self, bare: Any, contents: list[str], source: Any = None) -> None:
        self.bare, self.source, self._contents = bare, source, contents
        # the added tokens, leftmost-longest as the backend's added vocabulary matches them: split()
        # gives the stretches between them at the even places, the tokens at the odd ones
        self._split = re.compile(f"({longest(contents)})").split if contents else None

    def __reduce__(self) -> tuple:
        # pickled (to a worker process) as the backend it was made from, which the encoder's tokenizer
        # pickles anyway: made again there, its model shared, not a second copy
        if self.source is None:
            return Prenormal, (self.bare, self._contents)
        return _made_again, (self.source, self._contents)

    def normalize(self, text: str) -> str:
        """``text`` as the normalizer leaves it: ``▁`` before each stretch between added tokens
        (an empty stretch gets none), every space a ``▁``."""
        if self._split is None:
            return METASPACE + text.replace(" ", METASPACE) if text else text
        parts = self._split(text)
        parts[0::2] = [METASPACE + stretch if stretch else stretch for stretch in parts[0::2]]
        return "".join(parts).replace(" ", METASPACE)

    def tokenize(self, texts: list[str]) -> list:
        """The backend ``Encoding``s (ids, no offsets) of ``texts``."""
        return self.bare.encode_batch_fast([self.normalize(text) for text in texts], add_special_tokens=False)


def longest(words: list[str]) -> str:
    """A regular expression matching the longest of ``words`` (none empty) that starts where it
    is tried: their trie, one branch per next character, so that a place is tried against the
    words that share its characters so far (an alternation of Mistral v0.3's 771 control tokens,
    tried one after the other at every ``[``, took 40 µs a row)."""
    trie: dict = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[None] = True  # a word ends here

    def branch(node: dict) -> str:
        ways = [re.escape(char) + branch(child) for char, child in node.items() if char is not None]
        if not ways:
            return ""
        if None in node:  # a word ends here: a longer one first, else this one (greedy ?)
            return f"(?:{'|'.join(ways)})?"
        return ways[0] if len(ways) == 1 else f"(?:{'|'.join(ways)})"

    return branch(trie)


def _made_again(source: Any, contents: list[str]) -> Optional[Prenormal]:
    """A pickled ``Prenormal`` unpickled; None (the backend tokenizes alone) where its backend's
    added tokens no longer get their ids again."""
    bare = _bare(source, source.get_added_tokens_decoder())
    return None if bare is None else Prenormal(bare, contents, source)


def _bare(backend: Any, added: dict) -> Optional[Any]:
    """A ``tokenizers.Tokenizer`` of ``backend``'s model (shared, not copied), pre-tokenizer, post-processor
    and added tokens (``added``: its ``get_added_tokens_decoder()``), with no normalizer; None where its
    added tokens do not get their ids again."""
    from tokenizers import Tokenizer

    bare = Tokenizer(backend.model)
    bare.pre_tokenizer, bare.post_processor = backend.pre_tokenizer, backend.post_processor
    for index in sorted(added):  # in id order: an added token the model lacks gets the next id
        token = added[index]
        (bare.add_special_tokens if token.special else bare.add_tokens)([token])
    return None if any(bare.token_to_id(token.content) != index for index, token in added.items()) else bare


def prenormal(backend: Any, table: Optional[Widths]) -> Optional[Prenormal]:
    """The ``Prenormal`` of ``backend`` (a ``tokenizers.Tokenizer`` whose widths are ``table``),
    or None where its normalizer is not exactly the one done here or its added tokens are not
    all matched as they are."""
    if table is None or table.pieces is None or table.pieces.scheme != "each" or not hasattr(
            backend, "encode_batch_fast") or backend.encode_special_tokens:
        return None
    try:
        added = backend.get_added_tokens_decoder()
        if any(token.normalized or token.lstrip or token.rstrip or token.single_word or not token.content
               or " " in token.content or METASPACE in token.content for token in added.values()):
            return None
        bare = _bare(backend, added)
    except Exception:  # another tokenizers: parts it cannot copy
        return None
    return None if bare is None else Prenormal(bare, [token.content for token in added.values()], backend)
