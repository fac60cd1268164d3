"""Independent verification of labels, whoever made them (the built-in encoder, TRL's
SFTTrainer, a team's own formatting function): each message's content is located in the
rendered text of the example; user/system tokens must carry no loss, every token of a trained
assistant turn must (but those its inference prompt already holds), and every trained span must
end with a stop token. Truncation is
accounted for: content cut off by ``max_length`` is not located, so it is not judged.

Imports nothing of the package; no torch. A conversation is a ``layouts.Chat``: its messages,
which of them train, and the flag that stops a turn training."""

from __future__ import annotations

import operator
import re
from bisect import bisect_left
from typing import Any, Container, Mapping, Optional, Sequence


IGNORE_INDEX = -100


def verify_turns(chat, text: str, offsets, trained: list[bool], train_on: str,
                 starts: Optional[Sequence[int]] = None, prompt_ends: Mapping[int, int] = {},
                 supplied: Optional[list[int]] = None) -> list[tuple[str, str]]:
    """Independent of how the spans were found: locate each message's content in the render and
    compare what is trained with what the row asks for (its responses, its training flags).
    ``starts``: the tokens' start characters, when the caller knows that every token has
    characters and that they never go back (then they are not checked again, and ``offsets``
    may be None). ``prompt_ends``: per trained message, where its inference prompt
    (add_generation_prompt=True) ends in ``text``: tokens of the message that start before it
    are the prompt's (a reasoning template's ``<think>``), never generated, so not required to
    train; their indices are added to ``supplied`` when given."""
    if starts is None:
        starts, ends = (list(column) for column in zip(*offsets)) if len(offsets) else ([], [])
        if not all(map(operator.lt, starts, ends)):  # tokens without characters are found nowhere
            starts = [a if b > a else -1 for a, b in offsets]
        ordered = all(map(operator.le, starts[:-1], starts[1:]))  # the usual case: the tokens in order already
    elif offsets is not None and len(starts) != len(offsets):
        raise ValueError(f"verify_turns: {len(starts)} starts for {len(offsets)} tokens")
    else:
        ordered = True
    if ordered:
        order, sorted_starts = None, starts
    else:
        order = sorted(range(len(starts)), key=starts.__getitem__)
        sorted_starts = [starts[k] for k in order]
    problems = []
    cursor = 0
    turns = set(chat.trained)
    find = text.find
    for i, message in enumerate(chat.messages):
        content = message.get("content")
        if not isinstance(content, str) or not content:
            continue
        at = find(content, cursor)
        if at < 0:
            continue  # the template rewrote this content; nothing to attribute
        cursor = at + len(content)
        lo = bisect_left(sorted_starts, at)
        hi = bisect_left(sorted_starts, cursor, lo)
        if i in prompt_ends and prompt_ends[i] > at and i in turns:  # the inference prompt holds the content's start
            given = min(bisect_left(sorted_starts, prompt_ends[i]), hi)
            if supplied is not None:
                supplied.extend(range(lo, given) if order is None else (order[k] for k in range(lo, given)))
            lo = given
        if hi <= lo:
            continue
        flags = trained[lo:hi] if order is None else [trained[order[k]] for k in range(lo, hi)]
        if i in turns:
            if not all(flags):
                problems.append(("assistant_untrained", f"{len(flags) - sum(map(bool, flags))} of {len(flags)} tokens "
                                 f"of assistant turn {chat.labels[i]} carry no loss"))
        elif any(flags):
            label, role = chat.labels[i], message.get("role")
            why = (f"it is marked not to train ({chat.marks[i]})" if chat.marks[i]
                   else f"{role} turns do not train under train_on = \"{train_on}\"" if role != "assistant"
                   else f"it is not a trained turn under train_on = \"{train_on}\"")
            problems.append(("wrong_role_trained", f"{sum(flags)} tokens of {label} ({role}) carry loss, but {why}"))
    return problems


def runs(flags: Sequence[bool]) -> list[tuple[int, int]]:
    """(start, end) of each run of consecutive True flags."""
    flags = list(map(bool, flags))
    out: list[tuple[int, int]] = []
    at, n = 0, len(flags)
    while True:
        try:
            start = flags.index(True, at)
        except ValueError:
            return out
        try:
            at = flags.index(False, start)
        except ValueError:
            at = n
        out.append((start, at))


