"""Fake machines for what this machine cannot have (GPUs, NVML, ROCm, Apple), built from
the same dataclasses the real probes fill."""

from __future__ import annotations

from dataclasses import replace

from pytest_ftready.machine.probes import Gpu, Host, Kernel, Machine, Nvml, TorchBuild

GiB = 1024 ** 3
LINUX = Host(os="Linux", os_release="6.8.0", machine="x86_64", python="3.11.7", cpu_model="Fake Xeon",
             cores_logical=32, cores_physical=16, memory_total_bytes=256 * GiB,
             cpu_flags=("avx2", "avx512f", "avx512_bf16", "amx_bf16"))  # a Sapphire Rapids Xeon: native bf16
CU124_ARCHES = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")
CU128_ARCHES = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")


def nvidia(name="NVIDIA H100 80GB HBM3", cc=(9, 0), memory=80 * GiB, driver="550.54.15", driver_cuda=12040,
           torch_cuda="12.4", arches=CU124_ARCHES, kernels=(), count=1) -> Machine:
    gpus = tuple(Gpu(index=i, vendor="nvidia", name=name, memory_total_bytes=memory, capability=cc,
                     arch=f"sm_{cc[0]}{cc[1]}") for i in range(count))
    return Machine(host=LINUX, torch=TorchBuild(version=f"2.6.0+cu{torch_cuda.replace('.', '')}", cuda=torch_cuda,
                                                arch_list=arches, cuda_available=True, driver_cuda_version=driver_cuda),
                   nvml=Nvml(available=True, driver_version=driver, cuda_driver_version=driver_cuda), gpus=gpus,
                   packages=(("torch", "2.6.0"),), kernels=tuple(kernels), fake=True)


def rocm(arch="gfx942", name="AMD Instinct MI300X", memory=192 * GiB, hip="6.2.41133", kernels=()) -> Machine:
    gpus = (Gpu(index=0, vendor="amd", name=name, memory_total_bytes=memory, arch=arch),)
    return Machine(host=LINUX, torch=TorchBuild(version="2.5.1+rocm6.2", hip=hip, arch_list=("gfx90a", "gfx942", "gfx1100"),
                                                cuda_available=True),
                   nvml=Nvml(available=False, error="NVML Shared Library Not Found (NVML error 12)"), gpus=gpus,
                   kernels=tuple(kernels), fake=True)


def apple(macos="14.5", torch_version="2.5.1", mlx_lm=None) -> Machine:
    host = replace(LINUX, os="Darwin", os_release="23.5.0", machine="arm64", cpu_model="Apple M2 Max",
                   macos_version=macos, memory_total_bytes=64 * GiB)
    return Machine(host=host, torch=TorchBuild(version=torch_version, mps_built=True, mps_available=True),
                   nvml=Nvml(available=False, error="nvml.dll/libnvidia-ml not found (NVML error 12)"),
                   gpus=(Gpu(index=0, vendor="apple", name="Apple M2 Max", memory_total_bytes=64 * GiB, arch="apple"),),
                   mlx_lm_version=mlx_lm, packages=(("mlx-lm", mlx_lm),) if mlx_lm else (), fake=True)


def cpu_only(torch_version="2.6.0+cu124", torch_cuda="12.4", memory=256 * GiB) -> Machine:
    """A CUDA build of torch on a machine whose NVML (and so driver) is absent."""
    return Machine(host=replace(LINUX, memory_total_bytes=memory),
                   torch=TorchBuild(version=torch_version, cuda=torch_cuda, cuda_available=False),
                   nvml=Nvml(available=False, error="NVML Shared Library Not Found (NVML error 12)"), fake=True)


def kernel(version="2.7.4", error="", libs=()) -> Kernel:
    return Kernel(version=version, import_error=error, native_libs=tuple(libs))
