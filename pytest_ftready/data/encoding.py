"""The built-in encoder: a row -> ``input_ids`` and ``labels`` exactly as training will see them,
row by row (``Encoder.encode``); ``encode_many`` gives the same faster (``fast_encoding``).

The data checks inspect what it produces and the model checks train on it, so what is
checked is what is trained. Trained spans are found three ways:

* ``generation-markers``: the template's ``{% generation %}`` blocks (never trusted when
  they mark nothing);
* ``prefix-diff``: render ``messages[:i]`` with the generation prompt and ``messages[:i+1]``;
  the difference is assistant turn ``i`` (each render checked to be a prefix of the next);
* ``prompt-completion``: the boundary between prompt and completion; ``all-tokens`` for text.

Each encoded row also carries the problems found on the way (kind, detail), independent of
the method: the content of every message is located in the rendered text, so a template
that trains user tokens, or leaves the end-of-turn token out, is caught either way.
"""

from __future__ import annotations

import bisect
import operator
import re
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from ..recipe.schema import CHAT_FORMATS
from .encoded import Encoded
from .fast_encoding import FastPaths
from .layouts import Chat, Plain, Sample, read_sample
from ..privacy.redaction import redact_pieces, row_values
from .rendering import Renderer, generation_runs
from .rows import Row
from .skeleton import turn_span
from .verify import (IGNORE_INDEX, content_texts, dropped_by_template, empty_block_pattern, empty_reasoning,
                     empty_reasoning_problem, reasoning_tags, runs, sequence_problems, verify_turns)

# Encoded.method of rows rendered through the chat template: how their trained spans were found
GENERATION_MARKERS = "generation-markers"
PREFIX_DIFF = "prefix-diff"
CHAT_METHODS = (GENERATION_MARKERS, PREFIX_DIFF)
MARKERS = re.compile(r"\{%-?\s*generation\s*-?%\}")
# A conversation of more messages than this is rendered first in its leading LEADING_MESSAGES, 2x, 4x, ...
# messages, until they hold a trained turn and are more than max_length or render past the character
# budget: the messages after lie beyond max_length tokens and are left out, so a row's per-turn renders
# cost what its first max_length tokens cost
LEADING_MESSAGES = 16


def stop_token_ids(tokenizer, generation_eos: Iterable[int] = (), extra: Iterable[str] = ()) -> frozenset[int]:
    """EOS, the generation config's eos ids, and the recipe's extra stop tokens."""
    ids: set[int] = {int(i) for i in generation_eos}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for token in extra:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"[data] stop_tokens: {token!r} is not in the tokenizer's vocabulary")
        ids.add(int(token_id))
    return frozenset(ids)


