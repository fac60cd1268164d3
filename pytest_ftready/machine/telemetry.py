"""Telemetry sampled in a background thread at a fixed interval: NVML on NVIDIA (temperature,
SM and memory clocks, power and its limit, utilization, memory used, throttle reasons),
amdsmi on AMD when installed, host CPU load everywhere. Each source says what it cannot
read; the sampler measures its own overhead."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from .compat import load


def decode_reasons(mask: int) -> list[str]:
    reasons = load("nvml")["reasons"]
    return [name for bit, name in reasons.items() if bit != "source" and mask & int(bit, 16)]


class Source(Protocol):
    name: str
    missing: list[str]

    def read(self) -> dict[str, Any]: ...


class HostSource:
    name = "host"

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._proc = psutil.Process()
        psutil.cpu_percent(None)
        self.missing: list[str] = []

    def read(self) -> dict[str, Any]:
        return {"cpu_percent": self._psutil.cpu_percent(None), "rss_bytes": self._proc.memory_info().rss}


class NvmlSource:
    """One NVIDIA GPU through NVML. ``nvml`` is the pynvml module (tests pass a fake one)."""

    name = "nvml"

    def __init__(self, index: int = 0, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.nvml = nvml
        nvml.nvmlInit()
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.missing: list[str] = []
        self._readers = {
            "temperature_c": lambda h: nvml.nvmlDeviceGetTemperature(h, 0),  # NVML_TEMPERATURE_GPU
            "sm_clock_mhz": lambda h: nvml.nvmlDeviceGetClockInfo(h, 1),  # NVML_CLOCK_SM
            "mem_clock_mhz": lambda h: nvml.nvmlDeviceGetClockInfo(h, 2),  # NVML_CLOCK_MEM
            "power_w": lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "power_limit_w": lambda h: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "utilization_percent": lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu,
            "memory_used_bytes": lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used,
            "throttle_mask": lambda h: (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                                        or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)(h),
        }

    def read(self) -> dict[str, Any]:
        out = {}
        for key, reader in list(self._readers.items()):
            try:
                out[key] = reader(self.handle)
            except Exception as exc:  # NVMLError_NotSupported on some boards: stop asking, say so
                self.missing.append(f"{key} ({type(exc).__name__})")
                del self._readers[key]
        if "throttle_mask" in out:
            out["throttle_reasons"] = decode_reasons(int(out["throttle_mask"]))
        return out


class AmdSource:
    """One AMD GPU through amdsmi (optional extra pytest-ftready[amd])."""

    name = "amdsmi"

    def __init__(self, index: int = 0) -> None:
        import amdsmi

        self.amdsmi = amdsmi
        amdsmi.amdsmi_init()
        self.handle = amdsmi.amdsmi_get_processor_handles()[index]
        self.missing: list[str] = []

    def read(self) -> dict[str, Any]:
        a, h, out = self.amdsmi, self.handle, {}
        readers = {
            "temperature_c": lambda: a.amdsmi_get_temp_metric(h, a.AmdSmiTemperatureType.HOTSPOT,
                                                              a.AmdSmiTemperatureMetric.CURRENT),
            "power_w": lambda: a.amdsmi_get_power_info(h)["average_socket_power"],
            "sm_clock_mhz": lambda: a.amdsmi_get_clock_info(h, a.AmdSmiClkType.GFX)["clk"],
            "utilization_percent": lambda: a.amdsmi_get_gpu_activity(h)["gfx_activity"],
        }
        for key, reader in readers.items():
            if any(m.startswith(key) for m in self.missing):
                continue
            try:
                out[key] = reader()
            except Exception as exc:  # amdsmi raises AmdSmiLibraryException for unsupported metrics
                self.missing.append(f"{key} ({type(exc).__name__})")
        return out


def sources_for(device, machine) -> tuple[list, list[str]]:
    """The sources this device offers, and what is missing (in words)."""
    sources: list = [HostSource()]
    missing = []
    if device.kind == "cuda":
        try:
            sources.append(NvmlSource(0))
        except Exception as exc:  # NVML absent or driver not loaded
            missing.append(f"GPU telemetry: NVML unavailable ({machine.nvml.error or type(exc).__name__})")
    elif device.kind == "rocm":
        try:
            sources.append(AmdSource(0))
        except ImportError:
            missing.append("GPU telemetry: amdsmi is not installed (pip install 'pytest-ftready[amd]')")
        except Exception as exc:  # amdsmi present but failing
            missing.append(f"GPU telemetry: amdsmi failed ({type(exc).__name__})")
    else:
        missing.append(f"GPU telemetry: none on {device.kind} (temperature, clocks and power are not readable here)")
    return sources, missing


@dataclass
class Sampler:
    sources: list
    interval_s: float = 1.0
    samples: list = field(default_factory=list)  # (seconds since start, {metric: value})
    read_seconds: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None
    _start: float = 0.0

    def sample(self) -> None:
        t0 = time.perf_counter()
        reading: dict[str, Any] = {}
        for source in self.sources:
            reading.update(source.read())
        self.read_seconds += time.perf_counter() - t0
        self.samples.append((t0 - self._start, reading))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> "Sampler":
        self._start = time.perf_counter()
        self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        self.elapsed_s = time.perf_counter() - self._start

    @property
    def overhead_share(self) -> float:
        """Share of wall time spent reading telemetry (the sampler's own cost)."""
        return self.read_seconds / self.elapsed_s if getattr(self, "elapsed_s", 0) else 0.0

    def series(self, metric: str) -> list:
        return [(round(t, 3), r[metric]) for t, r in self.samples if metric in r]
