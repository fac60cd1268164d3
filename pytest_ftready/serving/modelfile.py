"""An Ollama Modelfile read as Ollama reads it (FROM, TEMPLATE, SYSTEM, PARAMETER, ADAPTER,
MESSAGE, LICENSE; instructions case-insensitive; values bare, "quoted" or \"\"\"triple-quoted\"\"\";
# comments), and held against the training render and the trained stop token, with no server."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

INSTRUCTIONS = ("FROM", "TEMPLATE", "SYSTEM", "PARAMETER", "ADAPTER", "MESSAGE", "LICENSE", "REQUIRES")
# The Go template's fields a chat template writes messages through ({{ .Prompt }}, {{ range .Messages }})
GO_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.S)


class ModelfileError(ValueError):
    """A Modelfile Ollama would refuse; the message names the file and line."""


@dataclass
class Modelfile:
    path: Path
    base: str = ""  # FROM
    template: str | None = None
    system: str | None = None
    parameters: dict = field(default_factory=dict)  # name -> [values] (stop repeats)
    adapters: list = field(default_factory=list)

    @property
    def stops(self) -> list[str]:
        return list(self.parameters.get("stop", []))


def parse(path: Path) -> Modelfile:
    text = Path(path).read_text(encoding="utf-8")
    out = Modelfile(Path(path))
    i = 0
    lines = text.split("\n")
    while i < len(lines):
        line = lines[i].strip()
        start = i + 1
        i += 1
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        name = word.upper()
        if name not in INSTRUCTIONS:
            raise ModelfileError(f"{path}:{start}: unknown instruction {word!r}; Ollama reads "
                                 f"{', '.join(INSTRUCTIONS)}")
        rest = rest.strip()
        if name == "PARAMETER":
            key, _, value = rest.partition(" ")
            value, i = _value(value.strip(), lines, i, path, start)
            out.parameters.setdefault(key.lower(), []).append(value)
            continue
        value, i = _value(rest, lines, i, path, start)
        if name == "FROM":
            out.base = value
        elif name == "TEMPLATE":
            out.template = value
        elif name == "SYSTEM":
            out.system = value
        elif name == "ADAPTER":
            out.adapters.append(value)
    if not out.base:
        raise ModelfileError(f"{path}: no FROM line; Ollama needs FROM <model or .gguf file>")
    return out


def _value(rest: str, lines: list, i: int, path, start: int) -> tuple[str, int]:
    """A value: \"\"\"...\"\"\" (may span lines), "..." or the rest of the line."""
    if rest.startswith('"""'):
        body = rest[3:]
        if '"""' in body:
            return body[: body.index('"""')], i
        parts = [body]
        while i < len(lines):
            line = lines[i]
            i += 1
            if '"""' in line:
                parts.append(line[: line.index('"""')])
                return "\n".join(parts), i
            parts.append(line)
        raise ModelfileError(f'{path}:{start}: a """ value is never closed')
    if len(rest) >= 2 and rest[0] == rest[-1] == '"':
        try:
            return json.loads(rest), i  # Go's quoted strings escape as JSON's do (\n, \", \\)
        except ValueError:
            return rest[1:-1], i
    return rest, i


def literal_text(template: str) -> str:
    """The Go template's literal text (its {{ actions }} removed): what it writes around the messages."""
    return GO_ACTION.sub("\n", template)


def judge(modelfile: Modelfile, stop_texts: list[str], training_render: str, specials: list[str]) -> list[str]:
    """Findings: PARAMETER stop against the trained stop tokens, TEMPLATE's special tokens against
    those the training render writes, and its end-of-turn token. ``specials``: the tokenizer's
    special tokens (text)."""
    where = modelfile.path
    found = []
    stops = modelfile.stops
    if stops and not any(s in stop_texts for s in stops):
        found.append(f"{where}: PARAMETER stop {', '.join(repr(s) for s in stops)} is not the trained end-of-turn "
                     f"token {' or '.join(stop_texts)}: Ollama stops on its stop list, so the model's trained stop "
                     f"is not one and it runs on; write PARAMETER stop \"{stop_texts[0]}\"")
    if modelfile.template is not None:
        literal = literal_text(modelfile.template)
        used = [s for s in specials if s in literal]
        foreign = [s for s in used if s not in training_render]
        if foreign:
            found.append(f"{where}: TEMPLATE writes {', '.join(foreign)}, which the training render never has: "
                         "the served prompts are not the trained ones; write the TEMPLATE in the training chat "
                         "template's format (or remove TEMPLATE so Ollama uses the GGUF's own template)")
        if stop_texts and not any(s in literal for s in stop_texts) and any(s in training_render for s in stop_texts):
            found.append(f"{where}: TEMPLATE closes no turn with the trained end-of-turn token "
                         f"{' or '.join(stop_texts)}: the served history lacks it, unlike training; add it after "
                         "each message as the training template does")
    return found
