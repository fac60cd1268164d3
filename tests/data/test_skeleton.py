"""Splicing (data/skeleton.py) gives exactly what rendering each row gives: opacity proved from
the template's syntax tree (and refused for every other use of a content), and
``Encoder.encode_many`` equal to ``encode`` row by row on the real templates of the repo's
tests, on rows built to break the splice, and on fuzzed contents (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytest_ftready.data.fast_encoding import WidthCheck
from pytest_ftready.data.layouts import read_sample, row_problems
from pytest_ftready.data.rows import Row
from pytest_ftready.data.skeleton import MARKS, needles, opaque
from pytest_ftready.tiny import CHATML
from tests.data.test_encoding import CHAT, GEMMA, LLAMA3, MISTRAL, THINKING
from tests.data.test_fast_paths import ROWS, TEMPLATES, WITH_TOOLS, encoder, tokenizers  # noqa: F401
from tests.faults.test_hostile_templates import RAISES_ON_BOOM

LOOP = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
END = "<|im_end|>\n{% endfor %}"


@pytest.mark.parametrize("template", [CHATML, LLAMA3, GEMMA, MISTRAL, WITH_TOOLS, TEMPLATES["no-markers"][0],
                                      LOOP + "{% if m['content'] is string and m['content'] %}{{ m.content | trim }}"
                                      "{% endif %}" + END,
                                      LOOP + "{% set c = m.get('content') %}{{ c }}" + END,
                                      LOOP + "{{ (m['content'] ~ '!') if loop.last else m['content'] }}" + END,
                                      "{% set sys = messages[0]['content'] if messages[0]['role'] == 'system' %}"
                                      "{{ sys }}" + LOOP + "{{ m['content'] }}" + END,
                                      "{% for m in messages|selectattr('role', 'equalto', 'user') %}{{ m.content }}"
                                      "{% endfor %}"],
                         ids=["chatml", "llama3-trim", "gemma", "mistral", "tools", "no-markers", "type-and-empty-tests",
                              "get", "tilde-concat", "system-first", "selectattr-role"])
def test_templates_that_only_print_contents_are_opaque(template):
    assert opaque(template)


@pytest.mark.parametrize("use", [
    "{{ m['content'].split('</think>')[-1] }}", "{% if '<tool>' in m['content'] ~ '' %}x{% endif %}",
    "{% if '7' in m['content'] %}x{% endif %}",  # a needle a placeholder may hold
    "{% if m['content'].startswith(m['role']) %}x{% endif %}",  # a needle that is no constant
    "{{ m['content'] | length }}", "{{ m['content'][0] }}", "{{ m['content'] | replace('a', 'b') }}",
    "{{ m | tojson }}", "{{ m }}", "{{ messages | tojson }}", "{{ m['content'] | upper }}",
    "{% if m['content'] == 'hi' %}x{% endif %}", "{% set c = m['content'] %}{{ c.strip() }}",
    "{% set ns = namespace(c='') %}{% set ns.c = m['content'] %}{{ ns.c | length }}",
    "{% set ns = namespace(c='') %}{% set ns.c = m['content'] %}{{ ns }}",
    "{{ c | length }}{% set c = m['content'] %}",  # a use before the binding, in source order
    "{% filter upper %}{{ m['content'] }}{% endfilter %}", "{% for k, v in m.items() %}{{ v }}{% endfor %}",
    "{% macro show(x) %}{{ x | upper }}{% endmacro %}{{ show(m['content']) }}",
    "{{ m['content'] | trim('x') }}", "{{ m[key] }}", "{{ '%s' % m['content'] }}",
    "{{ messages | map(attribute='content') | join }}",
    "{% for m2 in messages|selectattr('content', 'equalto', 'x') %}{% endfor %}",
], ids=lambda use: use[:40])
def test_any_other_use_of_a_content_is_not_opaque(use):
    assert not opaque(LOOP + use + END)


def test_reasoning_raising_and_marked_templates_are_not_opaque():
    assert not opaque(THINKING)  # it rewrites earlier turns from their content
    # it raises on a content holding "boom": proved for the rows without it, those with it go row by row
    assert needles(RAISES_ON_BOOM) == {"boom"}
    assert not opaque(CHATML.replace("<|im_start|>", "<|im_start|>" + MARKS[0]))  # the template prints a mark
    assert not opaque(CHATML, special_tokens=["<s" + MARKS[1]])
    assert not opaque("{% include 'x' %}") and not opaque("{% for %}") and not opaque("")


# rows built to break a splice: whitespace, marks, empty and huge contents, contents that look like markup
SPLICE_ROWS = ROWS + [
    {"messages": [{"role": "user", "content": "  padded \n"}, {"role": "assistant", "content": "\tboth sides "}]},
    {"messages": [{"role": "user", "content": "   "}, {"role": "assistant", "content": "answer"}]},
    {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "answer"}]},
    {"messages": [{"role": "user", "content": "a" + MARKS[1] + "0" + MARKS[2]}, {"role": "assistant", "content": "b"}]},
    {"messages": [{"role": "user", "content": MARKS[0] + "x"}, {"role": "assistant", "content": "y" + MARKS[0]}]},
    {"messages": [{"role" + MARKS[0]: "user", "role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
    {"messages": [{"role": "user", "content": "{{ x }}{% if %}"}, {"role": "assistant", "content": "<|im_end|>\n"}]},
    {"messages": [{"role": "user", "content": "q " * 3000}, {"role": "assistant", "content": "short"}]},
    {"messages": [{"role": "system", "content": "s " * 3000}, {"role": "user", "content": "u"},
                  {"role": "assistant", "content": "a"}]},
    {"messages": [{"role": "user", "content": "x", "name": "ann"}, {"role": "assistant", "content": "y", "name": 7}]},
]


def variants(data: dict, k: int) -> dict:
    """The same structure with other contents: rows that share one skeleton."""
    if "messages" not in data:
        return data
    return {**data, "messages": [dict(m, content=m["content"] + f" v{k}") if isinstance(m.get("content"), str)
                                 and m["content"].strip() else m for m in data["messages"]]}


@pytest.mark.parametrize("name, tok_name", [(name, "tiny") for name in TEMPLATES]
                         + [("chatml", "adds-bos"), ("llama3", "adds-bos"), ("mistral", "adds-bos")])
def test_encode_many_is_encode_row_by_row(tokenizers, name, tok_name):  # noqa: F811
    template, eos = TEMPLATES[name]
    spliced = compared = 0
    rows = [Row("t.jsonl", n, variants(data, k)) for n, (k, data) in enumerate(
        (k, data) for k in range(2) for data in SPLICE_ROWS)]
    for train_on in ("all", "assistant", "last_assistant"):
        for max_length, add_special in ((512, False), (24, True)):  # whole rows; cut rows with the tokenizer's specials
            enc = encoder(tokenizers[tok_name], template, eos, train_on, max_length, add_special)
            pairs = [(row, read_sample(row, "auto", train_on)[0]) for row in rows
                     if not row_problems(row, "auto", train_on)]
            assert enc.encode_many(pairs) == [enc.encode(row, sample) for row, sample in pairs], (train_on, max_length)
            compared += len(pairs)
            if enc.fast.splicer is not None:
                spliced += sum(1 for _, s in pairs if hasattr(s, "messages")
                               and enc.fast.splicer.splice(s, enc.render, enc.render_marked) is not None)
    assert compared > 200
    # the opaque templates really took the spliced path (a template whose inference prompt is no prefix
    # of its training render too: its renders are spliced and held per row; a reasoning template splitting
    # the reasoning off earlier turns too: its contents cut around '</think>')
    assert spliced > 0


# templates that branch on a content's emptiness (trimmed or not) and type
BRANCHING = {
    "trimmed-empty": LOOP + "{% if m['content'] | trim %}{{ m['content'] }}{% else %}(empty){% endif %}" + END,
    "empty-or-string": LOOP + "{% if not m['content'] %}-{% elif m['content'] is string %}{{ m.content | trim }}"
                       "{% endif %}" + END + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
}


@pytest.mark.parametrize("name", list(BRANCHING))
def test_templates_branching_on_emptiness_splice_exactly(tokenizers, name):  # noqa: F811
    enc = encoder(tokenizers["tiny"], BRANCHING[name], "<|im_end|>", "assistant", 512, False)
    assert enc.fast.splicer is not None
    rows = [Row("t.jsonl", n, data) for n, data in enumerate(SPLICE_ROWS)]
    pairs = [(row, read_sample(row, "auto", "assistant")[0]) for row in rows if not row_problems(row, "auto", "assistant")]
    # blank contents never pass the layout checks; the encoder is still exact on them
    row = Row("t.jsonl", 99, {"messages": CHAT})
    sample = read_sample(row, "auto", "assistant")[0]
    for blank in ("", "  ", "\n"):
        pairs.append((row, replace(sample, messages=(dict(sample.messages[0], content=blank), *sample.messages[1:]))))
    assert enc.encode_many(pairs) == [enc.encode(row, sample) for row, sample in pairs]


def test_the_splice_is_taken_and_skeletons_are_shared(tokenizers):  # noqa: F811
    enc = encoder(tokenizers["tiny"], CHATML, "<|im_end|>", "assistant", 512, False)
    rows = [Row("t.jsonl", k, variants({"messages": ROWS[1]["messages"]}, k)) for k in range(50)]
    pairs = [(row, enc.sample(row)) for row in rows]
    assert enc.encode_many(pairs) == [enc.encode(row, s) for row, s in pairs]
    assert len(enc.fast.splicer.skeletons) == 1
    assert all(enc.fast.splicer.splice(s, enc.render, enc.render_marked) is not None for _, s in pairs)
    # a template splitting contents on '</think>': spliced only with its contents cut around it
    assert needles(THINKING) is None and needles(THINKING, segments=True) == {"</think>"}
    thinking = encoder(tokenizers["tiny"], THINKING, "<|im_end|>", "assistant", 512, False).fast.splicer
    assert thinking is not None and thinking.segments


contents = st.lists(st.sampled_from(["a", "b", " ", "\n", "\t", "<|im_end|>", "<|eot_id|>", "{{", "%}", "é", "😀",
                                     "\u3000", "\ue000", "\ue001", "0", "\r", "\x00"]), max_size=8).map("".join)
conversations = st.lists(st.tuples(st.sampled_from(["user", "system", "tool"]), contents, contents), min_size=1,
                         max_size=3)


@settings(max_examples=60, deadline=None, database=None)
@given(conversations, st.sampled_from(["chatml", "llama3", "gemma", "mistral", "no-markers"]))
# a content of a tag and spaces, trimmed by the template: written, yet "nowhere in the text" to message_dropped
@example([("user", " <|im_end|>", "a")], "llama3")
def test_fuzzed_contents_encode_many_is_encode(tokenizers, turns, name):  # noqa: F811
    template, eos = TEMPLATES[name]
    enc = encoder(tokenizers["tiny"], template, eos, "assistant", 64, False)
    messages = [m for role, ask, answer in turns
                for m in ({"role": role, "content": ask}, {"role": "assistant", "content": answer})]
    rows = [Row("t.jsonl", 1, {"messages": messages})]
    pairs = [(row, read_sample(row, "auto", "assistant")[0]) for row in rows if not row_problems(row, "auto", "assistant")]
    assert enc.encode_many(pairs) == [enc.encode(row, sample) for row, sample in pairs]


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.sampled_from(["a", "bc", " ", "\n", "\t", "<think>", "</think>", "</thi", "nk>", "<think></think>",
                                 "'", "é"]), max_size=10).map("".join))
def test_a_content_is_cut_around_its_needles(content):
    """``shape``: the literals and the cores put back together are the content; each core is
    stripped and holds no needle; a core starting or ending with an edge needle's character is refused."""
    from pytest_ftready.data.skeleton import shape

    needles_ = frozenset({"<think>", "</think>", ("edge", "\n")})
    literals, cores = shape(content, needles_)
    assert len(literals) == len(cores) + 1
    assert "".join(lit + core for lit, core in zip(literals, [*cores, ""])) == content
    assert all(core and core == core.strip() and "<think>" not in core and "</think>" not in core for core in cores)
    assert (shape(content, needles_ | {("edge", "'")}) is None) == any(core[0] == "'" or core[-1] == "'"
                                                                      for core in cores)


