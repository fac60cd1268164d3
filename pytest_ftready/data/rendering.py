"""Chat-template rendering for the encoder, without ``apply_chat_template``'s per-call overhead.

``tokenizer.apply_chat_template(messages, tokenize=False)`` is, in transformers 5, template
selection (``get_chat_template``), message normalisation (``_normalize_chat_messages``), the
special tokens as template variables, and ``render_jinja_template``; with
``return_assistant_tokens_mask=True`` the same render also yields the character spans of the
``{% generation %}`` blocks, which are mapped onto the tokens of the rendered text. This module
makes exactly those calls itself, once per render, so one render gives both the text and the
generation spans. Where the installed transformers lacks those functions, has another
signature, or the tokenizer overrides ``apply_chat_template``, every render goes through
``apply_chat_template`` itself: the results are the same either way, only slower. Every render of
a template this module (or the special-token probe) has bound is bounded: its loops together may
take MAX_RANGE_STEPS ``range()`` steps (``bound_template``).
"""

from __future__ import annotations

import inspect
import itertools
import operator
from bisect import bisect_left, bisect_right
from contextvars import ContextVar
from typing import Any, Callable, Optional, Sequence

from .verify import runs

# range() steps one render may take, all its loops together (jinja's sandbox bounds each range() call to
# 100,000 items, not nested loops of them): a template past it fails the row, naming this limit
MAX_RANGE_STEPS = 100_000

# the parameters of transformers' render_jinja_template this module relies on, in order
RENDER_PARAMS = ("conversations", "tools", "documents", "chat_template", "return_assistant_tokens_mask",
                 "continue_final_message", "add_generation_prompt")


def _internals() -> Optional[tuple[Callable, Callable, Callable]]:
    """(base apply_chat_template, render_jinja_template, _normalize_chat_messages), or None."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.utils import chat_template_utils as utils

        render, normalize = utils.render_jinja_template, utils._normalize_chat_messages
        params = list(inspect.signature(render).parameters.values())
    except Exception:  # another transformers: no such functions
        return None
    names = tuple(p.name for p in params[: len(RENDER_PARAMS)])
    if names != RENDER_PARAMS or params[-1].kind is not inspect.Parameter.VAR_KEYWORD:
        return None
    return PreTrainedTokenizerBase.apply_chat_template, render, normalize


class Renderer:
    """Renders conversations with one tokenizer's chat template. ``fast`` says whether the
    direct path is used; ``force_slow()`` turns it off (tests compare both paths)."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        internals = _internals()
        base = internals[0] if internals else None
        self.fast = internals is not None and getattr(type(tokenizer), "apply_chat_template", None) is base
        self._render: Any = internals[1] if internals else None
        self._normalize: Any = internals[2] if internals else None

    def force_slow(self) -> None:
        self.fast = False

    def _slow(self, messages, tools, add_generation_prompt: bool) -> str:
        bound_template(self.tok, list(tools) if tools else None)
        return self.tok.apply_chat_template(list(messages), tools=list(tools) if tools else None, tokenize=False,
                                            add_generation_prompt=add_generation_prompt)

    def _direct(self, messages, tools, add_generation_prompt: bool, mask: bool):
        """What apply_chat_template does for one conversation, without tokenizing."""
        tools = list(tools) if tools else None
        template = self.tok.get_chat_template(None, tools)
        conversation = self._normalize(list(messages))
        bound_template(self.tok, tools, template)
        rendered, indices = self._render(conversations=[conversation], tools=tools, documents=None,
                                         chat_template=template, return_assistant_tokens_mask=mask,
                                         continue_final_message=False, add_generation_prompt=add_generation_prompt,
                                         **self.tok.special_tokens_map)
        return rendered[0], (indices[0] if mask else None)

    def _direct_ok(self, messages) -> bool:
        # apply_chat_template's own checks (empty conversation, a batch) raise or branch: let it
        return self.fast and bool(messages) and isinstance(messages[0], dict)

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = False, tools=None) -> str:
        if self._direct_ok(messages):
            return self._direct(messages, tools, add_generation_prompt, False)[0]
        return self._slow(messages, tools, add_generation_prompt)

    def render_marked(self, messages: Sequence[dict], tools=None) -> tuple[str, Optional[list[tuple[int, int]]]]:
        """The training render and the character spans of its {% generation %} blocks (None
        when only the slow path is available: the caller asks apply_chat_template for the mask)."""
        if self._direct_ok(messages):
            return self._direct(messages, tools, False, True)
        return self._slow(messages, tools, False), None


