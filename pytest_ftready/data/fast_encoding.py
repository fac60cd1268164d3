"""The encoder's speed-ups: ``FastPaths.encode_many`` gives exactly what ``Encoder.encode`` gives
row by row (``data/encoding.py``), faster, for chat rows in three steps that build on each other:

* **spliced renders**: a row's contents spliced into its structure's render (``data/skeleton.py``)
  instead of one template render per trained turn;
* **batched, threaded tokenizing**: chat rows (spliced, or rendered as ``Encoder.render_chat``
  renders them where the splicer cannot) tokenized BATCH_ROWS at a time (the first two batches
  FIRST_BATCH_ROWS) by the backend tokenizer, each batch in a thread while the rows before it are
  labelled (the backend releases the GIL);
* **offsets from token widths**: where the tokens of a text cover it end to end, their offsets
  are read from each token's width (``data/tiling.py``) and the backend skips making them;
  trusted for a kind of text (ASCII, other UTF-8) only once a batch's real offsets agreed;
  a SentencePiece-style normalizer is then applied before the backend (``data/prenormal.py``),
  trusted once a batch's ids agreed.

Rows none of these apply to (plain rows; rows cut at the character budget, finished from their
render by ``Encoder.encode_rendered``) go through the row-by-row encoder. tests/data/test_fast_paths.py,
test_tiling.py and test_skeleton.py hold every path equal to the row-by-row one.
"""

from __future__ import annotations

import enum
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

from .encoded import Encoded
from .layouts import Chat, Sample
from .prenormal import Prenormal, prenormal
from .rows import Row
from .skeleton import Splicer, needles
from .tiling import ASCII, UTF8, Columns, Widths, columns, columns_many, holder, widths
from .verify import dropped_by_template


class _Encoder(Protocol):
    """What the speed-ups use of the ``Encoder`` they speed up (``data/encoding.py``)."""

    tok: Any
    renderer: Any
    train_on: str
    add_special: bool
    markers: bool
    max_length: int
    char_budget: int
    may_hold_chat: bool

    def encode(self, row: Row, sample: Optional[Sample] = None) -> Encoded: ...
    def render_chat(self, row: Row, chat: Chat, budget: Optional[int] = None,
                    prompt: Optional[Callable] = None) -> Any: ...
    def encode_rendered(self, row: Row, rendered: Any) -> Encoded: ...
    def render(self, messages, add_generation_prompt: bool = False, tools=None) -> str: ...
    def render_marked(self, messages, tools): ...

    @property
    def chat_labels(self) -> Callable[..., Encoded]: ...

# spliced chat rows tokenized in one call (each row's offsets are Python objects until labelled)
BATCH_ROWS = 256
# the first two batches, which are tokenized with offsets before any batch is labelled (the widths are
# not yet checked against offsets): small, so that the rows after them may skip their offsets
FIRST_BATCH_ROWS = 32


class WidthCheck(enum.Enum):
    """Whether the token widths give a kind of text's offsets (or ``Prenormal`` the ids), as the first
    batch with such text found."""

    UNCHECKED = "unchecked"  # no batch had text of this kind yet: tokenized with offsets, compared
    AGREES = "agrees"  # the widths gave the offsets: read from them, without offsets from the backend
    DIFFERS = "differs"  # they differed once: this tokenizer is not what tiling.py reads it as; offsets always


