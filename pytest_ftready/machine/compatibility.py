"""Compatibility rules: the machine and the recipe judged against the compatibility facts
(machine/compat/*.toml): which precisions are native, which optional kernels import and
support the device, which torch build a driver can run. Plain functions returning '' or
the reason, used by the stack checks, the lever sweep and the accelerator marker."""

from __future__ import annotations

from typing import Optional

from .compat import cc_text, load, version_tuple


def parse_cc(cc) -> tuple[int, int]:
    major, minor = (int(x) for x in str(cc).split("."))
    return major, minor


def gpu_family(cc: tuple[int, int]) -> str:
    return load("compute")["gpus"].get(cc_text(cc), "")


def gpu_words(gpu) -> str:
    if gpu.capability:
        family = gpu_family(gpu.capability)
        return f"{gpu.name} (compute capability {cc_text(gpu.capability)}{', ' + family if family else ''})"
    if gpu.vendor == "amd":
        return f"{gpu.name} ({gpu.arch}, {load('rocm')['archs'].get(gpu.arch, 'unknown AMD arch')})"
    return gpu.name


def cuda_text(version: tuple[int, ...]) -> str:
    return ".".join(str(v) for v in version[:2])


def best_torch_build(max_cuda: tuple[int, int]) -> Optional[str]:
    builds = [b for b in load("cuda")["torch_builds"]["cuda"] if version_tuple(b) <= max_cuda]
    return builds[-1] if builds else None


def precisions(recipe) -> list[str]:
    wanted = [recipe.model.dtype] if recipe.model.dtype == "bfloat16" else []
    return wanted + (["tf32"] if recipe.training.tf32 else []) + (["fp8"] if recipe.training.fp8 else [])


def precision_problem(name: str, row: dict, machine, device) -> str:
    """'' when ``name`` (bfloat16, tf32, fp8) is native on ``device``, else why not."""
    if device.kind == "cuda":
        gpu = machine.gpus[0]
        need = parse_cc(row["cuda_min_cc"])
        if gpu.capability < need:
            emulated = (" (torch.cuda.is_bf16_supported() says True here because it counts emulation)"
                        if name == "bfloat16" else "")
            return (f"{gpu_words(gpu)} has no native {name}: it needs compute capability {row['cuda_min_cc']} "
                    f"or newer{emulated}")
        return ""
    if device.kind == "rocm":
        gpu = machine.gpus[0]
        return "" if gpu.arch in row["rocm_archs"] else f"{gpu_words(gpu)} has no native {name} support"
    if device.kind == "mps":
        if name != "bfloat16":
            return f"Apple GPUs have no {name}"
        host, build = machine.host, machine.torch
        if host.machine != "arm64":
            return "MPS bfloat16 needs Apple silicon; this Mac is Intel"
        if version_tuple(host.macos_version or "0") < version_tuple(row["mps_min_macos"]):
            return f"MPS bfloat16 needs macOS {row['mps_min_macos']} or newer; this Mac runs macOS {host.macos_version}"
        if version_tuple(build.version or "0") < version_tuple(row["mps_min_torch"]):
            return f"MPS bfloat16 needs torch >= {row['mps_min_torch']}; installed: {build.version}"
        return ""
    # CPU: bf16 runs everywhere, but natively only with AVX512-BF16/AMX/Arm BF16 (else emulated, several
    # times slower than float32); TF32 has no meaning; FP8 does not train. Unknown flags: the check skips.
    if name == "fp8":
        return "FP8 training needs a GPU (compute capability 8.9+ or MI300)"
    flags = machine.host.cpu_flags
    if name == "bfloat16" and flags and not set(row["cpu_flags"]) & set(flags):
        return (f"this CPU ({machine.host.cpu_model or machine.host.machine}) has no native bfloat16 (none of "
                f"{', '.join(row['cpu_flags'])} among its flags): torch emulates it, slower than float32")
    return ""


def config_value(config: dict, key: str):
    """``key`` of config.json, or of its ``text_config`` (multimodal models such as Gemma 3 nest the text model)."""
    value = config.get(key)
    return value if value is not None else (config.get("text_config") or {}).get(key)


def training_dtype(config: dict) -> str:
    """The dtype config.json says the weights were trained and saved in (``dtype`` in transformers 5,
    ``torch_dtype`` before); '' when it does not say."""
    value = config_value(config, "dtype") or config_value(config, "torch_dtype") or ""
    return str(value).replace("torch.", "")


def model_types(config: dict) -> list[str]:
    """config.json's model_type and its text_config's (gemma3 holds gemma3_text)."""
    return [t for t in (config.get("model_type"), (config.get("text_config") or {}).get("model_type")) if t]


