"""The one encoder: a row -> ``input_ids`` and ``labels`` exactly as training will see them.

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
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from .redaction import redact_pieces, row_values
from .rows import Row

IGNORE_INDEX = -100
MARKERS = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass(frozen=True)
class Encoded:
    row: Row
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    method: str
    full_length: int  # tokens before truncation
    trained_full: int  # supervised tokens before truncation
    problems: tuple[tuple[str, str], ...] = ()  # (kind, detail)

    @property
    def trained(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)

    @property
    def length(self) -> int:
        return len(self.input_ids)


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
        self.max_length = data.max_length
        self.add_special = bool(data.add_special_tokens)
        self.stop_ids = stop_ids
        template = getattr(tokenizer, "chat_template", None) or ""
        if isinstance(template, dict):  # several named templates: training uses "default"
            template = template.get("default", "")
        self.template = template
        if self.format == "messages":
            if not template:
                raise ValueError("the tokenizer has no chat template (chat_template.jinja or tokenizer_config.json); "
                                 "set [data] chat_template = \"template.jinja\"")
            self.method = "generation-markers" if MARKERS.search(template) else "prefix-diff"
        elif self.format == "prompt_completion":
            self.method = "prompt-completion"
        else:
            self.method = "all-tokens"
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("the encoder needs a fast tokenizer (offset mapping); this model's tokenizer is slow")
        self._eos_auto = self._adds_eos()

    def _adds_eos(self) -> bool:
        ids = self.tok("a", add_special_tokens=True)["input_ids"]
        return bool(ids) and ids[-1] == self.tok.eos_token_id

    # ---- rendering -------------------------------------------------------------------
    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def prompt_ids(self, row: Row) -> list[int]:
        """The inference prompt of a row: everything before its (last) trained response."""
        data = row.data
        if self.format == "messages":
            messages = data["messages"]
            last = max(i for i, m in enumerate(messages) if m.get("role") == "assistant")
            text = self.render(messages[:last], add_generation_prompt=True)
            return self.tok(text, add_special_tokens=self.add_special)["input_ids"]
        if self.format == "prompt_completion":
            return self.tok(data["prompt"], add_special_tokens=True)["input_ids"]
        return self.tok(data["text"][: max(1, len(data["text"]) // 2)], add_special_tokens=True)["input_ids"]

    # ---- encoding --------------------------------------------------------------------
    def encode(self, row: Row) -> Encoded:
        if self.format == "messages":
            return self._encode_messages(row)
        data = row.data
        if self.format == "prompt_completion":
            text = data["prompt"] + data["completion"]
            spans = [(len(data["prompt"]), None)]
        else:
            text, spans = data["text"], [(0, None)]
        if self.tok.eos_token and not self._eos_auto and not text.endswith(self.tok.eos_token):
            text += self.tok.eos_token  # the model must learn to stop
        spans = [(a, len(text) if b is None else b) for a, b in spans]
        enc = self.tok(text, add_special_tokens=True, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        trained = _trained_flags(enc["offset_mapping"], spans)
        if self._eos_auto and ids and ids[-1] == self.tok.eos_token_id:
            trained[-1] = True  # the appended EOS has no characters but is trained
        return self._finish(row, ids, trained, [], self.method)

    def _encode_messages(self, row: Row) -> Encoded:
        messages = row.data["messages"]
        problems: list[tuple[str, str]] = []
        try:
            text = self.render(messages)
        except Exception as exc:  # jinja raises TemplateError, TypeError, ...; report, don't crash
            return Encoded(row, (), (), self.method, 0, 0, (("render_error", f"template failed: {exc}"),))
        trained_turns = self._trained_turns(messages)
        spans = []
        for i in trained_turns:
            try:
                prompt = self.render(messages[:i], add_generation_prompt=True)
                upto = text if i == len(messages) - 1 else self.render(messages[: i + 1])
            except Exception as exc:
                problems.append(("render_error", f"template failed on messages[:{i}]: {exc}"))
                continue
            if not text.startswith(prompt):
                problems.append(("prompt_not_prefix", f"the inference prompt before messages[{i}] "
                                 "(add_generation_prompt=True) is not a prefix of the training render"))
                continue
            if not text.startswith(upto):
                problems.append(("history_rewritten", f"assistant turn messages[{i}] renders differently once later "
                                 "turns follow (the template rewrites history, as reasoning templates do)"))
                continue
            spans.append((len(prompt), len(upto)))
        base = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        if self.method == "generation-markers" and self.train_on != "all":
            spans = self._marker_spans(messages, base, problems)
        final = self.tok(text, add_special_tokens=True, return_offsets_mapping=True) if self.add_special else base
        ids, offsets = list(final["input_ids"]), final["offset_mapping"]
        if self.train_on == "all":
            trained = [True] * len(ids)
        else:
            trained = _trained_flags(offsets, spans)
            if self.method == "prefix-diff":
                _trim_after_stop(ids, trained, self.stop_ids)
            problems += self._verify_roles(messages, text, offsets, trained, trained_turns)
        return self._finish(row, ids, trained, problems, self.method)

    def _trained_turns(self, messages: list[dict]) -> list[int]:
        assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        if self.train_on == "last_assistant":
            return assistant[-1:] if assistant and assistant[-1] == len(messages) - 1 else []
        return assistant if self.train_on == "assistant" else []

    def _marker_spans(self, messages, base, problems) -> list[tuple[int, int]]:
        out = self.tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        mask = list(out["assistant_masks"])
        if list(out["input_ids"]) != list(base["input_ids"]):
            problems.append(("render_error", "the template's tokenization differs from tokenizing its rendered text"))
            return []
        if not any(mask):
            problems.append(("markers_empty", "the template's {% generation %} blocks mark no token; "
                             "its assistant mask is all zero"))
            return []
        spans = [(a, b) for (a, b), m in zip(base["offset_mapping"], mask) if m and b > a]
        if self.train_on == "last_assistant":
            # keep only the last contiguous marked region
            last_start = max(i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
            spans = [(a, b) for (a, b), m, i in zip(base["offset_mapping"], mask, range(len(mask)))
                     if m and b > a and i >= last_start]
        return spans

    def _verify_roles(self, messages, text, offsets, trained, trained_turns) -> list[tuple[str, str]]:
        """Locate each message's content in the render; compare with what is trained."""
        starts = [a if b > a else -1 for a, b in offsets]
        order = sorted(range(len(starts)), key=lambda k: starts[k])
        sorted_starts = [starts[k] for k in order]
        problems = []
        cursor = 0
        turns = set(trained_turns)
        for i, message in enumerate(messages):
            content = message.get("content")
            if not isinstance(content, str) or not content:
                continue
            at = text.find(content, cursor)
            if at < 0:
                continue  # the template rewrote this content; nothing to attribute
            cursor = at + len(content)
            lo = bisect.bisect_left(sorted_starts, at)
            hi = bisect.bisect_left(sorted_starts, cursor)
            tokens = [order[k] for k in range(lo, hi)]
            if not tokens:
                continue
            flags = [trained[t] for t in tokens]
            if i in turns and not all(flags):
                problems.append(("assistant_untrained", f"{sum(1 for f in flags if not f)} of {len(flags)} tokens of "
                                 f"assistant turn messages[{i}] carry no loss"))
            elif i not in turns and any(flags):
                problems.append(("wrong_role_trained", f"{sum(flags)} tokens of messages[{i}] "
                                 f"({message.get('role')}) carry loss under train_on = \"{self.train_on}\""))
        return problems

    def _finish(self, row: Row, ids: list[int], trained: list[bool], problems: list, method: str) -> Encoded:
        problems = list(problems)
        bos = self.tok.bos_token_id
        if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
            problems.append(("bos_doubled", "the sequence starts with BOS twice (the template writes BOS and the "
                             "tokenizer adds another)"))
        runs = _runs(trained)
        if runs:
            missing = [r for r in runs if not any(ids[k] in self.stop_ids for k in range(*r))]
            if missing and self.stop_ids:
                names = ", ".join(sorted({self.tok.convert_ids_to_tokens(s) for s in self.stop_ids}))
                problems.append(("stop_untrained", f"{len(missing)} of {len(runs)} trained spans end without a stop "
                                 f"token ({names}): the model never learns to stop"))
        trained_full = sum(trained)
        labels = [t if flag else IGNORE_INDEX for t, flag in zip(ids, trained)]
        full_length = len(ids)
        ids, labels = ids[: self.max_length], labels[: self.max_length]
        kept = sum(1 for label in labels if label != IGNORE_INDEX)
        if trained_full and kept == 0:
            problems.append(("truncated_all", f"max_length {self.max_length} cuts the whole response "
                             f"({full_length} tokens, response starts at token {trained.index(True)})"))
        elif kept < trained_full:
            problems.append(("truncated_part", f"max_length {self.max_length} cuts {trained_full - kept} of "
                             f"{trained_full} response tokens"))
        if trained_full == 0 and not any(kind in ("render_error", "markers_empty") for kind, _ in problems):
            problems.append(("no_supervised", "no token of this row carries loss"))
        return Encoded(row, tuple(ids), tuple(labels), method, full_length, trained_full, tuple(problems))


def _trained_flags(offsets, spans) -> list[bool]:
    spans = sorted(spans)
    span_starts = [a for a, _ in spans]
    flags = []
    for a, b in offsets:
        if b <= a:
            flags.append(False)
            continue
        k = bisect.bisect_right(span_starts, a) - 1
        flags.append(k >= 0 and spans[k][0] <= a < spans[k][1])
    return flags


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, flag in enumerate(flags + [False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _trim_after_stop(ids: list[int], trained: list[bool], stop_ids: frozenset[int]) -> None:
    """Prefix-diff spans end with the template's text after the stop token (a newline):
    that text is never generated, so it carries no loss."""
    for start, end in _runs(trained):
        stops = [k for k in range(start, end) if ids[k] in stop_ids]
        if stops:
            for k in range(stops[-1] + 1, end):
                trained[k] = False


def mask_runs(tokenizer, encoded: Encoded, limit: Optional[int] = None) -> list[tuple[str, bool]]:
    """The decoded text of each run of consecutive trained / masked tokens: (text, trained)."""
    runs: list[tuple[str, bool]] = []
    current, buf = None, []
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
