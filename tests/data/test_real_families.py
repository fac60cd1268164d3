"""The encoder and the label verification on real chat templates of the main families, kept
verbatim in tests/data/templates/ (sources in SOURCES.md): Qwen 3.5's reasoning template (the
inference prompt ends inside the response, earlier turns lose their reasoning) and Phi-3's
GGUF template (no system branch, no tool branch).

The tokenizer is the tiny trained BPE with the family's special tokens; with
FTREADY_REAL_TOKENIZERS naming a folder of tokenizer folders saved from llama.cpp's
vocabulary files (``qwen35``, ``phi-3``: ``AutoTokenizer.from_pretrained(models,
gguf_file="ggml-vocab-qwen35.gguf").save_pretrained(folder / "qwen35")``), every test runs on
the real tokenizers too."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_ftready.data.encoding import IGNORE_INDEX, Encoder, stop_token_ids
from pytest_ftready.data.layouts import read_sample
from pytest_ftready.data.rows import Row
from pytest_ftready.data.token_view import token_view
from pytest_ftready.data.verify import judge_labels, verify_turns
from pytest_ftready.outputs.report import token_spans

TEMPLATES = Path(__file__).parent / "templates"
QWEN35 = (TEMPLATES / "Qwen3.5-4B.jinja").read_text()
PHI3_GGUF = (TEMPLATES / "Phi-3-gguf.jinja").read_text()
# family -> (the llama.cpp vocabulary's folder name, eos, special tokens the tiny tokenizer lacks)
FAMILIES = {"qwen35": ("qwen35", "<|im_end|>", ()),
            "phi3": ("phi-3", "<|end|>", ("<|user|>", "<|assistant|>", "<|system|>", "<|end|>"))}
REAL = os.environ.get("FTREADY_REAL_TOKENIZERS")

REASONING_IN_CONTENT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "How many comets does kalo see?"},
    {"role": "assistant", "content": "<think>\nKalo counts one, then two.\n</think>\n\nKalo sees two comets."}]
REASONING_APART = REASONING_IN_CONTENT[:2] + [
    {"role": "assistant", "reasoning_content": "Kalo counts one, then two.", "content": "Kalo sees two comets."}]
REASONING_IN_HISTORY = REASONING_IN_CONTENT[1:] + [
    {"role": "user", "content": "And the lamps?"},
    {"role": "assistant", "content": "<think>\nThree lamps glow.\n</think>\n\nKalo sees three lamps."}]
TRAINED = "Kalo counts one, then two.\n</think>\n\nKalo sees two comets.<|im_end|>"


@pytest.fixture(scope="module", params=["tiny"] + (["llama.cpp"] if REAL else []))
def tokenizers(request):
    """family -> tokenizer (the tiny BPE with the family's special tokens, or llama.cpp's vocabulary)."""
    from pytest_ftready.tiny import build_tokenizer

    out = {}
    for family, (folder, eos, specials) in FAMILIES.items():
        if request.param == "llama.cpp":
            from transformers import AutoTokenizer

            out[family] = AutoTokenizer.from_pretrained(Path(REAL) / folder)
        else:
            tok = build_tokenizer()
            tok.add_tokens(list(specials), special_tokens=True)
            tok.eos_token = eos
            out[family] = tok
    return out


def encoder(tokenizers, family: str, template: str, train_on: str = "last_assistant") -> Encoder:
    tok = copy.deepcopy(tokenizers[family])
    tok.chat_template = template
    data = SimpleNamespace(format="messages", train_on=train_on, max_length=1024, add_special_tokens=False)
    return Encoder(tok, data, stop_token_ids(tok, extra=[FAMILIES[family][1]]))


def encode(enc: Encoder, messages: list[dict]):
    """The row encoded row by row, held equal to the batched (spliced where it can) path."""
    row = Row("train.jsonl", 3, {"messages": messages})
    sample = read_sample(row, "messages", enc.train_on)[0]
    one = enc.encode(row, sample)
    assert enc.encode_many([(row, sample)]) == [one]
    return one


def trained_text(enc: Encoder, encoded) -> str:
    return enc.tok.decode([t for t, label in zip(encoded.input_ids, encoded.labels) if label != IGNORE_INDEX])


@pytest.mark.parametrize("train_on", ["last_assistant", "assistant"])
@pytest.mark.parametrize("messages", [REASONING_IN_CONTENT, REASONING_APART], ids=["in-content", "reasoning_content"])
def test_qwen35_reasoning_trains_all_the_model_generates_and_nothing_the_prompt_holds(tokenizers, messages, train_on):
    enc = encoder(tokenizers, "qwen35", QWEN35, train_on)
    encoded = encode(enc, messages)
    assert encoded.problems == ()
    assert trained_text(enc, encoded) == TRAINED  # the same labels whichever field holds the reasoning
    prompt = enc.render(messages[:2], add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    if messages is REASONING_IN_CONTENT:  # the content's "<think>\n" is the inference prompt's: shown as such
        given = [k for start, end in encoded.prompted for k in range(start, end)]
        assert enc.tok.decode([encoded.input_ids[k] for k in given]).strip() == "<think>"
        view = token_view(enc.tok, encoded)
        assert [view["tokens"][k][1] for k in view["prompted"]] == [False] * len(given)
        assert "".join(view["tokens"][k][0] for k in view["prompted"]).strip() == "<think>"
        assert token_spans(view).count("<span class='tok p'>") == len(given)  # drawn apart in masking.html
    else:
        assert encoded.prompted == ()


def test_qwen35_response_tokens_after_the_prompt_must_still_train(tokenizers):
    enc = encoder(tokenizers, "qwen35", QWEN35)
    encoded = encode(enc, REASONING_IN_CONTENT)
    labels = list(encoded.labels)
    first = next(k for k, label in enumerate(labels) if label != IGNORE_INDEX)
    labels[first] = IGNORE_INDEX  # the reasoning's first word, which the model does generate, left out
    sample = read_sample(encoded.row, "messages", "last_assistant")[0]
    problems = judge_labels(enc.tok, sample, "last_assistant", encoded.input_ids, labels, enc.stop_ids)
    assert [kind for kind, _ in problems] == ["assistant_untrained"]
    assert problems[0][1].startswith("1 of ")
    # the labels as made pass the same verification a trainer's labels get (TRL, LLaMA-Factory, Axolotl)
    assert judge_labels(enc.tok, sample, "last_assistant", encoded.input_ids, encoded.labels, enc.stop_ids) == []
    # without the prompt's end, the "<think>" the prompt holds is (wrongly) required to train
    text = enc.tok.decode(list(encoded.input_ids), skip_special_tokens=False)
    offsets = enc.tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    flags = [label != IGNORE_INDEX for label in encoded.labels]
    assert [k for k, _ in verify_turns(sample, text, offsets, flags, "last_assistant")] == ["assistant_untrained"]


def test_qwen35_stripping_earlier_reasoning_is_history_rewritten_not_a_prompt_mismatch(tokenizers):
    every_turn = encode(encoder(tokenizers, "qwen35", QWEN35, "assistant"), REASONING_IN_HISTORY)
    assert [kind for kind, _ in every_turn.problems] == ["history_rewritten"]
    assert "messages[1] renders differently once later turns follow" in every_turn.problems[0][1]
    last = encoder(tokenizers, "qwen35", QWEN35)
    encoded = encode(last, REASONING_IN_HISTORY)
    assert encoded.problems == ()
    assert trained_text(last, encoded) == "Three lamps glow.\n</think>\n\nKalo sees three lamps.<|im_end|>"


def test_qwen35_without_its_generation_prompt_branch_says_the_header_is_missing(tokenizers):
    bare = QWEN35[: QWEN35.rindex("{%- if add_generation_prompt %}")]
    encoded = encode(encoder(tokenizers, "qwen35", bare), REASONING_APART)
    assert [kind for kind, _ in encoded.problems] == ["generation_prompt_ignored"]
    assert "the inference prompt before messages[2] lacks the assistant header" in encoded.problems[0][1]
    assert "counts" not in encoded.problems[0][1]  # the header shown holds reasoning: not shown


@pytest.mark.parametrize("dropped, role", [
    ({"role": "system", "content": "You answer in one short sentence."}, "system"),
    ({"role": "tool", "content": "{\"comets\": 2}"}, "tool"),
], ids=["system", "tool"])
def test_phi3_gguf_template_dropping_a_message_names_it(tokenizers, dropped, role):
    enc = encoder(tokenizers, "phi3", PHI3_GGUF, "assistant")
    rest = [{"role": "user", "content": "How many comets?"}, {"role": "assistant", "content": "Two comets."}]
    encoded = encode(enc, [dropped] + rest if role == "system" else rest[:1] + [dropped] + rest[1:])
    label = "messages[0]" if role == "system" else "messages[1]"
    assert ("message_dropped", f"the chat template drops {label} ({role}): its content is nowhere in the "
            "rendered text") in encoded.problems
    # spliced: the skeleton shows the other messages' contents only, so the dropped one is looked for
    spliced = enc.fast.splicer.splice(read_sample(encoded.row, "messages", "assistant")[0], enc.render, None)
    assert spliced is not None and spliced[4] == {0, 1, 2} - {int(label[-2])}
    assert encode(enc, rest).problems == ()  # the same template with nothing to drop


# family -> (template file, eos, bos, the strings the template tests a content for or splits it on, when the
# code behind its tests is analysed too: needles(..., segments=True))
SPLICED = {"llama-3.1": ("Llama-3.1-8B-Instruct.jinja", "<|eot_id|>", "<|begin_of_text|>", set()),
           "mistral-nemo": ("Mistral-Nemo-Instruct-2407.jinja", "</s>", "<s>", set()),
           "qwen3.5": ("Qwen3.5-4B.jinja", "<|im_end|>", "<s>",
                       {"<think>", "</think>", "<tool_response>", "</tool_response>", ("edge", "\n")}),
           "deepseek-r1-distill": ("DeepSeek-R1-Distill-Qwen-32B.jinja", "<｜end▁of▁sentence｜>",
                                   "<｜begin▁of▁sentence｜>", {"</think>"}),
           "qwen2.5": ("Qwen2.5-7B-Instruct.jinja", "<|im_end|>", "<s>", set()),
           "qwen3": ("Qwen3-0.6B.jinja", "<|im_end|>", "<s>",
                     {"<think>", "</think>", "<tool_response>", "</tool_response>", ("edge", "\n")}),
           "gemma-2": ("gemma-2-2b-it.jinja", "<end_of_turn>", "<bos>", set()),
           "phi-3": ("Phi-3-gguf.jinja", "<|end|>", "<s>", set())}
# rows whose reasoning is in the content or in reasoning_content, earlier turns' reasoning, a user
# turn that looks like a tool response (Qwen 3.5 looks for the last real user query)
REASONING_ROWS = [{"messages": m} for m in (REASONING_IN_CONTENT, REASONING_APART, REASONING_IN_HISTORY, [
    {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "\nHello."}], [
    {"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Checking."},
    {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"},
    {"role": "assistant", "content": "Sunny."}])]


@pytest.mark.parametrize("name", list(SPLICED))
def test_family_templates_take_the_fast_path_and_splice_exactly(name):
    """Their constructs ('tool_calls' in message, message == user_messages[-1], a tool result's
    content | tojson, Qwen 3.5's render_content macro, '</think>' in content before a split) are
    proved or probed, and the spliced rows equal the row-by-row ones; a row with a needle in a
    content is spliced too, its contents cut around the needles (the reasoning split off)."""
    from pytest_ftready.data.layouts import row_problems
    from pytest_ftready.data.skeleton import needles
    from pytest_ftready.tiny import build_tokenizer
    from tests.data.test_skeleton import SPLICE_ROWS, variants

    file, eos, bos, tested = SPLICED[name]
    template = (TEMPLATES / file).read_text()
    assert needles(template, segments=True) == tested
    tool_turns = {"messages": [{"role": "user", "content": "Weather in Oslo?"},
                               {"role": "assistant", "content": "Let me look."},
                               {"role": "user", "content": "Weather in Oslo?"},  # equal to an earlier message
                               {"role": "assistant", "content": "Sunny."},
                               {"role": "tool", "content": "{\"sky\": \"clear\"}\n", "tool_call_id": "abcdefghi"},
                               {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "You're welcome."}]}
    rows = [Row("t.jsonl", n, variants(data, k)) for n, (k, data) in enumerate(
        (k, data) for k in range(2) for data in SPLICE_ROWS + [tool_turns] + REASONING_ROWS)]
    spliced = cut = 0
    for train_on in ("assistant", "last_assistant"):
        tok = build_tokenizer(template, eos=eos, bos=bos)
        enc = Encoder(tok, SimpleNamespace(format="auto", train_on=train_on, max_length=512, add_special_tokens=False),
                      stop_token_ids(tok))
        assert enc.fast.splicer is not None and enc.fast.splicer.needles == tested
        pairs = [(row, read_sample(row, "auto", train_on)[0]) for row in rows if not row_problems(row, "auto", train_on)]
        assert enc.encode_many(pairs) == [enc.encode(row, sample) for row, sample in pairs], train_on
        taken = [hasattr(s, "messages") and enc.fast.splicer.splice(s, enc.render, None) is not None for _, s in pairs]
        spliced += sum(taken)
        for (_, sample), took in zip(pairs, taken):
            if any(needle in m["content"] for m in getattr(sample, "messages", ()) for needle in tested
                   if isinstance(needle, str)):
                cut += took  # '</think>' in a content: cut around it, spliced
    # DeepSeek-R1-Distill's inference prompt ends "<think>\n</think>", which its training render never holds: no
    # trained turn passes the prefix check (the rows fail data.template), its renders spliced and held per row
    assert spliced > 20, spliced
    assert (cut > 0) == (name in ("qwen3.5", "qwen3", "deepseek-r1-distill")), cut


LOOP = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
END = "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


@pytest.mark.parametrize("use, proved", [
    ("{% if 'tool_calls' in m %}T{% endif %}{{ m.content }}", True),
    ("{% if 'weight' not in m %}{{ m.content }}{% endif %}", True),
    ("{% if m == messages[-1] %}L{% endif %}{{ m['content'] }}", True),
    ("{% if m.content.content is defined %}{{ m.content.content }}{% else %}{{ m.content }}{% endif %}", True),
    ("{% if m.content.upper is defined %}U{% endif %}{{ m.content }}", True),
    ("{{ m.content | tojson }}", True),  # proved opaque but escaping: the probe render sends such rows row by row
    ("{% if 'x' in m.content %}X{% endif %}", True),  # a needle: rows holding 'x' go row by row
    ("{% if not m.content.startswith(('<a>', 'b')) %}{{ m.content }}{% endif %}", True),
    ("{% macro show(c) %}{% if c is string %}{{- c }}{% else %}{% for i in c %}{{ i.text }}{% endfor %}{% endif %}"
     "{% endmacro %}{% set c = show(m.content) | trim %}{% if '</t>' in c %}{{ c.split('</t>')[1] }}{% endif %}{{ c }}",
     True),  # Qwen 3.5's render_content and reasoning split: the split runs only for a content holding '</t>'
    ("{% macro show(c) %}{{ c }}!{% endmacro %}{% if '</t>' in show(m.content) %}{{ m.content.split('</t>') }}"
     "{% endif %}", False),  # the macro prints more than the content: '</t>' may straddle
    ("{% set c = m.content if loop.first else [m.content] %}{% if c is string %}{{ c }}{% else %}{{ c[0] }}"
     "{% endif %}", False),  # not always a string: its other branch is analysed
    ("{% if 'x' in m.content ~ m.role %}X{% endif %}", False),
    ("{% if '12' in m.content %}X{% endif %}", False),  # a placeholder holds digits
    ("{{ m.content.lstrip('\n') }}", True),  # Qwen 3: a content starting with a newline goes row by row
    ("{{ m.content.lstrip() }}", False),  # whitespace: a placeholder's padding
    ("{% if m.content == messages[0].content %}S{% endif %}", False),
    ("{% if m == 'hi' %}S{% endif %}", False),
    ("{{ m.content.upper() }}", False),
    ("{{ m.content | tojson(indent=2) }}", False),
], ids=lambda value: str(value)[:40])
def test_structure_only_constructs_are_proved_and_content_uses_refused(use, proved):
    from pytest_ftready.data.skeleton import opaque

    assert opaque(LOOP + use + END) is proved


@pytest.mark.parametrize("use", ["{{ m.content | tojson }}", "{% if m == messages[0] %}F{% endif %}{{ m['content'] }}"])
def test_escaping_and_equal_messages_splice_exactly_or_go_row_by_row(use):
    from pytest_ftready.tiny import build_tokenizer

    tok = build_tokenizer(LOOP + use + END)
    enc = Encoder(tok, SimpleNamespace(format="messages", train_on="assistant", max_length=512, add_special_tokens=False),
                  stop_token_ids(tok))
    same = [{"role": "user", "content": "say \"hi\"\n"}, {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "say \"hi\"\n"}, {"role": "assistant", "content": "hi"}]
    rows = [Row("t.jsonl", 1, {"messages": same}), Row("t.jsonl", 2, {"messages": same[:2] + [
        {"role": "user", "content": "again"}, {"role": "assistant", "content": "hi"}]})]
    pairs = [(row, read_sample(row, "messages", "assistant")[0]) for row in rows]
    assert enc.encode_many(pairs) == [enc.encode(row, sample) for row, sample in pairs]
    taken = [enc.fast.splicer.splice(s, enc.render, None) is not None for _, s in pairs]
    assert taken == ([False, False] if "tojson" in use else [True, True])


def test_reasoning_content_a_template_drops_is_named_and_one_it_renders_passes(tokenizers):
    dropped = encode(encoder(tokenizers, "phi3", PHI3_GGUF), REASONING_APART[1:])  # no reasoning branch
    assert dropped.problems == (("reasoning_dropped", "the chat template drops the reasoning_content of messages[1]: "
                                 "the model would be trained to answer without it"),)
    assert encode(encoder(tokenizers, "qwen35", QWEN35), REASONING_APART).problems == ()
    # earlier turns' reasoning that Qwen 3.5 strips is not judged under last_assistant: those turns do not train
    # (the last answer, without reasoning, trains the template's empty <think> block: counted, not blocking)
    earlier = [REASONING_APART[1], REASONING_APART[2], {"role": "user", "content": "And the lamps?"},
               {"role": "assistant", "content": "Kalo sees three lamps."}]
    problems = encode(encoder(tokenizers, "qwen35", QWEN35), earlier).problems
    assert [kind for kind, _ in problems] == ["empty_reasoning_trained"]


@pytest.mark.parametrize("family", ["qwen3.5", "qwen3", "deepseek-r1-distill"])
def test_fuzzed_reasoning_contents_splice_exactly(family):
    """Contents made of the needles' pieces ("</think>", a half of it, "<tool_response>"...), whitespace
    and marks: the batched (spliced where it can, contents cut around the needles) path equals the
    row-by-row one on Qwen 3.5, Qwen 3 and DeepSeek-R1-Distill, which split the reasoning off a content."""
    from hypothesis import example, given, settings
    from hypothesis import strategies as st

    from pytest_ftready.data.layouts import row_problems
    from pytest_ftready.tiny import build_tokenizer

    file, eos, bos, _ = SPLICED[family]
    tok = build_tokenizer((TEMPLATES / file).read_text(), eos=eos, bos=bos)
    enc = Encoder(tok, SimpleNamespace(format="auto", train_on="last_assistant", max_length=96,
                                       add_special_tokens=False), stop_token_ids(tok))
    assert enc.fast.splicer is not None and enc.fast.splicer.segments
    pieces = st.lists(st.sampled_from(["a", " ", "\n", "<think>", "</think>", "</thi", "nk>", "<tool_response>",
                                       "</tool_response>", "<|im_end|>", "\u3000", "é"]), max_size=6).map("".join)
    turns = st.lists(st.tuples(st.sampled_from(["user", "tool"]), pieces, pieces), min_size=1, max_size=3)

    # derandomize seeds from this function's source: a few plain conversations that always splice keep
    # "spliced rows were compared" true whatever the edit
    plain = [[("user", "a" * (k + 1), " a" * (k + 1))] for k in range(6)]

    @settings(max_examples=80, deadline=None, database=None, derandomize=True)
    @given(turns)
    @example(plain[0]).via("splices")
    @example(plain[1]).via("splices")
    @example(plain[2]).via("splices")
    @example(plain[3]).via("splices")
    @example(plain[4]).via("splices")
    @example(plain[5]).via("splices")
    def check(turns):
        messages = [m for k, (role, ask, answer) in enumerate(turns)  # a user query first, as Qwen 3.5 wants
                    for m in ({"role": "user" if k == 0 else role, "content": ask},
                              {"role": "assistant", "content": answer})]
        row = Row("t.jsonl", 1, {"messages": messages})
        if not row_problems(row, "auto", "last_assistant"):
            sample = read_sample(row, "auto", "last_assistant")[0]
            assert enc.encode_many([(row, sample)]) == [enc.encode(row, sample)]
            taken.append(enc.fast.splicer.splice(sample, enc.render, None) is not None)
            cut.append(taken[-1] and any("</think>" in m["content"] for m in messages))

    taken: list = []
    cut: list = []
    check()
    assert sum(taken) > 5 and sum(cut) > 5, (taken, cut)  # spliced rows, reasoning split off some, were compared



# SentencePiece-style vocabularies (spaces as ▁, byte fallback): llama.cpp's Llama vocabulary under
# Mistral Nemo's template (a Metaspace prepending ▁ to the text's start), Phi-3's (▁ before every stretch
# between added tokens); without FTREADY_REAL_TOKENIZERS, the tiny SentencePiece-style BPE of each kind
SENTENCEPIECE_FAMILIES = {"mistral-nemo": ("llama-spm", "Mistral-Nemo-Instruct-2407.jinja", "</s>", "first", ()),
                          "phi-3": ("phi-3", "Phi-3-gguf.jinja", "<|end|>", "each", FAMILIES["phi3"][2])}
CONTENTS = ["Hi", " lead and trail ", "\nstarts on a new line", "tabs\tand  two  spaces\n\nhere", "café über 中文",
            "Как дела? 👍🏽", "☃ first", "x" * 40, "1+1=2", "Хорошо’ ﬁne", "a\u2581b", "<0x0A> as text"]


@pytest.fixture(scope="module", params=["tiny"] + (["llama.cpp"] if REAL else []))
def sentencepiece_tokenizers(request):
    """family -> its SentencePiece-style tokenizer (llama.cpp's, or the tiny one of its kind)."""
    from tests.data.test_tiling import sentencepiece_style

    out = {}
    for family, (folder, template, eos, scheme, specials) in SENTENCEPIECE_FAMILIES.items():
        if request.param == "llama.cpp":
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(Path(REAL) / folder)
        else:
            tok = sentencepiece_style(scheme)
            tok.add_tokens(list(specials), special_tokens=True)
            tok.eos_token = eos
        tok.chat_template = (TEMPLATES / template).read_text()
        out[family] = tok
    return out


@pytest.mark.parametrize("family", list(SENTENCEPIECE_FAMILIES))
def test_sentencepiece_families_read_offsets_from_widths_exactly(sentencepiece_tokenizers, family, monkeypatch):
    """Their pipelines are read as SentencePiece-style; each render's columns from the widths are
    its offsets (ASCII or not; a text holding ▁ or <0x is not read so), the holder of each
    character ``char_to_token``'s; encode_many, which reads the rows after its first batches
    without offsets (Phi-3's normalized before the backend), gives the row-by-row results."""
    from pytest_ftready.data import fast_encoding
    from pytest_ftready.data import tiling
    from pytest_ftready.data.fast_encoding import FastPaths, WidthCheck

    _, _, eos, scheme, _ = SENTENCEPIECE_FAMILIES[family]
    tok = copy.deepcopy(sentencepiece_tokenizers[family])
    table = tiling.widths(tok._tokenizer)
    assert table is not None and table.pieces is not None and table.pieces.scheme == scheme
    chats = [[{"role": "user", "content": a}, {"role": "assistant", "content": b}, {"role": "user", "content": b},
              {"role": "assistant", "content": a}] for a in CONTENTS for b in CONTENTS[::3]]
    for messages in chats:
        text = tok.apply_chat_template(messages, tokenize=False)
        encoding = tok._tokenizer.encode(text, add_special_tokens=False)
        found = tiling.columns(table, text, encoding.ids)
        assert (found is not None) == ("\u2581" not in text and "<0x" not in text), text
        if found is not None:
            assert list(zip(*found)) == encoding.offsets, text
            assert [tiling.holder(found[1], x) for x in range(len(text) + 1)] == [
                encoding.char_to_token(x) for x in range(len(text) + 1)]
    quick = []
    read_quick = FastPaths.read_without_offsets
    monkeypatch.setattr(FastPaths, "read_without_offsets",
                        lambda self, e, t, k: quick.extend(k) or read_quick(self, e, t, k))
    monkeypatch.setattr(fast_encoding, "FIRST_BATCH_ROWS", 8)
    monkeypatch.setattr(fast_encoding, "BATCH_ROWS", 8)
    for train_on in ("assistant", "last_assistant"):
        data = SimpleNamespace(format="messages", train_on=train_on, max_length=1024, add_special_tokens=False)
        enc = Encoder(tok, data, stop_token_ids(tok, extra=[eos]))
        rows = [Row("train.jsonl", n + 1, {"messages": m}) for n, m in enumerate(chats)]
        pairs = [(row, read_sample(row, "messages", train_on)[0]) for row in rows]
        assert enc.encode_many(pairs) == [enc.encode(row, sample) for row, sample in pairs]
        assert enc.fast.checks == {tiling.ASCII: WidthCheck.AGREES, tiling.UTF8: WidthCheck.AGREES}
    assert tiling.ASCII in quick and tiling.UTF8 in quick and None in quick
    # Phi-3's Prepend and Replace normalizer is applied before the backend, checked by the first batch
    assert (enc.fast.prenormal is not None) == (scheme == "each")
    if enc.fast.prenormal is not None:
        assert enc.fast.prenormal_check is WidthCheck.AGREES
        texts = [tok.apply_chat_template(messages, tokenize=False) for messages in chats]
        assert [e.ids for e in enc.fast.prenormal.tokenize(texts)] == [
            e.ids for e in tok._tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
