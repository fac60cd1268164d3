"""Tokenizations that tile their text (data/tiling.py): which pipelines are read as byte-level or
SentencePiece-style (and which are refused, with a text that shows why), the claim against the
offsets themselves on fuzzed texts, the encoder's results equal with and without it, and the
first batch's check (a planted SentencePiece case included)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_ftready.data import fast_encoding as fast_module
from pytest_ftready.data import tiling
from pytest_ftready.data.encoding import Encoder, _in_order
from pytest_ftready.data.fast_encoding import FastPaths, WidthCheck
from pytest_ftready.data.layouts import read_sample
from pytest_ftready.data.rows import Row
from pytest_ftready.tiny import CHATML, SPECIAL_TOKENS, build_tokenizer
from tests.data.test_encoding import CHATML_NO_MARKERS
from tests.data.test_fast_paths import ROWS

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def variant(base, **parts):
    """The tiny tokenizer (its trained vocabulary and merges) with other pipeline ``parts``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(base._tokenizer.to_str())
    for name, part in parts.items():
        setattr(backend, name, part)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="<|im_end|>", pad_token="<pad>",
                                  unk_token="<unk>", additional_special_tokens=[
                                      t for t in SPECIAL_TOKENS if t not in ("<s>", "<|im_end|>", "<pad>", "<unk>")])
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="module")
def tokenizers():
    from tokenizers import Regex, normalizers, pre_tokenizers, processors

    base = build_tokenizer()
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return {
        "gpt2-style": base,
        "llama3-style": variant(base, normalizer=normalizers.NFC(), pre_tokenizer=pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"), byte_level])),
        "trims-offsets": variant(base, post_processor=processors.ByteLevel(trim_offsets=True)),
        "prefix-space": variant(base, pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=True)),
        "split-removes": variant(base, pre_tokenizer=pre_tokenizers.Sequence(
            [pre_tokenizers.Split(" ", behavior="removed"), byte_level])),
        "lowercase": variant(base, normalizer=normalizers.Lowercase()),
        "metaspace": variant(base, pre_tokenizer=pre_tokenizers.Metaspace()),
        "byte-fallback": _byte_fallback(variant(base)),
        "unknown-bytes": _unknown_bytes(base),
        "spm-each": sentencepiece_style("each"),
        "spm-first": sentencepiece_style("first"),
        "spm-never": sentencepiece_style("never"),
        "spm-always": sentencepiece_style("always"),
    }


def _unknown_bytes(base):
    """The tiny tokenizer without the byte characters of \\x01-\\x03, unknown runs fused into one
    ``<unk>``: a token whose width is that of the run, not of its own text."""
    import json

    from tokenizers import Tokenizer

    spec = json.loads(base._tokenizer.to_str())
    gone = {chr(0x101), chr(0x102), chr(0x103)}  # the byte-level characters of \x01 \x02 \x03
    model = spec["model"]
    model["fuse_unk"], model["unk_token"] = True, "<unk>"
    model["vocab"] = {t: i for t, i in model["vocab"].items() if not set(t) & gone}
    model["merges"] = [m for m in model["merges"] if not set("".join(m) if isinstance(m, list) else m) & gone]
    return variant(base, model=Tokenizer.from_str(json.dumps(spec)).model)


def sentencepiece_style(scheme: str):
    """A SentencePiece-style BPE trained on the tiny tokenizer's texts (spaces as ``▁``, the 256
    byte-fallback tokens ``<0xXX>`` first, as Llama 2's and Phi-3's), with the tiny tokenizer's
    special tokens: ``scheme`` "each" prepends ``▁`` to every stretch between added tokens (a
    Prepend and Replace normalizer, as Phi-3's and Mistral's), "first" to the text's start (a
    Metaspace pre-tokenizer, as llama.cpp's Llama vocabulary saved by transformers), or any other
    Metaspace prepend scheme."""
    import json

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from pytest_ftready.tiny import _corpus, example_rows

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=True)
    trained.train_from_iterator(_corpus(example_rows()), trainer=trainers.BpeTrainer(
        vocab_size=500, show_progress=False, limit_alphabet=60))
    spec = json.loads(trained.to_str())["model"]
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    vocab.update({token: 256 + index for token, index in spec["vocab"].items()})
    backend = Tokenizer(models.BPE(vocab, [tuple(m) for m in spec["merges"]], byte_fallback=True, fuse_unk=True))
    if scheme == "each":
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme, split=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="<|im_end|>", pad_token="<pad>",
                                  unk_token="<unk>", additional_special_tokens=[
                                      t for t in SPECIAL_TOKENS if t not in ("<s>", "<|im_end|>", "<pad>", "<unk>")])
    tok.chat_template = CHATML
    return tok


