"""What the machine is, as plain frozen data. Probes fill it from the real machine; tests
build one by hand (a fake machine), so checks never know where the numbers came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Host:
    os: str  # "Linux", "Darwin", "Windows"
    os_release: str
    machine: str  # "x86_64", "arm64"
    python: str
    cpu_model: str
    cores_logical: int
    cores_physical: Optional[int]
    memory_total_bytes: int
    macos_version: Optional[str] = None
    cpu_flags: tuple[str, ...] = ()
    compiler: Optional[str] = None  # a C compiler on PATH (torch.compile on the CPU needs one)


@dataclass(frozen=True)
class TorchBuild:
    version: Optional[str]  # None: torch is not installed
    cuda: Optional[str] = None  # torch.version.cuda, e.g. "12.4"
    hip: Optional[str] = None  # torch.version.hip
    arch_list: tuple[str, ...] = ()  # torch.cuda.get_arch_list()
    cuda_available: bool = False
    mps_built: bool = False
    mps_available: bool = False
    driver_cuda_version: Optional[int] = None  # cudaDriverGetVersion via torch, e.g. 12040


@dataclass(frozen=True)
class Nvml:
    available: bool
    error: str = ""  # why NVML could not be read, e.g. "NVML Shared Library Not Found (code 12)"
    driver_version: Optional[str] = None  # "550.54.15"
    cuda_driver_version: Optional[int] = None  # 12040 = CUDA 12.4


@dataclass(frozen=True)
class Gpu:
    index: int
    vendor: str  # nvidia | amd | apple
    name: str
    memory_total_bytes: Optional[int]
    capability: Optional[tuple[int, int]] = None  # NVIDIA compute capability
    arch: Optional[str] = None  # "sm_90", "gfx942", "apple"


@dataclass(frozen=True)
class Kernel:
    """An optional kernel package: installed version, import outcome, native builds."""

    version: Optional[str]
    import_error: str = ""  # "" when it imports
    native_libs: tuple[str, ...] = ()  # e.g. ("cuda124", "rocm64", "cpu") for bitsandbytes


@dataclass(frozen=True)
class Machine:
    host: Host
    torch: TorchBuild
    nvml: Nvml
    gpus: tuple[Gpu, ...] = ()
    packages: tuple[tuple[str, Optional[str]], ...] = ()  # (distribution, version or None)
    kernels: tuple[tuple[str, Kernel], ...] = ()
    mlx_lm_version: Optional[str] = None
    fake: bool = False  # built by a test or a user hook, not read from this machine

    @property
    def package_versions(self) -> dict[str, Optional[str]]:
        return dict(self.packages)

    def kernel(self, name: str) -> Kernel:
        return dict(self.kernels).get(name, Kernel(version=None, import_error=f"{name} is not installed"))

    @property
    def vendor(self) -> Optional[str]:
        return self.gpus[0].vendor if self.gpus else None

    @property
    def accelerator(self) -> Optional[str]:
        """The accelerator torch can use here: cuda | rocm | mps, or None."""
        if self.torch.cuda_available and self.torch.hip:
            return "rocm"
        if self.torch.cuda_available:
            return "cuda"
        if self.torch.mps_available:
            return "mps"
        return None

    def describe(self) -> str:
        if self.gpus:
            return ", ".join(f"{g.name} ({g.arch or g.vendor})" for g in self.gpus)
        return f"CPU only ({self.host.cpu_model})"
