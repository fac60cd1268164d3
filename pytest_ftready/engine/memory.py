"""Peak memory of one piece of work: device (CUDA allocator, MPS driver), host RSS of the
work itself (not the process's lifetime high-water mark), and live tensor bytes (so a CPU
run measures something meaningful too)."""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

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
        self._thread = None
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
            return max(0, (_status_kib("VmHWM") or 0) - self.start_kib) * 1024, "VmHWM after clear_refs"
        self._stop.set()
        self._thread.join()
        return max(0, self._max - self.start_bytes), "RSS sampled every 2 ms"


class TensorBytes:
    """Counts bytes of tensors created inside the block while they are alive (dispatch mode)."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def track(self, tensor) -> None:
        import torch

        if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = storage.data_ptr()
        if key == 0 or key in self._seen:
            return
        nbytes = storage.nbytes()
        self._seen.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(tensor, self._free, key, nbytes)

    @contextmanager
    def watching(self) -> Iterator["TensorBytes"]:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        tracker = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                inputs = {_storage_key(t) for t in tree_flatten((args, kwargs))[0]}
                for t in tree_flatten(out)[0]:
                    key = _storage_key(t)
                    if key is not None and key not in inputs:
                        tracker.track(t)
                return out

        with Mode():
            yield self


def _storage_key(tensor) -> Optional[int]:
    """The data pointer of a tensor's storage; None for non-tensors, meta tensors and wrapper
    subclasses without storage of their own (FSDP2's DTensor parameters)."""
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
        return None
    try:
        return tensor.untyped_storage().data_ptr()
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