@pytest.mark.parametrize("text,rows", [("ascii", 1500), ("typographic", 300), ("cyrillic", 300)])
def test_a_pass_over_a_generated_corpus_is_the_same_spliced_or_row_by_row(tmp_path, tiny_model_dir, text, rows):
    """The issue's proof in small: every problem, length and the fingerprint of every row's tokens
    and labels agree between the spliced and the row-by-row data pass (planted secrets, escaped
    values and decoys included), whatever the script of the rows (the scale benchmark's
    FTREADY_SCALE_TEXT)."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from pytest_ftready.data.digest import Plan
    from pytest_ftready.data.encoding import Encoder, stop_token_ids
    from pytest_ftready.data.passes import run_pass
    from tests.benchmarks.corpus import write_corpus

    path = tmp_path / "chat.jsonl"
    write_corpus(path, rows, plant_every=20, text=text)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = SimpleNamespace(format="messages", train_on="assistant", max_length=128, add_special_tokens=False, roles={})
    spliced, row_by_row = (Encoder(tok, data, stop_token_ids(tok)) for _ in range(2))
    row_by_row.fast.splicer = None
    plan = Plan(format="messages", train_on="assistant")
    one, other = (run_pass([path], plan, encoder=e, chunk_bytes=65536) for e in (spliced, row_by_row))
    assert one.encoded == rows and one.problems and len(spliced.fast.splicer.skeletons) > 1
    # the rows' offsets were read from their widths: the ASCII ones, and the others where there are some
    assert spliced.fast.widths is not None and spliced.fast.checks["ascii"] is WidthCheck.AGREES
    assert (spliced.fast.checks["utf-8"] is WidthCheck.AGREES) == (text != "ascii")
    for name in ("problems", "bad", "bad_count", "full_lengths", "lengths", "fingerprint", "head",
                 "with_problems", "first_trainable", "layouts", "methods"):
        assert getattr(one, name) == getattr(other, name), name


def test_a_backend_left_truncating_goes_through_the_tokenizers_own_call(tokenizers):  # noqa: F811
    enc = encoder(tokenizers["tiny"], CHATML, "<|im_end|>", "assistant", 512, True)
    rows = [Row("t.jsonl", k, variants({"messages": ROWS[1]["messages"]}, k)) for k in range(4)]
    pairs = [(row, enc.sample(row)) for row in rows]
    expected = [enc.encode(row, s) for row, s in pairs]
    enc.tok._tokenizer.enable_truncation(8)  # the backend's batch call would cut every row at 8 tokens
    assert enc.encode_many(pairs) == expected
    assert enc.tok._tokenizer.truncation is None  # the tokenizer's __call__ ran (and set its backend back)


def test_turn_renders_that_are_no_prefix_are_spliced_and_held_row_by_row(tokenizers):  # noqa: F811
    """An inference prompt ending "<think>\\n" (as DeepSeek-R1's does): with placeholder contents
    the turn renders are no prefix of the training render, but an answer starting "<think>\\n"
    makes them one. The skeleton splices those renders row after row and holds them as the
    row-by-row path does: each row gets that path's spans and problems, spliced."""
    template = LOOP + "{{ m.content }}" + END + "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
    answers = ["Two comets.", "<think>\nTwo", "<think>\nThree", "<think>Four"]
    rows = [Row("t.jsonl", n + 1, {"messages": [{"role": "user", "content": "How many comets?"},
                                                {"role": "assistant", "content": answer}]})
            for n, answer in enumerate(answers)]
    for train_on in ("assistant", "last_assistant"):
        enc = encoder(tokenizers["tiny"], template, "<|im_end|>", train_on, 512, False)
        pairs = [(row, read_sample(row, "messages", train_on)[0]) for row in rows]
        fast = enc.encode_many(pairs)
        assert fast == [enc.encode(row, sample) for row, sample in pairs]
        assert all(enc.fast.splicer.splice(s, enc.render, None) is not None for _, s in pairs)
        assert ["prompt_not_prefix" in {kind for kind, _ in e.problems} for e in fast] == [True, False, False, True]
        assert fast[1].trained_full > 0 and fast[0].trained_full == 0


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_spliced_inference_prompts_are_the_renders(tokenizers, name):  # noqa: F811
    """``Splicer.splice_prompt``, which the fast path gives the rows it renders row by row: the
    render of a row's first messages with the generation prompt, spliced, is that render exactly (or None)."""
    template, eos = TEMPLATES[name]
    enc = encoder(tokenizers["tiny"], template, eos, "assistant", 512, False)
    if enc.fast.splicer is None:
        return
    spliced = 0
    for k in range(2):
        for data in SPLICE_ROWS:
            row = Row("t.jsonl", 1, variants(data, k))
            if row_problems(row, "auto", "assistant") or "messages" not in row.data:
                continue
            chat = read_sample(row, "auto", "assistant")[0]
            for i in chat.trained:
                got = enc.fast.splicer.splice_prompt(chat, i, enc.render)
                if got is not None:
                    spliced += 1
                    assert got == enc.render(chat.messages[:i], True, chat.tools), (row.data, i)
    assert spliced > 0