def _byte_fallback(tok):
    tok._tokenizer.model.byte_fallback = True  # <0xC4> <0x8A>: two tokens of one character
    return tok


SENTENCEPIECE = ("spm-each", "spm-first", "spm-never")
BYTE_LEVEL = ("gpt2-style", "llama3-style", "unknown-bytes")
READ_AS_TILING = (*BYTE_LEVEL, *SENTENCEPIECE)


def test_byte_level_pipelines_are_read_as_tiling_and_others_refused(tokenizers):
    for name, tok in tokenizers.items():
        table = tiling.widths(tok._tokenizer)
        assert (table is not None) == (name in READ_AS_TILING), name
        if table is not None:
            assert table.table[tok.convert_tokens_to_ids("<|im_end|>")] == len("<|im_end|>")
            assert table.forms == (("NFC",) if name == "llama3-style" else ())
            assert (table.pieces is not None) == (name in SENTENCEPIECE)


def test_sentencepiece_pieces_are_read_as_their_bytes(tokenizers):
    """A ``▁`` is one byte (a space), a byte token one, a stretch's leading ``▁`` none; a
    Metaspace prepending before every stretch but one starting with a space ("always"), or a
    tokenizer whose special tokens are tokenized as text, is refused."""
    tok = tokenizers["spm-each"]
    table = tiling.widths(tok._tokenizer)
    ids = tok.convert_tokens_to_ids(["\u2581", "<0x0A>", "<0xE2>"])
    assert [table.table[i] for i in ids] == [1, 1, 1] and [table.pieces.lead[i] for i in ids] == [0, tiling.NO_WIDTH,
                                                                                                tiling.NO_WIDTH]
    assert table.kind("a \u2581 b") is None and table.kind("a <0x0A> b") is None and table.kind("\u00e9") == tiling.UTF8
    for text in ("<|im_start|>\nhi", "<|im_start|>\n\u2603 x"):  # the prepended ▁ alone holds the newline's character
        encoding = tok._tokenizer.encode(text, add_special_tokens=False)
        assert encoding.tokens[1] == "\u2581" and encoding.offsets[1] == encoding.offsets[2] == (12, 13)
        assert list(zip(*tiling.columns(table, text, encoding.ids))) == encoding.offsets
    backend = copy.deepcopy(tok._tokenizer)
    backend.encode_special_tokens = True
    assert tiling.widths(backend) is None


SPM_TEXT = st.lists(st.one_of(st.sampled_from(list("ab xyz019\t\n.,!'-") + ["  ", "\n\n", " the", "é", "中", "😀",
                                                                            "ﬁ", "’", "👍🏽", "Ж", "\u2581", "<0x0A>"]),
                              st.sampled_from(list(SPECIAL_TOKENS))), max_size=40).map("".join)


