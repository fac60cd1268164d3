"""NVIDIA probe through NVML (nvidia-ml-py, imported as pynvml)."""

from __future__ import annotations

from .records import Gpu, Nvml


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml() -> tuple[Nvml, tuple[Gpu, ...]]:
    """Driver and GPUs as NVML sees them; on failure, the NVML error in words."""
    try:
        import pynvml
    except ImportError:
        return Nvml(available=False, error="nvidia-ml-py is not installed (pip install nvidia-ml-py)"), ()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Nvml(available=False, error=f"{exc} (NVML error {getattr(exc, 'value', '?')})"), ()
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            cuda_driver = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())
        except (pynvml.NVMLError, AttributeError):
            cuda_driver = int(pynvml.nvmlSystemGetCudaDriverVersion())
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(Gpu(index=index, vendor="nvidia", name=_text(pynvml.nvmlDeviceGetName(handle)),
                            memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                            capability=(int(major), int(minor)), arch=f"sm_{major}{minor}"))
        return Nvml(available=True, driver_version=driver, cuda_driver_version=cuda_driver), tuple(gpus)
    except pynvml.NVMLError as exc:
        return Nvml(available=False, error=f"{exc} (NVML error {getattr(exc, 'value', '?')})"), ()
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
