"""An Ollama Modelfile read as Ollama reads it (FROM, TEMPLATE, SYSTEM, PARAMETER, ADAPTER,
MESSAGE, LICENSE; instructions case-insensitive; values bare, "quoted" or \"\"\"triple-quoted\"\"\";
# comments), and held against the training render and the trained stop token, with no server."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from . import gotemplate

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
    messages: list = field(default_factory=list)  # MESSAGE <role> <content>: put before every conversation

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
        if name == "MESSAGE":
            role, _, value = rest.partition(" ")
            if role.lower() not in ("system", "user", "assistant"):
                raise ModelfileError(f"{path}:{start}: MESSAGE role {role!r}; Ollama takes system, user or assistant "
                                     "(MESSAGE user Is the sky blue?)")
            value, i = _value(value.strip(), lines, i, path, start)
            out.messages.append({"role": role.lower(), "content": value})
            continue
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


def ollama_prompt(template: "gotemplate.Template", messages: list, system: str | None = None,
                  history: Sequence[dict] = ()) -> str:
    """The prompt Ollama's /api/chat builds from ``messages`` with this TEMPLATE (server/routes.go
    and template/template.go, see tests/serving/ollama/SOURCES.md): the Modelfile's MESSAGE
    ``history`` put before them, and its SYSTEM first of all when the conversation does not start
    with a system message; consecutive messages of one role
    merged with a blank line; a template that mentions ``.Messages`` executed once over them all;
    a legacy ``.System``/``.Prompt``/``.Response`` template executed once per turn, the last turn cut
    after ``{{ .Response }}``. Raises :class:`gotemplate.TemplateError`."""
    from . import gotemplate

    first_is_system = bool(messages) and messages[0].get("role") == "system"
    messages = [*history, *messages]
    if system and not first_is_system:
        messages = [{"role": "system", "content": system}, *messages]
    systems: list = []
    collated: list = []
    for message in messages:
        role, content = str(message.get("role") or ""), str(message.get("content") or "")
        if role == "system":
            systems.append(content)
        if collated and collated[-1]["role"] == role and role != "tool":
            collated[-1]["content"] += "\n\n" + content
        else:
            collated.append({"role": role, "content": content})
    names = template.identifiers()
    flags = {"Think": False, "ThinkLevel": "", "IsThinkSet": False}
    if "messages" in names:
        return template.execute({
            "System": "\n\n".join(systems), "Tools": [], "Response": "", **flags,
            "Messages": [gotemplate.Struct("*template.templateMessage", {
                "Role": m["role"], "Content": m["content"], "Thinking": "", "Images": [], "ToolCalls": [],
                "ToolName": "", "ToolCallID": ""}) for m in collated]})
    nodes = template.nodes if "response" in names else [
        *template.nodes, gotemplate.Action(gotemplate.Pipe([], False, [gotemplate.Command(
            [gotemplate.Field(("Response",), "end")], "end")], "end"), "end")]
    out, turn = [], {"System": "", "Prompt": "", "Response": ""}

    def execute(tree: list) -> None:
        out.append(gotemplate.Template(template.text, tree).execute({**turn, **flags}))
        turn.update(System="", Prompt="", Response="")

    for m in collated:
        if m["role"] == "system":
            if turn["Prompt"] or turn["Response"]:
                execute(nodes)
            turn["System"] = m["content"]
        elif m["role"] == "user":
            if turn["Response"]:
                execute(nodes)
            turn["Prompt"] = m["content"]
        elif m["role"] == "assistant":
            turn["Response"] = m["content"]
    execute(gotemplate.cut_after(nodes, "Response"))
    return "".join(out)


NEXT_TURN = "(the next user turn)"


def ollama_engine(template: "gotemplate.Template", modelfile: Modelfile):
    """``render(messages, add_generation_prompt)`` for :func:`templates.compare`: Ollama's prompt
    with the Modelfile's SYSTEM and MESSAGE history (it always ends as the TEMPLATE writes it). A
    history ending in an assistant message is rendered as Ollama renders a past turn, followed by a
    user turn, and cut before that turn's text: Ollama would treat a last assistant message as a
    reply to continue, not a closed turn."""
    def render(messages, add_generation_prompt):
        if add_generation_prompt or not messages or messages[-1].get("role") != "assistant":
            return ollama_prompt(template, list(messages), modelfile.system, modelfile.messages)
        full = ollama_prompt(template, [*messages, {"role": "user", "content": NEXT_TURN}], modelfile.system,
                             modelfile.messages)
        end = full.rfind(NEXT_TURN)
        return full[:end] if end >= 0 else full

    return render


def judge(modelfile: Modelfile, stop_texts: list[str], training_render: str, specials: list[str],
          executed: bool = False) -> list[str]:
    """Findings: PARAMETER stop against the trained stop tokens, TEMPLATE's special tokens against
    those the training render writes (every branch, run or not), and, where the TEMPLATE was not
    ``executed`` (its turns then judged on its render), its literal end-of-turn token.
    ``specials``: the tokenizer's special tokens (text)."""
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
        if (not executed and stop_texts and not any(s in literal for s in stop_texts)
                and any(s in training_render for s in stop_texts)):
            found.append(f"{where}: TEMPLATE closes no turn with the trained end-of-turn token "
                         f"{' or '.join(stop_texts)}: the served history lacks it, unlike training; add it after "
                         "each message as the training template does")
    return found