@pytest.mark.parametrize("name", SENTENCEPIECE)
@settings(max_examples=300, deadline=None)
@given(text=SPM_TEXT)
def test_a_sentencepiece_tiling_claim_holds_against_the_offsets(tokenizers, name, text):
    """Every text is read from its widths but one holding ``▁`` or ``<0x``; the columns are the
    offsets, the holder of each character ``char_to_token``'s."""
    backend = tokenizers[name]._tokenizer
    encoding = backend.encode(text, add_special_tokens=False)
    fast = backend.encode_batch_fast([text], add_special_tokens=False)[0]
    assert fast.ids == encoding.ids
    found = tiling.columns(tiling.widths(backend), text, fast.ids)
    assert (found is not None) == ("\u2581" not in text and "<0x" not in text)
    if found is not None:
        assert list(zip(*found)) == encoding.offsets
        for x in range(-1, len(text) + 2):
            assert tiling.holder(found[1], x) == (encoding.char_to_token(x) if x >= 0 else None)


@pytest.mark.parametrize("name", READ_AS_TILING)
@settings(max_examples=150, deadline=None)
@given(texts=st.lists(st.one_of(SPM_TEXT, st.sampled_from(["", " a", "<|im_start|>\n", "a<|im_end|>", "x \x01\x02 y"])),
                      max_size=8))
def test_a_batch_is_read_as_each_of_its_texts(tokenizers, name, texts):
    """``columns_many`` (the ASCII texts of a batch in one numpy pass) gives each text what
    ``columns`` gives it alone: its columns, or None where it refuses (an unknown token, a lone
    prepended ``▁`` ending the text, a text its tokens do not cover)."""
    backend = tokenizers[name]._tokenizer
    table = tiling.widths(backend)
    ids = [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
    kinds = [table.kind(text) for text in texts]
    expected = [tiling.columns(table, t, i, k) if k is not None else None for t, i, k in zip(texts, ids, kinds)]
    assert _as_lists(tiling.columns_many(table, texts, ids, kinds)) == expected
    if len(texts) >= 2 and ids[0]:  # tokens that do not cover their text; then an id beyond the vocabulary
        for wrong in ([[*ids[0], ids[0][-1]], *ids[1:]], [*ids[:-1], [*ids[-1], len(table.table)]]):
            assert _as_lists(tiling.columns_many(table, texts, wrong, kinds)) == [
                tiling.columns(table, t, i, k) if k is not None else None for t, i, k in zip(texts, wrong, kinds)]


def _as_lists(found):
    """``columns_many``'s columns (``array("q")``s for the texts read together) as ``columns`` gives them."""
    return [None if c is None else (list(c[0]), list(c[1])) for c in found]


def test_a_refused_pipeline_does_not_tile_ascii_text(tokenizers):
    """Why trimmed offsets are refused: a lone space token keeps no character."""
    encoding = tokenizers["trims-offsets"]._tokenizer.encode("a  b", add_special_tokens=False)
    assert (1, 1) in encoding.offsets or (2, 2) in encoding.offsets
    assert _in_order(encoding.offsets) is None


DECOMPOSED = "e\u0301"  # é as e and a combining accent: NFC composes it, so the llama3-style text changes
TEXT = st.lists(st.one_of(st.sampled_from(list("ab xyz019\t\n.,!'-") + ["  ", "\n\n", "é", "中", "😀", "ﬁ", "’",
                                                                        "👍🏽", "Ж", DECOMPOSED]),
                          st.sampled_from(list(SPECIAL_TOKENS))), max_size=40).map("".join)


@pytest.mark.parametrize("name", BYTE_LEVEL)
@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_a_tiling_claim_holds_against_the_offsets(tokenizers, name, text):
    backend = tokenizers[name]._tokenizer
    encoding = backend.encode(text, add_special_tokens=False)
    fast = backend.encode_batch_fast([text], add_special_tokens=False)[0]
    assert fast.ids == encoding.ids  # the tokens without offsets are the same tokens
    found = tiling.columns(tiling.widths(backend), text, fast.ids)
    # every text of these tokenizers is read from its widths, but where the unknown token stands or
    # the normalizer would change it
    assert (found is not None) == ("<unk>" not in text and not (name == "llama3-style" and DECOMPOSED in text))
    if found is not None:
        assert list(zip(*found)) == encoding.offsets and _in_order(encoding.offsets) is not None
        for x in range(-1, len(text) + 2):  # the token holding each character, bounds included
            assert tiling.holder(found[1], x) == (encoding.char_to_token(x) if x >= 0 else None)


@settings(max_examples=300, deadline=None)
@given(text=TEXT, cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=8))
def test_generation_runs_are_the_runs_of_the_mask(tokenizers, text, cuts):
    """The {% generation %} blocks' tokens as runs from bisection (tiled or in-order offsets)
    are the runs of the mask transformers' two ways agree on, on real tokenizations."""
    from pytest_ftready.data.fast_encoding import _Encoding
    from pytest_ftready.data.rendering import generation_mask, generation_runs
    from pytest_ftready.data.verify import runs

    backend = tokenizers["gpt2-style"]._tokenizer
    encoding = _Encoding(backend.encode(text, add_special_tokens=False))
    bounds = sorted(min(c, len(text)) for c in cuts)
    spans = [(a, b) for a, b in zip(bounds[0::2], bounds[1::2]) if b > a]
    mask = generation_mask(encoding, spans)  # the loop over every token's offsets
    expected = None if mask is None else runs(mask)
    assert generation_runs(encoding, spans, _in_order(encoding.offset_mapping)) == expected
    found = tiling.columns(tiling.widths(backend), text, encoding.input_ids)
    if found is not None:  # read without offsets, as encode_many does: the same runs
        fast = backend.encode_batch_fast([text], add_special_tokens=False)[0]
        assert generation_runs(_Encoding(fast, fast.ids, found), spans, found) == expected


