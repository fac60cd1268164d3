"""Memory targets: what ``[hardware] target`` or ``ftready-forecast --target`` names (a size
such as "24GiB", a GPU model such as "RTX 4090", an Apple chip with its memory such as
"M3 Max 64GB"), resolved from the facts table ``compat/memory.toml`` into the bytes a step may
use and the runtime's overhead on top of its tensors, each figure with its source.
Plain Python; imports nothing heavy."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from . import compat

GIB = 1024 ** 3
UNITS = {"b": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4,
         "kib": 1024, "mib": 1024 ** 2, "gib": GIB, "tib": 1024 ** 4}
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)\s*$", re.IGNORECASE)


class TargetError(ValueError):
    """A target that names no size and no known device; ``str()`` says what to write."""


@dataclass(frozen=True)
class Target:
    name: str
    kind: str  # cuda | rocm | mps: whose runtime overhead applies
    capacity_bytes: int  # the device's memory
    usable_share: float  # of capacity, before the recipe's headroom (unified memory: < 1)
    context_bytes: int  # runtime context and kernels, besides the step's tensors
    allocator_share: float  # reserved above allocated, as a share of the tensor peak
    sources: tuple[str, ...]  # where each figure comes from
    assumed: str = ""  # what was assumed (a bare size is taken as a CUDA device)

    def need_bytes(self, tensor_peak_bytes: int) -> int:
        """What the device must hold for a step whose live tensors peak at ``tensor_peak_bytes``."""
        return int(tensor_peak_bytes * (1 + self.allocator_share)) + self.context_bytes

    def usable_bytes(self, headroom: float) -> int:
        """Capacity the recipe allows itself: the usable share less ``memory_headroom``."""
        return int(self.capacity_bytes * self.usable_share * (1 - headroom))


def _key(text: str) -> str:
    text = text.lower().replace("nvidia", "").replace("geforce", "")
    return re.sub(r"[^a-z0-9]", "", text)


def parse_size(text: str) -> Optional[int]:
    """'24GiB' -> 25769803776; '24 GB' -> 24e9; None when ``text`` is no size."""
    m = SIZE.match(text)
    return int(float(m.group(1)) * UNITS[m.group(2).lower()]) if m else None


def _overhead(kind: str, facts: dict) -> tuple[int, float, tuple[str, ...], str]:
    row = facts["overhead"][kind]
    sources = (compat.source(facts, row), facts["sources"][row["allocator_source"]])
    return row["context_bytes"], row["allocator_share"], sources, row.get("note", "")


def known_names() -> list[str]:
    facts = compat.load("memory")
    return [row["name"] for row in facts["gpu"]] + ['"M<n> [Pro|Max|Ultra] <memory>GB" (Apple)']


def resolve_target(text: str, where: str = "--target") -> Target:
    """The target ``text`` names; TargetError says what was expected (``where``: the key or option)."""
    facts = compat.load("memory")
    size = parse_size(text)
    if size is not None:
        if size <= 0:
            raise TargetError(f"{where}: expected a positive size, got {text!r}")
        context, share, sources, _ = _overhead("cuda", facts)
        return Target(text.strip(), "cuda", size, 1.0, context, share, sources,
                      assumed="a bare size is taken as a CUDA device (its context and allocator overhead apply); "
                              "name the GPU for its own figures")
    wanted = _key(text)
    for row in facts["gpu"]:
        if wanted in {_key(n) for n in (row["name"], *row.get("aliases", ()))}:
            context, share, sources, note = _overhead(row["kind"], facts)
            return Target(row["name"], row["kind"], row["memory_gib"] * GIB, 1.0, context, share,
                          (compat.source(facts, row), *sources), assumed=note)
    for row in facts["unified"]:
        m = re.match(row["pattern"], text.strip(), re.IGNORECASE)
        if m:
            return _unified(text.strip(), int(m.group("gib")) * GIB, row, facts)
    raise TargetError(f"{where}: {text!r} is neither a size like \"24GiB\" nor a known device; known: "
                      f"{', '.join(known_names())}")


def _unified(name: str, capacity_bytes: int, row: dict, facts: dict) -> Target:
    """Unified memory: the GPU may wire only a share of it (the facts row's rule)."""
    share = row["usable_share_large"] if capacity_bytes > row["large_above_gib"] * GIB else row["usable_share_small"]
    context, allocator, sources, _ = _overhead(row["kind"], facts)
    return Target(f"{name} (unified memory, GPU may use {share:.0%})", row["kind"], capacity_bytes, share, context,
                  allocator, (compat.source(facts, row), *sources))


def device_target(kind: str, name: str, capacity_bytes: int) -> Target:
    """The device this machine has (probed capacity), with its kind's overhead; Apple's unified
    memory with the share its GPU may use."""
    facts = compat.load("memory")
    unified = [row for row in facts["unified"] if row["kind"] == kind]
    if unified:
        return _unified(name, capacity_bytes, unified[0], facts)
    context, share, sources, note = _overhead(kind if kind in facts["overhead"] else "cuda", facts)
    return Target(name, kind, capacity_bytes, 1.0, context, share, sources, assumed=note)


def recipe_target(recipe, device) -> Optional[Target]:
    """The recipe's [hardware] target, else the accelerator the recipe resolves to here, else
    None (a CPU: nothing to judge a GPU forecast against). TargetError for a target it cannot read."""
    if recipe.hardware.target:
        return resolve_target(recipe.hardware.target, f"{recipe.source} [hardware] target")
    if device.is_accelerator and not device.missing and device.memory_total_bytes:
        return device_target(device.kind, device.name, device.memory_total_bytes)
    return None
