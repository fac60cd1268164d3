"""One row as training sees it (``Encoded``): its ``input_ids`` and ``labels``, how its trained
spans were found and the problems found on the way; made by the built-in encoder
(``encoding``) and its speed-ups (``fast_encoding``), judged by the data checks."""

from __future__ import annotations

from dataclasses import dataclass

from .rows import Row
from .specials import KIND as SPECIALS
from .verify import IGNORE_INDEX

# Problems that make a row unusable for training (the engine leaves such rows out).
BLOCKING = frozenset({"render_error", "markers_empty", "truncated_all", "no_supervised", SPECIALS})


@dataclass(frozen=True)
class Encoded:
    row: Row
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    method: str
    full_length: int  # tokens before truncation (at least this many when ``cut``)
    trained_full: int  # supervised tokens before truncation (at least this many when ``cut``)
    problems: tuple[tuple[str, str], ...] = ()  # (kind, detail)
    cut: bool = False  # the row was far beyond max_length: only its start was tokenized
    # token runs of trained messages that their inference prompt already holds (a reasoning
    # template's "<think>\n"): never generated, so rightly not trained
    prompted: tuple[tuple[int, int], ...] = ()

    @property
    def trained(self) -> int:
        return len(self.labels) - self.labels.count(IGNORE_INDEX)

    @property
    def length(self) -> int:
        return len(self.input_ids)

    @property
    def trainable(self) -> bool:
        """Some token carries loss and no problem blocks the row: what training uses."""
        return self.trained > 0 and not any(kind in BLOCKING for kind, _ in self.problems)