def _rows():
    extra = [{"messages": [{"role": "user", "content": "tabs\tand  two  spaces\n\nhere "},
                           {"role": "assistant", "content": "  lead and trail  "}]},
             {"messages": [{"role": "user", "content": "café über 中文"}, {"role": "assistant", "content": "très 😀"}]},
             {"messages": [{"role": "user", "content": "Как дела? 👍🏽"}, {"role": "assistant", "content": "Хорошо’ ﬁne"}]},
             {"messages": [{"role": "user", "content": f"caf{DECOMPOSED}"}, {"role": "assistant", "content": "ok"}]}]
    return [Row("t.jsonl", k + 1, data) for k, data in enumerate(ROWS + extra)]


def _encoder(tok, train_on="assistant", max_length=512, add_special=False, template=None):
    if template is not None:
        tok = copy.deepcopy(tok)
        tok.chat_template = template
    data = SimpleNamespace(format="auto", train_on=train_on, max_length=max_length, add_special_tokens=add_special)
    return Encoder(tok, data, frozenset({tok.convert_tokens_to_ids("<|im_end|>")}))


def _pairs(enc, rows):
    pairs = [(row, read_sample(row, "auto", enc.train_on, {})) for row in rows]
    pairs = [(row, sample) for row, (sample, problems) in pairs if not problems]
    assert len(pairs) > len(rows) // 2
    return pairs


@pytest.mark.parametrize("name", ["gpt2-style", "llama3-style", "trims-offsets", "split-removes", "byte-fallback",
                                  "spm-each", "spm-first", "spm-always"])
@pytest.mark.parametrize("train_on,max_length,add_special,template", [
    ("assistant", 512, False, None), ("last_assistant", 512, False, None), ("assistant", 20, False, None),
    ("assistant", 512, True, None), ("all", 512, False, None), ("assistant", 512, False, CHATML_NO_MARKERS),
    ("last_assistant", 20, False, CHATML_NO_MARKERS)], ids=lambda v: "no-markers" if v == CHATML_NO_MARKERS else None)
