"""The subset of Go's text/template that Ollama's chat templates use, parsed and executed as Go
does: text and actions with ``{{-``/``-}}`` trimming, comments, ``.Field`` chains, ``$``,
variables (``$x :=``, ``$x =``), ``range`` (one or two variables, ``else``, ``break``,
``continue``), ``if``/``else if``/``else``/``with``/``end``, pipelines with ``|``, parenthesized
calls, string/number/bool literals, the builtins eq ne lt le gt ge and or not len index slice
print printf println, and Ollama's funcs (json, currentDate, yesterdayDate). Anything else raises
:class:`TemplateError` naming the construct and its line and column, never a guess.

Values are Python's: str, int, float, bool, None (Go's nil), list (slice), dict (map, and the
top-level data Ollama passes as ``map[string]any``) and :class:`Struct` (a Go struct: a missing
field is an error, as in Go)."""

from __future__ import annotations

import datetime
import decimal
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional


class TemplateError(ValueError):
    """A template outside the supported subset, or one Go would refuse to parse or execute; the
    message names the construct and its line:column in the template."""


@dataclass
class Struct:
    """A Go struct value: ``type_name`` for messages, ``fields`` in declaration order."""
    type_name: str
    fields: dict


# --- nodes (named after Go's text/template/parse nodes) ---------------------------------------

@dataclass
class Text:
    text: str


@dataclass
class Field:  # .A.B
    names: tuple
    pos: str


@dataclass
class Variable:  # $ or $x, with an optional .A.B
    name: str
    names: tuple
    pos: str


@dataclass
class Chain:  # (pipeline).A.B
    pipe: "Pipe"
    names: tuple
    pos: str


@dataclass
class Dot:
    pos: str


@dataclass
class Identifier:  # a function name
    name: str
    pos: str


@dataclass
class Literal:
    value: Any
    pos: str


@dataclass
class Command:
    args: list
    pos: str


@dataclass
class Pipe:
    decl: list  # variable names declared (:=) or assigned (=)
    assign: bool
    cmds: list
    pos: str


@dataclass
class Action:
    pipe: Pipe
    pos: str


@dataclass
class Branch:  # if / with / range
    kind: str
    pipe: Pipe
    body: list
    orelse: Optional[list]
    pos: str


@dataclass
class Jump:  # break / continue
    kind: str
    pos: str


# --- lexing ------------------------------------------------------------------------------------