def fp16_overflow_row(config: dict) -> Optional[dict]:
    """The compute facts' ``fp16_overflow`` row whose family this config belongs to (by model_type, or
    a config key such as num_local_experts with more than one expert), or None."""
    types = model_types(config)
    for row in load("compute")["fp16_overflow"]:
        if set(types) & set(row["model_types"]):
            return row
        if any(isinstance(n := config_value(config, key), int) and n > 1 for key in row["config_keys"]):
            return row
    return None


def required_kernels(recipe) -> list[tuple[str, str]]:
    """(kernel row name, why) for each optional kernel the recipe implies."""
    out = []
    if recipe.model.attn_implementation in ("flash_attention_2", "flash_attention_3"):
        out.append((recipe.model.attn_implementation, f"attn_implementation = \"{recipe.model.attn_implementation}\""))
    if recipe.model.quantization != "none":
        out.append(("bitsandbytes", f"quantization = \"{recipe.model.quantization}\""))
    elif recipe.training.optimizer in ("adamw_8bit", "paged_adamw", "paged_adamw_8bit"):
        out.append(("bitsandbytes", f"optimizer = \"{recipe.training.optimizer}\""))
    return out


def kernel_problem(row: dict, why: str, recipe, machine, device) -> str:
    """'' when the kernel imports and supports this device, else what to do."""
    name, package = row["name"], row["package"]
    if device.kind in ("cpu", "mps", "mlx"):
        if name == "bitsandbytes" and device.kind == "mps":
            modes = row["mps_modes"]
            mode = ("optim8" if recipe.training.optimizer in ("adamw_8bit", "paged_adamw", "paged_adamw_8bit")
                    else recipe.model.quantization)
            if mode not in modes:
                return (f"{why}: bitsandbytes on Apple GPUs supports {', '.join(modes)} only; use "
                        f"{row['instead']}")
        else:
            where = "an Apple GPU" if device.kind in ("mps", "mlx") else "the CPU"
            return (f"{why} needs {name.replace('_', ' ')} on an NVIDIA GPU"
                    f"{' or an AMD MI200/MI300' if row['rocm_train_archs'] else ''}; this recipe runs on {where} "
                    f"({machine.describe()}): use {row['instead']}")
    elif device.kind == "cuda":
        gpu = machine.gpus[0]
        low, high = parse_cc(row["cuda_min_cc"]), parse_cc(row["cuda_max_cc"]) if row["cuda_max_cc"] else None
        if gpu.capability < low or (high and gpu.capability > high):
            span = f"exactly {row['cuda_min_cc']}" if high == low else f"{row['cuda_min_cc']} or newer"
            return (f"{why}: {name} needs compute capability {span}; {gpu_words(gpu)} lacks it: use {row['instead']}")
        if (name == "bitsandbytes" and recipe.model.quantization == "8bit"
                and gpu.capability < parse_cc(row["int8_min_cc"])):
            return f"{why}: LLM.int8 needs compute capability {row['int8_min_cc']}; use quantization = \"4bit\""
    elif device.kind == "rocm":
        gpu = machine.gpus[0]
        if gpu.arch in row["rocm_forward_only_archs"]:
            return f"{why} on {gpu_words(gpu)}: {row['rocm_note']}"
        if gpu.arch not in row["rocm_train_archs"]:
            return f"{why}: no ROCm build of {name} for {gpu_words(gpu)} ({row['rocm_note']}); use {row['instead']}"
        if name == "bitsandbytes":
            k = machine.kernel(package)
            if k.version and not any(lib.startswith("rocm") for lib in k.native_libs):
                return (f"{why}: bitsandbytes {k.version} carries no ROCm library (native builds: "
                        f"{', '.join(k.native_libs) or 'none'}); install bitsandbytes >= {row['rocm_min_version']} "
                        f"({row['rocm_note']}) or use {row['instead']}")
    if row["dtypes"] and recipe.model.dtype not in row["dtypes"]:
        return f"{why}: {name} runs in {' or '.join(row['dtypes'])}, the recipe trains in {recipe.model.dtype}"
    k = machine.kernel(package)
    if k.version is None:
        install = {"flash_attn": "pip install flash-attn --no-build-isolation",
                   "flash_attn_3": "build flash-attention's hopper/ folder (python setup.py install)",
                   "bitsandbytes": "pip install 'pytest-ftready[quant]'"}[package]
        return f"{why}: {package} is not installed ({install})"
    if k.import_error:
        return f"{why}: {k.import_error}"
    return ""


def sdpa_backends(machine, device, dtype: str) -> str:
    if device.kind != "cuda":
        return "math" if device.kind == "cpu" else "native"
    cc = machine.gpus[0].capability
    backends = []
    if (8, 0) <= cc <= (12, 1) and dtype in ("float16", "bfloat16"):
        backends.append("flash")
    if cc >= (5, 0):
        backends.append("mem_efficient")
    return ", ".join(backends + ["math"])
