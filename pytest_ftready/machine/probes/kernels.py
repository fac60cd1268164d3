"""Optional kernel packages: installed version, whether they import, native builds."""

from __future__ import annotations

import importlib
import importlib.metadata as md
import re

from .records import Kernel

# kernel name -> (distribution, import module)
KERNELS = {
    "flash_attn": ("flash-attn", "flash_attn"),
    "flash_attn_3": ("flash-attn-3", "flash_attn_interface"),
    "bitsandbytes": ("bitsandbytes", "bitsandbytes"),
    "triton": ("triton", "triton"),
    "liger_kernel": ("liger-kernel", "liger_kernel"),
    "xformers": ("xformers", "xformers"),
}
NATIVE = re.compile(r"libbitsandbytes_([a-z0-9]+)\.(?:so|dylib|dll)$")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _native_libs(dist: str) -> tuple[str, ...]:
    try:
        files = md.files(dist) or []
    except md.PackageNotFoundError:
        return ()
    return tuple(sorted({m.group(1) for f in files if (m := NATIVE.search(str(f)))}))


def read_kernel(name: str) -> Kernel:
    dist, module = KERNELS[name]
    version = _version(dist)
    if version is None:
        return Kernel(version=None, import_error=f"{dist} is not installed")
    try:
        importlib.import_module(module)
        error = ""
    except Exception as exc:  # an import that fails for any reason is what we report
        error = f"import {module} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return Kernel(version=version, import_error=error, native_libs=_native_libs(dist))
