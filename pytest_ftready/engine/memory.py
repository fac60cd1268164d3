"""Peak memory of one piece of work: device (CUDA allocator, MPS driver), host RSS of the
work itself (not the process's lifetime high-water mark), and live tensor bytes (so a CPU
run measures something meaningful too)."""

from __future__ import annotations

import math
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> Optional[int]:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class Peak:
    host_bytes: int = 0  # peak RSS above the RSS at the start
    host_method: str = ""
    tensor_bytes: int = 0  # peak bytes of live tensors created during the work
    device_allocated_bytes: Optional[int] = None
    device_reserved_bytes: Optional[int] = None


class _HostPeak:
    """Linux: reset VmHWM through clear_refs, read it after. Elsewhere: sample RSS."""

    def __init__(self) -> None:
        self.start_kib = _status_kib("VmRSS")
        self.exact = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None  # the RSS sampler where VmHWM cannot be reset
        self._max = 0
        if self.start_kib is not None:
            try:
                CLEAR_REFS.write_text("5")
                self.exact = True
            except OSError:
                self.exact = False
        if not self.exact:
            import psutil

            proc = psutil.Process()
            self.start_bytes = proc.memory_info().rss

            def sample() -> None:
                while not self._stop.wait(0.002):
                    self._max = max(self._max, proc.memory_info().rss)

            self._thread = threading.Thread(target=sample, daemon=True)
            self._thread.start()

    def finish(self) -> tuple[int, str]:
        if self.exact:
            return max(0, (_status_kib("VmHWM") or 0) - (self.start_kib or 0)) * 1024, "VmHWM after clear_refs"
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return max(0, self._max - self.start_bytes), "RSS sampled every 2 ms"


class TensorBytes:
    """Counts the bytes of every storage an op creates while the block runs, from the storage's
    creation to its death (a dispatch mode). Keyed by storage, not by tensor: a tensor's
    Python object can die while a view of it, or autograd's saved copy, keeps its storage
    alive (counting tensors undercounted the tiny model's step by ~47 % against the CPU
    allocator's own figures in the profiler). Outputs sharing an input's storage (views,
    in-place results) add nothing, nor do storages that existed before (``existing``).
    Works on real and on fake tensors (forecast.trace); keeps, per storage, the events of its
    birth and death so the live set at the peak can be classified afterwards."""

    def __init__(self, existing: Sequence = (), scalar_reads: bool = False) -> None:
        self.scalar_reads = scalar_reads  # answer float(fake tensor) with 1.0 (fake tensors only)
        self.known = {s._cdata for s in map(storage_of, existing) if s is not None}
        self.alive: dict[int, int] = {}  # storage key -> serial
        self.nbytes: list[int] = []  # per serial
        self.born: list[int] = []
        self.died: list[float] = []
        self.event = 0
        self.live = 0
        self.peak = 0
        self.peak_event = 0
        self.marks: list[tuple[int, str]] = []  # (event at which a phase started, phase)

    def serial_of(self, tensor) -> Optional[int]:
        return self.alive.get(tensor.untyped_storage()._cdata)

    def mark(self, phase: str) -> None:
        self.marks.append((self.event, phase))

    def phase_at(self, event: int, first: str = "") -> str:
        started = [name for e, name in self.marks if e < event]
        return started[-1] if started else first

    def live_at(self, event: int) -> list[int]:
        """Serials of the storages alive just after ``event``."""
        return [s for s, (b, d) in enumerate(zip(self.born, self.died)) if b <= event < d]

    def track(self, storage, key: int) -> None:
        serial = len(self.nbytes)
        self.alive[key] = serial
        self.nbytes.append(storage.nbytes())
        self.event += 1
        self.born.append(self.event)
        self.died.append(math.inf)
        self.live += self.nbytes[serial]
        if self.live > self.peak:
            self.peak, self.peak_event = self.live, self.event
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        serial = self.alive.pop(key)
        self.event += 1
        self.died[serial] = self.event
        self.live -= self.nbytes[serial]

    @contextmanager
    def watching(self) -> Iterator["TensorBytes"]:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self
        scalar = torch.ops.aten._local_scalar_dense.default
        tensor = torch.Tensor

        def tensors(obj) -> Iterator:  # ops take and return tensors, lists/tuples of them, dicts
            if isinstance(obj, tensor):
                yield obj
            elif isinstance(obj, (list, tuple)):
                for item in obj:
                    yield from tensors(item)
            elif isinstance(obj, dict):
                for item in obj.values():
                    yield from tensors(item)

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if tracker.scalar_reads and func is scalar:
                    return 1.0  # a fake tensor has no value: float(loss) and Adam's step count read 1.0
                out = func(*args, **(kwargs or {}))
                inputs = None
                for t in tensors(out):
                    storage = storage_of(t)
                    if storage is None:  # no storage bytes behind it (meta, sparse, a DTensor wrapper)
                        continue
                    key = storage._cdata
                    if key in tracker.alive or key in tracker.known:
                        continue
                    if inputs is None:  # only for a storage not seen yet: is it an input's?
                        inputs = {s._cdata for s in map(storage_of, tensors((args, kwargs))) if s is not None}
                    if key not in inputs:
                        tracker.track(storage, key)
                return out

        with Mode():
            yield self


def storage_of(tensor):
    """The storage behind a strided tensor; None for meta and sparse tensors and for wrapper
    subclasses without storage of their own (FSDP2's DTensor parameters)."""
    import torch

    if tensor.layout != torch.strided or tensor.device.type == "meta":
        return None
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


@contextmanager
def peak_memory(torch_device: str, count_tensors: bool) -> Iterator[Peak]:
    """Measure the peaks of the block. ``count_tensors`` adds the dispatch-mode tensor count
    (slower; used where the device has no allocator statistics, i.e. the CPU)."""
    import torch

    peak = Peak()
    if torch_device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    host = _HostPeak()
    tensors = TensorBytes()
    mps_sampler = _MpsSampler() if torch_device.startswith("mps") else None
    try:
        if count_tensors:
            with tensors.watching():
                yield peak
        else:
            yield peak
    finally:
        if torch_device.startswith("cuda"):
            torch.cuda.synchronize()
            peak.device_allocated_bytes = int(torch.cuda.max_memory_allocated())
            peak.device_reserved_bytes = int(torch.cuda.max_memory_reserved())
        if mps_sampler is not None:
            peak.device_allocated_bytes = peak.device_reserved_bytes = mps_sampler.finish()
        peak.host_bytes, peak.host_method = host.finish()
        peak.tensor_bytes = tensors.peak


class _MpsSampler:
    """MPS has no peak statistic: sample the driver's allocation while the block runs."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._max = int(torch.mps.driver_allocated_memory())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self._max = max(self._max, int(self._torch.mps.driver_allocated_memory()))

    def finish(self) -> int:
        self._torch.mps.synchronize()
        self._stop.set()
        self._thread.join()
        return max(self._max, int(self._torch.mps.driver_allocated_memory()))


def free_device_memory(torch_device: str) -> None:
    import gc

    import torch

    gc.collect()
    if torch_device.startswith("cuda"):
        torch.cuda.empty_cache()
    elif torch_device.startswith("mps"):
        torch.mps.empty_cache()
