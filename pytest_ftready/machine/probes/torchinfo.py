"""What the installed torch build carries and can reach: CUDA/HIP versions, arch list,
devices (AMD GPUs are seen through torch's HIP build, Apple GPUs through MPS)."""

from __future__ import annotations

import importlib.util
import platform

from .records import Gpu, TorchBuild


def read_torch() -> tuple[TorchBuild, tuple[Gpu, ...]]:
    if importlib.util.find_spec("torch") is None:
        return TorchBuild(version=None), ()
    import torch

    cuda_available = bool(torch.cuda.is_available())
    mps = getattr(torch.backends, "mps", None)
    mps_built = bool(mps and mps.is_built())
    mps_available = bool(mps and mps.is_available())
    arch_list: tuple[str, ...] = ()
    driver_cuda = None
    gpus: list[Gpu] = []
    if cuda_available:
        arch_list = tuple(torch.cuda.get_arch_list())
        try:  # the driver's CUDA version, also when NVML is absent
            driver_cuda = int(torch._C._cuda_getDriverVersion())
        except (AttributeError, RuntimeError):
            driver_cuda = None
        if torch.version.hip:
            for index in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(index)
                arch = getattr(props, "gcnArchName", "").split(":")[0] or None
                gpus.append(Gpu(index=index, vendor="amd", name=props.name,
                                memory_total_bytes=int(props.total_memory), arch=arch))
    elif mps_available:
        import psutil

        # Unified memory: the GPU shares the host RAM.
        gpus.append(Gpu(index=0, vendor="apple", name=platform.processor() or "Apple GPU",
                        memory_total_bytes=int(psutil.virtual_memory().total), arch="apple"))
    build = TorchBuild(version=torch.__version__, cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None),
                       arch_list=arch_list, cuda_available=cuda_available, mps_built=mps_built,
                       mps_available=mps_available, driver_cuda_version=driver_cuda)
    return build, tuple(gpus)
