"""A SentencePiece-style normalizer applied before the backend (data/prenormal.py): which
tokenizers get it (and which are refused, with the text that shows why), its ids against the
backend's own on fuzzed texts, and the encoder's first-batch check (a planted disagreement
switched off for good, the results the row-by-row ones either way)."""

from __future__ import annotations

import copy
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_ftready.data import fast_encoding as fast_module
from pytest_ftready.data import tiling
from pytest_ftready.data.fast_encoding import WidthCheck
from pytest_ftready.data.prenormal import Prenormal, longest, prenormal
from pytest_ftready.tiny import SPECIAL_TOKENS
from tests.data.test_tiling import SPM_TEXT, _encoder, _pairs, _rows, sentencepiece_style


@pytest.fixture(scope="module")
def each():
    return sentencepiece_style("each")


def _ids(backend, texts):
    return [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]


def _with_added(tok, token):
    """``tok`` with one more added token (a ``tokenizers.AddedToken``, or its text)."""
    tok = copy.deepcopy(tok)
    tok._tokenizer.add_special_tokens([token])
    return tok


def test_only_a_prepend_and_replace_normalizer_with_plain_added_tokens_is_applied_here(each):
    from tokenizers import AddedToken

    from pytest_ftready.tiny import build_tokenizer

    assert isinstance(prenormal(each._tokenizer, tiling.widths(each._tokenizer)), Prenormal)
    for scheme in ("first", "never"):  # a Metaspace pre-tokenizer: not a normalizer
        tok = sentencepiece_style(scheme)
        assert prenormal(tok._tokenizer, tiling.widths(tok._tokenizer)) is None
    byte_level = build_tokenizer()
    assert prenormal(byte_level._tokenizer, tiling.widths(byte_level._tokenizer)) is None
    table = tiling.widths(each._tokenizer)
    # an added token the raw text and the normalized one would match differently (held against the widths of
    # the tokenizer without it: widths() refuses a normalized one by itself); applied anyway, the ids would differ
    for token, text in [(AddedToken("<sep>", rstrip=True), "<sep> x"),  # takes the space after it
                        (AddedToken("<sep>", lstrip=True), "x <sep>"),
                        (AddedToken("two words"), "two words"),  # a space in it: never in the normalized text
                        (AddedToken("\u2581zq9"), " zq9"),  # the normalized text holds "▁zq9" where the raw one has " zq9"
                        (AddedToken("<sep>", normalized=True), "x<sep>")]:
        tok = _with_added(each, token)
        assert prenormal(tok._tokenizer, table) is None, token
        assert _ids(tok._tokenizer, [text]) != _ids(_without_normalizer(tok), [_normalize(tok, text)]), token
    backend = copy.deepcopy(each._tokenizer)
    backend.encode_special_tokens = True
    assert prenormal(backend, table) is None


def _without_normalizer(tok):
    backend = copy.deepcopy(tok._tokenizer)
    backend.normalizer = None
    return backend


def _normalize(tok, text):
    """``text`` as Prenormal normalizes it, with every added token of ``tok`` (refused or not)."""
    return Prenormal(None, [t.content for t in tok._tokenizer.get_added_tokens_decoder().values()]).normalize(text)


EDGES = st.sampled_from(["", " ", "  ", "\n", "<|im_end|>", "<|im_start|><|im_end|>", " <|im_end|> ", "<|im_end|>\n",
                         "\n<|im_start|>", "a<|im_end|>b", "\u2581", " \u2581 ", "<0x0A>", "<|im_end|>" * 3])


@settings(max_examples=400, deadline=None)
@given(texts=st.lists(st.one_of(SPM_TEXT, EDGES, st.lists(EDGES, max_size=5).map("".join)), min_size=1, max_size=6))
def test_the_ids_are_the_backends_own(each, texts):
    """Texts of spaces, tabs, newlines, ▁, byte-token text, non-ASCII and added tokens anywhere
    (first, last, one after another, alone, none): the same ids as the backend's normalizer gives."""
    found = prenormal(each._tokenizer, tiling.widths(each._tokenizer))
    assert [e.ids for e in found.tokenize(texts)] == _ids(each._tokenizer, texts)


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(SPM_TEXT, min_size=1, max_size=4))
def test_a_tokenizer_of_no_added_tokens_and_of_added_tokens_the_model_lacks(each, texts):
    """No added token at all: a ``▁`` before the whole text; an added token past the model's vocabulary
    (a new id): the same ids still."""
    from tokenizers import Tokenizer

    spec = Tokenizer.from_str(each._tokenizer.to_str())
    bare = Tokenizer(spec.model)
    bare.normalizer = spec.normalizer
    table = tiling.widths(bare)
    found = prenormal(bare, table)
    assert found is not None
    assert [e.ids for e in found.tokenize(texts)] == _ids(bare, texts)
    many = _with_added(each, "<extra_9>")
    found = prenormal(many._tokenizer, tiling.widths(many._tokenizer))
    assert found is not None
    assert [e.ids for e in found.tokenize([t + "<extra_9>" for t in texts])] == _ids(
        many._tokenizer, [t + "<extra_9>" for t in texts])


