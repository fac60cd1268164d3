"""Dataset layouts: each row recognised (or read as the recipe's ``[data] format`` says) and
converted to the one model the encoder knows, with a problem list naming the field.

Layouts (``[data] format``): ``messages`` (OpenAI / TRL conversational, with ``tools``,
``tool_calls`` and per-message ``weight`` 0/1 or Axolotl's ``training``), ``sharegpt``
(``conversations`` of ``from``/``value``), ``alpaca`` (``instruction``/``input``/``output``,
optional ``system`` and ``history``), ``prompt_completion`` (strings, or TRL's conversational
message lists), ``text``; ``auto`` recognises each row from its fields.

Every chat layout becomes a ``Chat``: the messages the chat template renders, which of them
carry loss, and a label per message naming where it came from in the row (for messages).
String prompt/completion and text rows become ``Plain``. Nothing here reads files, imports
torch or tokenizes; problems never quote a row's content, only field names and roles.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Optional, Union

from ..recipe.schema import ROLES
from .rows import Row

# ShareGPT speaker names as Axolotl, LLaMA-Factory and FastChat write them; [data] roles adds more.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
                  "system": "system", "tool": "tool", "observation": "tool", "function_call": "assistant",
                  "function": "tool", "developer": "developer"}
# A conversation of more messages than this is no sane training row (a whole chat log in one row): it is
# unusable, named with this limit, and never rendered (its per-turn checks would cost without end)
MAX_MESSAGES = 10_000
TRAIN_FLAGS = ("weight", "training")  # OpenAI: weight 0|1; Axolotl: training true|false
_FLAGS = frozenset(TRAIN_FLAGS)
_NOT_KEPT = frozenset((*TRAIN_FLAGS, "from", "value"))  # a message's keys its turn does not keep


@dataclass(frozen=True)
class Chat:
    """A conversation rendered through the chat template."""

    layout: str
    messages: tuple[dict, ...]  # role/content(/tool_calls...) exactly as the template sees them
    labels: tuple[str, ...]  # per message, where it is in the row: "messages[2]", "output", "completion[0]"
    trained: tuple[int, ...]  # indices of the messages meant to carry loss (the responses)
    marks: tuple[Optional[str], ...]  # per message: the flag that stops it training ("weight: 0"), or None
    tools: Optional[tuple] = None


@dataclass(frozen=True)
class Plain:
    """Text tokenized without a chat template: ``prompt`` (never trained unless train_on = "all")
    followed by ``completion``; a text row is all completion."""

    layout: str
    prompt: str
    completion: str


Sample = Union[Chat, Plain]


def layout_of(data: Any) -> Optional[str]:
    """The layout a row's fields say it is, or None."""
    if not isinstance(data, dict):
        return None
    messages = data.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], dict) and "from" in messages[0]:
        return "sharegpt"
    if "messages" in data:
        return "messages"
    if "conversations" in data:
        return "sharegpt"
    if "prompt" in data and "completion" in data:
        return "prompt_completion"
    if "instruction" in data and "output" in data:
        return "alpaca"
    if "text" in data:
        return "text"
    return None


def read_sample(row: Row, fmt: str, train_on: str, roles: Optional[Mapping[str, str]] = None
                ) -> tuple[Optional[Sample], list[str]]:
    """The row in the encoder's model, and what is wrong with it ([] when usable)."""
    data = row.data
    if not isinstance(data, dict):
        return None, [f"expected a JSON object, got {type(data).__name__}"]
    found = layout_of(data)
    layout = found if fmt == "auto" else fmt
    if layout is None:
        keys = ", ".join(repr(k) for k in list(data)[:6]) or "none"
        return None, ["no known layout: expected 'messages', 'conversations', 'prompt' + 'completion', "
                      f"'instruction' + 'output' or 'text' (fields found: {keys})"]
    sample, problems = READERS[layout](data, train_on, dict(roles or {}))
    problems = _media_problem(data) + problems
    if problems and fmt != "auto" and found not in (None, fmt):
        problems.append(f"this row looks like format = \"{found}\": set [data] format = \"{found}\" or \"auto\"")
    return (None if problems else sample), problems


def row_problems(row: Row, fmt: str, train_on: str, roles: Optional[Mapping[str, str]] = None) -> list[str]:
    """What is wrong with one row's shape for ``fmt``; [] when it is usable."""
    return read_sample(row, fmt, train_on, roles)[1]