def test_encode_many_equals_row_by_row_whatever_the_pipeline(tokenizers, name, train_on, max_length, add_special,
                                                              template, monkeypatch):
    read, quick = [], []
    monkeypatch.setattr(fast_module, "columns", lambda *a: read.append(tiling.columns(*a)) or read[-1])
    read_quick = FastPaths.read_without_offsets
    monkeypatch.setattr(FastPaths, "read_without_offsets", lambda self, e, t, q: quick.extend(zip(t, q)) or read_quick(self, e, t, q))
    monkeypatch.setattr(fast_module, "BATCH_ROWS", 3)  # many batches: each tokenized while the one before is labelled
    enc = _encoder(tokenizers[name], train_on, max_length, add_special, template)
    pairs = _pairs(enc, _rows() * 3)
    assert enc.encode_many(pairs) == [enc.encode(row, sample) for row, sample in pairs]
    # the widths were read where they apply (byte-level pipelines, no special tokens added), and only there;
    # after the first batches checked them, the rows were tokenized without offsets, ASCII or not, but
    # for a text the normalizer would change
    applies = name in READ_AS_TILING and not add_special and train_on != "all"
    assert any(c is not None for c in read) == applies
    assert any(flag for _, flag in quick) == applies
    if applies:
        assert any(flag and not text.isascii() for text, flag in quick)
        assert not any(flag and DECOMPOSED in text for text, flag in quick) == (name == "llama3-style")


def test_a_backend_left_padding_after_the_encoder_was_built_goes_through_the_tokenizers_call(tokenizers):
    enc = _encoder(tokenizers["gpt2-style"])
    pairs = _pairs(enc, _rows())
    expected = [enc.encode(row, sample) for row, sample in pairs]
    enc.tok._tokenizer.enable_padding(pad_id=enc.tok.pad_token_id, pad_token=enc.tok.pad_token)  # a collator's doing
    assert enc.fast.widths is not None and enc.fast.backend() is None
    assert enc.encode_many(pairs) == expected
    assert enc.tok._tokenizer.padding is None  # the tokenizer's own __call__ ran (and set its backend back)


def test_the_first_batch_checks_the_claim(tokenizers, monkeypatch):
    """A tokenizer wrongly read as tiling (its offsets are trimmed): the first batch sees a claim
    the offsets deny, the encoder stops claiming, and the results are the row-by-row ones."""
    tok = tokenizers["trims-offsets"]
    monkeypatch.setattr(fast_module, "widths", lambda backend: tiling.widths(tokenizers["gpt2-style"]._tokenizer))
    enc = _encoder(tok)
    assert enc.fast.widths is not None
    pairs = _pairs(enc, _rows())
    assert enc.encode_many(pairs) == [enc.encode(row, sample) for row, sample in pairs]
    assert enc.fast.checks == {tiling.ASCII: WidthCheck.DIFFERS, tiling.UTF8: WidthCheck.DIFFERS} and not enc.fast.kinds_from_widths()


def test_a_sentencepiece_claim_the_offsets_deny_is_switched_off(tokenizers, monkeypatch):
    """A SentencePiece-style tokenizer that also applies NFKC, read as one that does not: "ﬁ" (3
    bytes) becomes "fi" (2), "ǆ" (2) "dž" (3), the sums agree while the positions do not. The first
    batch with such text finds it, the widths are never read for that kind of text again, and the
    results are the row-by-row ones."""
    from tokenizers import normalizers

    plain = tokenizers["spm-each"]
    tok = copy.deepcopy(plain)
    tok._tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), tok._tokenizer.normalizer])
    assert tiling.widths(tok._tokenizer) is None
    monkeypatch.setattr(fast_module, "widths", lambda backend: tiling.widths(plain._tokenizer))
    enc = _encoder(tok)
    rows = [Row("t.jsonl", k + 1, {"messages": [{"role": "user", "content": "\ufb01 \u01c6 ok"},
                                                {"role": "assistant", "content": "\u01c6 \ufb01"}]}) for k in range(4)]
    rows += [Row("t.jsonl", 5 + k, row.data) for k, row in enumerate(_rows())]
    pairs = _pairs(enc, rows)
    monkeypatch.setattr(fast_module, "BATCH_ROWS", 3)
    monkeypatch.setattr(fast_module, "FIRST_BATCH_ROWS", 3)
    assert enc.encode_many(pairs) == [enc.encode(row, sample) for row, sample in pairs]
    assert enc.fast.checks[tiling.UTF8] is WidthCheck.DIFFERS and enc.fast.checks[tiling.ASCII] is WidthCheck.AGREES