class FastPaths:
    """The speed-ups of one ``Encoder``: its splicer, its token widths and what they were checked to give."""

    def __init__(self, encoder: _Encoder, named_templates: Sequence[str]) -> None:
        self.encoder = encoder
        tok = encoder.tok
        specials = [str(v) for v in tok.special_tokens_map.values()]
        # a row with tools may pick another template; rows holding needles are cut around them where every
        # template was analysed for it (see skeleton.needles)
        segments = [needles(t, specials, segments=True) for t in named_templates]
        cut = all(needle is not None for needle in segments)
        tested = segments if cut else [needles(t, specials) for t in named_templates]
        found = [needle for needle in tested if needle is not None]
        self.splicer: Optional[Splicer] = (
            Splicer(encoder.char_budget, frozenset().union(*found), cut)
            if encoder.may_hold_chat and encoder.renderer.fast and len(found) == len(tested) else None)
        # offsets are looked at for masks and verification only (not under train_on = "all"), of the
        # text as tokenized (no special tokens added)
        backend = self.backend() if self.splicer is not None else None
        self.widths: Optional[Widths] = (
            widths(backend) if backend is not None and encoder.train_on != "all" and not encoder.add_special
            else None)
        self.checks: dict[str, WidthCheck] = {ASCII: WidthCheck.UNCHECKED, UTF8: WidthCheck.UNCHECKED}
        # the texts read from widths normalized here, where the normalizer is a SentencePiece-style one
        self.prenormal: Optional[Prenormal] = prenormal(backend, self.widths)
        self.prenormal_check = WidthCheck.UNCHECKED

    def encode_many(self, pairs: Sequence[tuple[Row, Sample]]) -> list[Encoded]:
        """``[encoder.encode(row, sample) for row, sample in pairs]``, the same Encoded, faster."""
        encoder = self.encoder
        out: list[Optional[Encoded]] = [None] * len(pairs)
        if self.splicer is not None:
            with ThreadPoolExecutor(1, thread_name_prefix="ftready-tokenize") as pool:
                # transformers' own __call__ holds the GIL: no thread for it
                submit = pool.submit if self.backend() is not None else _now
                waiting = None  # (batch, future of its tokenizations)
                for batch in self._rendered_batches(pairs, out):
                    texts = [text for _, _, (text, *_) in batch]
                    future = submit(self._tokenize_both, texts, self.kinds_from_widths(), self.trusted_prenormal())
                    if waiting is not None:
                        self._encode_batch(pairs, *waiting, out)
                    waiting = batch, future
                if waiting is not None:
                    self._encode_batch(pairs, *waiting, out)
        return [e if e is not None else encoder.encode(row, sample) for e, (row, sample) in zip(out, pairs)]

    def _rendered_batches(self, pairs: Sequence[tuple[Row, Sample]], out: list) -> Iterator[list]:
        """[(index in pairs, chat, (text, generation spans, turn spans, problems))] of the chat rows,
        BATCH_ROWS at a time (the first two FIRST_BATCH_ROWS): spliced where the splicer can, else
        rendered as ``Encoder.encode`` renders them (``render_chat``). A row whose template fails gets
        its Encoded in ``out`` here, and so does a row its render cuts (past the character budget: only
        its start is tokenized, ``Encoder.encode_rendered``)."""
        encoder, splicer = self.encoder, self.splicer
        assert splicer is not None
        render_marked = encoder.render_marked if encoder.markers else None
        batch, made = [], 0
        for k, (row, sample) in enumerate(pairs):
            if not isinstance(sample, Chat):
                continue
            done = None
            # a row whose contents alone are past the budget, or of more messages than max_length, is
            # never spliced (its text would be past it): the row-by-row path cuts it before its per-turn renders
            if len(sample.messages) <= encoder.max_length and _content_chars(sample) <= encoder.char_budget:
                spliced = splicer.splice(sample, encoder.render, render_marked)
                if spliced is not None:
                    text, generation, turns, problems, shown = spliced
                    done = text, generation, turns, dropped_by_template(sample, text, shown) + problems
            if done is None:
                # its inference prompts spliced where they can be (they hold no needle more often than the row)
                rendered = encoder.render_chat(row, sample, prompt=lambda chat, i: splicer.splice_prompt(
                    chat, i, encoder.render))
                if isinstance(rendered, Encoded):
                    out[k] = rendered
                    continue
                chat, text, generation, turns, problems, cut, _ = rendered
                if cut:  # only its start is tokenized, exactly as row by row (never rendered twice)
                    out[k] = encoder.encode_rendered(row, rendered)
                    continue
                sample, done = chat, (text, generation, turns, problems)
            batch.append((k, sample, done))
            if len(batch) == (min(FIRST_BATCH_ROWS, BATCH_ROWS) if made < 2 else BATCH_ROWS):
                yield batch
                batch, made = [], made + 1
        if batch:
            yield batch

    def kinds_from_widths(self) -> frozenset[str]:
        """The kinds of text whose offsets are read from the widths (the backend makes none for them)."""
        if self.widths is None:
            return frozenset()
        return frozenset(kind for kind, check in self.checks.items() if check is WidthCheck.AGREES)

    def trusted_prenormal(self) -> Optional[Prenormal]:
        """The ``Prenormal`` once a batch's ids agreed with the backend's, else None."""
        return self.prenormal if self.prenormal_check is WidthCheck.AGREES else None

    def _tokenize_both(self, texts: list[str], from_widths: frozenset[str] = frozenset(),
                       prenormalized: Optional[Prenormal] = None) -> tuple[list, list, Optional[list]]:
        """Each text's tokenization without and with the tokenizer's special tokens, and each
        text's kind where its offsets come from the widths (else None): the texts of the
        ``from_widths`` kinds, tokenized without offsets (the backend's ``encode_batch_fast``, or
        ``prenormalized``'s)."""
        backend = self.backend()
        if from_widths and hasattr(backend, "encode_batch_fast"):  # tokenizers 0.20.2+
            assert self.widths is not None
            kinds = [kind if kind in from_widths else None for kind in map(self.widths.kind, texts)]
            quick = [t for t, k in zip(texts, kinds) if k]
            fast = iter(prenormalized.tokenize(quick) if prenormalized is not None
                        else backend.encode_batch_fast(quick, add_special_tokens=False))
            full = iter(backend.encode_batch([t for t, k in zip(texts, kinds) if not k], add_special_tokens=False))
            base = [next(fast) if k else next(full) for k in kinds]
            return base, base, kinds
        base = self.tokenize_many(texts, False)
        return base, (self.tokenize_many(texts, True) if self.encoder.add_special else base), None

    def _encode_batch(self, pairs: Sequence[tuple[Row, Sample]], batch: list, tokenized: Future,
                        out: list) -> None:
        raw_base, raw_final, kinds = tokenized.result()
        texts = [text for _, _, (text, *_) in batch]
        if kinds is not None:
            base = final = self.read_without_offsets(raw_base, texts, kinds)
        else:
            base = _readable(raw_base)
            final = base if raw_final is raw_base else _readable(raw_final)
            # only the backend's own encodings are read from the widths (not the tokenizer __call__'s)
            if self.widths is not None and isinstance(base[0], _Encoding):
                self.read_columns(base, texts, [True] * len(base))
                if self.prenormal is not None and self.prenormal_check is WidthCheck.UNCHECKED:
                    self.check_prenormal(base, texts)
        for n, (k, chat, (text, generation, turns, problems)) in enumerate(batch):
            out[k] = self.encoder.chat_labels(pairs[k][0], chat, text, generation, turns, problems, base[n], final[n],
                                              False)

    def read_columns(self, encodings: list, texts: list[str], chosen: list[bool]) -> None:
        """Give the ``chosen`` encodings (with offsets) whose tokens cover their text end to end
        their ``columns`` from the widths. A kind of text still UNCHECKED is compared with the
        offsets themselves here: AGREES when all of a batch's agree, DIFFERS (for good) when one does not."""
        assert self.widths is not None
        found = {}
        for n, (e, text, flag) in enumerate(zip(encodings, texts, chosen)):
            kind = self.widths.kind(text) if flag else None
            if kind is not None and self.checks[kind] is not WidthCheck.DIFFERS:
                found[n] = kind, columns(self.widths, text, e.input_ids, kind)
        for kind, check in self.checks.items():
            if check is WidthCheck.UNCHECKED:
                mine = [(n, c) for n, (k, c) in found.items() if k == kind and c is not None]
                if any(list(zip(*c)) != encodings[n].offset_mapping for n, c in mine):
                    self.checks[kind] = WidthCheck.DIFFERS
                elif mine:
                    self.checks[kind] = WidthCheck.AGREES
        for n, (kind, c) in found.items():
            if self.checks[kind] is not WidthCheck.DIFFERS:
                encodings[n].columns = c

    def check_prenormal(self, encodings: list, texts: list[str]) -> None:
        """Hold ``Prenormal``'s ids against the backend's (``encodings``) on the texts that would be
        read from widths: AGREES when all agree, DIFFERS (for good) when one does not."""
        assert self.widths is not None and self.prenormal is not None
        chosen = [(e, text) for e, text in zip(encodings, texts) if self.widths.kind(text) is not None]
        if chosen:
            found = self.prenormal.tokenize([text for _, text in chosen])
            same = all(mine.ids == list(e.input_ids) for mine, (e, _) in zip(found, chosen))
            self.prenormal_check = WidthCheck.AGREES if same else WidthCheck.DIFFERS

    def read_without_offsets(self, encodings: list, texts: list[str], kinds: list) -> list:
        """The batch's tokenizations, those without offsets (``kinds``: their kind, None for the
        others) given their columns from the widths; one whose tokens do not cover its text end to
        end is tokenized again, with offsets. The others go through ``read_columns``."""
        assert self.widths is not None
        ids = [None if kind is None else e.ids for e, kind in zip(encodings, kinds)]
        found = columns_many(self.widths, texts, ids, kinds)
        out = []
        for e, text, kind, i, c in zip(encodings, texts, kinds, ids, found):
            if kind is None:
                out.append(_Encoding(e))
            else:
                out.append(_Encoding(e, i, c) if c is not None else _readable(self.tokenize_many([text], False))[0])
        if None in kinds:
            self.read_columns(out, texts, [kind is None for kind in kinds])
        return out

    def backend(self) -> Any:
        """The backend tokenizer when the tokenizer left it as its __call__ does (no truncation,
        no padding, its split_special_tokens): batches then go to it directly, in a thread of their
        own (it reads nothing of Python's and releases the GIL); else None."""
        tok = self.encoder.tok
        backend = getattr(tok, "_tokenizer", None)
        if (backend is not None and backend.truncation is None and backend.padding is None
                and backend.encode_special_tokens == bool(getattr(tok, "split_special_tokens", False))):
            return backend
        return None

    def tokenize_many(self, texts: list[str], add_special: bool) -> list:
        """Each text's tokenization with offsets, as ``tok(text, return_offsets_mapping=True)``
        gives it, without a per-row conversion to a dict."""
        backend = self.backend()
        if backend is not None:
            return backend.encode_batch(texts, add_special_tokens=add_special)
        batch = self.encoder.tok(texts, add_special_tokens=add_special, return_offsets_mapping=True)
        return [_Item(batch, n) for n in range(len(texts))]