# ---- readers: fields -> (sample, problems) --------------------------------------------------
def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _content_ok(content: Any) -> bool:
    """A non-empty string, or a non-empty list of typed parts (OpenAI / multimodal style)."""
    if isinstance(content, list):
        return bool(content) and all(isinstance(p, dict) and "type" in p for p in content)
    return _nonempty_str(content)


TEXT_PART = "text"  # the part type chat templates render as text ({"type": "text", "text": ...})
# Row columns that hold media beside the messages (LLaMA-Factory, TRL, Axolotl's multimodal rows).
MEDIA_COLUMNS = ("images", "image", "videos", "video", "audios", "audio")
MULTIMODAL_FIX = ("the checks and the text-only fine-tune read text only: drop those parts (or rows), or fine-tune "
                  "them with a multimodal pipeline")


def _shape_problem(content: Any) -> str:
    """What a content that is neither text nor a list of typed parts is ("" when it is only empty:
    none, a blank string, an empty list)."""
    if content is None or isinstance(content, str) or content == []:
        return ""
    if not isinstance(content, list):
        return f"has content of type {type(content).__name__}, not text"
    k, item = next((k, p) for k, p in enumerate(content) if not (isinstance(p, dict) and "type" in p))
    if isinstance(item, dict):
        return f"has content[{k}], an object without a 'type', where a content part belongs"
    if not isinstance(item, list):
        return f"has content[{k}] of type {type(item).__name__} where a content part (an object) belongs"
    depth = 1  # the content's own list
    while isinstance(item, list) and depth < 1000:
        item, depth = (item[0] if item else None), depth + 1
    return f"has content[{k}], a list in a list (lists nested {depth} deep), where a content part (an object) belongs"


def text_parts(content: Any) -> Optional[list[str]]:
    """The texts of a list of content parts, in order, as a chat template joins them; None when
    ``content`` is not a list of parts."""
    if not isinstance(content, list):
        return None
    return [p["text"] for p in content if isinstance(p, dict) and p.get("type") == TEXT_PART
            and isinstance(p.get("text"), str)]


def _parts_problem(content: list, label: str, role: Any) -> Optional[str]:
    """What a list of typed parts holds that a text-only fine-tune cannot train: parts that are
    not text (images, audio, ...; named by type), a text part without its text, or no text at all."""
    others = sorted({str(p["type"]) for p in content if p["type"] != TEXT_PART})
    texts = [p for p in content if p["type"] == TEXT_PART]
    textless = [i for i, p in enumerate(content) if p["type"] == TEXT_PART and not isinstance(p.get("text"), str)]
    if textless:
        return f"{label}.content[{textless[0]}] is a text part without a 'text' string"
    if others and not any(p["text"].strip() for p in texts):
        return (f"{label} ({role}) has no text part, only {', '.join(others)} part(s): the turn would train nothing; "
                + MULTIMODAL_FIX)
    if others:
        return (f"{label} ({role}) is multimodal: it holds {', '.join(others)} part(s) beside its text; "
                + MULTIMODAL_FIX)
    if not any(p["text"].strip() for p in texts):
        return f"{label} ({role}) has empty content (its text parts hold no text)"
    return None


def _media_problem(data: dict) -> list[str]:
    """A row whose media columns hold something is multimodal: its text alone is not the example."""
    held = [key for key in MEDIA_COLUMNS if data.get(key) not in (None, "", [], {})]
    return [f"the row is multimodal: its {', '.join(repr(k) for k in held)} column(s) hold media beside the text; "
            + MULTIMODAL_FIX] if held else []


class _Turn(NamedTuple):  # a tuple: made for every message of every row
    message: dict  # without its training flag
    label: str  # where it is in the row
    flag: Optional[bool]  # its own training flag, None when it has none
    mark: Optional[str] = None  # the flag as written, when it says "do not train"


def _flag(message: dict, label: str, problems: list[str]) -> tuple[Optional[bool], Optional[str]]:
    """A message's own training flag (True, False or None) and, when False, how it is written."""
    flag, mark = None, None
    for key in TRAIN_FLAGS:
        value = message.get(key)
        if value is None:  # absent, or filled in by a parquet/json schema that other rows set
            continue
        if key == "weight" and value not in (0, 1):
            problems.append(f"{label}.weight is {value!r}; expected 0 (not trained) or 1")
        elif key == "training" and not isinstance(value, bool):
            problems.append(f"{label}.training is {value!r}; expected true or false")
        elif flag is None:
            flag, mark = bool(value), None if value else f"{key}: {json.dumps(value)}"
    return flag, mark