WORDS = st.lists(st.text(alphabet="<|>[]/_ab01", min_size=1, max_size=6), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(words=WORDS, text=st.text(alphabet="<|>[]/_ab01 x\n", max_size=60))
def test_the_trie_of_the_added_tokens_matches_the_longest_leftmost(words, text):
    """``longest``'s trie splits a text as an alternation of the words, longest first, does: the
    leftmost place a word starts, the longest word there (words that are prefixes of others,
    shared starts)."""
    naive = "|".join(re.escape(w) for w in sorted(set(words), key=len, reverse=True))
    assert re.compile(f"({longest(words)})").split(text) == re.compile(f"({naive})").split(text)


def test_many_added_tokens_sharing_their_starts(each):
    """Mistral v0.3's way: hundreds of control tokens (``[control_7]``, ``[control_77]``) beside
    ``[INST]`` and ``[INST``: the same ids as the backend."""
    tok = copy.deepcopy(each)
    tok._tokenizer.add_special_tokens([f"[control_{k}]" for k in range(300)] + ["[INST]", "[/INST]", "[INST"])
    found = prenormal(tok._tokenizer, tiling.widths(tok._tokenizer))
    assert found is not None
    texts = ["[INST] hi [control_7] [control_77][control_7 [/INST] x [INST", "[control_299][control_2990]", "[ [x] [",
             "<s>[INST]a b[/INST]</s>"]
    assert [e.ids for e in found.tokenize(texts)] == _ids(tok._tokenizer, texts)


def _encoded(tok, monkeypatch) -> tuple:
    """The encoder of ``tok``, what its encode_many gives against encode row by row on small batches, and
    the sizes of the batches ``Prenormal.tokenize`` tokenized."""
    used: list[int] = []
    tokenize = Prenormal.tokenize
    monkeypatch.setattr(Prenormal, "tokenize", lambda self, texts: used.append(len(texts)) or tokenize(self, texts))
    monkeypatch.setattr(fast_module, "BATCH_ROWS", 3)
    monkeypatch.setattr(fast_module, "FIRST_BATCH_ROWS", 3)
    enc = _encoder(tok)
    assert enc.fast.prenormal is not None and enc.fast.prenormal_check is WidthCheck.UNCHECKED
    pairs = _pairs(enc, _rows() * 3)
    return enc, enc.encode_many(pairs), [enc.encode(row, sample) for row, sample in pairs], used


def test_the_encoder_uses_it_once_the_first_batch_agreed(each, monkeypatch):
    enc, many, one_by_one, used = _encoded(each, monkeypatch)
    assert many == one_by_one
    assert enc.fast.prenormal_check is WidthCheck.AGREES
    assert len(used) > 1  # the check, then the batches after it


def test_ids_that_differ_on_the_first_batch_switch_it_off_for_good(each, monkeypatch):
    """A normalization that forgets the ▁ after added tokens: the first batch's ids differ, it is
    never used again, and the results are the row-by-row ones."""
    monkeypatch.setattr(Prenormal, "normalize", lambda self, text: text.replace(" ", "\u2581"))
    enc, many, one_by_one, used = _encoded(each, monkeypatch)
    assert many == one_by_one
    assert enc.fast.prenormal_check is WidthCheck.DIFFERS and enc.fast.trusted_prenormal() is None
    assert len(used) == 1  # the check alone
    assert enc.fast.checks[tiling.ASCII] is WidthCheck.AGREES  # the widths still read


def test_special_tokens_added_or_all_trained_take_no_fast_path_of_it(each):
    """Where the widths are not read (special tokens added by the tokenizer, train_on = "all"), nor is this."""
    for train_on, add_special in (("all", False), ("assistant", True)):
        enc = _encoder(each, train_on=train_on, add_special=add_special)
        assert enc.fast.widths is None and enc.fast.prenormal is None


def test_the_bare_backend_gives_every_added_token_its_id(each):
    """The tiny tokenizer's special tokens, which transformers added after the model's vocabulary:
    the bare backend (the same model, no normalizer) gives each the same id."""
    found = prenormal(each._tokenizer, tiling.widths(each._tokenizer))
    assert found is not None and found.bare.normalizer is None
    assert all(found.bare.token_to_id(t) == each.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS)


def test_a_pickled_encoder_makes_it_again_from_its_tokenizer(each):
    """Sent to a worker process, the encoder's Prenormal travels as the tokenizer's own backend (pickled
    once, with the tokenizer) and is made again there: the same ids, the same rows."""
    import pickle

    enc = _encoder(each)
    again = pickle.loads(pickle.dumps(enc))
    found = again.fast.prenormal
    assert found is not None and found.source is again.tok._tokenizer and found.bare is not enc.fast.prenormal.bare
    texts = ["<|im_start|>user\nhi there<|im_end|>\n", " a  b ", ""]
    assert [e.ids for e in found.tokenize(texts)] == _ids(each._tokenizer, texts)
    pairs = _pairs(again, _rows())
    assert again.encode_many(pairs) == [enc.encode(row, sample) for row, sample in pairs]