SPACE = " \t\r\n"
TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n]+)
  | (?P<declare>:=)
  | (?P<punct>[|(),=])
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<char>'(?:[^'\\\n]|\\.)*')
  | (?P<number>[+-]?(?:0[xX][0-9a-fA-F_]+|(?:\d[\d_]*)?\.?\d[\d_]*(?:[eE][+-]?\d+)?))
  | (?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+)
  | (?P<dot>\.)
  | (?P<variable>\$[A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
""", re.X)
GO_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b",
              "f": "\f", "v": "\v"}
UNSUPPORTED_KEYWORDS = ("define", "template", "block")
RIGHT_TRIM = re.compile(r"[ \t\r\n]+-}}")  # " -}}": the action ends and the whitespace after it is trimmed


def _where(source: str, offset: int) -> str:
    line = source.count("\n", 0, offset) + 1
    column = offset - (source.rfind("\n", 0, offset) + 1) + 1
    return f"line {line}, column {column}"


def _go_string(body: str, pos: str) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = body[i + 1]
        if e in GO_ESCAPES:
            out.append(GO_ESCAPES[e])
            i += 2
        elif e in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[e]
            out.append(chr(int(body[i + 2:i + 2 + width], 16)))
            i += 2 + width
        else:
            raise TemplateError(f"{pos}: the string escape \\{e} is not supported")
    return "".join(out)


@dataclass
class _Token:
    kind: str
    text: str
    pos: str
    glued: bool  # no space before it (a field right after ')' belongs to the parenthesized value)
    end: int


@dataclass
class _Item:  # one {{ action }} lexed, or a text run
    text: Optional[str] = None
    tokens: list = field(default_factory=list)
    pos: str = ""


def _lex(source: str) -> list:
    items: list = []
    i, trim_next = 0, False
    while True:
        start = source.find("{{", i)
        text = source[i:] if start < 0 else source[i:start]
        if trim_next:
            text = text.lstrip(SPACE)
        if start < 0:
            if text:
                items.append(_Item(text=text))
            return items
        j = start + 2
        if source.startswith("-", j) and j + 1 < len(source) and source[j + 1] in SPACE:
            text = text.rstrip(SPACE)
            j += 2
        if text:
            items.append(_Item(text=text))
        pos = _where(source, start)
        k = j
        if source.startswith("/*", k):  # Go: a comment starts right after "{{" or "{{- "
            close = source.find("*/", k + 2)
            if close < 0:
                raise TemplateError(f"{pos}: a comment {{{{/* is never closed with */}}}}")
            rest = close + 2
            m = RIGHT_TRIM.match(source, rest)
            if m:
                i, trim_next = m.end(), True
            elif source.startswith("}}", rest):
                i, trim_next = rest + 2, False
            else:
                raise TemplateError(f"{pos}: a comment must end with */}}}} (or */ -}}}})")
            continue
        tokens: list = []
        k = j
        while True:
            if k >= len(source):
                raise TemplateError(f"{pos}: an action {{{{ ... is never closed with }}}}")
            trim = RIGHT_TRIM.match(source, k)
            if trim:
                i, trim_next = trim.end(), True
                break
            if source.startswith("}}", k):
                i, trim_next = k + 2, False
                break
            m = TOKEN.match(source, k)
            if not m:
                raise TemplateError(f"{_where(source, k)}: unexpected {source[k]!r} in an action: not part of "
                                    "the Go template subset Ollama's templates use")
            if m.lastgroup and m.lastgroup != "space":
                glued = bool(tokens) and tokens[-1].text == ")" and k == tokens[-1].end
                tokens.append(_Token(m.lastgroup, m.group(), _where(source, k), glued, m.end()))
            k = m.end()
        items.append(_Item(tokens=tokens, pos=pos))


# --- parsing -----------------------------------------------------------------------------------

class _Parser:
    def __init__(self, source: str):
        self.items = _lex(source)
        self.at = 0
        self.loops = 0

    def parse(self) -> list:
        nodes, stop = self.nodes_until_else_or_end()
        if stop is not None:
            raise TemplateError(f"{stop.pos}: unexpected {{{{{stop.tokens[0].text}}}}} with no if/range/with open")
        return nodes

    def nodes_until_else_or_end(self):
        """Nodes up to an ``else`` or ``end`` item (returned, not consumed into a node) or the end."""
        nodes: list = []
        while self.at < len(self.items):
            item = self.items[self.at]
            self.at += 1
            if item.text is not None:
                nodes.append(Text(item.text))
                continue
            if not item.tokens:
                raise TemplateError(f"{item.pos}: an empty action {{{{}}}}")
            head = item.tokens[0]
            word = head.text if head.kind == "ident" else ""
            if word in ("else", "end"):
                return nodes, item
            if word in ("if", "with", "range"):
                nodes.append(self.branch(word, item.tokens[1:], item.pos))
            elif word in ("break", "continue"):
                if not self.loops:
                    raise TemplateError(f"{item.pos}: {{{{{word}}}}} outside a range")
                if len(item.tokens) > 1:
                    raise TemplateError(f"{item.pos}: unexpected {item.tokens[1].text!r} after {word}")
                nodes.append(Jump(word, item.pos))
            elif word in UNSUPPORTED_KEYWORDS:
                raise TemplateError(f"{item.pos}: {{{{{word}}}}} (named templates) is not supported: Ollama's chat "
                                    "templates do not use it")
            else:
                nodes.append(Action(self.pipe(item.tokens, item.pos, decl_ok=True), item.pos))
        return nodes, None

    def branch(self, kind: str, tokens: list, pos: str) -> Branch:
        if not tokens:
            raise TemplateError(f"{pos}: {{{{{kind}}}}} with no pipeline")
        pipe = self.pipe(tokens, pos, decl_ok=True, range_decl=kind == "range")
        self.loops += kind == "range"
        body, stop = self.nodes_until_else_or_end()
        self.loops -= kind == "range"
        if stop is None:
            raise TemplateError(f"{pos}: {{{{{kind}}}}} is never closed with {{{{end}}}}")
        orelse = None
        rest = stop.tokens[1:]
        if stop.tokens[0].text == "else":
            if rest and rest[0].kind == "ident" and rest[0].text in ("if", "with"):
                # {{else if x}} is {{else}}{{if x}}...{{end}} sharing the outer {{end}}
                inner = self.branch(rest[0].text, rest[1:], stop.pos)
                return Branch(kind, pipe, body, [inner], pos)
            if rest:
                raise TemplateError(f"{stop.pos}: unexpected {rest[0].text!r} after else")
            orelse, stop = self.nodes_until_else_or_end()
            if stop is None or stop.tokens[0].text != "end":
                raise TemplateError(f"{pos}: {{{{{kind}}}}} ... {{{{else}}}} is never closed with {{{{end}}}}")
        if len(stop.tokens) > 1:
            raise TemplateError(f"{stop.pos}: unexpected {stop.tokens[1].text!r} after end")
        return Branch(kind, pipe, body, orelse, pos)

    def pipe(self, tokens: list, pos: str, decl_ok: bool = False, range_decl: bool = False) -> Pipe:
        decl: list = []
        assign = False
        if decl_ok and tokens and tokens[0].kind == "variable":
            names, k = [tokens[0].text], 1
            if range_decl and len(tokens) > 2 and tokens[1].text == "," and tokens[2].kind == "variable":
                names, k = [tokens[0].text, tokens[2].text], 3
            if len(tokens) > k and tokens[k].kind == "declare" or (len(tokens) > k and tokens[k].text == "="
                                                                     and len(names) == 1):
                assign = tokens[k].text == "="
                decl, tokens = names, tokens[k + 1:]
                if not tokens:
                    raise TemplateError(f"{pos}: missing value for {' '.join(names)}")
        cmds: list = []
        cmd_tokens: list = []
        depth = 0
        for token in tokens:
            if token.text == "(":
                depth += 1
            elif token.text == ")":
                depth -= 1
            if token.text == "|" and depth == 0:
                cmds.append(self.command(cmd_tokens, pos))
                cmd_tokens = []
            else:
                cmd_tokens.append(token)
        cmds.append(self.command(cmd_tokens, pos))
        return Pipe(decl, assign, cmds, pos)

    def command(self, tokens: list, pos: str) -> Command:
        if not tokens:
            raise TemplateError(f"{pos}: missing command in a pipeline")
        args, k = [], 0
        while k < len(tokens):
            node, k = self.operand(tokens, k)
            args.append(node)
        return Command(args, tokens[0].pos)

    def operand(self, tokens: list, k: int):
        token = tokens[k]
        kind, text, pos = token.kind, token.text, token.pos
        if kind == "punct" and text == "(":
            depth, j = 1, k + 1
            while j < len(tokens) and depth:
                depth += {"(": 1, ")": -1}.get(tokens[j].text, 0) if tokens[j].kind == "punct" else 0
                j += 1
            if depth:
                raise TemplateError(f"{pos}: unclosed parenthesis")
            inner = self.pipe(tokens[k + 1:j - 1], pos, decl_ok=False)
            if j < len(tokens) and tokens[j].kind == "field" and tokens[j].glued:
                return Chain(inner, tuple(tokens[j].text[1:].split(".")), pos), j + 1
            return Chain(inner, (), pos), j
        if kind == "field":
            return Field(tuple(text[1:].split(".")), pos), k + 1
        if kind == "dot":
            return Dot(pos), k + 1
        if kind == "variable":
            name, *names = text.split(".")
            return Variable(name, tuple(names), pos), k + 1
        if kind == "string":
            return Literal(_go_string(text[1:-1], pos), pos), k + 1
        if kind == "raw":
            return Literal(text[1:-1], pos), k + 1
        if kind == "number":
            return Literal(_go_number(text, pos), pos), k + 1
        if kind == "ident":
            if text in ("true", "false"):
                return Literal(text == "true", pos), k + 1
            if text == "nil":
                return Literal(None, pos), k + 1
            if text in FUNCS or text in ("and", "or"):
                return Identifier(text, pos), k + 1
            if text in ("if", "else", "end", "range", "with", "break", "continue") + UNSUPPORTED_KEYWORDS:
                raise TemplateError(f"{pos}: unexpected keyword {text!r} inside an action")
            raise TemplateError(f"{pos}: function {text!r} is not supported (the subset has "
                                f"{', '.join(sorted([*FUNCS, 'and', 'or']))})")
        if kind == "char":
            raise TemplateError(f"{pos}: character constants ({text}) are not supported")
        raise TemplateError(f"{pos}: unexpected {text!r} in an action")


def _go_number(text: str, pos: str):
    clean = text.replace("_", "")
    try:
        if clean.lower().lstrip("+-").startswith("0x"):
            return int(clean, 16)
        if any(c in clean for c in ".eE"):
            return float(clean)
        return int(clean)
    except ValueError:
        raise TemplateError(f"{pos}: bad number {text!r}") from None


# --- values --------------------------------------------------------------------------------------

def truth(value) -> bool:
    """Go's template truth: false, 0, "", nil and empty slices/maps are false; structs are true."""
    if isinstance(value, Struct):
        return True
    return bool(value)


def _type(value) -> str:
    if value is None:
        return "nil"
    if isinstance(value, Struct):
        return value.type_name
    return {bool: "bool", int: "int", float: "float64", str: "string", list: "slice", dict: "map"}.get(
        type(value), type(value).__name__)


def _float_text(value: float) -> str:
    """fmt's %v of a float64: the shortest digits, %e form when the exponent is < -4 or >= 21."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    sign, digits, exp = decimal.Decimal(repr(value)).normalize().as_tuple()
    text = "".join(map(str, digits))
    exponent = len(text) + int(exp) - 1
    if value and (exponent < -4 or exponent >= 21):
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{'-' if sign else ''}{mantissa}e{exponent:+03d}"
    return format(decimal.Decimal(repr(value)).normalize(), "f")


def sprint_value(value) -> str:
    """fmt's %v of a value."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, list):
        return "[" + " ".join(sprint_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{sprint_value(k)}:{sprint_value(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, Struct):
        return "&{" + " ".join(sprint_value(v) for v in value.fields.values()) + "}"
    return str(value)


def go_json(value) -> str:
    """Go's json.Marshal: compact, map keys sorted, struct fields in order, <>& escaped as \\u003c..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if abs(value) < 1e21 and (value == 0 or abs(value) >= 1e-6):
            text = repr(value)
            return text[:-2] if text.endswith(".0") else text
        return re.sub(r"e([+-])0?(\d)", r"e\1\2", repr(value))
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        for c, e in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                     ("\u2029", "\\u2029")):
            text = text.replace(c, e)
        return text
    if isinstance(value, list):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{go_json(str(k))}:{go_json(value[k])}" for k in sorted(value)) + "}"
    if isinstance(value, Struct):
        return "{" + ",".join(f"{go_json(k)}:{go_json(v)}" for k, v in value.fields.items()) + "}"
    raise TemplateError(f"json: cannot encode a {type(value).__name__}")


PRINTF_VERB = re.compile(r"%([-+# 0]*)(\d+)?(?:\.(\d+))?(.)", re.S)


def sprintf(pos: str, fmt: str, *args) -> str:
    """fmt.Sprintf for the verbs chat templates use: %s %v %d %q %t %f %g %x %%, with width and precision."""
    out, i, used = [], 0, 0
    for m in PRINTF_VERB.finditer(fmt):
        out.append(fmt[i:m.start()])
        i = m.end()
        flags, width, precision, verb = m.groups()
        if verb == "%":
            out.append("%")
            continue
        if used >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        arg = args[used]
        used += 1
        if verb in "sv":
            text = sprint_value(arg) if not isinstance(arg, str) else arg
            if precision is not None and verb == "s":
                text = text[:int(precision)]
        elif verb == "q" and isinstance(arg, str):
            text = go_json(arg).replace("\\u003c", "<").replace("\\u003e", ">").replace("\\u0026", "&")
        elif verb == "t" and isinstance(arg, bool):
            text = sprint_value(arg)
        elif verb == "d" and isinstance(arg, int) and not isinstance(arg, bool):
            text = str(arg)
        elif verb == "x" and isinstance(arg, (int, str)) and not isinstance(arg, bool):
            text = format(arg, "x") if isinstance(arg, int) else arg.encode().hex()
        elif verb in "fg" and isinstance(arg, (int, float)) and not isinstance(arg, bool):
            if isinstance(arg, int):
                text = f"%!{verb}(int={arg})"
            elif verb == "f":
                text = f"{arg:.{6 if precision is None else int(precision)}f}"
            else:
                text = _float_text(arg) if precision is None else f"{arg:.{int(precision)}g}"
        elif verb in "sqvtdxfg":
            text = f"%!{verb}({_type(arg)}={sprint_value(arg)})"
        else:
            raise TemplateError(f"{pos}: printf verb %{verb} is not supported (the subset has %s %v %d %q %t %f "
                                "%g %x %%)")
        if flags.strip("-0"):
            raise TemplateError(f"{pos}: printf flag {flags!r} is not supported")
        if width:
            text = text.ljust(int(width)) if "-" in flags else text.rjust(int(width), "0" if "0" in flags else " ")
        out.append(text)
    out.append(fmt[i:])
    if used < len(args):
        out.append("%!(EXTRA " + ", ".join(f"{_type(a)}={sprint_value(a)}" for a in args[used:]) + ")")
    return "".join(out)


def _go_print(*args) -> str:
    """fmt.Sprint: spaces between operands when neither is a string."""
    out = []
    for k, arg in enumerate(args):
        if k and not isinstance(arg, str) and not isinstance(args[k - 1], str):
            out.append(" ")
        out.append(sprint_value(arg))
    return "".join(out)


def _basic(value, pos: str, what: str):
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "nil"
    raise TemplateError(f"{pos}: {what}: non-comparable type {_type(value)}")


def _eq(pos: str, first, *others) -> bool:
    if not others:
        raise TemplateError(f"{pos}: eq: missing argument for comparison")
    kind = _basic(first, pos, "eq")
    for other in others:
        if first is None or other is None:  # Go compares nil with anything, without an error
            if first is other:
                return True
            continue
        if _basic(other, pos, "eq") != kind:
            raise TemplateError(f"{pos}: eq: incompatible types for comparison ({_type(first)} and {_type(other)})")
        if first == other:
            return True
    return False


def _ordered(name: str, test: Callable) -> Callable:
    def compare(pos: str, a, b) -> bool:
        kind = _basic(a, pos, name)
        if kind in ("bool", "nil") or _basic(b, pos, name) != kind:
            raise TemplateError(f"{pos}: {name}: invalid type for comparison ({_type(a)} and {_type(b)})")
        return test(a, b)
    return compare


def _len(pos: str, value) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8"))  # Go's len of a string counts bytes
    if isinstance(value, (list, dict)):
        return len(value)
    raise TemplateError(f"{pos}: len of {_type(value)}")


def _index(pos: str, value, *keys):
    for key in keys:
        if isinstance(value, (list, str)):
            if not isinstance(key, int) or isinstance(key, bool):
                raise TemplateError(f"{pos}: index: cannot index a slice with {_type(key)}")
            items = value.encode("utf-8") if isinstance(value, str) else value
            if not 0 <= key < len(items):
                raise TemplateError(f"{pos}: index: index out of range: {key}")
            value = items[key]
        elif isinstance(value, dict):
            value = value.get(key)
        else:
            raise TemplateError(f"{pos}: index: can't index item of type {_type(value)}")
    return value


def _slice(pos: str, value, *bounds):
    if not isinstance(value, (list, str)):
        raise TemplateError(f"{pos}: slice: can't slice item of type {_type(value)}")
    if len(bounds) > 2:
        raise TemplateError(f"{pos}: slice: three-index slices are not supported")
    if any(not isinstance(b, int) or isinstance(b, bool) for b in bounds):
        raise TemplateError(f"{pos}: slice: the indexes must be integers")
    items = value.encode("utf-8") if isinstance(value, str) else value
    start = bounds[0] if bounds else 0
    stop = bounds[1] if len(bounds) > 1 else len(items)
    if not 0 <= start <= stop <= len(items):
        raise TemplateError(f"{pos}: slice: index out of range: [{start}:{stop}] of {len(items)}")
    out = items[start:stop]
    return out.decode("utf-8", "replace") if isinstance(out, bytes) else out


def _today(pos: str, *_fmt) -> str:
    return datetime.date.today().isoformat()


def _yesterday(pos: str, *_fmt) -> str:
    return (datetime.date.today() - datetime.timedelta(days=1)).isoformat()


# name -> function(pos, *args); and/or are evaluated lazily by the executor, as Go does
FUNCS: dict = {
    "eq": _eq,
    "ne": lambda pos, a, b: not _eq(pos, a, b),
    "lt": _ordered("lt", lambda a, b: a < b),
    "le": _ordered("le", lambda a, b: a <= b),
    "gt": _ordered("gt", lambda a, b: a > b),
    "ge": _ordered("ge", lambda a, b: a >= b),
    "not": lambda pos, a: not truth(a),
    "len": _len,
    "index": _index,
    "slice": _slice,
    "print": lambda pos, *a: _go_print(*a),
    "println": lambda pos, *a: " ".join(sprint_value(x) for x in a) + "\n",
    "printf": lambda pos, fmt, *a: sprintf(pos, fmt, *a),
    "json": lambda pos, v: go_json(v),  # Ollama's
    "currentDate": _today,  # Ollama's (the format argument is ignored, as Ollama does)
    "yesterdayDate": _yesterday,
}


# --- execution -----------------------------------------------------------------------------------

class _Break(Exception):
    pass


class _Continue(Exception):
    pass


# A chat prompt is far shorter than these: a TEMPLATE past them (a range over a huge number, nesting
# deeper than Python's stack) is refused, never left to hang or crash the run.
MAX_OUTPUT_CHARS = 4_000_000
MAX_STEPS = 1_000_000  # statements executed and range iterations


class Template:
    """A parsed template: ``Template(text).execute(data)`` is Go's ``Execute`` of it."""

    def __init__(self, text: str, nodes: Optional[list] = None):
        self.text = text
        try:
            self.nodes = _Parser(text).parse() if nodes is None else nodes
        except RecursionError:
            raise TemplateError("the template nests actions or parentheses deeper than can be followed") from None

    def execute(self, data) -> str:
        out: list = []
        self._vars: list = [["$", data]]
        self._steps = self._chars = 0
        try:
            self._list(self.nodes, data, out)
        except RecursionError:
            raise TemplateError("the template nests actions deeper than can be executed") from None
        return "".join(out)

    def _step(self, out: list, text: str = "") -> None:
        """Count one statement or iteration and the characters written; refuse past the limits."""
        self._steps += 1
        self._chars += len(text)
        if self._steps > MAX_STEPS or self._chars > MAX_OUTPUT_CHARS:
            raise TemplateError(f"the template runs past {MAX_STEPS:,} steps or writes more than "
                                f"{MAX_OUTPUT_CHARS:,} characters for one prompt (a range over a huge value?)")
        if text:
            out.append(text)

    def identifiers(self) -> set:
        """The lower-cased field and variable names the template mentions (Ollama's ``Vars``)."""
        found: set = set()
        _identifiers(self.nodes, found)
        return found

    # statements
    def _list(self, nodes: list, dot, out: list) -> None:
        for node in nodes:
            if isinstance(node, Text):
                self._step(out, node.text)
            elif isinstance(node, Action):
                value = self._pipe(node.pipe, dot)
                self._step(out, "" if node.pipe.decl else "<no value>" if value is None else sprint_value(value))
            elif isinstance(node, Branch):
                self._branch(node, dot, out)
            elif isinstance(node, Jump):
                raise _Break() if node.kind == "break" else _Continue()

    def _branch(self, node: Branch, dot, out: list) -> None:
        mark = len(self._vars)
        try:
            if node.kind == "range":
                self._range(node, dot, out)
                return
            value = self._pipe(node.pipe, dot)
            if truth(value):
                self._list(node.body, value if node.kind == "with" else dot, out)
            elif node.orelse is not None:
                self._list(node.orelse, dot, out)
        finally:
            del self._vars[mark:]

    def _range(self, node: Branch, dot, out: list) -> None:
        decl = node.pipe.decl
        value = self._pipe(Pipe([], False, node.pipe.cmds, node.pipe.pos), dot)
        pairs: Any
        if isinstance(value, list):
            pairs, empty = enumerate(value), not value
        elif isinstance(value, dict):
            pairs, empty = [(k, value[k]) for k in sorted(value)], not value
        elif isinstance(value, int) and not isinstance(value, bool):
            pairs, empty = ((k, k) for k in range(value)), value <= 0
        elif value is None:
            pairs, empty = (), True
        else:
            raise TemplateError(f"{node.pos}: range can't iterate over {_type(value)} {sprint_value(value)}")
        for key, element in pairs:
            self._step(out)
            mark = len(self._vars)
            if len(decl) == 1:
                self._vars.append([decl[0], element])
            elif len(decl) == 2:
                self._vars += [[decl[0], key], [decl[1], element]]
            try:
                self._list(node.body, element, out)
            except _Continue:
                pass
            except _Break:
                break
            finally:
                del self._vars[mark:]
        if empty and node.orelse is not None:
            self._list(node.orelse, dot, out)

    # expressions
    def _pipe(self, pipe: Pipe, dot):
        value, first = None, True
        for cmd in pipe.cmds:
            value = self._command(cmd, dot, None if first else [value])
            first = False
        if pipe.decl:
            if pipe.assign:
                self._set(pipe.decl[0], value, pipe.pos)
            else:
                self._vars.append([pipe.decl[-1], value])
        return value

    def _command(self, cmd: Command, dot, piped: Optional[list]):
        head, rest = cmd.args[0], cmd.args[1:]
        if isinstance(head, Identifier):
            if head.name in ("and", "or"):
                args = [*rest, *(Literal(value, head.pos) for value in piped or [])]
                if not args:
                    raise TemplateError(f"{head.pos}: {head.name} needs at least one argument")
                value = None
                for arg in args:
                    value = self._arg(arg, dot)
                    if truth(value) != (head.name == "and"):
                        return value
                return value
            values = [self._arg(a, dot) for a in rest] + (piped or [])
            try:
                return FUNCS[head.name](head.pos, *values)
            except TypeError:
                raise TemplateError(f"{head.pos}: wrong number of arguments for {head.name}: "
                                    f"{len(values)}") from None
        if rest or piped:
            raise TemplateError(f"{cmd.pos}: can't give arguments to a non-function ({_describe(head)})")
        return self._arg(head, dot)

    def _arg(self, node, dot):
        if isinstance(node, Literal):
            return node.value
        if isinstance(node, Dot):
            return dot
        if isinstance(node, Field):
            return self._fields(dot, node.names, node.pos)
        if isinstance(node, Variable):
            return self._fields(self._get(node.name, node.pos), node.names, node.pos)
        if isinstance(node, Chain):
            return self._fields(self._pipe(node.pipe, dot), node.names, node.pos)
        if isinstance(node, Identifier):
            return self._command(Command([node], node.pos), dot, None)
        raise TemplateError(f"unexpected node {node!r}")

    def _fields(self, value, names: tuple, pos: str):
        for name in names:
            if isinstance(value, dict):
                value = value.get(name)  # Ollama executes with missingkey=zero over map[string]any
            elif isinstance(value, Struct):
                if name not in value.fields:
                    raise TemplateError(f"{pos}: can't evaluate field {name} in type {value.type_name}")
                value = value.fields[name]
            elif value is None:
                raise TemplateError(f"{pos}: nil pointer evaluating .{name}")
            else:
                raise TemplateError(f"{pos}: can't evaluate field {name} in type {_type(value)}")
        return value

    def _get(self, name: str, pos: str):
        for entry in reversed(self._vars):
            if entry[0] == name:
                return entry[1]
        raise TemplateError(f"{pos}: undefined variable {name}")

    def _set(self, name: str, value, pos: str) -> None:
        for entry in reversed(self._vars):
            if entry[0] == name:
                entry[1] = value
                return
        raise TemplateError(f"{pos}: undefined variable {name}")


def _describe(node) -> str:
    if isinstance(node, Field):
        return "." + ".".join(node.names)
    if isinstance(node, Variable):
        return ".".join([node.name, *node.names])
    if isinstance(node, Literal):
        return repr(node.value)
    return type(node).__name__.lower()


def _identifiers(nodes: list, found: set) -> None:
    def pipe(p: Pipe) -> None:
        for cmd in p.cmds:
            for arg in cmd.args:
                if isinstance(arg, Field):
                    found.update(n.lower() for n in arg.names)
                elif isinstance(arg, Variable):
                    found.update(n.lower() for n in (arg.name, *arg.names))
                elif isinstance(arg, Chain) and not arg.names:  # Go's parenthesized pipe; a chain is not walked
                    pipe(arg.pipe)
    for node in nodes:
        if isinstance(node, Action):
            pipe(node.pipe)
        elif isinstance(node, Branch):
            pipe(node.pipe)
            _identifiers(node.body, found)
            _identifiers(node.orelse or [], found)


def cut_after(nodes: list, name: str) -> list:
    """The nodes up to and including the first ``.{name}`` field, everything after it removed
    (Ollama's ``deleteNode`` for the last turn of a legacy template: the prompt ends at
    ``{{ .Response }}``). Conditions of if/with/range are not searched, as Ollama does not."""
    cut = [False]

    def walk_list(items: list) -> list:
        kept = []
        for node in items:
            if cut[0]:
                continue
            node = walk(node)
            if node is not None:
                kept.append(node)
        return kept

    def walk(node):
        if isinstance(node, Branch):
            body = walk_list(node.body)
            orelse = walk_list(node.orelse) if node.orelse is not None else None
            return Branch(node.kind, node.pipe, body, orelse, node.pos)
        if isinstance(node, Action):
            cmds = []
            for cmd in node.pipe.cmds:
                args = []
                for arg in cmd.args:
                    if cut[0]:
                        continue
                    if isinstance(arg, Field) and name in arg.names:
                        cut[0] = True
                    args.append(arg)
                if args:
                    cmds.append(Command(args, cmd.pos))
            if not cmds:
                return None
            return Action(Pipe(node.pipe.decl, node.pipe.assign, cmds, node.pipe.pos), node.pos)
        return node

    return walk_list(nodes)
