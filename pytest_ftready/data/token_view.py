"""Encoded examples as plain, redacted data for people to look at: each token's text and
whether it carries loss. The outputs draw it (the report, masking.html); nothing here formats.

Redaction runs over the row's whole text, not token by token, because a secret spans many
tokens (``redaction.redact_pieces``): the values found in the row's own strings, in the
decoded window, and any ``known`` ones, even cut short by truncation, become one marker.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from .encoding import IGNORE_INDEX, Encoded
from ..privacy.redaction import redact_pieces, redact_text, row_values

HEAD_TOKENS, TAIL_TOKENS = 384, 128  # a long example shows its start and its end (where EOS is trained)


def token_view(tokenizer, encoded: Encoded, head: int = HEAD_TOKENS, tail: int = TAIL_TOKENS,
               known: Mapping[str, str] = {}) -> dict[str, Any]:
    """``{where, length, trained, tokens: [[text, trained], ...], prompted, skipped_at, skipped,
    problems}``; ``prompted``: the indices in ``tokens`` of the response tokens the inference
    prompt already holds (not trained, rightly). An example longer than ``head + tail`` tokens
    shows its first ``head`` and last ``tail``."""
    ids, labels = list(encoded.input_ids), list(encoded.labels)
    shown = list(range(len(ids)))
    skipped_at: Optional[int] = None
    skipped = 0
    if len(ids) > head + tail:
        skipped_at, skipped = head, len(ids) - head - tail
        ids, labels = ids[:head] + ids[-tail:], labels[:head] + labels[-tail:]
        shown = shown[:head] + shown[-tail:]
    given = {k for start, end in encoded.prompted for k in range(start, end)}
    values = {**known, **row_values(encoded.row.data)}
    pieces = redact_pieces([(tokenizer.decode([token_id]), label != IGNORE_INDEX)
                            for token_id, label in zip(ids, labels)],
                           values, edges=True)
    return {
        "where": encoded.row.where,
        "length": encoded.length,
        "trained": encoded.trained,
        "tokens": [[text, trained] for text, trained in pieces],
        "prompted": [n for n, k in enumerate(shown) if k in given],
        "skipped_at": skipped_at,
        "skipped": skipped,
        "problems": [[kind, redact_text(detail, values)] for kind, detail in encoded.problems],
    }