def sequence_problems(tokenizer, ids: Sequence[int], trained: Sequence[bool], stop_ids: frozenset[int],
                      bos: object = ..., spans: Optional[list[tuple[int, int]]] = None) -> list[tuple[str, str]]:
    """BOS written twice; trained spans that end without a stop token. ``bos``: the tokenizer's
    ``bos_token_id`` when the caller has it already (reading it from the tokenizer costs more
    than the check, row after row); ``spans``: the trained spans to judge, when the caller has
    them (else ``runs(trained)``)."""
    problems = []
    if bos is ...:
        bos = tokenizer.bos_token_id
    if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        problems.append(("bos_doubled", "the sequence starts with BOS twice (the template writes BOS and the "
                         "tokenizer adds another)"))
    spans = runs(trained) if spans is None else spans
    # most spans end with their stop token: the whole span is looked at only where the last is none
    n = len(ids)
    missing = [(a, b) for a, b in spans
               if not (0 <= a < b <= n and ids[b - 1] in stop_ids) and stop_ids.isdisjoint(ids[a:b])]
    if spans and missing and stop_ids:
        names = ", ".join(sorted({tokenizer.convert_ids_to_tokens(s) for s in stop_ids}))
        problems.append(("stop_untrained", f"{len(missing)} of {len(spans)} trained spans end without a stop "
                         f"token ({names}): the model never learns to stop"))
    return problems