class RenderLimit(ValueError):
    """A chat template's render went past MAX_RANGE_STEPS."""


# the steps left to the render under way (a one-item list), None outside a bounded template's render
_STEPS: ContextVar[Optional[list]] = ContextVar("ftready_range_steps", default=None)


def bound_template(tokenizer, tools=None, template: Optional[str] = None) -> None:
    """Bound every render of the tokenizer's chat template (``template``, else the one picked for
    ``tools``), whoever renders it in this process: transformers compiles a template once (its own
    cache) and renders that object; its ``range`` becomes ``counted_range`` and each ``render``
    (or ``generate``) starts with MAX_RANGE_STEPS steps. Nothing where transformers compiles otherwise."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        compiled = _compile_jinja_template(template or tokenizer.get_chat_template(None, tools))
    except Exception:  # another transformers, or no template: the render itself says so
        return
    if compiled.globals.get("range") is counted_range:
        return
    render, generate = compiled.render, compiled.generate

    def bounded_render(*args, **kwargs):
        before = _STEPS.get()
        _STEPS.set([MAX_RANGE_STEPS])
        try:
            return render(*args, **kwargs)
        finally:
            _STEPS.set(before)

    def bounded_generate(*args, **kwargs):  # the render that tracks {% generation %} blocks
        before = _STEPS.get()
        _STEPS.set([MAX_RANGE_STEPS])
        try:
            yield from generate(*args, **kwargs)
        finally:
            _STEPS.set(before)
    compiled.render, compiled.generate = bounded_render, bounded_generate
    compiled.globals["range"] = counted_range


def counted_range(*args: int):
    """``range`` as a bounded template sees it: jinja's sandboxed range, whose items spend the steps
    of the render under way."""
    from jinja2.sandbox import safe_range

    items = safe_range(*args)
    steps = _STEPS.get()
    return items if steps is None else _Steps(items, steps)


class _Steps:
    """A range whose iteration spends one of ``steps`` per item, raising RenderLimit past the last
    (length, indexing and ``in`` as the range's own)."""

    __slots__ = ("items", "steps")

    def __init__(self, items: range, steps: list) -> None:
        self.items, self.steps = items, steps

    def __iter__(self):
        steps = self.steps
        for item in self.items:
            steps[0] -= 1
            if steps[0] < 0:
                raise RenderLimit(f"the template's loops took more than {MAX_RANGE_STEPS:,} range() steps in one "
                                  "render (nested range loops?): a chat template must render a conversation in a "
                                  "bounded number of steps; remove those loops or set [data] chat_template to one "
                                  "without them")
            yield item

    def __reversed__(self):
        return iter(_Steps(self.items[::-1], self.steps))

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, item) -> bool:
        return item in self.items

    def __getitem__(self, key):
        got = self.items[key]
        return _Steps(got, self.steps) if isinstance(got, range) else got

    def __repr__(self) -> str:
        return repr(self.items)


