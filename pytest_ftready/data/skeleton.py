"""Chat renders by splicing: render a conversation's structure once, then write each row's text.

Most chat templates treat a message's content as opaque text: they print it (maybe ``| trim``),
concatenated with role markers, and test at most whether it is empty or a string. For such a
template the render of a conversation is a skeleton fixed by its structure (the roles and
other fields of its messages, which turns train, its tools) with each content spliced in. The
skeleton is rendered once per structure with placeholder contents, together with the renders
the encoder needs around each trained turn (the inference prompt before it, the render up to
it) and the ``{% generation %}`` spans; a row's text and its spans then cost one string join.

``opaque(template)`` proves from the template's Jinja syntax tree that every use of a content
is printed, concatenated into printed text, trimmed, passed to the template's own macro (whose
output is then what it prints), or tested for being a string / empty, or, the content itself
(trimmed or not), for holding a constant string (``'</think>' in content``,
``content.startswith('<tool_response>')``: ``needles``). Any other use (``split``, ``replace``,
``length``, indexing, ``tojson`` with arguments, a needle test on the content concatenated to
something...) and the template is rendered row by row, except where it sits behind a needle test
no spliced row passes (Qwen 3.5's and DeepSeek-R1's reasoning ``split``). Where the code behind
the needle tests only splits a content on needles, reads a part by a constant index and strips
a part's ends (``needles(..., segments=True)``), a row whose contents hold needles is spliced
too: each such content is cut around the needles and the whitespace next to them (``shape``),
its literals part of the structure and a placeholder for each core between them (a core holds no
needle and no whitespace at its ends, so the template does to its placeholder what it does to
it). A row is rendered row by row when a content holds a needle the template was not analysed
for, when a content holds a placeholder character, is whitespace only (no placeholder keeps both its
truthiness and its trimmed emptiness), or is not a string, and a structure whose render
fails goes row by row (the row-by-row path then names the problem). A trained turn whose renders
with placeholders are not prefixes of the training render (DeepSeek-R1's inference prompt ends
``<think>\n</think>``) has those renders spliced too, row after row, and held against the row's text as
the row-by-row path holds its own (``turn_span``: the row's contents may make them prefixes).
Imports jinja2 (through transformers) only when ``opaque`` is first called."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

# a placeholder is " k " between private-use marks, padded with an ideographic space (whitespace
# to str.strip, so ``| trim`` shows as the padding's absence)
PAD, OPEN, CLOSE = "\u3000", "\ue000", "\ue001"
MARKS = (PAD, OPEN, CLOSE)
_PIECE = re.compile(f"{PAD}{OPEN}(\\d+){CLOSE}{PAD}|{OPEN}(\\d+){CLOSE}")
MAX_STRUCTURES = 4096  # skeletons kept per encoder (the cache is emptied when full)

LIST, MESSAGE, TEXT = "messages", "message", "content"  # what a template expression holds
PARTS = "parts"  # a content split on a needle (``segments`` only): only a part may be read, by a constant index
BARE = "bare content"  # a content itself, or trimmed: what a needle test reads (see ``needles``)
TEXTS = (TEXT, BARE)
TYPE_TESTS = frozenset({"string", "defined", "undefined", "none", "mapping", "sequence", "iterable"})
DICT_ATTRIBUTES = frozenset(dir(dict))  # message.items, message.values, ...: contents as data


class _NotOpaque(Exception):
    pass


def opaque(template: str, special_tokens: Sequence[str] = ()) -> bool:
    """Whether every render of ``template`` is its structure's skeleton with the contents spliced
    in (see the module docstring), for the rows whose contents hold none of ``needles(template)``.
    False when it cannot be parsed as transformers parses it, or when it (or a special token it
    may print) holds a placeholder character."""
    return needles(template, special_tokens) is not None


def needles(template: str, special_tokens: Sequence[str] = (), segments: bool = False) -> Optional[frozenset]:
    """The strings a content is tested for (``'</think>' in content``, ``content.startswith('<x>')``,
    Qwen 3.5's and DeepSeek-R1's templates) when the template is opaque otherwise, else None.

    Such a test is false for every placeholder (a needle holds a character no placeholder has),
    and false for a content holding none of the needles (the test reads the content itself or
    its ``| trim``, nothing concatenated to it), so a row whose contents hold none is spliced
    (``Splicer``) and the code behind a true test (Qwen 3.5 splitting the reasoning off a content)
    is never run for it: that code is not analysed. A row with a needle in a content is rendered
    row by row. ``("edge", chars)``: the content is stripped of ``chars`` (Qwen 3's
    ``content.lstrip('\n')``), the content itself unless it starts or ends with one of them (no
    placeholder does); a row whose content does is rendered row by row.

    ``segments``: the code behind the needle tests is analysed too, and may also split a content
    on a needle (``content.split('</think>')[0]``) and strip a part's ends (``.rstrip('\n')``);
    then a row whose content holds needles is spliced as well, its contents cut around them
    (``shape``). None where the template does more than that with a content."""
    if not template or any(mark in text for mark in MARKS for text in (template, *special_tokens)):
        return None
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        tree = _compile_jinja_template(template).environment.parse(template)
    except Exception:  # another transformers, or a template jinja rejects: row by row
        return None
    taint = _Taint(segments)
    try:
        for _ in range(8):  # until no name gains a taint: an earlier use may read a later binding
            taint.changed = False
            taint.needles = set()
            taint.statements(tree.body)
            if not taint.changed:
                return frozenset(taint.needles)
    except _NotOpaque:
        return None
    return None


class _Taint:
    """What each template name may hold (``LIST``, ``MESSAGE``, ``TEXT``), and the check that
    every use of those is one that keeps the content opaque."""

    def __init__(self, segments: bool = False) -> None:
        self.segments = segments  # needle tests decide nothing: both branches are analysed (see ``needles``)
        self.names: dict[str, str] = {"messages": LIST}
        self.untainted: set[str] = set()  # names also bound to something else than a content/message/list
        self.macros: dict = {}  # name -> the template's {% macro %} node
        self.needles: set[str | tuple[str, str]] = set()  # a text, or ("edge", characters)
        self.changed = False

    def bind(self, name: str, kind: Optional[str]) -> None:
        if kind is None:  # a name never loses a taint: scopes and orders are not followed
            if name not in self.untainted:
                self.untainted.add(name)
                self.changed = True
            return
        old = self.names.get(name)
        if old is None or (old == BARE and kind == TEXT):
            self.names[name] = kind
            self.changed = True
        elif old != kind and {old, kind} != {BARE, TEXT}:
            raise _NotOpaque

    def mentions(self, node) -> bool:
        from jinja2 import nodes

        return any(n.name in self.names or n.name == "loop" for n in node.find_all(nodes.Name))

    def statements(self, body) -> None:
        for node in body:
            self.statement(node)

    def statement(self, node) -> None:
        from jinja2 import nodes as n

        if isinstance(node, n.Output):
            for child in node.nodes:
                if self.expr(child) not in (None, *TEXTS):
                    raise _NotOpaque  # a message or the list printed: its repr holds the contents
        elif isinstance(node, n.For):
            kind = self.expr(node.iter)
            if kind == LIST and isinstance(node.target, n.Name):
                self.bind(node.target.name, MESSAGE)
            elif kind is not None:
                raise _NotOpaque
            else:
                self.target(node.target, None)
            if node.test is not None:
                self.expr(node.test)
            self.statements(node.body)
            self.statements(node.else_)
        elif isinstance(node, n.If):
            self.expr(node.test)
            known = self.static(node.test)
            if known is not False:
                self.statements(node.body)
            if known is not True:  # the branches a spliced row may take
                self.statements(node.elif_)
                self.statements(node.else_)
        elif isinstance(node, n.Assign):
            self.target(node.target, self.expr(node.node))
        elif isinstance(node, n.AssignBlock):
            if node.filter is not None and self.mentions(node):
                raise _NotOpaque
            self.statements(node.body)
            self.target(node.target, TEXT if self.mentions(node) else None)
        elif isinstance(node, n.CallBlock):
            call = node.call
            if not (isinstance(call, n.Call) and isinstance(call.node, n.ExtensionAttribute)
                    and call.node.name == "_generation_support") and self.mentions(node):
                raise _NotOpaque  # a macro's caller() with a content: the macro may do anything with it
            self.statements(node.body)
        elif isinstance(node, n.Macro):
            for default in node.defaults:
                if self.expr(default) is not None:
                    raise _NotOpaque
            self.macros[node.name] = node
            self.statements(node.body)
        elif isinstance(node, n.With):
            for target, value in zip(node.targets, node.values):
                self.target(target, self.expr(value))
            self.statements(node.body)
        elif isinstance(node, n.ExprStmt):
            if self.expr(node.node) is not None:
                raise _NotOpaque
        elif isinstance(node, n.Scope):
            self.statements(node.body)
        elif isinstance(node, n.FilterBlock):
            if self.mentions(node):
                raise _NotOpaque  # the filter rewrites the printed content
            self.statements(node.body)
        elif not isinstance(node, (n.Break, n.Continue)):
            raise _NotOpaque  # include, import, extends, autoescape...: not analysed

    def target(self, node, kind: Optional[str]) -> None:
        from jinja2 import nodes as n

        if isinstance(node, n.Name):
            self.bind(node.name, kind)
        elif isinstance(node, n.NSRef):
            self.bind(f"{node.name}.{node.attr}", kind)
        elif kind is not None:
            raise _NotOpaque
        else:
            for name in node.find_all(n.Name):
                self.bind(name.name, None)

    def clean(self, *exprs) -> None:
        for expr in exprs:
            if expr is not None and self.expr(expr) is not None:
                raise _NotOpaque

    def field(self, kind: Optional[str], name, through_attribute: bool) -> Optional[str]:
        """A message's field ``name``: its content, or structure (part of the skeleton's key)."""
        if kind is None:
            return None
        if kind == MESSAGE and isinstance(name, str) and not (through_attribute and name in DICT_ATTRIBUTES):
            return BARE if name == "content" else None
        if kind in TEXTS and isinstance(name, str) and not hasattr(str, name):
            return None  # undefined for every str content (Mistral's "message.content.content is defined")
        raise _NotOpaque

    def expr(self, node) -> Optional[str]:
        from jinja2 import nodes as n

        if isinstance(node, (n.Const, n.TemplateData)):
            return None
        if isinstance(node, n.Name):
            if node.name not in self.names and any(key.startswith(node.name + ".") for key in self.names):
                return MESSAGE  # a namespace holding a content: only its fields may be read
            return self.names.get(node.name)
        if isinstance(node, n.Getattr):
            if isinstance(node.node, n.Name):
                if node.node.name == "loop" and node.attr in ("previtem", "nextitem"):
                    return MESSAGE
                if f"{node.node.name}.{node.attr}" in self.names:
                    return self.names[f"{node.node.name}.{node.attr}"]
            return self.field(self.expr(node.node), node.attr, True)
        if isinstance(node, n.Getitem):
            kind = self.expr(node.node)
            if kind == LIST:
                self.clean(node.arg)
                return LIST if isinstance(node.arg, n.Slice) else MESSAGE
            if kind == MESSAGE and isinstance(node.arg, n.Const):
                return self.field(kind, node.arg.value, False)
            index = node.arg.node if isinstance(node.arg, n.Neg) else node.arg  # parts[0], parts[-1]
            if kind == PARTS and isinstance(index, n.Const) and type(index.value) is int:
                return BARE  # a part of a content: a piece of it, as a content is (see ``shape``)
            if kind is not None:
                raise _NotOpaque
            self.clean(node.arg)
            return None
        if isinstance(node, n.Call):
            return self.call(node)
        if isinstance(node, n.Filter):
            return self.filter(node)
        if isinstance(node, n.Test):
            if (node.name in ("defined", "undefined") and isinstance(node.node, n.Getattr)
                    and self.expr(node.node.node) in TEXTS):
                return None  # an attribute of a content (a str in every spliced row): whether it exists is its type's
            kind = self.expr(node.node)
            self.clean(*node.args, *(kw.value for kw in node.kwargs), node.dyn_args, node.dyn_kwargs)
            if kind is not None and node.name not in TYPE_TESTS:
                raise _NotOpaque
            return None
        if isinstance(node, (n.Add, n.Concat)):
            kinds = {self.expr(child) for child in ((node.left, node.right) if isinstance(node, n.Add) else node.nodes)}
            return self.either({TEXT if kind == BARE else kind for kind in kinds})  # more than the content
        if isinstance(node, n.Not):
            self.expr(node.node)  # truthiness: emptiness is part of the structure
            return None
        if isinstance(node, n.Compare) and (self.has_key(node) or self.same_messages(node) or self.needle(node)):
            return None
        if isinstance(node, (n.And, n.Or)):
            return self.either({self.expr(node.left), self.expr(node.right)}, loose=True)
        if isinstance(node, n.CondExpr):
            self.expr(node.test)
            return self.either({self.expr(node.expr1), None if node.expr2 is None else self.expr(node.expr2)},
                               loose=True)
        # anything else (comparisons, arithmetic, literals, slices...) only on structure
        for child in node.iter_child_nodes():
            self.clean(child)
        return None

    def has_key(self, node) -> bool:
        """``'tool_calls' in message`` (or ``not in``): which fields a message has is part of its
        structure (Llama 3.x's and Mistral's templates branch on it)."""
        from jinja2 import nodes as n

        return (isinstance(node.expr, n.Const) and isinstance(node.expr.value, str) and len(node.ops) == 1
                and node.ops[0].op in ("in", "notin") and self.expr(node.ops[0].expr) == MESSAGE)

    def same_messages(self, node) -> bool:
        """``message == user_messages[-1]`` (Mistral's templates): messages are equal when their
        fields and contents are, and which contents are equal is part of the structure."""
        return (all(op.op in ("eq", "ne") for op in node.ops)
                and all(self.expr(e) == MESSAGE for e in (node.expr, *(op.expr for op in node.ops))))

    def needle(self, node) -> bool:
        """``'</think>' in content`` (``not in``): see ``needles``."""
        from jinja2 import nodes as n

        if not (isinstance(node.expr, n.Const) and len(node.ops) == 1 and node.ops[0].op in ("in", "notin")
                and self.expr(node.ops[0].expr) == BARE):
            return False
        self.add_needle(node.expr.value)
        return True

    def add_needle(self, value) -> None:
        """A needle must be a str holding a character no placeholder holds (a digit or a mark)."""
        if not isinstance(value, str) or not value.strip("0123456789"):
            raise _NotOpaque
        self.needles.add(value)

    def static(self, test) -> Optional[bool]:
        """The value of an {% if %} test in every spliced row, where the syntax tells it: a needle
        test is false (``in`` / ``startswith`` / ``endswith``, see ``needles``), a content ``is
        string``; ``not``, ``and``, ``or`` of those."""
        from jinja2 import nodes as n

        if isinstance(test, n.Not):
            inner = self.static(test.node)
            return None if inner is None else not inner
        if isinstance(test, (n.And, n.Or)):
            left, right = self.static(test.left), self.static(test.right)
            stop = isinstance(test, n.Or)  # the value that decides: True for or, False for and
            if stop in (left, right):
                return stop
            return (not stop) if left is not None and right is not None else None
        if isinstance(test, n.Compare) and isinstance(test.expr, n.Const) and len(test.ops) == 1 \
                and test.ops[0].op in ("in", "notin") and self.expr(test.ops[0].expr) == BARE:
            return None if self.segments else test.ops[0].op == "notin"
        if (isinstance(test, n.Call) and isinstance(test.node, n.Getattr)
                and test.node.attr in ("startswith", "endswith") and self.expr(test.node.node) == BARE):
            return None if self.segments else False
        if isinstance(test, n.Test) and test.name == "string" and not test.args and self.always_text(test.node):
            return True
        return None

    def always_text(self, node) -> bool:
        """Whether ``node`` holds a content (a str in every spliced row) whatever it is bound to:
        a content of a message, its ``| trim``, a name bound to nothing else, a macro's output."""
        from jinja2 import nodes as n

        return self.expr(node) == BARE and not any(
            name.name in self.untainted for name in node.find_all(n.Name))

    def either(self, kinds: set, loose: bool = False) -> Optional[str]:
        """The one taint of ``kinds``; ``loose``: some of them may hold something else (``a or
        content``), so no longer the content itself."""
        if loose and None in kinds and BARE in kinds:
            kinds.add(TEXT)
            kinds.discard(BARE)
        kinds.discard(None)
        if kinds == {BARE, TEXT}:
            return TEXT
        if len(kinds) > 1:
            raise _NotOpaque
        return kinds.pop() if kinds else None

    def call(self, node) -> Optional[str]:
        from jinja2 import nodes as n

        callee = node.node
        if isinstance(callee, n.Name) and callee.name in self.macros and callee.name not in self.names:
            return self.macro_call(self.macros[callee.name], node)
        if (isinstance(callee, n.Getattr) and callee.attr in ("startswith", "endswith") and not node.kwargs
                and node.dyn_args is None and node.dyn_kwargs is None and len(node.args) == 1
                and self.expr(callee.node) == BARE):
            arg = node.args[0]  # a string or a tuple of strings, constant
            for value in arg.items if isinstance(arg, n.Tuple) else (arg,):
                if not isinstance(value, n.Const):
                    raise _NotOpaque
                self.add_needle(value.value)
            return None
        if (isinstance(callee, n.Getattr) and callee.attr in ("lstrip", "rstrip", "strip") and not node.kwargs
                and node.dyn_args is None and node.dyn_kwargs is None and len(node.args) == 1
                and isinstance(node.args[0], n.Const) and isinstance(node.args[0].value, str) and node.args[0].value
                and self.expr(callee.node) == BARE):
            # Qwen 3's content.lstrip('\n'): the content itself where it neither starts nor ends with one of
            # those characters (as no placeholder does: its ends are marks); a row whose content does goes
            # row by row (an edge needle: ("edge", chars))
            self.needles.add(("edge", node.args[0].value))
            return BARE
        if (self.segments and isinstance(callee, n.Getattr) and callee.attr == "split" and not node.kwargs
                and node.dyn_args is None and node.dyn_kwargs is None and len(node.args) == 1
                and isinstance(node.args[0], n.Const) and self.expr(callee.node) == BARE):
            # Qwen 3.5's content.split('</think>'): on a needle, which every content is cut around (``shape``)
            self.add_needle(node.args[0].value)
            return PARTS
        self.clean(*node.args[1:], *(kw.value for kw in node.kwargs), node.dyn_args, node.dyn_kwargs)
        if isinstance(callee, n.Getattr) and callee.attr == "get" and self.expr(callee.node) == MESSAGE:
            if node.args and isinstance(node.args[0], n.Const):
                return self.field(MESSAGE, node.args[0].value, False)
            raise _NotOpaque
        self.clean(callee, *node.args[:1])
        return None

    def macro_call(self, macro, node) -> Optional[str]:
        """A call of the template's own macro: its parameters take the arguments' taints (one not
        given holds its default or is undefined: something else); its output is what it prints."""
        if node.dyn_args is not None or node.dyn_kwargs is not None or len(node.args) > len(macro.args):
            raise _NotOpaque
        given = {param.name: self.expr(arg) for param, arg in zip(macro.args, node.args)}
        names = {param.name for param in macro.args}
        for kw in node.kwargs:
            if kw.key not in names:
                raise _NotOpaque
            given[kw.key] = self.expr(kw.value)
        for param in macro.args:
            self.bind(param.name, given.get(param.name))
        printed = self.printed(macro.body)
        if printed is not None:
            return BARE if len(printed) == 1 and self.always_text(printed[0]) else (TEXT if printed else None)
        return TEXT if any(kind is not None for kind in given.values()) else None

    def printed(self, body) -> Optional[list]:
        """The tainted expressions ``body`` prints in every spliced row, in order, when the syntax
        tells (ifs decided by ``static``, constant text only empty); None when it does not."""
        from jinja2 import nodes as n

        out = []
        for node in body:
            if isinstance(node, n.Output):
                for child in node.nodes:
                    if isinstance(child, n.TemplateData) or (isinstance(child, n.Const) and child.value == ""):
                        if child.data if isinstance(child, n.TemplateData) else False:
                            return None
                    elif self.expr(child) is not None:
                        out.append(child)
                    else:
                        return None
            elif isinstance(node, n.If):
                known = self.static(node.test)
                if known is None or (known is False and node.elif_):
                    return None
                inner = self.printed(node.body if known else node.else_)
                if inner is None:
                    return None
                out.extend(inner)
            else:
                return None
        return out

    def filter(self, node) -> Optional[str]:
        from jinja2 import nodes as n

        kind = None if node.node is None else self.expr(node.node)
        self.clean(*node.args, *(kw.value for kw in node.kwargs), node.dyn_args, node.dyn_kwargs)
        plain = not node.args and not node.kwargs and node.dyn_args is None and node.dyn_kwargs is None
        if kind is None:
            return None
        if kind in TEXTS and node.name in ("trim", "string") and plain:
            return kind  # a content trimmed is still the content itself to a needle test
        if kind in TEXTS and node.name == "tojson" and plain:
            return TEXT  # tojson escapes the content: _skeleton's probe render finds where it does
        if kind in (LIST, MESSAGE) and node.name in ("length", "count"):
            return None
        if kind == LIST and node.name in ("first", "last") and plain:
            return MESSAGE
        if kind == LIST and node.name == "list" and plain:
            return LIST
        if (kind == LIST and node.name in ("selectattr", "rejectattr") and node.args
                and isinstance(node.args[0], n.Const) and node.args[0].value != "content"):
            return LIST
        raise _NotOpaque


# ---- skeletons ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Skeleton:
    """A training render with placeholders: ``literals[j]`` then ``refs[j]`` (message index,
    trimmed) for each j, then the last literal. ``points``: positions of interest as (literal
    index, offset in it): the generation span ends, then each trained turn's prompt end and
    render end. ``renders``: the trained turns whose renders with placeholders are not prefixes
    of the training render (DeepSeek-R1's inference prompt ends ``<think>\n</think>``): per such turn its
    index among the trained turns and the (literals, refs) of its inference prompt and of its
    render up to it (None: the training render itself), spliced per row and held against the
    row's text as the row-by-row path holds its renders (``turn_span``). ``shown``: the messages
    whose content the training render holds as it is."""

    literals: tuple[str, ...]
    refs: tuple[tuple[int, bool], ...]
    generation: Optional[tuple[tuple[tuple[int, int], tuple[int, int]], ...]]
    turns: tuple[Optional[tuple[tuple[int, int], tuple[int, int]]], ...]
    renders: tuple[tuple[int, tuple, Optional[tuple]], ...] = ()
    shown: frozenset[int] = frozenset()


def turn_span(label: str, prompt: str, upto: str, text: str, problems: list) -> Optional[tuple[int, int]]:
    """A trained turn's character span in the training render ``text``: from the end of its
    inference prompt ``prompt`` to the end of ``upto``, the render of the turns up to it. The
    prompt is held against ``upto`` (the same conversation), and ``upto`` against ``text`` (which
    later turns may rewrite): each mismatch is a problem of its own, and a turn with one has no span."""
    if not upto.startswith(prompt):
        problems.append(("prompt_not_prefix", f"the inference prompt before {label} "
                         "(add_generation_prompt=True) is not a prefix of the render of the turns up to it"))
    if not text.startswith(upto):
        problems.append(("history_rewritten", f"assistant turn {label} renders differently once later "
                         "turns follow (the template rewrites history, as reasoning templates do)"))
    elif upto.startswith(prompt):
        return len(prompt), len(upto)
    return None


class Splicer:
    """Renders chat rows of one encoder by splicing; ``splice`` gives (text, generation spans,
    turn spans, turn problems) exactly as the row-by-row renders would, or None (then render the row)."""

    def __init__(self, char_budget: int, needles: frozenset = frozenset(), segments: bool = False) -> None:
        self.char_budget = char_budget
        self.needles = needles  # a row with one of them in a content goes row by row (see ``needles``)...
        self.segments = segments  # ...or, where the template was analysed for it, is cut around them (``shape``)
        self.skeletons: dict = {}

    def splice(self, chat, render: Callable, render_marked: Optional[Callable]
               ) -> Optional[tuple[str, Optional[list], dict, list, frozenset[int]]]:
        """``render(messages, add_generation_prompt, tools)``: the text; ``render_marked(messages,
        tools)``: the text and its {% generation %} spans (None spans: unknown), or None when the
        generation spans are not wanted. The turn spans: per trained message whose renders are
        prefixes of the text (``turn_span``); the problems: those ``turn_span`` found; the
        messages whose content the text holds (``Skeleton.shown``)."""
        found = structure(chat, self.needles, self.segments)
        if found is None:
            return None
        key, shapes = found
        try:
            skeleton = self.skeletons[key]
        except KeyError:
            if len(self.skeletons) >= MAX_STRUCTURES:
                self.skeletons.clear()
            skeleton = self.skeletons[key] = _skeleton(chat, render, render_marked, shapes=shapes)
        if skeleton is None:
            return None
        contents = _contents(chat, key[1], shapes)
        if max(map(len, contents), default=0) > self.char_budget:
            return None  # the row-by-row path clips such contents
        literals = skeleton.literals
        pieces = [contents[i].strip() if trimmed else contents[i] for i, trimmed in skeleton.refs]
        text = "".join(itertools.chain.from_iterable(zip(literals, pieces))) + literals[-1]
        if len(text) > self.char_budget:
            return None
        # where each literal starts in the row's text
        starts = list(itertools.accumulate(itertools.chain.from_iterable(zip(map(len, literals), map(len, pieces))),
                                           initial=0))[::2]

        def at(point):
            return starts[point[0]] + point[1]

        generation = None if skeleton.generation is None else [(at(a), at(b)) for a, b in skeleton.generation]
        spans = [None if turn is None else (at(turn[0]), at(turn[1])) for turn in skeleton.turns]
        problems: list = []
        for n, prompt, upto in skeleton.renders:
            i = chat.trained[n]
            spans[n] = turn_span(chat.labels[i], _joined(prompt, contents),
                                 text if upto is None else _joined(upto, contents), text, problems)
        return (text, generation, {i: span for i, span in zip(chat.trained, spans) if span is not None}, problems,
                skeleton.shown)


    def splice_prompt(self, chat, count: int, render: Callable) -> Optional[str]:
        """The render of ``chat``'s first ``count`` messages with the generation prompt (an inference
        prompt: what the row-by-row path renders before each trained turn), spliced into the skeleton
        of those messages' structure; None where it cannot be (then render it)."""
        head = _Head(tuple(chat.messages[:count]), chat.tools)
        found = structure(head, self.needles, self.segments)
        if found is None:
            return None
        structure_key, shapes = found
        key = ("prompt", structure_key)
        try:
            skeleton = self.skeletons[key]
        except KeyError:
            if len(self.skeletons) >= MAX_STRUCTURES:
                self.skeletons.clear()
            skeleton = self.skeletons[key] = _skeleton(head, render, None, generation_prompt=True, shapes=shapes)
        contents = _contents(head, structure_key[1], shapes)
        if skeleton is None or max(map(len, contents), default=0) > self.char_budget:
            return None
        return _joined((skeleton.literals, skeleton.refs), contents)


@dataclass(frozen=True)
class _Head:
    """The first messages of a conversation, none of them trained: what an inference prompt renders."""

    messages: tuple
    tools: Optional[tuple]
    trained: tuple = ()


def _joined(parsed: tuple, contents: list) -> str:
    """A render with placeholders (``_parsed``'s literals and refs) with the row's ``contents`` in them."""
    literals, refs = parsed
    pieces = [contents[i].strip() if trimmed else contents[i] for i, trimmed in refs]
    return "".join(itertools.chain.from_iterable(zip(literals, pieces))) + literals[-1]


def _parsed(text: str) -> Optional[tuple[tuple[str, ...], tuple[tuple[int, bool], ...], list[int]]]:
    """A render with placeholders read as (literals, refs, each literal's start), or None where a
    placeholder was cut or changed by the template."""
    literals, refs, starts, at = [], [], [], 0
    for match in _PIECE.finditer(text):
        literals.append(text[at:match.start()])
        starts.append(at)
        refs.append((int(match.group(1) or match.group(2)), match.group(1) is None))
        at = match.end()
    literals.append(text[at:])
    starts.append(at)
    if any(mark in literal for literal in literals for mark in MARKS):
        return None
    return tuple(literals), tuple(refs), starts


def _skeleton(chat, render: Callable, render_marked: Optional[Callable],
              generation_prompt: bool = False, shapes: Optional[tuple] = None) -> Optional[Skeleton]:
    """The structure's renders with placeholder contents, or None where splicing cannot be
    trusted for it (a render fails, a placeholder is cut or changed). ``generation_prompt``: the render is
    the one with the generation prompt (``render_marked`` then None). ``shapes``: per message, its
    content cut around needles (``shape``), or None: the content whole."""
    messages = _placeholders(chat, "", shapes)
    tools = chat.tools
    try:
        if render_marked is not None:
            text, spans = render_marked(messages, tools)
            if spans is None:
                return None
        else:
            text, spans = render(messages, generation_prompt, tools), None
        turns: list = []
        odd = []  # (index among the trained turns, prompt render, render up to it or None: the text)
        for n, i in enumerate(chat.trained):
            prompt = render(messages[:i], True, tools)
            upto = text if i == len(messages) - 1 else render(messages[: i + 1], tools=tools)
            if upto.startswith(prompt) and text.startswith(upto):
                turns.append((len(prompt), len(upto)))
            else:  # held against the row's own text row after row (the contents may make it a prefix)
                turns.append(None)
                odd.append((n, prompt, None if upto is text else upto))
    except Exception:  # the row-by-row path reports the template's error
        return None
    if not (_verbatim(chat, text, render, tools, None, generation_prompt, shapes) and all(
            _verbatim(chat, prompt, render, tools, chat.trained[n], True, shapes)
            and (upto is None or _verbatim(chat, upto, render, tools, chat.trained[n] + 1, shapes=shapes))
            for n, prompt, upto in odd)):
        return None
    parsed = _parsed(text)
    renders = [(n, _parsed(prompt), None if upto is None else _parsed(upto)) for n, prompt, upto in odd]
    if parsed is None or any(p is None or (upto is not None and u is None)
                             for (_, _, upto), (_, p, u) in zip(odd, renders)):
        return None  # a placeholder the template cut or changed
    literals, refs, starts = parsed
    points = [p for span in (spans or ()) for p in span] + [p for turn in turns if turn is not None for p in turn]
    located = [_locate(starts, literals, p) for p in points]
    if any(p is None for p in located):
        return None
    marked = len(spans or ()) * 2
    found = iter(_pairs(located[marked:]))
    # a content written whole (not trimmed: a trimmed content of tags and spaces only shows as no text)
    whole = {k for k, trimmed in refs if not trimmed}
    return Skeleton(literals, refs, None if spans is None else _pairs(located[:marked]),
                    tuple(None if turn is None else next(found) for turn in turns),
                    tuple((n, p[:2], None if u is None else u[:2]) for n, p, u in renders),  # type: ignore[index]
                    frozenset(i for i, slots in enumerate(_slots(chat, shapes))
                              if (shapes is None or shapes[i] is None) and slots[0] in whole))


# characters that escaping filters (tojson) change: a placeholder holding them must come out as it went in
PROBE = "\"\\\n\t'<>&é"


def _verbatim(chat, text: str, render: Callable, tools, count: Optional[int] = None, prompt: bool = False,
              shapes: Optional[tuple] = None) -> bool:
    """Whether each content goes into the training render as it is: the render with placeholders
    holding PROBE is ``text`` with PROBE inside each placeholder (a template escaping a content,
    as ``| tojson`` does, changes it). ``count`` and ``prompt``: ``text`` is the render of the
    first ``count`` messages, with the generation prompt when ``prompt``."""
    messages = _placeholders(chat, PROBE, shapes)
    try:
        probed = render(messages[:count], prompt, tools)
    except Exception:
        return False
    return probed == re.sub(f"{OPEN}(\\d+){CLOSE}", lambda m: f"{OPEN}{m.group(1)}{PROBE}{CLOSE}", text)


def _placeholders(chat, probe: str = "", shapes: Optional[tuple] = None) -> list[dict]:
    """The messages with each content a placeholder (``probe`` inside it), or a content cut around
    needles (``shapes``) its literals with an unpadded placeholder for each core; equal contents get the
    placeholders of the first, so that messages equal in the row are equal in the skeleton.
    Placeholder k stands for ``_contents(...)[k]``."""
    out = []
    for m, slots, cut in zip(chat.messages, _slots(chat, shapes), shapes or itertools.repeat(None)):
        if cut is None:
            content = f"{PAD}{OPEN}{slots[0]}{probe}{CLOSE}{PAD}" if m["content"] else ""
        else:
            # a core has no whitespace at its ends: its placeholder no padding (a strip leaves both alone)
            literals = cut[0]
            content = literals[0] + "".join(f"{OPEN}{k}{probe}{CLOSE}{literal}"
                                            for k, literal in zip(slots, literals[1:]))
        out.append(dict(m, content=content))
    return out


def _slots(chat, shapes: Optional[tuple]) -> list[tuple[int, ...]]:
    """Per message, the indices in ``_contents`` of what its placeholders stand for: the first equal
    content's index, or where the first equal content's cores are."""
    first = _first_equal(chat)
    if not shapes or all(cut is None for cut in shapes):
        return [(k,) for k in first]
    at = len(first)
    slots: list[tuple[int, ...]] = []
    for i, (k, cut) in enumerate(zip(first, shapes)):
        if cut is None:
            slots.append((k,))
        elif k == i:
            slots.append(tuple(range(at, at + len(cut[1]))))
            at += len(cut[1])
        else:
            slots.append(slots[k])
    return slots


def _contents(chat, first: tuple[int, ...], shapes: Optional[tuple]) -> list[str]:
    """What a row's placeholders stand for (``_slots``): each message's content, then the cores of
    each first of equal contents cut around needles."""
    contents = [m["content"] for m in chat.messages]
    if shapes:
        for i, (k, cut) in enumerate(zip(first, shapes)):
            if cut is not None and k == i:
                contents += cut[1]
    return contents


def _first_equal(chat) -> tuple[int, ...]:
    """Per message, the index of the first message with the same content."""
    seen: dict = {}
    return tuple(seen.setdefault(m["content"], i) for i, m in enumerate(chat.messages))


def _pairs(seq: list) -> tuple:
    return tuple(zip(seq[::2], seq[1::2]))


def _locate(starts: list[int], literals: Sequence[str], position: int) -> Optional[tuple[int, int]]:
    """(literal index, offset) of a position of the skeleton's text; None inside a placeholder."""
    for j, (start, literal) in enumerate(zip(starts, literals)):
        if start <= position <= start + len(literal):
            return j, position - start
    return None


def structure(chat, needles: frozenset = frozenset(), segments: bool = False
              ) -> Optional[tuple[tuple, Optional[tuple]]]:
    """What a render depends on besides the contents (None: the row cannot be spliced): each
    message's other fields, whether its content is empty, which turns train, the tools; and per
    message its content cut around needles (``shape``) or None (None for all when none is).
    ``needles``: strings the template tests a content for (see ``needles``); ``segments``: a
    content holding one is cut around them, its literals part of the structure."""
    parts: list[tuple] = []
    shapes: Optional[list] = None
    kept: Optional[str | tuple]
    for n, m in enumerate(chat.messages):
        content = m.get("content")
        if not isinstance(content, str) or (content and not content.strip()):
            return None
        if OPEN in content or CLOSE in content or PAD in content:
            return None
        if needles and any(_edged(content, needle[1]) if isinstance(needle, tuple) else needle in content
                           for needle in needles):
            cut = shape(content, needles) if segments else None
            if cut is None:
                return None
            if shapes is None:
                shapes = [None] * len(chat.messages)
            shapes[n] = cut
        if len(m) == 2 and type(m.get("role")) is str:  # the usual message: its role and its content
            role = m["role"]
            if OPEN in role or CLOSE in role or PAD in role:
                return None
            kept = (("role", role),)
        else:
            fields = tuple((k, v) for k, v in m.items() if k != "content")
            kept = fields  # the fields, or their JSON where some value is not a string
            values = [v for _, v in fields]
            if not all(isinstance(v, str) for v in values):
                kept = _dumped(fields)
                if kept is None:
                    return None
            else:
                joined = "".join(values)  # a mark in one of them is a mark in their join (the marks are one character)
                if OPEN in joined or CLOSE in joined or PAD in joined:
                    return None
        cut = None if shapes is None else shapes[n]
        parts.append((kept, bool(content)) if cut is None else (kept, True, cut[0]))
    tools = _dumped(chat.tools) if chat.tools else ""
    if tools is None:
        return None
    return (tuple(parts), _first_equal(chat), chat.trained, tools), None if shapes is None else tuple(shapes)


def shape(content: str, needles: frozenset) -> Optional[tuple[tuple[str, ...], list[str]]]:
    """``content`` cut around every occurrence of the string ``needles`` and the whitespace next to
    them: (literals, cores), the content being literals[0] + cores[0] + literals[1] + ... +
    literals[-1]; each core is stripped and holds no needle, so a template that splits a content
    on needles, strips a part's ends and tests parts for needles (``needles(..., segments=True)``)
    does to each core's placeholder what it does to the core. None where a core starts or ends
    with a character an edge needle strips (its placeholder would not be stripped)."""
    found = []
    for needle in needles:
        if isinstance(needle, str):
            at = content.find(needle)
            while at >= 0:
                found.append((at, at + len(needle)))
                at = content.find(needle, at + 1)
    regions: list[tuple[int, int]] = []
    for a, b in sorted(found):  # overlapping occurrences are one literal
        if regions and a <= regions[-1][1]:
            regions[-1] = (regions[-1][0], max(regions[-1][1], b))
        else:
            regions.append((a, b))
    literals, cores, held, at = [], [], "", 0
    for a, b in [*regions, (len(content), len(content))]:
        gap = content[at:a]
        core = gap.strip()
        if core:
            literals.append(held + gap[: len(gap) - len(gap.lstrip())])
            cores.append(core)
            held = gap[len(gap.rstrip()):]
        else:
            held += gap
        held += content[a:b]
        at = b
    literals.append(held)
    if any(_edged(core, needle[1]) for needle in needles if isinstance(needle, tuple) for core in cores):
        return None
    return tuple(literals), cores


def _edged(content: str, chars: str) -> bool:
    """Whether ``content`` or its ``| trim`` starts or ends with one of ``chars``."""
    trimmed = content.strip()
    return content != "" and any(end != "" and end in chars for end in (content[:1], content[-1:], trimmed[:1],
                                                                          trimmed[-1:]))


def _dumped(value) -> Optional[str]:
    """JSON of ``value`` (order kept: equal strings render the same), None when it has none or
    holds a placeholder character."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return None
    return None if any(mark in text for mark in MARKS) else text