def text_and_offsets(tokenizer, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """The text of ``ids`` and each token's character span in it. Re-tokenizing the decoded text
    gives exact offsets when it round-trips; else each token's decoded piece is laid end to end."""
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    again = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(again["input_ids"]) == list(ids):
        return text, [tuple(o) for o in again["offset_mapping"]]
    pieces = [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    offsets, at = [], 0
    for piece in pieces:
        offsets.append((at, at + len(piece)))
        at += len(piece)
    return "".join(pieces), offsets


def judge_labels(tokenizer, sample, train_on: str, ids: Sequence[int], labels: Sequence[int],
                 stop_ids: frozenset[int], full_length: Optional[int] = None,
                 max_length: Optional[int] = None) -> list[tuple[str, str]]:
    """Every problem of labels someone else made for one row, read as ``sample`` (``layouts.Chat``
    or ``Plain``; the same verification the built-in encoder's own labels get). ``full_length``:
    tokens before truncation, when known; else a row that fills ``max_length`` is taken as cut there."""
    if len(ids) != len(labels):
        return [("render_error", f"input_ids ({len(ids)}) and labels ({len(labels)}) differ in length")]
    trained = [label != IGNORE_INDEX for label in labels]
    wrong = [k for k, (t, label) in enumerate(zip(ids, labels)) if label != IGNORE_INDEX and label != t]
    problems: list[tuple[str, str]] = []
    if wrong:
        problems.append(("labels_shifted", f"{len(wrong)} labels differ from their input_ids (first at token "
                         f"{wrong[0]}): labels must be input_ids with -100 where no loss is taken; the model shifts"))
    if hasattr(sample, "messages") and train_on != "all":  # a conversation (layouts.Chat): judge each turn
        text, offsets = text_and_offsets(tokenizer, ids)
        ends = prompt_ends(tokenizer, sample, text)
        problems += verify_turns(sample, text, offsets, trained, train_on, prompt_ends=ends)
        tags, pattern = _template_reasoning(tokenizer)
        if pattern.search(text):
            bounds: list[tuple[Any, int]] = sorted(ends.items(), key=lambda item: item[1]) + [(None, len(text))]
            turns = {i: (end, after) for (i, end), (_, after) in zip(bounds, bounds[1:])}  # prompt end to the next
            count, held = empty_reasoning(text, [a for a, _ in offsets], trained, pattern, turns)
            problems += empty_reasoning_problem(count, held, sample.labels, tags)
    known = full_length is not None
    truncated = (full_length > len(ids)) if full_length is not None else (max_length is not None
                                                                          and len(ids) >= max_length)
    spans = runs(trained)
    if truncated and spans and spans[-1][1] == len(ids):
        spans = spans[:-1]  # the last span runs into the cut: its stop token is beyond max_length
    problems += sequence_problems(tokenizer, ids, [any(s <= k < e for s, e in spans) for k in range(len(ids))]
                                  if truncated else trained, stop_ids)
    was = f"{full_length} tokens" if known else "a longer row"
    if not any(trained):
        problems.append(("truncated_all", f"max_length {len(ids)} cuts the whole response ({was})") if truncated
                        else ("no_supervised", "no token of this row carries loss"))
    elif truncated:
        problems.append(("truncated_part", f"max_length cuts this row to {len(ids)} tokens ({was})"))
    return problems


def prompt_ends(tokenizer, chat, text: str) -> dict[int, int]:
    """Per trained message of ``chat``, where its inference prompt (the chat template's render of
    the messages before it with add_generation_prompt=True) ends in ``text``, the decoded training
    sequence; a prompt that does not start ``text`` (after the tokenizer's BOS) is left out."""
    ends = {}
    bos = tokenizer.bos_token or ""
    for i in chat.trained:
        try:
            prompt = tokenizer.apply_chat_template(list(chat.messages[:i]),
                                                   tools=list(chat.tools) if chat.tools else None,
                                                   add_generation_prompt=True, tokenize=False)
        except Exception:  # the template's errors are data.template's to report
            continue
        if isinstance(prompt, str) and prompt and text.startswith(prompt):
            ends[i] = len(prompt)
        elif isinstance(prompt, str) and prompt and bos and text.startswith(bos + prompt):
            ends[i] = len(bos) + len(prompt)
    return ends


def _tool_name(item) -> str:
    """The function name of a tool schema or a tool call (OpenAI's nested ``function`` or flat)."""
    if not isinstance(item, dict):
        return ""
    inner = item["function"] if isinstance(item.get("function"), dict) else item
    name = inner.get("name")
    return name if isinstance(name, str) else ""


def content_texts(content) -> list[str]:
    """The text a message's content holds: the string, or the text of each text part."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
    return []


_MARKUP = re.compile(r"<[^<>\n]{1,40}>|\n")  # tags (<think>) and line ends: where templates take contents apart


def _reaches(content: str, text: str) -> bool:
    """Whether ``content`` shows in the render: whole, or (a template that rewrites it: trims it,
    takes its reasoning apart) any of its pieces between tags and line ends."""
    return content in text or any(piece.strip() in text for piece in _MARKUP.split(content) if piece.strip())


def dropped_by_template(chat, text: str, shown: Container[int] = ()) -> list[tuple[str, str]]:
    """What of the row the rendered text does not hold (templates drop silently what they have no
    branch for): a message whose content shows nowhere in it (a system message under a template
    without a system branch), a trained turn's ``reasoning_content``, tool calls, tool schemas.
    The model would never see or learn them. ``shown``: messages the caller knows the text holds
    the content of (spliced into it): not looked for."""
    problems = []
    cursor = 0  # contents come in order: each is looked for after the one before (linear in a long row)
    trained = set(chat.trained)
    for i, (label, message) in enumerate(zip(chat.labels, chat.messages)):
        contents = [c for c in content_texts(message.get("content")) if c.strip()] if i not in shown else []
        found = next((at for at in (text.find(c, cursor) for c in contents) if at >= 0), -1)
        if found >= 0:
            cursor = found
        elif contents and not any(_reaches(c, text) for c in contents):
            problems.append(("message_dropped", f"the chat template drops {label} ({message.get('role')}): "
                             "its content is nowhere in the rendered text"))
        reasoning = message.get("reasoning_content")
        if (i in trained and isinstance(reasoning, str) and reasoning.strip()
                and not _reaches(reasoning.strip(), text)):
            problems.append(("reasoning_dropped", f"the chat template drops the reasoning_content of {label}: "
                             "the model would be trained to answer without it"))
        calls = message.get("tool_calls") or []
        missing = [name for name in map(_tool_name, calls) if name and name not in text]
        if missing:
            problems.append(("tool_calls_dropped", f"the chat template drops the tool_calls of {label} "
                             f"({', '.join(missing)}): these tool calls will never be trained"))
    names = [name for name in map(_tool_name, chat.tools or ()) if name]
    if names and not any(name in text for name in names):
        problems.append(("tools_dropped", f"the chat template drops the row's tools ({', '.join(names)}): "
                         "the model never sees the tool schemas it is to call"))
    return problems


# ---- empty reasoning blocks (issue 42) ------------------------------------------------------
REASONING_TAGS = (("<think>", "</think>"),)  # Qwen3, DeepSeek-R1, QwQ and their kin; a template's own are added
_PROBE_REASONING = "ftready-probe-reasoning"


def reasoning_tags(render) -> tuple[tuple[str, str], ...]:
    """The (opening, closing) reasoning tags: ``<think>``/``</think>``, and the tags between which
    the chat template puts a message's ``reasoning_content`` (``render(messages)`` gives its
    text), where it renders it: the last tag before the reasoning and the first after it, tags
    that a user turn's render does not hold as well (those are the turn's own markers)."""
    tags = list(REASONING_TAGS)
    try:
        text = render([{"role": "user", "content": "Q"},
                       {"role": "assistant", "reasoning_content": _PROBE_REASONING, "content": "A"}])
        structural = set(_TAG.findall(render([{"role": "user", "content": "Q"}])))
    except Exception:  # a template that needs more than the probe: the usual tags only
        return tuple(tags)
    at = text.find(_PROBE_REASONING) if isinstance(text, str) else -1
    if at > 0:
        before = [t for t in _TAG.findall(text[text.find("Q"):at]) if t not in structural]
        after = [t for t in _TAG.findall(text[at + len(_PROBE_REASONING):]) if t not in structural]
        if before and after and (before[-1], after[0]) not in tags:
            tags.append((before[-1], after[0]))
    return tuple(tags)


_TAG = re.compile(r"<[^<>\s]{1,40}>")


def empty_block_pattern(tags: Sequence[tuple[str, str]]) -> "re.Pattern[str]":
    """An opening tag, only whitespace, its closing tag: an empty reasoning block."""
    return re.compile("|".join(f"{re.escape(a)}\\s*{re.escape(b)}" for a, b in tags))


def empty_reasoning(text: str, starts: Sequence[int], trained: Sequence[bool], pattern: "re.Pattern[str]",
                    turns: Mapping[int, tuple[int, int]] = {}, ordered: Optional[bool] = None) -> tuple[int, list[int]]:
    """(how many empty reasoning blocks of ``text`` have a trained token, the trained turns that
    hold them): a token starting inside the block carries loss. ``starts``: each token's start
    character (in order, or not); ``turns``: message index -> its character span in ``text``;
    ``ordered``: True when the caller knows the starts never go back (else they are looked at)."""
    count = 0
    held: list[int] = []
    if "<" not in text:
        return 0, held
    for match in pattern.finditer(text):
        a, b = match.span()
        if ordered is None:
            ordered = all(map(operator.le, starts[:-1], starts[1:]))
        if ordered:
            hit = any(trained[bisect_left(starts, a):bisect_left(starts, b)])
        else:
            hit = any(flag for start, flag in zip(starts, trained) if a <= start < b)
        if hit:
            count += 1
            held += [i for i, (lo, hi) in turns.items() if lo < b and a < hi and i not in held]
    return count, held


def empty_reasoning_problem(count: int, held: Sequence[int], labels: Sequence[str],
                            tags: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The row's ``empty_reasoning_trained`` problem ([] when ``count`` is 0)."""
    if not count:
        return []
    where = f" of {', '.join(labels[i] for i in held)}" if held else ""
    shown = " or ".join(f"{a}…{b}" for a, b in tags)
    return [("empty_reasoning_trained", f"{count} empty reasoning block(s) ({shown} with only whitespace between) "
             f"carry loss in the trained tokens{where}: the model learns to answer without reasoning")]


_TEMPLATE_REASONING: dict = {}  # chat template text -> (its reasoning tags, their empty-block pattern)


def _template_reasoning(tokenizer) -> tuple:
    """``reasoning_tags`` of the tokenizer's chat template and their pattern, found once per template."""
    template = getattr(tokenizer, "chat_template", None)
    key = template if isinstance(template, str) else repr(template)
    if key not in _TEMPLATE_REASONING:
        tags = reasoning_tags(lambda messages: tokenizer.apply_chat_template(messages, tokenize=False))
        _TEMPLATE_REASONING[key] = tags, empty_block_pattern(tags)
    return _TEMPLATE_REASONING[key]
