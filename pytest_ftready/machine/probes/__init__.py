"""Reading the machine. ``read_machine()`` is the real path; tests and users substitute a
``Machine`` through the ``pytest_ftready_machine`` hook."""

from __future__ import annotations

import importlib.metadata as md

from .records import Gpu, Host, Kernel, Machine, Nvml, TorchBuild
from .host import read_host
from .kernels import KERNELS, read_kernel
from .nvidia import read_nvml
from .torchinfo import read_torch

PACKAGES = (
    "torch", "transformers", "peft", "datasets", "accelerate", "trl", "tokenizers", "safetensors",
    "huggingface-hub", "bitsandbytes", "flash-attn", "triton", "xformers", "liger-kernel", "deepspeed",
    "mlx", "mlx-lm", "nvidia-ml-py", "amdsmi", "gguf", "numpy", "pytest", "pytest-benchmark", "pytest-ftready",
)


def installed(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def read_machine() -> Machine:
    """Probe this machine once: host, torch build, NVML, GPUs, packages, kernels."""
    host = read_host()
    build, torch_gpus = read_torch()
    nvml, nvml_gpus = read_nvml()
    gpus = nvml_gpus if nvml_gpus else torch_gpus
    packages = tuple((name, installed(name)) for name in PACKAGES)
    kernels = tuple((name, read_kernel(name)) for name in KERNELS) if build.version else ()
    return Machine(host=host, torch=build, nvml=nvml, gpus=gpus, packages=packages, kernels=kernels,
                   mlx_lm_version=installed("mlx-lm"))


__all__ = ["Gpu", "Host", "Kernel", "Machine", "Nvml", "TorchBuild", "read_machine", "installed"]
