"""What a test asks of the machine (``@pytest.mark.accelerator(kind=..., min_memory=...,
capability=..., dtype=..., kernels=[...])``), parsed with messages that name the argument,
and judged by the same probes and compatibility facts as the ``stack.*`` checks."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional

from ..units import human_bytes
from .compat import cc_text, load
from .compatibility import gpu_words, kernel_problem, precision_problem
from .devices import Device, no_accelerator_reason, resolve_device
from .targets import parse_size as target_size

KINDS = ("any", "cuda", "rocm", "mps")
COMPARE = {">=": operator.ge, ">": operator.gt, "==": operator.eq, "<=": operator.le, "<": operator.lt}
DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "tf32": "tf32", "float8": "fp8", "fp8": "fp8",
          "float16": "", "fp16": "", "float32": ""}  # "": every accelerator has it


@dataclass(frozen=True)
class Requirements:
    kind: str = "any"
    min_memory_bytes: Optional[int] = None
    capability: Optional[tuple[str, tuple[int, int]]] = None  # (operator, (major, minor))
    dtype: str = ""
    kernels: tuple[str, ...] = ()


def parse_size(text: Any) -> int:
    """'24GiB', '24 GB', '80gib', 25769803776 -> bytes (the units of [hardware] target)."""
    if isinstance(text, int) and not isinstance(text, bool) and text > 0:
        return text
    size = target_size(str(text))
    if not size:
        raise ValueError(f"expected a size like '24GiB' or '80GB', got {text!r}")
    return size


def parse_capability(text: Any) -> tuple[str, tuple[int, int]]:
    """'>=8.0', '8.0' (at least), 'sm_80', '==9.0' -> (operator, (major, minor))."""
    m = re.fullmatch(r"\s*(>=|>|==|<=|<)?\s*(?:sm_?(\d)(\d)|(\d+)\.(\d+))\s*", str(text))
    if not m:
        raise ValueError(f"expected a compute capability like '>=8.0' or 'sm_80', got {text!r}")
    major, minor = (m.group(2), m.group(3)) if m.group(2) else (m.group(4), m.group(5))
    return m.group(1) or ">=", (int(major), int(minor))


def parse_requirements(args: tuple, kwargs: dict) -> Requirements:
    """The accelerator marker's arguments; ValueError naming the bad argument."""
    if args:
        raise ValueError(f"takes keyword arguments only (kind, min_memory, capability, dtype, kernels), got {args!r}")
    unknown = sorted(set(kwargs) - {"kind", "min_memory", "capability", "dtype", "kernels"})
    if unknown:
        raise ValueError(f"unknown argument {unknown[0]!r}; expected kind, min_memory, capability, dtype or kernels")
    out: dict[str, Any] = {}
    if "kind" in kwargs:
        if kwargs["kind"] not in KINDS:
            raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kwargs['kind']!r}")
        out["kind"] = kwargs["kind"]
    for name, parse, field in (("min_memory", parse_size, "min_memory_bytes"), ("capability", parse_capability,
                                                                                   "capability")):
        if name in kwargs:
            try:
                out[field] = parse(kwargs[name])
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
    if "dtype" in kwargs:
        if kwargs["dtype"] not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {kwargs['dtype']!r}")
        out["dtype"] = kwargs["dtype"]
    if "kernels" in kwargs:
        names = [kwargs["kernels"]] if isinstance(kwargs["kernels"], str) else kwargs["kernels"]
        known = [row["name"] for row in load("compute")["kernel"]]
        if not isinstance(names, (list, tuple)) or any(n not in known for n in names):
            raise ValueError(f"kernels: expected a list of {', '.join(known)}, got {kwargs['kernels']!r}")
        out["kernels"] = tuple(names)
    return Requirements(**out)


def unmet(req: Requirements, machine, device: Optional[Device] = None) -> list[str]:
    """Why this machine does not meet ``req`` ([] when it does), one reason per requirement."""
    device = device or resolve_device(machine, "auto")
    if not device.is_accelerator or device.kind == "mlx":
        return [f"needs a CUDA/ROCm GPU or an Apple GPU: {no_accelerator_reason(machine)}"]
    reasons = []
    if req.kind != "any" and device.kind != req.kind:
        reasons.append(f"needs kind={req.kind!r}; this machine's accelerator is {device.kind} ({device.name})")
    if req.min_memory_bytes is not None and (device.memory_total_bytes or 0) < req.min_memory_bytes:
        reasons.append(f"needs min_memory {human_bytes(req.min_memory_bytes)}; {device.name} has "
                       f"{human_bytes(device.memory_total_bytes or 0)}")
    if req.capability is not None:
        op, wanted = req.capability
        have = device.capability
        if have is None:
            reasons.append(f"needs compute capability {op}{cc_text(wanted)}; {device.name} is not an NVIDIA GPU")
        elif not COMPARE[op](have, wanted):
            reasons.append(f"needs compute capability {op}{cc_text(wanted)}; {gpu_words(machine.gpus[0])} has "
                           f"{cc_text(have)}")
    precision = DTYPES.get(req.dtype, "")
    if precision:
        row = next(r for r in load("compute")["precision"] if r["name"] == precision)
        problem = precision_problem(precision, row, machine, device)
        if problem:
            reasons.append(f"needs dtype={req.dtype!r}: {problem}")
    if req.kernels:
        rows = {r["name"]: r for r in load("compute")["kernel"]}
        # The kernel rules read the recipe's dtype, quantization and optimizer: judge the kernel alone.
        plain = SimpleNamespace(model=SimpleNamespace(dtype=precision if precision == "bfloat16" else "float16",
                                                      quantization="4bit"),
                                training=SimpleNamespace(optimizer="adamw"))
        for name in req.kernels:
            problem = kernel_problem(rows[name], f"kernels=[{name!r}]", plain, machine, device)
            if problem:
                reasons.append(problem)
    return reasons
