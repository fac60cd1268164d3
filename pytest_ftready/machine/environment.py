"""The environment record (repro.environment): hardware, driver, runtimes and packages."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from .probes import Machine


def environment_record(machine: Machine) -> dict[str, Any]:
    host = machine.host
    return {
        "host": asdict(host) | {"cpu_flags": None},
        "os": f"{host.os} {host.os_release}" + (f" (macOS {host.macos_version})" if host.macos_version else ""),
        "python": host.python,
        "torch": asdict(machine.torch),
        "nvml": asdict(machine.nvml),
        "gpus": [asdict(g) for g in machine.gpus],
        "packages": {name: version for name, version in machine.packages if version},
        "kernels": {name: asdict(k) for name, k in machine.kernels if k.version},
        "mlx_lm": machine.mlx_lm_version,
        "fake_machine": machine.fake,
    }


def suite_properties(machine: Machine) -> dict[str, str]:
    """The flat properties a CI dashboard shows for the whole run."""
    host, build = machine.host, machine.torch
    props = {
        "ftready.os": f"{host.os} {host.os_release}",
        "ftready.python": host.python,
        "ftready.cpu": host.cpu_model,
        "ftready.cpu_cores": str(host.cores_logical),
        "ftready.ram_bytes": str(host.memory_total_bytes),
        "ftready.torch": str(build.version),
        "ftready.torch_cuda": str(build.cuda),
        "ftready.torch_hip": str(build.hip),
        "ftready.driver": str(machine.nvml.driver_version),
        "ftready.driver_cuda": str(machine.nvml.cuda_driver_version or build.driver_cuda_version),
    }
    for gpu in machine.gpus:
        props[f"ftready.gpu{gpu.index}"] = (f"{gpu.name}; {gpu.arch}; "
                                             f"{gpu.memory_total_bytes} bytes")
    for name, k in machine.kernels:
        if k.version:
            props[f"ftready.kernel.{name}"] = k.version + (f" (import fails: {k.import_error})" if k.import_error
                                                           else "")
    for name, version in machine.packages:
        if version:
            props[f"ftready.pkg.{name}"] = version
    return props
