"""The tokenizer's special tokens written as literal text in a row.

A fast tokenizer turns the text ``<|im_end|>`` in a message into the special token itself, so a
reply holding ``...<|im_end|>\\n<|im_start|>user\\n...`` trains the model to end its turn and
invent a user's mid-reply. Every field a template renders (content, text parts, reasoning, tool
calls and results, names, tool schemas) is searched for the tokenizer's special tokens; a token
the chat template itself mentions but does not write around turns (``</think>``, which a
reasoning template splits content on) is the template's convention for content, and allowed.

Imports nothing of torch; the tokenizer is asked once (``reserved_tokens``), the rows after."""

from __future__ import annotations

import functools
import re
from typing import Any, Iterable, Optional

from .layouts import Chat, Sample
from .rendering import bound_template
from ..privacy.scan import iter_strings

KIND = "special_token_text"  # the problem kind an encoded row carries (blocking: never trained)
_PROBE = ({"role": "user", "content": "x"}, {"role": "assistant", "content": "y"})


def reserved_tokens(tokenizer) -> tuple[str, ...]:
    """The special tokens a row must not write as text, longest first; () when the tokenizer
    splits special tokens written as text (``split_special_tokens``: they stay text)."""
    if getattr(tokenizer, "split_special_tokens", False):
        return ()
    special = {str(t) for t in getattr(tokenizer, "all_special_tokens", ())}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special |= {str(t) for t in decoder.values() if getattr(t, "special", False)}
    special.discard("")
    template = getattr(tokenizer, "chat_template", None) or ""
    source = "\n".join(template.values()) if isinstance(template, dict) else template
    written = _probe_render(tokenizer) if source else ""
    # mentioned by the template, but not among what it writes around turns: its content convention
    allowed = {t for t in special if t in source and t not in written} if written is not None else set()
    # split on, or looked for in, a message's content by the template (a reasoning template's
    # <think> / </think>, which it also writes as an empty block): content it parses, not a turn
    allowed |= {t for t in special if t in source and _parsed_from_content(t, source)}
    return tuple(sorted(special - allowed, key=lambda t: (-len(t), t)))


def _parsed_from_content(token: str, source: str) -> bool:
    """Whether the template source splits a string on ``token`` or tests ``'token' in ...content``."""
    quoted = rf"(['\"]){re.escape(token)}\1"
    return re.search(rf"split\(\s*{quoted}|{quoted}\s+in\s+[\w.\[\]'\"]*content", source) is not None


def _probe_render(tokenizer) -> Optional[str]:
    """A two-turn conversation rendered by the chat template (its own tokens around turns); None
    when it does not render (then every special token is reserved)."""
    bound_template(tokenizer)  # a template looping without end fails this render, bounded
    try:
        return tokenizer.apply_chat_template(list(_PROBE), tokenize=False)
    except Exception:  # a template that refuses this conversation (jinja raises many types)
        return None


@functools.lru_cache(maxsize=8)
def _pattern(tokens: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(map(re.escape, tokens)))


def literal_specials(sample: Sample, tokens: tuple[str, ...]) -> list[str]:
    """One problem per message (or field) holding one of ``tokens`` as text, naming the message,
    its role, the field and the token; [] when none does."""
    if not tokens:
        return []
    pattern = _pattern(tokens)
    # one search of the whole row first (repr writes printable text as it is): most rows hold no token
    whole = (sample.messages, sample.tools) if isinstance(sample, Chat) else (sample.prompt, sample.completion)
    if _printable(tokens) and pattern.search(repr(whole)) is None:
        return []
    if isinstance(sample, Chat):
        places: list[tuple[str, Optional[str], Any]] = [(label, message.get("role"), message)
                                                      for label, message in zip(sample.labels, sample.messages)]
        if sample.tools:
            places.append(("tools", None, list(sample.tools)))
    else:
        places = [("prompt", None, sample.prompt), ("completion" if sample.prompt else "text", None, sample.completion)]
    problems = []
    for label, role, value in places:
        fields, found = _found(pattern, _strings(value))
        if found:
            where = f"{label} ({role})" if role else label
            inside = "" if fields[0] in ("value", "content") else f" in its {fields[0]}"
            more = f" (and {len(fields) - 1} more field(s))" if len(fields) > 1 else ""
            problems.append(f"{where} holds the tokenizer's special token(s) {', '.join(map(repr, found))} as text"
                            f"{inside}{more}: each tokenizes to the token itself, so the row teaches the model to end "
                            "turns or start new ones mid-message; remove or rewrite them in the data")
    return problems


@functools.lru_cache(maxsize=8)
def _printable(tokens: tuple[str, ...]) -> bool:
    """Whether ``repr`` writes each token as it is (no quote, backslash or unprintable character)."""
    return all(t.isprintable() and not set(t) & set("'\"\\") for t in tokens)


def _strings(value) -> Iterable[tuple[str, str]]:
    """(field, text) of what a template renders of ``value``: a plain message's own strings
    directly (most rows), else ``iter_strings``."""
    if isinstance(value, str):
        return (("value", value),)
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return value.items()
    return iter_strings(value)


def _found(pattern: re.Pattern, strings: Iterable[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(the fields holding a token, the distinct tokens in the order first found)."""
    fields: list[str] = []
    tokens: dict[str, None] = {}
    for field, text in strings:
        matches = pattern.findall(text)
        if matches:
            fields.append(field)
            tokens.update(dict.fromkeys(matches))
    return fields, list(tokens)
