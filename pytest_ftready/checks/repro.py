"""Reproducibility checks: environment record, pins, resolved config and seeds, manifest."""

from __future__ import annotations

from ..environment import environment_record, suite_properties
from ..report import write_json
from .base import STAGES, Fail, check


@check("repro.environment", stage=STAGES["repro.environment"])
def environment(ctx) -> None:
    """Record hardware, driver, CUDA/ROCm, OS, Python and package versions."""
    machine = ctx.machine
    record = environment_record(machine)
    path = write_json(ctx.state.artifacts / "environment.json", record)
    for name, value in suite_properties(machine).items():
        ctx.suite_property(name, value)
    ctx.measure("cpu_cores", machine.host.cores_logical, "cores")
    ctx.measure("host_memory_total", machine.host.memory_total_bytes, "bytes")
    for gpu in machine.gpus:
        if gpu.memory_total_bytes:
            ctx.measure(f"gpu{gpu.index}_memory_total", gpu.memory_total_bytes, "bytes")
    ctx.user_properties.append(("environment_json", str(path)))
    if machine.torch.version is None:
        raise Fail("torch is not installed: pip install torch (the CPU, CUDA or ROCm build for this machine)")