def generation_mask(encoding, spans: Sequence[tuple[int, int]], columns=None) -> Optional[list[bool]]:
    """The assistant mask apply_chat_template gives for ``spans`` over ``encoding`` (one
    tokenization of the rendered text, with offsets), or None where the two ways transformers
    has computed it disagree (then the caller asks apply_chat_template itself).

    transformers 5 marks every token that overlaps a span; transformers 4 marked the tokens
    from ``char_to_token(start)`` to ``char_to_token(end - 1)``. Both are computed here.
    ``columns``: the tokens' (starts, ends), when the caller knows both never go back."""
    n = len(encoding["input_ids"])
    overlap = _overlap_mask(None if columns else encoding["offset_mapping"], spans, columns, n)
    old = [False] * n
    for first, stop in _old_ranges(encoding, spans, n):
        old[first:stop] = [True] * (stop - first)
    return overlap if overlap == old else None


def generation_runs(encoding, spans: Sequence[tuple[int, int]], columns=None) -> Optional[list[tuple[int, int]]]:
    """``runs(generation_mask(encoding, spans, columns))``, None where that is None; with
    ``columns`` known, without a mask per token: each way's marked tokens as ranges, joined."""
    n = len(encoding["input_ids"])
    if not (columns and n and spans):
        mask = generation_mask(encoding, spans, columns)
        return None if mask is None else runs(mask)
    new, old = _joined(_overlap_ranges(columns, spans)), _joined(_old_ranges(encoding, spans, n))
    return new if new == old else None


def _old_ranges(encoding, spans: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """transformers 4's marked tokens: from ``char_to_token(start)`` to ``char_to_token(end - 1)``
    of each span (to the end when that is 0 or None), until a span whose start has no token."""
    out = []
    for start_char, end_char in spans:
        first = encoding.char_to_token(start_char)
        last = encoding.char_to_token(end_char - 1) if end_char > 0 else None  # an empty block at the start
        if first is None:
            break
        stop = min(last + 1 if last else n, n)
        if stop > first:
            out.append((first, stop))
    return out


def _overlap_ranges(columns, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """transformers 5's marked tokens as ranges, for tokens whose (starts, ends) ``columns`` never
    go back: the pointer stops at the first span whose end is past the token's start, i.e. the first
    span whose running maximum end is past it: span k decides tokens starting in [reach[k-1], reach[k])."""
    starts, ends = columns
    out = []
    below = float("-inf")
    for (lo, _), upto in zip(spans, itertools.accumulate((hi for _, hi in spans), max)):
        if upto > below:
            first, stop = bisect_left(starts, below), bisect_left(starts, upto)
            out.append((bisect_right(ends, lo, first, stop), stop))  # ends grow: the overlapping ones are a suffix
            below = upto
    return out


def _joined(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The runs of the tokens ``ranges`` mark: sorted, empty ones left out, touching ones joined."""
    out: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if stop <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(stop, out[-1][1]))
        else:
            out.append((start, stop))
    return out


def _overlap_mask(offsets, spans: Sequence[tuple[int, int]], columns=None, n: Optional[int] = None) -> list[bool]:
    """transformers 5's loop: a pointer over the spans, each token marked when it overlaps the
    first span not yet passed. Where the token starts and ends never go back (the usual case)
    the tokens each span decides are found by bisection, without a Python loop per token.
    ``columns``: the tokens' (starts, ends), when the caller knows neither goes back (then
    ``offsets`` may be None, and ``n`` says how many tokens there are)."""
    n, count = (len(offsets) if n is None else n), len(spans)
    if n and count:
        starts, ends = columns or zip(*offsets)
        if columns or (all(map(operator.le, starts[:-1], starts[1:])) and all(map(operator.le, ends[:-1], ends[1:]))):
            mask = [False] * n
            for marked, stop in _overlap_ranges((starts, ends), spans):
                mask[marked:stop] = [True] * (stop - marked)
            return mask
    overlap = [False] * n
    k = 0
    if count:
        lo, hi = spans[0]
        for token, (start, end) in enumerate(offsets or ()):
            while start >= hi:
                k += 1
                if k == count:
                    break
                lo, hi = spans[k]
            if k == count:
                break
            if end > lo:
                overlap[token] = True
    return overlap
