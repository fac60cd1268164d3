"""Progress of a pass over data files, as a line for the terminal: what is done, the rate, the
share of the bytes and the ETA. Quiet for a pass shorter than QUIET_SECONDS."""

from __future__ import annotations

import time
from typing import Callable, Optional

from ..units import format_duration, human_bytes

QUIET_SECONDS = 2.0


class Meter:
    def __init__(self, what: str, size: int, report: Optional[Callable[[str], None]]) -> None:
        self.what, self.size, self.report = what, size, report
        self.start = time.monotonic()
        self.done = 0

    def update(self, size: int, rows: Optional[int] = None) -> None:
        """``size`` more bytes done; ``rows``: the rows done so far, when the pass counts rows."""
        self.done += size
        elapsed = time.monotonic() - self.start
        if self.report is None or elapsed < QUIET_SECONDS or not self.done or not elapsed:
            return
        share = min(1.0, self.done / self.size) if self.size else 1.0
        eta = format_duration(elapsed * (1 - share) / share)
        if rows is None:
            self.report(f"{self.what} {human_bytes(self.done)} of {human_bytes(self.size)} ({share:.0%}), "
                        f"{self.done / 1e6 / elapsed:,.0f} MB/s, ETA {eta}")
        else:
            self.report(f"{self.what} {rows:,} rows ({share:.0%} of {human_bytes(self.size)}), "
                        f"{rows / elapsed:,.0f} rows/s, ETA {eta}")