def _now(function, *args) -> Future:
    """``function(*args)`` called here and now, as a done future."""
    future: Future = Future()
    future.set_result(function(*args))
    return future


def _readable(encodings: list) -> list:
    """Backend ``Encoding``s read as __call__ results (``_Encoding``); ``_Item``s as they are."""
    return [_Encoding(e) if not isinstance(e, _Item) else e for e in encodings]


class _Item:
    """Row ``index`` of a batch tokenization, read as the tokenization of that one text."""

    __slots__ = ("batch", "index")

    def __init__(self, batch, index: int) -> None:
        self.batch, self.index = batch, index

    def __getitem__(self, key: str):
        return self.batch[key][self.index]

    def char_to_token(self, char: int):
        return self.batch.char_to_token(self.index, char)


class _Encoding:
    """A backend ``tokenizers.Encoding`` read as the tokenizer's __call__ result for one text; its
    offsets become Python objects when first asked for. ``columns``: the tokens' (starts, ends)
    from their widths (``tiling.columns``), when those give them: then the offsets and
    ``char_to_token`` are read from them (an encoding of ``encode_batch_fast`` has no offsets of its own)."""

    __slots__ = ("encoding", "input_ids", "_offsets", "columns")

    def __init__(self, encoding, ids: Optional[list[int]] = None,
                 columns: Optional[Columns] = None) -> None:
        self.encoding, self.input_ids = encoding, (encoding.ids if ids is None else ids)
        self._offsets: Optional[list] = None
        self.columns = columns

    @property
    def offset_mapping(self) -> list:
        if self._offsets is None:
            self._offsets = self.encoding.offsets if self.columns is None else list(zip(*self.columns))
        return self._offsets

    def __getitem__(self, key: str):
        return self.input_ids if key == "input_ids" else self.offset_mapping

    def char_to_token(self, char: int):
        return self.encoding.char_to_token(char) if self.columns is None else holder(self.columns[1], char)


def _content_chars(chat: Chat) -> int:
    """The characters of a conversation's string contents."""
    return sum(len(m["content"]) for m in chat.messages if isinstance(m.get("content"), str))