class Encoder:
    """Encodes rows of one recipe's ``[data]`` table with one tokenizer."""

    def __init__(self, tokenizer, data, stop_ids: frozenset[int]) -> None:
        self.tok = tokenizer
        self.format = data.format
        self.train_on = data.train_on
        self.roles = dict(getattr(data, "roles", None) or {})
        self.max_length = data.max_length
        self.add_special = bool(data.add_special_tokens)
        self.stop_ids = stop_ids
        self.bos_id = tokenizer.bos_token_id
        template = getattr(tokenizer, "chat_template", None) or ""
        named = list(template.values()) if isinstance(template, dict) else [template]
        if isinstance(template, dict):  # several named templates: training uses "default"
            template = template.get("default", "")
        self.template = template
        # how assistant spans are found in chat rows; plain rows use "prompt-completion" / "all-tokens"
        self.chat_method = GENERATION_MARKERS if MARKERS.search(template) else PREFIX_DIFF
        # the trained spans come from the template's {% generation %} blocks
        self.markers = self.chat_method == GENERATION_MARKERS and self.train_on != "all"
        if self.format in CHAT_FORMATS:
            self._need_template()
        # a token covers at most this many characters of text: a row longer than max_length + 1
        # such tokens is cut before tokenizing (training never sees the rest; issue 26)
        self.char_budget = (self.max_length + 1) * max(map(len, tokenizer.get_vocab()), default=1)
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("the encoder needs a fast tokenizer (offset mapping); this model's tokenizer is slow")
        self._eos_auto = self._adds_eos()
        self.renderer = Renderer(tokenizer)  # one render gives the text and the {% generation %} spans
        self.may_hold_chat = self.format in ("auto", *CHAT_FORMATS)
        # whether the template writes the same with and without add_generation_prompt: found on
        # the first trained turn rendered (None until then)
        self._prompt_ignored: Optional[bool] = None
        # the reasoning tags (<think>, the template's own) and the pattern of an empty block: found
        # on the first chat row (None until then)
        self._reasoning: Any = None
        self.fast = FastPaths(self, named)  # encode_many's speed-ups (data/fast_encoding.py)

    def _need_template(self) -> None:
        if not self.template:
            raise ValueError("the tokenizer has no chat template (chat_template.jinja or tokenizer_config.json); "
                             "set [data] chat_template = \"template.jinja\"")

    def sample(self, row: Row) -> Sample:
        """The row in the message model (``Chat`` or ``Plain``). A row with problems is a
        ValueError: callers encode only rows that ``row_problems`` passed."""
        sample, problems = read_sample(row, self.format, self.train_on, self.roles)
        if sample is None:
            raise ValueError(f"{row.where}: {'; '.join(problems)}")
        if isinstance(sample, Chat):
            self._need_template()
        return sample

    def _adds_eos(self) -> bool:
        ids = self.tok("a", add_special_tokens=True)["input_ids"]
        return bool(ids) and ids[-1] == self.tok.eos_token_id

    # ---- rendering -------------------------------------------------------------------
    def render(self, messages, add_generation_prompt: bool = False, tools=None) -> str:
        return self.renderer.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)

    def prompt_ids(self, row: Row) -> list[int]:
        """The inference prompt of a row: everything before its (last) trained response."""
        sample = self.sample(row)
        if isinstance(sample, Chat):
            text = self.render(sample.messages[: max(sample.trained)], add_generation_prompt=True, tools=sample.tools)
            return self.tok(text, add_special_tokens=self.add_special)["input_ids"]
        if sample.prompt:
            return self.tok(sample.prompt, add_special_tokens=True)["input_ids"]
        text = sample.completion
        return self.tok(text[: max(1, len(text) // 2)], add_special_tokens=True)["input_ids"]

    # ---- encoding --------------------------------------------------------------------
    def encode(self, row: Row, sample: Optional[Sample] = None) -> Encoded:
        """``sample``: the row already read by ``layouts.read_sample`` with this encoder's format,
        train_on and roles (callers that checked the row pass it, so it is not read twice)."""
        if sample is None:
            sample = self.sample(row)
        if isinstance(sample, Chat):
            self._need_template()
            return self._encode_chat(row, sample)
        return self._encode_plain(row, sample, cut=len(sample.prompt) + len(sample.completion) > self.char_budget)

    def encode_many(self, pairs: Sequence[tuple[Row, Sample]]) -> list[Encoded]:
        """``[encode(row, sample) for row, sample in pairs]``, the same Encoded, faster
        (``data/fast_encoding.py``)."""
        return self.fast.encode_many(pairs)

    def render_marked(self, messages, tools):
        """The render of ``messages`` and the character spans of its {% generation %} blocks."""
        return self.renderer.render_marked(messages, tools=tools)

    def _encode_plain(self, row: Row, sample: Plain, cut: bool) -> Encoded:
        text = sample.prompt + sample.completion
        start = 0 if self.train_on == "all" else len(sample.prompt)  # trained from here to the end
        method = "prompt-completion" if sample.prompt else "all-tokens"
        if cut:
            text = text[: self.char_budget]
        elif self.tok.eos_token and not self._eos_auto and not text.endswith(self.tok.eos_token):
            text += self.tok.eos_token  # the model must learn to stop
        spans = [(start, len(text))]
        enc = self.tok(text, add_special_tokens=True, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        if cut and len(ids) <= self.max_length:  # the budget was not enough (a normalizer dropped text)
            return self._encode_plain(row, sample, cut=False)
        trained = _trained_flags(enc["offset_mapping"], spans)
        if self._eos_auto and ids and ids[-1] == self.tok.eos_token_id and not cut:
            trained[-1] = True  # the appended EOS has no characters but is trained
        return self._finish(row, ids, trained, [], method, cut)

    def _encode_chat(self, row: Row, chat: Chat, budget: Optional[int] = None) -> Encoded:
        """``budget``: characters to tokenize at most (default ``char_budget``; 0: the whole row,
        after a cut that proved unsafe): each longer message is cut to it before rendering, and
        the render too, so a row of megabytes costs what max_length tokens cost."""
        return self.encode_rendered(row, self.render_chat(row, chat, budget))

    def encode_rendered(self, row: Row, rendered) -> Encoded:
        """``_encode_chat`` from its tokenizing on: ``rendered`` is what ``render_chat`` returned (the
        fast path hands over the rows it rendered but does not batch, so none is rendered twice)."""
        if isinstance(rendered, Encoded):
            return rendered
        chat, text, generation, turns, problems, cut, whole = rendered
        base = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        if cut and (len(base["input_ids"]) <= self.max_length or (self.markers and generation is None)):
            return self._encode_chat(row, whole, budget=0)  # the cut is not safe here: the whole row, exactly
        final = self.tok(text, add_special_tokens=True, return_offsets_mapping=True) if self.add_special else base
        return self.chat_labels(row, chat, text, generation, turns, problems, base, final, cut)

    def render_chat(self, row: Row, chat: Chat, budget: Optional[int] = None, prompt: Optional[Callable] = None):
        """``_encode_chat`` up to its tokenizing: (the chat rendered, its text, its generation spans,
        its turn spans, its problems so far, whether it was cut, the whole chat), or the row's
        Encoded where the template fails. ``prompt(chat, i)``: the render of ``chat``'s first ``i``
        messages with the generation prompt, or None where the caller has none (then it is rendered)."""
        budget = self.char_budget if budget is None else budget
        whole = chat
        chat = self._leading(_clipped(chat, budget), budget) if budget else chat
        messages, tools = chat.messages, chat.tools
        problems: list[tuple[str, str]] = []
        try:
            if self.markers:
                text, generation = self.renderer.render_marked(messages, tools=tools)
            else:
                text, generation = self.render(messages, tools=tools), None
        except Exception as exc:  # jinja raises TemplateError, TypeError, ...; report, don't crash
            return Encoded(row, (), (), self.chat_method, 0, 0, (("render_error", f"template failed: {exc}"),))
        problems += dropped_by_template(chat, text)

        def turn_renders(i: int) -> tuple[str, str]:
            given = None if prompt is None else prompt(chat, i)
            before = self.render(messages[:i], add_generation_prompt=True, tools=tools) if given is None else given
            return before, (text if i == len(messages) - 1 else self.render(messages[: i + 1], tools=tools))

        turns = _turn_spans(chat, text, turn_renders, problems)
        cut = bool(budget) and (chat is not whole or len(text) > budget)
        if not cut:
            return chat, text, generation, turns, problems, False, whole
        # where every response starts past the budget, the first is kept in part: its labels then say
        # that max_length cuts the whole response (not that the template marks nothing)
        first = min((a for a, b in (turns.values() if generation is None else generation) if b > a), default=0)
        keep = budget if first < budget else first + budget
        generation = None if generation is None else [(a, min(b, keep)) for a, b in generation if a < keep]
        return chat, text[:keep], generation, turns, problems, True, whole

    def _leading(self, chat: Chat, budget: int) -> Chat:
        """``chat`` cut after its first 16, 32, 64, ... messages once they hold a trained turn and are more
        than max_length or render past ``budget`` characters (what follows is beyond max_length tokens;
        a cut that proves unsafe is undone by the caller, as for long contents); ``chat``
        itself where no such cut is shorter, or a render fails (the row's own render reports it).
        Costs renders of at most twice the messages kept."""
        count, n = LEADING_MESSAGES, len(chat.messages)
        while count < n:
            trained = tuple(i for i in chat.trained if i < count)
            try:  # more messages than max_length: each renders its content, one token at least
                past = bool(trained) and (count > self.max_length
                                          or len(self.render(chat.messages[:count], tools=chat.tools)) > budget)
            except Exception:  # a template refusing a conversation cut short: render the whole row
                return chat
            if past:
                return replace(chat, messages=chat.messages[:count], labels=chat.labels[:count], trained=trained,
                               marks=chat.marks[:count])
            count *= 2
        return chat

    def chat_labels(self, row: Row, chat: Chat, text: str, generation, turns: dict, problems: list, base, final,
                     cut: bool) -> Encoded:
        """The labels of a rendered chat row from its tokenization without (``base``) and with
        (``final``) the tokenizer's special tokens: what the row-by-row and the spliced paths share.
        ``turns``: per trained message whose renders are prefixes of ``text``, the character span
        from the end of its inference prompt to the end of the render up to it."""
        ids = list(final["input_ids"])
        spans = list(turns.values())
        problems += self._bare_prompts(chat, text, turns)
        supplied: list[int] = []
        # the tokens' (starts, ends) when they are in order (given by the fast path when it read them
        # from the token widths), else one look at the offsets for every use
        columns = None if self.train_on == "all" else (getattr(final, "columns", None)
                                                        or _in_order(final["offset_mapping"]))
        columns_base = columns if final is base else None
        blocks = self._marker_blocks(chat, base, problems, generation, columns_base) if self.markers else None
        trained_runs = None  # runs(trained), where known without looking
        if self.train_on == "all":
            trained = [True] * len(ids)
        else:
            zero = None
            if blocks is not None and final is base:
                zero = _zero_width(final["offset_mapping"] if columns is None else None, columns)
            if zero is not None:  # the blocks' own tokens, in order: the flags are the blocks
                trained = _block_flags(len(ids), blocks, zero)
                # with no zero-width token the flags are the blocks, and the blocks are runs of the mask
                # (some left out): already runs(trained)
                trained_runs = None if zero else blocks
            else:
                if blocks is not None:  # each marked token's characters, mapped onto the final tokens
                    spans = _block_spans(blocks, base["offset_mapping"] if columns_base is None else None, columns_base)
                if columns is not None:
                    trained_runs = _runs_in_order(columns[0], spans)
                    trained = _block_flags(len(ids), trained_runs, [])
                else:
                    trained = _trained_flags(final["offset_mapping"], spans)
            if self.chat_method == PREFIX_DIFF:
                trained_runs = _trim_after_stop(ids, trained, self.stop_ids, trained_runs)
            prompt_ends = {i: start for i, (start, _) in turns.items()}
            problems += verify_turns(chat, text, None if columns else final["offset_mapping"], trained, self.train_on,
                                     columns and columns[0], prompt_ends, supplied)
        problems += self._empty_reasoning(chat, text, columns, final, trained, turns)
        encoded = self._finish(row, ids, trained, problems, self.chat_method, cut, trained_runs)
        if not supplied:
            return encoded
        kept = [k for k in supplied if k < encoded.length]
        return replace(encoded, prompted=tuple(runs(_flags_at(encoded.length, kept))))

    def _empty_reasoning(self, chat: Chat, text: str, columns, final, trained: list[bool],
                         turns: dict) -> list[tuple[str, str]]:
        """The row's empty reasoning blocks (``<think>\\n\\n</think>``, or the template's own tags)
        that carry loss: a reasoning template's boilerplate trained as content (issue 42)."""
        if self._reasoning is None:
            tags = reasoning_tags(self.render)
            self._reasoning = tags, empty_block_pattern(tags)
        tags, pattern = self._reasoning
        if "<" not in text or pattern.search(text) is None:
            return []
        starts = columns[0] if columns is not None else [a for a, _ in final["offset_mapping"]]
        count, held = empty_reasoning(text, starts, trained, pattern, turns, True if columns is not None else None)
        return empty_reasoning_problem(count, held, chat.labels, tags)

    def _bare_prompts(self, chat: Chat, text: str, turns: dict) -> list[tuple[str, str]]:
        """A template that ignores add_generation_prompt gives an inference prompt without the
        assistant header its training renders put before each response: the model, never trained
        to write that header, must write it at inference (issue 47). One problem per row where the
        response is found after other text (not whitespace) that the inference prompt lacks."""
        if not turns:
            return []
        if self._prompt_ignored is None:
            first = next(iter(turns))
            try:
                messages = chat.messages[:first]
                self._prompt_ignored = (self.render(messages, add_generation_prompt=True, tools=chat.tools)
                                        == self.render(messages, tools=chat.tools))
            except Exception:  # the row's renders report the template's errors
                self._prompt_ignored = False
        if not self._prompt_ignored:
            return []
        for i, (start, end) in turns.items():
            content = chat.messages[i].get("content")
            # its first text that is not whitespace, stripped
            stripped = (content.strip() if isinstance(content, str)
                        else next((c.strip() for c in content_texts(content) if c.strip()), ""))
            at = text.find(stripped, start, end) if stripped else -1
            if at > start and text[start:at].strip():
                header = text[start:at]
                shown = f" ({header!r})" if len(header) <= 40 and not _holds_row_text(header, chat) else ""
                return [("generation_prompt_ignored", f"the chat template ignores add_generation_prompt: the "
                         f"inference prompt before {chat.labels[i]} lacks the assistant header{shown} that training "
                         "puts before the response, so the model must write it itself at inference")]
        return []

    def _marker_blocks(self, chat: Chat, base, problems, generation=None, columns=None) -> list[tuple[int, int]]:
        """The (start, end) token runs of ``base`` in the template's {% generation %} mask, less the
        assistant turns that must not train (flagged, a prompt's, or not the last under
        last_assistant). ``generation``: the character spans of the blocks in the rendered text,
        when the render gave them; the mask is then apply_chat_template's, computed on ``base``
        (the tokenization of that very text); ``columns``: ``_in_order`` of its offsets, when known."""
        blocks = None if generation is None else generation_runs(base, generation, columns)
        if blocks is None:
            out = self.tok.apply_chat_template(list(chat.messages), tools=list(chat.tools) if chat.tools else None,
                                               tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            if list(out["input_ids"]) != list(base["input_ids"]):
                problems.append(("render_error", "the template's tokenization differs from tokenizing its "
                                 "rendered text"))
                return []
            blocks = runs(out["assistant_masks"])
        if not blocks:
            problems.append(("markers_empty", "the template's {% generation %} blocks mark no token; "
                             "its assistant mask is all zero"))
            return []
        assistant = [i for i, m in enumerate(chat.messages) if m.get("role") == "assistant"]
        if len(blocks) == len(assistant):  # one marked block per assistant turn, in order
            blocks = [block for block, i in zip(blocks, assistant) if i in chat.trained]
        elif self.train_on == "last_assistant":
            blocks = blocks[-1:]
        # otherwise the blocks do not line up with the turns: keep them all; verify_turns says what is wrong
        return blocks

    def _finish(self, row: Row, ids: list[int], trained: list[bool], problems: list, method: str,
                cut: bool = False, trained_runs: Optional[list[tuple[int, int]]] = None) -> Encoded:
        """Labels for the first max_length tokens, and the problems of the whole sequence. ``cut``:
        ``ids`` are only the start of the row; its lengths are lower bounds, and a trained span
        running into the cut is not judged for its stop token (its end was not tokenized).
        ``trained_runs``: exactly ``runs(trained)``, when the caller made ``trained`` from them."""
        spans = runs(trained) if trained_runs is None else trained_runs
        full_length = len(ids)
        # a trained span running into the cut is cut off before its stop token
        judged = spans[:-1] if cut and spans and spans[-1][1] == full_length else spans
        problems = list(problems) + sequence_problems(self.tok, ids, trained, self.stop_ids, self.bos_id, judged)
        trained_full = sum(end - start for start, end in spans)
        if len(ids) > self.max_length:
            ids = ids[: self.max_length]
        labels = [IGNORE_INDEX] * len(ids)
        kept = 0
        for start, end in spans:
            end = min(end, len(ids))
            if start >= end:
                break
            labels[start:end] = ids[start:end]
            kept += end - start
        least = "at least " if cut else ""
        size = f" (the row is at least {full_length:,} tokens; only its start was tokenized)" if cut else ""
        if trained_full and kept == 0:
            problems.append(("truncated_all", f"max_length {self.max_length} cuts the whole response "
                             f"({least}{full_length:,} tokens, response starts at token {spans[0][0]}): raise "
                             f"[data] max_length "
                             "past it, or shorten what comes before the response"))
        elif kept < trained_full:
            problems.append(("truncated_part", f"max_length {self.max_length} cuts {least}{trained_full - kept:,} of "
                             f"{least}{trained_full:,} response tokens{size}"))
        if trained_full == 0 and not any(kind in ("render_error", "markers_empty") for kind, _ in problems):
            problems.append(("no_supervised", "no token of this row carries loss"))
        return Encoded(row, tuple(ids), tuple(labels), method, full_length, trained_full, tuple(problems), cut)


def _turn_spans(chat: Chat, text: str, turn_renders, problems: list) -> dict[int, tuple[int, int]]:
    """Per trained message, its character span in ``text``: from the end of its inference prompt
    to the end of the render up to it (``turn_renders(i)`` gives both). The prompt is held against
    the render up to the turn (the same conversation), and that render against the training
    render (which later turns may rewrite): each mismatch is a problem of its own, and a turn with
    one has no span."""
    spans = {}
    for i in chat.trained:
        label = chat.labels[i]
        try:
            prompt, upto = turn_renders(i)
        except Exception as exc:
            problems.append(("render_error", f"template failed on the turns up to {label}: {exc}"))
            continue
        span = turn_span(label, prompt, upto, text, problems)
        if span is not None:
            spans[i] = span
    return spans


def _holds_row_text(piece: str, chat: Chat) -> bool:
    """Whether ``piece`` holds some string of the row's messages besides their roles (then it is not shown)."""
    return any(isinstance(v, str) and len(v.strip()) >= 3 and (v.strip() in piece or piece.strip() in v)
               for m in chat.messages for k, v in m.items() if k != "role")


def _flags_at(n: int, indices) -> list[bool]:
    flags = [False] * n
    for k in indices:
        flags[k] = True
    return flags


def _clipped(chat: Chat, budget: int) -> Chat:
    """``chat`` with every content longer than ``budget`` characters cut to it (the same object
    when none is): what follows such a content lies beyond max_length tokens anyway."""
    if all(not isinstance(m.get("content"), str) or len(m["content"]) <= budget for m in chat.messages):
        return chat
    messages = tuple({**m, "content": m["content"][:budget]} if isinstance(m.get("content"), str)
                     and len(m["content"]) > budget else m for m in chat.messages)
    return replace(chat, messages=messages)


def _trained_flags(offsets, spans) -> list[bool]:
    """Per token: does its first character fall in the span with the greatest start at or
    before it (zero-width tokens never train)? One pass over the tokens."""
    cover = _cover(spans)
    ends = [hi for _, hi in cover]
    inf = float("inf")
    flags: list[bool] = []
    append = flags.append
    j, prev = 0, -1
    lo, hi = cover[0] if cover else (inf, inf)
    for a, b in offsets:
        if b <= a:
            append(False)
            continue
        if a < prev:  # offsets out of order: find the interval again
            j = bisect.bisect_right(ends, a)
            lo, hi = cover[j] if j < len(cover) else (inf, inf)
        prev = a
        while a >= hi:
            j += 1
            lo, hi = cover[j] if j < len(cover) else (inf, inf)
        append(a >= lo)
    return flags


def _flags_in_order(starts, n: int, spans) -> list[bool]:
    """``_trained_flags`` of ``n`` tokens that all have characters and never go back (``starts``:
    their start characters)."""
    return _block_flags(n, _runs_in_order(starts, spans), [])


def _runs_in_order(starts, spans) -> list[tuple[int, int]]:
    """``runs(_flags_in_order(starts, n, spans))`` without the flags: the tokens of each interval of
    the cover are a run, found by bisection; the cover's intervals are apart and in order, so their
    runs are too, one joining the next only where it stops at the next one's first token."""
    out: list[tuple[int, int]] = []
    for lo, hi in _cover(spans):
        first, stop = bisect.bisect_left(starts, lo), bisect.bisect_left(starts, hi)
        if stop <= first:
            continue
        if out and out[-1][1] == first:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((first, stop))
    return out


def _in_order(offsets) -> Optional[tuple[list[int], list[int]]]:
    """The tokens' (starts, ends) when every token has characters and neither starts nor ends
    go back (the usual case; two tokens may share a character, as byte-level tokens splitting
    one of several bytes do), else None; checked without a Python loop per token."""
    if not len(offsets):
        return [], []
    starts, ends = map(list, zip(*offsets))
    # map stops at the shorter sequence: starts against starts[1:] compares each with the next
    if (all(map(operator.lt, starts, ends)) and all(map(operator.le, starts, starts[1:]))
            and all(map(operator.le, ends, ends[1:]))):
        return starts, ends
    return None


def _apart(columns: tuple[list[int], list[int]]) -> bool:
    """No token of ``columns`` (``_in_order``'s) starts before the one before it ends."""
    starts, ends = columns
    return all(map(operator.le, ends[:-1], starts[1:]))


def _block_spans(blocks, offsets, columns=None) -> list[tuple[int, int]]:
    """The character spans of the tokens of ``blocks`` (token runs) that have characters: the
    spans ``_trained_flags`` maps onto other tokens. ``columns``: ``_in_order(offsets)``, when the
    caller has it (``offsets`` may then be None); a block whose tokens leave no character between
    them is then one span, from its first token's start to its last one's end, which covers the
    same characters as its tokens' spans among the others' (the running start and end never go back)."""
    if columns is None:
        return [tuple(o) for start, end in blocks for o in offsets[start:end] if o[1] > o[0]]
    starts, ends = columns
    spans: list[tuple[int, int]] = []
    for start, end in blocks:
        if end <= start:
            continue
        if all(map(operator.le, starts[start + 1:end], ends[start:end - 1])):
            spans.append((starts[start], ends[end - 1]))
        else:
            spans += zip(starts[start:end], ends[start:end])
    return spans


def _zero_width(offsets, columns=None) -> Optional[list[int]]:
    """The indices of the tokens without characters, or None when the other tokens overlap or
    go back. When None is not returned, a token trains exactly when it is in a marked block and
    has characters (what ``_trained_flags`` of the block tokens' spans gives). ``columns``:
    ``_in_order(offsets)``, when the caller has it (``offsets`` may then be None)."""
    if columns is None:
        columns = _in_order(offsets)
    if columns is not None:  # every token has characters: none, or some overlap
        return [] if _apart(columns) else None
    zero, end = [], -1
    for k, (a, b) in enumerate(offsets):
        if b <= a:
            zero.append(k)
        elif a < end:
            return None
        else:
            end = b
    return zero


def _block_flags(n: int, blocks, zero: list[int]) -> list[bool]:
    flags = [False] * n
    for start, end in blocks:
        flags[start:end] = [True] * (end - start)
    for k in zero:
        flags[k] = False
    return flags


def _cover(spans) -> list[tuple[int, int]]:
    """The characters where "the span with the greatest start at or before this character
    contains it" holds, as sorted disjoint (start, end) intervals: each span decides from its
    start up to the next greater start (of equal starts, the last in sorted order decides)."""
    spans = sorted(spans)
    cover: list[tuple[int, int]] = []
    last = len(spans) - 1
    for k, (a, b) in enumerate(spans):
        if k < last:
            nxt = spans[k + 1][0]
            if nxt == a:
                continue
            if nxt < b:
                b = nxt
        if b > a:
            if cover and cover[-1][1] == a:
                cover[-1] = (cover[-1][0], b)
            else:
                cover.append((a, b))
    return cover


def _trim_after_stop(ids: list[int], trained: list[bool], stop_ids: frozenset[int],
                     trained_runs: Optional[list[tuple[int, int]]] = None) -> list[tuple[int, int]]:
    """Prefix-diff spans end with the template's text after the stop token (a newline):
    that text is never generated, so it carries no loss. Gives ``runs(trained)`` after the cut (each
    run cut after its last stop token: still runs, apart as they were). ``trained_runs``:
    ``runs(trained)``, when the caller has them."""
    out = []
    for start, end in (runs(trained) if trained_runs is None else trained_runs):
        last = next((k for k in range(end - 1, start - 1, -1) if ids[k] in stop_ids), None)
        if last is not None:
            trained[last + 1:end] = [False] * (end - last - 1)
            end = last + 1
        out.append((start, end))
    return out


def mask_runs(tokenizer, encoded: Encoded, limit: Optional[int] = None) -> list[tuple[str, bool]]:
    """The decoded text of each run of consecutive trained / masked tokens: (text, trained)."""
    runs: list[tuple[str, bool]] = []
    current = False
    buf: list[int] = []
    for token_id, label in zip(encoded.input_ids[:limit], encoded.labels[:limit]):
        flag = label != IGNORE_INDEX
        if flag != current and buf:
            runs.append((tokenizer.decode(buf), current))
            buf = []
        current = flag
        buf.append(token_id)
    if buf:
        runs.append((tokenizer.decode(buf), current))
    return runs


def redacted_runs(tokenizer, encoded: Encoded, limit: Optional[int] = None,
                  known: Mapping[str, str] = {}) -> list[tuple[str, bool]]:
    """``mask_runs`` with secrets and personal data redacted across the runs: the values are
    found in the row's own strings and in the whole decoded window (plus ``known`` ones), and
    a value cut short by truncation is redacted too."""
    values = {**known, **row_values(encoded.row.data)}
    return redact_pieces(mask_runs(tokenizer, encoded, limit), values, edges=True)


def render_example(tokenizer, encoded: Encoded, limit: int = 400, known: Mapping[str, str] = {}) -> str:
    """Tokens side by side with their mask: trained tokens in [[...]], masked ones plain
    (secrets and personal data redacted)."""
    text = "".join(_wrap(part, trained) for part, trained in redacted_runs(tokenizer, encoded, limit, known))
    return text + (" ..." if encoded.length > limit else "")


def _wrap(text: str, trained: Optional[bool]) -> str:
    return f"[[{text}]]" if trained else text
