"""Encoded examples as plain, redacted data for people to look at: each token's text and
whether it carries loss. The outputs draw it (the report, masking.html); nothing here formats.

Redaction runs over the whole decoded text, not token by token, because a secret spans many
tokens: every token that overlaps a finding is blanked, the first one showing
``<kind redacted>``.
"""

from __future__ import annotations

from typing import Any, Optional

from .encoding import IGNORE_INDEX, Encoded
from .scan import redact, scan_text

HEAD_TOKENS, TAIL_TOKENS = 384, 128  # a long example shows its start and its end (where EOS is trained)


def redact_tokens(texts: list[str]) -> list[str]:
    """Per-token texts with every token overlapping a secret or personal datum blanked."""
    starts, at = [], 0
    for text in texts:
        starts.append(at)
        at += len(text)
    out = list(texts)
    findings = list(scan_text("".join(texts)))
    for finding in findings:
        first = True
        for i, start in enumerate(starts):
            if start < finding.end and start + len(texts[i]) > finding.start:
                out[i] = f"<{finding.kind} redacted>" if first else ""
                first = False
    return out


def token_view(tokenizer, encoded: Encoded, head: int = HEAD_TOKENS, tail: int = TAIL_TOKENS) -> dict[str, Any]:
    """``{where, length, trained, tokens: [[text, trained], ...], skipped_at, skipped, problems}``;
    an example longer than ``head + tail`` tokens shows its first ``head`` and last ``tail``."""
    ids, labels = list(encoded.input_ids), list(encoded.labels)
    skipped_at: Optional[int] = None
    skipped = 0
    if len(ids) > head + tail:
        skipped_at, skipped = head, len(ids) - head - tail
        ids, labels = ids[:head] + ids[-tail:], labels[:head] + labels[-tail:]
    texts = redact_tokens([tokenizer.decode([token_id]) for token_id in ids])
    return {
        "where": encoded.row.where,
        "length": encoded.length,
        "trained": encoded.trained,
        "tokens": [[text, label != IGNORE_INDEX] for text, label in zip(texts, labels)],
        "skipped_at": skipped_at,
        "skipped": skipped,
        "problems": [[kind, redact(detail)] for kind, detail in encoded.problems],
    }