def _tools(data: dict, problems: list[str]) -> Optional[tuple]:
    tools = data.get("tools")
    if isinstance(tools, str) and tools.strip():  # LLaMA-Factory stores tools as a JSON string
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            problems.append("'tools' is a string that is not valid JSON; expected a list of tool schemas")
            return None
    if tools in (None, "", []):
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        problems.append("'tools' must be a list of tool schemas (objects)")
        return None
    return tuple(tools)


def _chat(layout: str, turns: list[_Turn], train_on: str, tools: Optional[tuple], problems: list[str],
          completion_from: Optional[int] = None) -> Optional[Chat]:
    """Decide which turns carry loss (train_on, the turns' own flags, the completion) and
    report a row that would train nothing."""
    if not turns:
        return None  # no message list: its problem is already said
    if len(turns) > MAX_MESSAGES:
        problems.append(f"holds {len(turns):,} messages, more than the {MAX_MESSAGES:,} one row may hold (only its "
                        "first max_length tokens would train): split the conversation into rows of fewer turns")
        return None
    roles = [t.message.get("role") for t in turns]
    assistant = [i for i, role in enumerate(roles) if role == "assistant"]
    for turn, role in zip(turns, roles):
        if turn.flag is True and role != "assistant":
            problems.append(f"{turn.label} ({role}) is marked to train; only assistant turns can carry loss")
    if completion_from is not None and not [i for i in assistant if i >= completion_from]:
        problems.append("the completion has no assistant message to train on")
        return None
    if not assistant:
        problems.append("has no assistant turn to train on")
        return None
    unflagged = [i for i in assistant if turns[i].flag is not False]
    if completion_from is not None:
        trained = assistant if train_on == "all" else [i for i in unflagged if i >= completion_from]
    elif train_on == "completion":
        problems.append(f"train_on = \"completion\" needs prompt/completion rows; this {layout} row has none: "
                        "use train_on = \"assistant\"")
        trained = []
    elif train_on == "all":
        flagged = [turns[i] for i in assistant if turns[i].flag is False]
        if flagged:
            problems.append(f"{flagged[0].label} is marked not to train ({flagged[0].mark}) but train_on = \"all\" "
                            "trains every token: use train_on = \"assistant\"")
        trained = assistant
    elif train_on == "last_assistant":
        if roles[-1] != "assistant":
            problems.append("does not end with an assistant turn (train_on = \"last_assistant\")")
        trained = [i for i in unflagged if turns[i].flag is True or i == len(turns) - 1]
    else:
        trained = unflagged
    if not trained and not problems:
        problems.append("every assistant turn is marked not to train (weight 0 / training false): nothing carries loss")
    if problems:
        return None
    return Chat(layout, tuple(t.message for t in turns), tuple(t.label for t in turns), tuple(trained),
                tuple(t.mark for t in turns), tools)


def _message_turns(items: Any, field: str, problems: list[str], role_of=None) -> list[_Turn]:
    """Check a list of role/content messages; ``role_of`` maps another speaker key (ShareGPT)."""
    if not isinstance(items, list) or not items:
        problems.append(f"needs a non-empty list field {field!r}")
        return []
    turns = []
    for i, message in enumerate(items):
        label = f"{field}[{i}]"
        if not isinstance(message, dict):
            problems.append(f"{label} is not an object")
            continue
        if role_of is None:
            role, content = message.get("role"), message.get("content")
            if role not in ROLES:
                problems.append(f"{label}.role is {role!r}; expected one of {', '.join(ROLES)}")
        else:
            role, content = role_of(message, label)
        # None stands for "absent": datasets fills every key some row sets (tool_calls, weight) into all rows
        out = {k: v for k, v in message.items() if v is not None and k not in _NOT_KEPT}
        out["role"] = role
        if content is not None:  # a tool-call turn may have none; the template decides how to show that
            out["content"] = content
        if "tool_calls" in message and not isinstance(message["tool_calls"], (list, type(None))):
            problems.append(f"{label}.tool_calls must be a list")
        if isinstance(content, str) and content.strip():  # the common case: a non-empty string
            pass
        elif not ((role == "assistant" and bool(message.get("tool_calls"))) or _content_ok(content)):
            problems.append(f"{label} ({role}) " + (_shape_problem(content) or "has empty content") + " (a string, "
                            "or a list of {\"type\": \"text\", \"text\": ...} parts)")
        elif _content_ok(content) and isinstance(content, list) and (found := _parts_problem(content, label, role)):
            problems.append(found)
        flags = (None, None) if _FLAGS.isdisjoint(message) else _flag(message, label, problems)
        turns.append(_Turn(out, label, *flags))
    return turns


