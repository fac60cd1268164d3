"""Measurement kinds: which recorded figures are compared night over night, in which unit,
and which direction is better. Data, in one place: the recipe schema validates
``[checks] max_regression`` against these names and the regression gate
(``outputs/regression.py``) judges measurements by them. Imports nothing.

A measurement belongs to the first kind whose unit equals its unit and one of whose name
patterns (``fnmatch``) matches its name. Figures that describe the machine or the data
rather than the recipe's behaviour (free disk, row counts, licenses) belong to no kind
and are never gated.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Optional

LOWER, HIGHER = "lower", "higher"


@dataclass(frozen=True)
class Kind:
    name: str  # the key in [checks] max_regression
    unit: str
    better: str  # LOWER | HIGHER
    names: tuple[str, ...]  # fnmatch patterns of measurement names
    default: Optional[float]  # threshold when the recipe names none; None: gated only when named
    doc: str = ""


KINDS: tuple[Kind, ...] = (
    Kind("peak_device_bytes", "bytes", LOWER,
         ("peak_device_allocated", "peak_device_reserved", "peak_tensor_bytes", "peak_memory"), 0.10,
         "peak memory of the training step on the device (CPU: weights + live tensors)"),
    Kind("peak_host_bytes", "bytes", LOWER, ("peak_host_*",), None, "host memory added by one step"),
    Kind("tokens_per_s", "tokens/s", HIGHER,
         ("step_tokens_per_s", "tokens_per_s", "tokens_per_s_median", "real_tokens_per_s"), 0.10,
         "training throughput: the measured step, each lever variant, the sustained run's median window"),
    Kind("data_tokens_per_s", "tokens/s", HIGHER, ("tokenize_tokens_per_s", "collate_tokens_per_s"), None,
         "data pipeline speed (millisecond timings on small data: noisy)"),
    Kind("step_seconds", "s", LOWER, ("step_seconds*",), None, "seconds per training step"),
    Kind("checkpoint_bytes", "bytes", LOWER, ("checkpoint_size", "checkpoint_bytes"), 0.10,
         "bytes of one saved checkpoint"),
    Kind("temperature_c", "C", LOWER, ("max_temperature",), None, "hottest GPU temperature under sustained load"),
)
KIND_NAMES = tuple(k.name for k in KINDS)


def kind_of(name: str, unit: str) -> Optional[Kind]:
    """The kind of a measurement, or None when it is not compared across runs."""
    return next((k for k in KINDS if k.unit == unit and any(fnmatchcase(name, p) for p in k.names)), None)


def thresholds(chosen: dict) -> dict[str, float]:
    """The kinds' defaults overridden by the recipe's ``max_regression`` table."""
    out = {k.name: k.default for k in KINDS if k.default is not None}
    out.update({str(name): float(share) for name, share in dict(chosen).items()})
    return out