def test_each_kind_of_text_is_checked_by_the_first_batch_that_has_some(tokenizers):
    """A first batch with no ASCII text checks the other texts only: ASCII ones are checked by the
    next batch that has one; a kind whose claim the offsets deny is never read from widths again."""
    enc = _encoder(tokenizers["gpt2-style"])
    backend = enc.tok._tokenizer

    def tile(texts, chosen=None):
        encodings = [fast_module._Encoding(e) for e in backend.encode_batch(texts, add_special_tokens=False)]
        enc.fast.read_columns(encodings, texts, chosen or [True] * len(texts))
        return encodings

    encodings = tile(["café", "中文 here"])
    assert enc.fast.checks == {tiling.ASCII: WidthCheck.UNCHECKED, tiling.UTF8: WidthCheck.AGREES}
    assert enc.fast.kinds_from_widths() == {tiling.UTF8}
    assert all(e.columns is not None for e in encodings)
    encodings = tile(["plain ascii", "über"], [True, False])  # the second has its columns already (quick)
    assert enc.fast.checks == {tiling.ASCII: WidthCheck.AGREES, tiling.UTF8: WidthCheck.AGREES}
    assert encodings[0].columns is not None and encodings[1].columns is None
    other = _encoder(tokenizers["gpt2-style"])
    texts = ["plain ascii", "über"]
    encodings = [fast_module._Encoding(e) for e in backend.encode_batch(texts, add_special_tokens=False)]
    encodings[1]._offsets = [(a, b + 1) for a, b in encodings[1].offset_mapping]  # what the widths cannot give
    other.fast.read_columns(encodings, texts, [True, True])
    assert other.fast.checks == {tiling.ASCII: WidthCheck.AGREES, tiling.UTF8: WidthCheck.DIFFERS}
    assert other.fast.kinds_from_widths() == {tiling.ASCII}
    assert encodings[0].columns is not None and encodings[1].columns is None


def test_a_tokenizers_without_encode_batch_fast_tokenizes_every_row_with_offsets(tokenizers, monkeypatch):
    """tokenizers before 0.20.2 has no encode_batch_fast: the widths still give the columns, of
    encodings that carry their offsets, and the results are the same."""
    class Older:  # the backend as an older tokenizers has it
        def __init__(self, backend):
            self.backend = backend

        def __getattr__(self, name):
            if name == "encode_batch_fast":
                raise AttributeError(name)
            return getattr(self.backend, name)

    monkeypatch.setattr(fast_module, "BATCH_ROWS", 3)
    enc = _encoder(tokenizers["gpt2-style"])
    pairs = _pairs(enc, _rows() * 3)
    expected = [enc.encode(row, sample) for row, sample in pairs]
    backend = enc.fast.backend
    monkeypatch.setattr(enc.fast, "backend", lambda: None if backend() is None else Older(backend()))
    quick = []
    read_quick = enc.fast.read_without_offsets
    monkeypatch.setattr(enc.fast, "read_without_offsets", lambda *a: quick.append(a) or read_quick(*a))
    assert enc.encode_many(pairs) == expected
    assert enc.fast.checks[tiling.ASCII] is WidthCheck.AGREES and enc.fast.widths is not None and not quick


