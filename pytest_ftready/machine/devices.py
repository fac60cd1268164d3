"""Which device a recipe trains on, resolved from the recipe and the probed machine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .probes import Machine


@dataclass(frozen=True)
class Device:
    kind: str  # cuda | rocm | mps | cpu | mlx
    torch_device: str  # what torch calls it: "cuda", "mps", "cpu"
    name: str
    memory_total_bytes: Optional[int]
    capability: Optional[tuple[int, int]] = None
    arch: Optional[str] = None
    driver: Optional[str] = None
    missing: str = ""  # the recipe asked for a device this machine lacks: why

    @property
    def is_accelerator(self) -> bool:
        return self.kind != "cpu"


def no_accelerator_reason(machine: Machine) -> str:
    torch_text = f"torch {machine.torch.version}" if machine.torch.version else "torch not installed"
    parts = [f"no CUDA/ROCm or Apple GPU reachable ({torch_text}"]
    if not machine.nvml.available:
        parts.append(f"; NVML: {machine.nvml.error}")
    return "".join(parts) + ")"


def resolve_device(machine: Machine, wanted: str) -> Device:
    """``wanted`` is the recipe's [hardware] device: auto | cuda | rocm | mps | cpu | mlx."""
    found = machine.accelerator
    if wanted == "auto":
        wanted = found or "cpu"
    if wanted == "cpu":
        return Device(kind="cpu", torch_device="cpu", name=machine.host.cpu_model,
                      memory_total_bytes=machine.host.memory_total_bytes)
    if wanted == "mlx":
        ok = machine.host.os == "Darwin" and machine.host.machine == "arm64"
        if not ok and not machine.fake and mlx_cpu_backend():  # mlx[cpu] on Linux: MLX runs for real on the CPU
            return Device(kind="mlx", torch_device="cpu", name=f"MLX's CPU backend ({machine.host.cpu_model})",
                          memory_total_bytes=machine.host.memory_total_bytes)
        return Device(kind="mlx", torch_device="cpu", name="Apple silicon (MLX)",
                      memory_total_bytes=machine.host.memory_total_bytes,
                      missing="" if ok else f"MLX needs an Apple silicon Mac, or mlx's CPU backend (pip install "
                      f"\"mlx[cpu]\" \"mlx-lm[cpu]\"); this is {machine.host.os} {machine.host.machine} without it")
    gpu = machine.gpus[0] if machine.gpus else None
    missing = "" if found == wanted else (
        f"the recipe asks for {wanted} but {no_accelerator_reason(machine)}" if found is None
        else f"the recipe asks for {wanted} but this machine has {found}")
    return Device(kind=wanted, torch_device="mps" if wanted == "mps" else "cuda",
                  name=gpu.name if gpu else wanted, memory_total_bytes=gpu.memory_total_bytes if gpu else None,
                  capability=gpu.capability if gpu else None, arch=gpu.arch if gpu else None,
                  driver=machine.nvml.driver_version, missing=missing)


def mlx_cpu_backend() -> bool:
    """Whether mlx's Python bindings (``mlx.core``) are installed here (Linux: ``mlx[cpu]``), found
    without importing them."""
    import importlib.util

    try:
        return importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx.core") is not None
    except (ImportError, ValueError):
        return False
