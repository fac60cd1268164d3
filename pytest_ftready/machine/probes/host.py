"""Host probe: CPU, cores, RAM, OS, Python."""

from __future__ import annotations

import os
import platform
import shutil

from .records import Host


def _cpu_model_and_flags() -> tuple[str, tuple[str, ...]]:
    model = platform.processor() or platform.machine()
    flags: tuple[str, ...] = ()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:  # x86 names them flags, arm64 Features
                    flags = tuple(value.split())
    except OSError:
        pass
    if platform.system() == "Darwin":
        import subprocess

        try:
            model = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                   text=True, timeout=5).stdout.strip() or model
        except (OSError, subprocess.SubprocessError):
            pass
    return model, flags


def read_host() -> Host:
    import psutil

    model, flags = _cpu_model_and_flags()
    mac = platform.mac_ver()[0] or None
    return Host(
        os=platform.system(), os_release=platform.release(), machine=platform.machine(),
        python=platform.python_version(), cpu_model=model, cores_logical=os.cpu_count() or 1,
        cores_physical=psutil.cpu_count(logical=False), memory_total_bytes=psutil.virtual_memory().total,
        macos_version=mac, cpu_flags=flags,
        compiler=next((c for c in (shutil.which(n) for n in ("cc", "gcc", "clang")) if c), None),
    )
