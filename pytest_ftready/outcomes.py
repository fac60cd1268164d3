"""What a check ends with besides passing: ``Fail`` (it looked and found a problem) and
``Skip`` (it cannot look here). Plain exceptions, raised anywhere below the pytest face
(checks, the engine, the session's facts) and turned into pytest outcomes by the collector.
Imports nothing."""

from __future__ import annotations

OUTCOME_RANK = {"skipped": 0, "passed": 1, "failed": 2}  # across variants of one check: the worst wins


class Fail(Exception):
    """The check looked and found a problem; the message says what to change."""


class Skip(Exception):
    """The check cannot look here; the message says what it needs."""