def _system_turn(data: dict) -> list[_Turn]:
    system = data.get("system")
    return [_Turn({"role": "system", "content": system}, "system", None)] if _nonempty_str(system) else []


def _read_messages(data: dict, train_on: str, roles: dict) -> tuple[Optional[Sample], list[str]]:
    problems: list[str] = []
    turns = _message_turns(data.get("messages"), "messages", problems)
    tools = _tools(data, problems)
    return _chat("messages", turns, train_on, tools, problems), problems


def _read_sharegpt(data: dict, train_on: str, roles: dict) -> tuple[Optional[Sample], list[str]]:
    problems: list[str] = []
    field = "conversations" if "conversations" in data else "messages"
    names = {**SHAREGPT_ROLES, **roles}

    def role_of(message: dict, label: str):
        speaker = message.get("from", message.get("role"))
        content = message.get("value", message.get("content"))
        role = names.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            problems.append(f"{label}.from is {speaker!r}; expected one of {', '.join(sorted(names))} "
                            "(map others in [data] roles, e.g. roles = { bot = \"assistant\" })")
        return role, content

    turns = _message_turns(data.get(field), field, problems, role_of)
    if turns and turns[0].message.get("role") != "system":
        turns = _system_turn(data) + turns  # LLaMA-Factory keeps the system prompt in its own column
    tools = _tools(data, problems)
    return _chat("sharegpt", turns, train_on, tools, problems), problems


def _read_alpaca(data: dict, train_on: str, roles: dict) -> tuple[Optional[Sample], list[str]]:
    problems = [f"needs a non-empty string field {k!r}" for k in ("instruction", "output")
                if not _nonempty_str(data.get(k))]
    for key in ("input", "system"):
        if data.get(key) is not None and not isinstance(data[key], str):
            problems.append(f"{key!r} must be a string")
    history = data.get("history") or []
    if not isinstance(history, list) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(_nonempty_str(s) for s in p) for p in history):
        problems.append("'history' must be a list of [instruction, response] string pairs")
        history = []
    if problems:
        return None, problems
    turns = _system_turn(data)
    for i, (asked, answered) in enumerate(history):
        turns.append(_Turn({"role": "user", "content": asked}, f"history[{i}][0]", None))
        turns.append(_Turn({"role": "assistant", "content": answered}, f"history[{i}][1]", None))
    # LLaMA-Factory's join: the instruction, then the input on its own line
    query = data["instruction"] + (f"\n{data['input']}" if _nonempty_str(data.get("input")) else "")
    turns.append(_Turn({"role": "user", "content": query}, "instruction", None))
    turns.append(_Turn({"role": "assistant", "content": data["output"]}, "output", None))
    return _chat("alpaca", turns, train_on, None, problems), problems


def _read_prompt_completion(data: dict, train_on: str, roles: dict) -> tuple[Optional[Sample], list[str]]:
    prompt, completion = data.get("prompt"), data.get("completion")
    if isinstance(prompt, list) or isinstance(completion, list):  # TRL's conversational prompt-completion
        problems: list[str] = []
        turns = _message_turns(prompt, "prompt", problems) + _message_turns(completion, "completion", problems)
        tools = _tools(data, problems)
        start = len(prompt) if isinstance(prompt, list) else 0
        return _chat("prompt_completion (conversational)", turns, train_on, tools, problems,
                     completion_from=start), problems
    problems = [f"needs a non-empty string field {k!r} (or a list of messages)" for k, v in
                (("prompt", prompt), ("completion", completion)) if not _nonempty_str(v)]
    if problems:
        return None, problems
    return Plain("prompt_completion", str(prompt), str(completion)), []  # both checked non-empty strings


def _read_text(data: dict, train_on: str, roles: dict) -> tuple[Optional[Sample], list[str]]:
    if not _nonempty_str(data.get("text")):
        return None, ["needs a non-empty string field 'text'"]
    if train_on != "all":
        return None, [f"a text row trains on every token, but train_on = \"{train_on}\": write train_on = \"all\""]
    return Plain("text", "", data["text"]), []


# The layouts rendered through the chat template (a Chat's ``layout``): what makes a row a conversation.
CHAT_LAYOUTS = ("messages", "sharegpt", "alpaca", "prompt_completion (conversational)")

READERS = {"messages": _read_messages, "sharegpt": _read_sharegpt, "alpaca": _read_alpaca,
           "prompt_completion": _read_prompt_completion, "text": _read_text}
