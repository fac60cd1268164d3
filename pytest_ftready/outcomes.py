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


# What each allocator says when it runs out (torch.OutOfMemoryError covers CUDA and recent MPS;
# the CPU allocator and older MPS/HIP builds raise a plain RuntimeError).
OUT_OF_MEMORY_SAYINGS = (
    "out of memory",  # CUDA, HIP, "MPS backend out of memory"
    "can't allocate memory",  # alloc_cpu.cpp on Linux: DefaultCPUAllocator
    "not enough memory",  # alloc_cpu.cpp on Windows/macOS: DefaultCPUAllocator
    "cannot allocate memory",  # ENOMEM from the OS
)


def out_of_memory(exc: BaseException) -> str:
    """The allocator's first line when ``exc`` means out of memory on any device (CUDA, ROCm,
    MPS, the CPU, Python's own MemoryError); '' otherwise. The one place that decides it."""
    name = type(exc).__name__
    text = str(exc).strip()
    first = (text.splitlines() or [""])[0].strip()
    if name == "OutOfMemoryError" or isinstance(exc, MemoryError):
        return first or name
    if isinstance(exc, RuntimeError) and any(saying in text.lower() for saying in OUT_OF_MEMORY_SAYINGS):
        return first or name
    return ""