def test_an_unknown_token_is_never_read_from_its_width(tokenizers, monkeypatch):
    """A fused ``<unk>`` covers a run of any length: two runs can sum to a multiple of its text's
    width, so the total matches while the positions do not. Such rows go through their offsets."""
    tok = tokenizers["unknown-bytes"]
    backend = tok._tokenizer
    text = "a\x01\x01\x01b c\x01\x01\x01\x01\x01\x01\x01d"
    encoding = backend.encode(text, add_special_tokens=False)
    unk = tok.convert_tokens_to_ids("<unk>")
    assert encoding.ids.count(unk) == 2 and sum(b - a for a, b in encoding.offsets) == len(text)
    assert tiling.widths(backend).table[unk] == tiling.NO_WIDTH and tiling.columns(tiling.widths(backend), text,
                                                                                  encoding.ids) is None
    enc = _encoder(tok)
    rows = [Row("t.jsonl", k + 1, {"messages": [{"role": "user", "content": f"hi {k}"},
                                                {"role": "assistant", "content": f"hello {k}"}]}) for k in range(9)]
    rows.append(Row("t.jsonl", 10, {"messages": [{"role": "user", "content": "q\x01\x01\x01"},
                                                  {"role": "assistant", "content": "\x01" * 7 + " answer"}]}))
    pairs = _pairs(enc, rows)
    monkeypatch.setattr(fast_module, "BATCH_ROWS", 3)  # the last row on the quick path
    assert enc.encode_many(pairs) == [enc.encode(row, sample) for row, sample in pairs]
    assert enc.fast.checks[tiling.ASCII] is WidthCheck.AGREES and enc.fast.widths is not None


def test_an_empty_generation_block_at_the_start_reads_the_same_either_way(tokenizers):
    """A span (0, 0) asks transformers 4's way for the token before character 0: no token, with or
    without offsets (the backend refuses a negative index; it is never asked)."""
    from pytest_ftready.data.fast_encoding import _Encoding
    from pytest_ftready.data.rendering import generation_runs

    backend = tokenizers["gpt2-style"]._tokenizer
    text = "<|im_start|>assistant\nhello there<|im_end|>"
    with_offsets = _Encoding(backend.encode(text, add_special_tokens=False))
    fast = backend.encode_batch_fast([text], add_special_tokens=False)[0]
    found = tiling.columns(tiling.widths(backend), text, fast.ids)
    spans = [(0, 0), (22, len(text))]
    expected = generation_runs(with_offsets, spans, _in_order(with_offsets.offset_mapping))
    assert generation_runs(_Encoding(fast, fast.ids, found), spans, found) == expected
    assert generation_runs(with_offsets, spans) == expected


def test_an_added_token_is_read_from_its_width_only_where_its_text_is_what_is_matched(tokenizers, monkeypatch):
    """A normalized added token is matched in the normalized text: "ﬁ" (3 bytes) as "fi" (2), "ǆ"
    (2) as "dž" (3); two such errors cancel in the sum while the positions go wrong. And an added
    token that takes the id of a byte character ("é") would have two widths. Neither is read from
    its width: such rows go through their offsets, with the results of the row-by-row way."""
    from tokenizers import AddedToken, normalizers

    tok = variant(build_tokenizer(), normalizer=normalizers.NFKC())
    tok.add_tokens([AddedToken("ﬁ", normalized=True), AddedToken("ǆ", normalized=True), AddedToken("é")])
    backend = tok._tokenizer
    table = tiling.widths(backend)
    assert [table.table[tok.convert_tokens_to_ids(t)] for t in ("ﬁ", "ǆ", "é")] == [tiling.NO_WIDTH] * 3
    text = "fi dž"
    encoding = backend.encode(text, add_special_tokens=False)
    assert len(encoding.ids) == 3 and tiling.columns(table, text, encoding.ids) is None
    enc = _encoder(tok)
    rows = [Row("t.jsonl", k + 1, {"messages": [{"role": "user", "content": "Как дела?"},
                                                {"role": "assistant", "content": "Хорошо"}]}) for k in range(3)]
    rows += [Row("t.jsonl", 4 + k, {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]})
             for k, (user, answer) in enumerate([("ok fi", "dž yes"), ("fi fi", "dž dž"), ("dž", "fi"), ("é 長", "é")])]
    pairs = _pairs(enc, rows)
    monkeypatch.setattr(fast_module, "BATCH_ROWS", 3)  # the Cyrillic batch checks the claim, the rest read quick
    assert enc.encode_many(pairs) == [enc.encode(row, sample) for row, sample in pairs]
    assert enc.fast.checks[tiling.UTF8] is WidthCheck.AGREES
