"""Stack checks: driver, architecture, precision, optional kernels, MLX, a real smoke test on
the device, and the installed versions against known fine-tuning bugs. Everything here reads
the ``Machine`` snapshot and the facts tables."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ..machine.compat import load, version_tuple
from ..machine.compat import source
from ..machine.compatibility import (best_torch_build, cuda_text, fp16_overflow_row, gpu_words, kernel_problem,
                                    model_types, parse_cc, precision_problem, precisions, required_kernels,
                                    sdpa_backends, training_dtype)
from ..machine.known_bugs import judge_all, needs_model_type, situation_of
from ..outcomes import Fail, Skip
from .registry import STAGES, check


def _gpu(ctx):
    if ctx.device.missing:
        raise Fail(ctx.device.missing)
    if ctx.device.kind in ("mps", "mlx"):
        raise Skip("Apple GPUs have no separate driver or per-arch kernel list: macOS and the MPS/MLX build carry them")
    if ctx.device.kind == "cpu":
        raise Skip("the recipe trains on the CPU: no GPU driver or kernel list to check")
    return ctx.machine.gpus[0]


@check("stack.driver", stage=STAGES["stack"], accelerator=True)
def driver(ctx) -> None:
    """The driver supports the CUDA runtime torch was built with (minor-version compatibility)."""
    machine, kind = ctx.machine, ctx.device.kind
    _gpu(ctx)
    build = machine.torch
    if kind == "rocm":
        if not build.hip:
            raise Fail(f"the recipe trains on ROCm but torch {build.version} is not a ROCm build: install "
                       f"the ROCm wheel")
        ctx.measure("torch_hip", build.hip, "")
        return
    if not build.cuda:
        raise Fail(f"torch {build.version} is a CPU build on a machine with an NVIDIA GPU: install a CUDA build")
    driver_cuda = machine.nvml.cuda_driver_version or build.driver_cuda_version
    if not driver_cuda:
        raise Fail(f"cannot read the driver's CUDA version (NVML: {machine.nvml.error or 'no answer'}); "
                   "install the NVIDIA driver or make libnvidia-ml.so.1 visible in the container")
    drv = (driver_cuda // 1000, driver_cuda % 1000 // 10)
    wanted = version_tuple(build.cuda)[:2]
    driver_version = machine.nvml.driver_version or "unknown"
    ctx.measure("driver_version", driver_version, "")
    ctx.measure("driver_max_cuda", cuda_text(drv), "")
    ctx.measure("torch_cuda", build.cuda, "")
    facts = load("cuda")
    toolkit = next((t for t in facts["toolkit"] if version_tuple(t["cuda"])[:2] == wanted), None)
    need = toolkit["linux"] if toolkit else f"one supporting CUDA {build.cuda}"
    if drv >= wanted:
        return
    older = best_torch_build(drv)
    instead = f", or install a torch build for CUDA {older} (the cu{older.replace('.', '')} wheel)" if older else ""
    if drv[0] == wanted[0]:
        family = next(f for f in facts["family"] if f["major"] == wanted[0])
        if machine.nvml.driver_version and version_tuple(driver_version) < version_tuple(family["linux"]):
            raise Fail(f"driver {driver_version} is older than {family['linux']}, the minimum for any CUDA "
                       f"{wanted[0]}.x runtime (minor-version compatibility); torch {build.version} needs a driver >= "
                       f"{need}{instead}")
        ctx.measure("minor_version_compatibility", "yes", "")
        if ctx.recipe.training.compile:
            raise Fail(f"driver {driver_version} supports CUDA {cuda_text(drv)} and runs torch's CUDA "
                       f"{build.cuda} runtime "
                       f"only through minor-version compatibility, where PTX that triton/torch.compile JIT-compiles "
                       f"may fail; upgrade the driver to >= {need}{instead}, or set compile = false")
        return
    raise Fail(f"driver {driver_version} supports CUDA up to {cuda_text(drv)} but torch {build.version} was built "
               f"with CUDA {build.cuda}: upgrade the driver to >= {need}{instead}")


@check("stack.arch", stage=STAGES["stack"] + 1, accelerator=True)
def arch(ctx) -> None:
    """The GPU's compute capability (or gfx arch) is among the arches the torch build carries."""
    gpu = _gpu(ctx)
    build = ctx.machine.torch
    arches = list(build.arch_list)
    ctx.measure("gpu_arch", gpu.arch or "", "")
    if not arches:
        raise Skip(f"torch {build.version} reports no arch list (torch.cuda.get_arch_list() is empty)")
    if gpu.vendor == "amd":
        if gpu.arch in arches:
            return
        raise Fail(f"{gpu_words(gpu)} is not among the arches of torch {build.version} ({', '.join(arches)}): "
                   "kernels will fail with 'invalid device function'; install a ROCm build of torch that lists it "
                   "(check AMD's ROCm support matrix for this GPU)")
    major, minor = gpu.capability
    if f"sm_{major}{minor}" in arches:
        return
    if any(a == f"sm_{major}{m}" for m in range(minor) for a in arches):
        ctx.measure("arch_note", f"runs sm_{major}x binaries compiled for an older minor (binary compatible)", "")
        return
    ptx = [a for a in arches if a.startswith("compute_") and version_tuple(a[8:-1] + "." + a[-1]) <= (major, minor)]
    if ptx:
        ctx.measure("arch_note", f"no sm_{major}{minor} binaries; PTX {ptx[-1]} is JIT-compiled at first use", "")
        return
    row = next((r for r in load("cuda")["arch"] if parse_cc(r["cc"]) == (major, minor)), None)
    if row and row["max_cuda"] and version_tuple(build.cuda or "0") > version_tuple(row["max_cuda"]):
        fix = f"install a torch build for CUDA <= {row['max_cuda']} (newer CUDA dropped this architecture)"
    elif row:
        builds = [b for b in load("cuda")["torch_builds"]["cuda"] if version_tuple(b) >= version_tuple(row["min_cuda"])]
        wheel = f" (e.g. the cu{builds[0].replace('.', '')} wheel)" if builds else ""
        fix = f"install a torch build for CUDA >= {row['min_cuda']}{wheel}, which carries sm_{major}{minor}"
    else:
        fix = "install a torch build whose get_arch_list() includes it"
    raise Fail(f"{gpu_words(gpu)} is sm_{major}{minor} but torch {build.version} carries {' '.join(arches)}: "
               f"training would stop with 'no kernel image is available for execution on the device'; {fix}")


@check("stack.precision", stage=STAGES["stack"] + 2)
def precision(ctx) -> None:
    """The recipe's dtype (and TF32 / FP8 if asked) is native on this device and safe for the model's family.

    float16 on a model whose config.json says bfloat16 fails for families known to overflow it (the
    compute facts' sourced fp16_overflow rows) and is measured as a risk for the others."""
    recipe, machine, device = ctx.recipe, ctx.machine, ctx.device
    if device.missing:
        raise Fail(device.missing)
    ctx.measure("dtype", recipe.model.dtype, "")
    if device.kind == "mlx":
        raise Skip("MLX chooses its own kernels; precision is checked by mlx-lm at load time")
    rows = {r["name"]: r for r in load("compute")["precision"]}
    problems = []
    ctx.measure("precisions_checked", len(precisions(recipe)), "precisions")
    for name in precisions(recipe):
        row = rows[name]
        problem = precision_problem(name, row, machine, device)
        if problem:
            problems.append(f"{problem}; use {row['instead']}")
    cpu_bf16 = device.kind == "cpu" and recipe.model.dtype == "bfloat16"
    if cpu_bf16:
        ctx.measure("cpu_bf16_native", bool(set(rows["bfloat16"]["cpu_flags"]) & set(machine.host.cpu_flags)), "")
    fp16 = _fp16_on_bf16_model(ctx, rows["bfloat16"])
    if fp16:
        problems.append(fp16)
    if problems:
        raise Fail("\n".join(problems))
    if cpu_bf16 and not machine.host.cpu_flags:
        raise Skip("this CPU's feature flags could not be read (no /proc/cpuinfo): whether its bfloat16 is native "
                   "or emulated is not known")


@check("stack.kernels", stage=STAGES["stack"] + 3)
def kernels(ctx) -> None:
    """Every optional kernel the recipe implies imports AND supports this device."""
    recipe, machine, device = ctx.recipe, ctx.machine, ctx.device
    if device.missing:
        raise Fail(device.missing)
    rows = {r["name"]: r for r in load("compute")["kernel"]}
    required = required_kernels(recipe)
    ctx.measure("kernels_required", ", ".join(n for n, _ in required) or "none", "")
    ctx.measure("kernels_checked", len(required), "kernels")
    if recipe.model.attn_implementation == "sdpa":
        ctx.measure("sdpa_backends", sdpa_backends(machine, device, recipe.model.dtype), "")
    problems = [p for name, why in required if (p := kernel_problem(rows[name], why, recipe, machine, device))]
    if recipe.model.gguf_file and not machine.package_versions.get("gguf"):
        problems.append(f"gguf_file = \"{recipe.model.gguf_file}\": transformers reads GGUF through the gguf "
                        "package: pip install 'pytest-ftready[gguf]'")
    if recipe.training.compile:
        if device.kind in ("cuda", "rocm"):
            k = machine.kernel("triton")
            if k.version is None or k.import_error:
                problems.append(f"compile = true: torch.compile on GPUs needs triton "
                                f"({k.import_error or 'not installed'})")
        elif device.kind == "cpu" and not machine.host.compiler:
            problems.append("compile = true: torch.compile on the CPU needs a C++ compiler (cc/gcc/clang) on PATH")
    if problems:
        raise Fail("\n".join(problems))


def _fp16_on_bf16_model(ctx, bfloat16_row: dict) -> str:
    """'' unless the recipe trains in float16 a model config.json says was trained in bfloat16 and whose
    family is known to overflow float16 (the compute facts' fp16_overflow rows); then why, and what to
    write. Another family is measured (fp16_overflow_risk), not failed: float16 may hold its activations."""
    recipe = ctx.recipe
    config = _model_config(recipe)
    if config is None:
        ctx.measure("model_config_dtype", "unknown (config.json not reachable offline)", "")
        return ""
    trained = training_dtype(config)
    ctx.measure("model_config_dtype", trained or "not stated", "")
    if recipe.model.dtype != "float16" or trained != "bfloat16":
        return ""
    model_type = "/".join(model_types(config)) or "unknown"
    row = fp16_overflow_row(config)
    facts = load("compute")
    if row is None:
        ctx.measure("fp16_overflow_risk", f"model_type {model_type} was trained in bfloat16 and the recipe trains in "
                    "float16: not a family known to overflow (no fp16_overflow row), but activations beyond 65504 "
                    "turn into inf/NaN; model.overfit's losses show it, or train in bfloat16", "")
        return ""
    ctx.measure("fp16_overflow_family", row["family"], "")
    bf16_problem = precision_problem("bfloat16", bfloat16_row, ctx.machine, ctx.device)
    remedy = ('dtype = "bfloat16" (native on this device)' if not bf16_problem else
              f'dtype = "float32" (bfloat16 is not native here: {bf16_problem})')
    return (f"dtype = \"float16\" on model_type {model_type}, whose config.json says it was trained in bfloat16: "
            f"{row['family']} models overflow float16 (largest finite value 65504) and the loss turns NaN within a few "
            f"steps (source: {source(facts, row)}); use {remedy}")


def _model_config(recipe) -> Optional[dict]:
    """config.json read without loading weights; None offline without a cached config, or unreadable."""
    from ..engine.loading import model_config

    try:
        return model_config(recipe)
    except Exception:  # offline without a cached config, or an unreadable one
        return None


def _model_type(recipe) -> Optional[str]:
    config = _model_config(recipe)
    return None if config is None else config.get("model_type")


def _mlx_missing() -> str:
    from ..trainers.mlx import mlx_missing

    return mlx_missing()


@check("stack.mlx", stage=STAGES["stack"] + 4,
       applies=lambda r: None if r.hardware.device == "mlx" else "not an MLX recipe ([hardware] device != \"mlx\")")
def mlx(ctx) -> None:
    """mlx-lm implements the model's architecture (where mlx imports: mlx-lm loads the model, its
    weights, tokenizer and template), and the recipe's export path supports it."""
    recipe, machine = ctx.recipe, ctx.machine
    if ctx.device.missing:
        raise Fail(ctx.device.missing)
    facts = load("mlx")
    if not machine.mlx_lm_version:
        raise Fail("mlx-lm is not installed: pip install 'pytest-ftready[apple]'")
    model_type = _model_type(recipe)
    if model_type is None:
        raise Skip("the model's config.json is not reachable offline; cannot read its model_type")
    resolved = facts["remapping"].get(model_type, model_type)
    ctx.measure("model_type", model_type, "")
    if not machine.fake and not _mlx_missing():  # mlx-lm itself loads the model here (mlx's CPU backend or a Mac)
        from ..trainers.mlx import loaded

        for name, value in loaded(recipe).items():
            ctx.measure(name, value, "")
        facts = {**facts, "model_types": [*facts["model_types"], resolved]}  # mlx-lm loaded it: it implements it
    known = f"(per mlx-lm {facts['version']}; installed {machine.mlx_lm_version})"
    if resolved not in facts["model_types"]:
        raise Fail(f"mlx-lm does not implement model_type {model_type!r} {known}: mlx_lm.lora would stop with "
                   f"'Model type {model_type} not supported.'; train this model with torch (device = \"mps\")")
    if recipe.export.format == "gguf":
        if resolved not in facts["gguf_model_types"]:
            raise Fail(f"mlx_lm.fuse --export-gguf supports model types {', '.join(facts['gguf_model_types'])} only "
                       f"{known}, not {model_type!r}: export safetensors (format = \"safetensors\") and convert "
                       f"with llama.cpp")
        if recipe.model.quantization != "none":
            raise Fail("GGUF export of a quantized model is not supported by mlx_lm.fuse: add --dequantize")


@check("stack.smoke", stage=STAGES["stack"] + 5, requires=("stack.precision",))
def smoke(ctx) -> None:
    """Allocate, multiply in the recipe's dtype on the real device, read back: 'imports' is not 'works'."""
    import torch

    from ..engine.loading import torch_dtype

    if ctx.device.kind == "mlx":
        raise Skip("MLX recipes train with mlx, not torch")
    if ctx.machine.fake:
        raise Skip("the machine is described (pytest_ftready_machine), not probed: there is no real device to run on")
    device = ctx.torch_device()
    dtype = torch_dtype(ctx.recipe.model.dtype)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(256, 256, generator=generator)
    b = torch.randn(256, 256, generator=generator)
    reference = a.double() @ b.double()
    try:
        out = (a.to(device, dtype) @ b.to(device, dtype)).double().cpu()
    except (RuntimeError, TypeError) as exc:
        raise Fail(f"a {ctx.recipe.model.dtype} matmul on {device} failed: {str(exc).splitlines()[0]}") from None
    error = float((out - reference).abs().max() / reference.abs().max())
    tolerance = {"float32": 5e-3, "float16": 2e-2, "bfloat16": 6e-2}[ctx.recipe.model.dtype]
    ctx.measure("smoke_relative_error", error, "")
    ctx.measure("smoke_elements", out.numel(), "elements")
    if not error <= tolerance:
        raise Fail(f"a {ctx.recipe.model.dtype} matmul on {device} is wrong: relative error {error:.3g} > {tolerance}")


@check("stack.known_bugs", stage=STAGES["stack"] + 6)
def known_bugs(ctx) -> None:
    """The installed versions, with this recipe on this (or the described) machine, hit no known fine-tuning bug."""
    recipe = ctx.recipe
    situation = situation_of(recipe, ctx.machine, ctx.device)
    if needs_model_type(situation):
        situation = replace(situation, model_type=_model_type(recipe))
    verdicts = judge_all(situation)
    by_state = {state: [v for v in verdicts if v.state == state] for state in ("applies", "may_apply", "unknown")}
    ctx.measure("known_bugs_considered", len(verdicts), "bugs")
    ctx.measure("known_bugs_applying", ", ".join(v.bug.id for v in by_state["applies"]) or "none", "")
    if by_state["may_apply"]:
        ctx.measure("known_bugs_may_apply", "; ".join(v.line() for v in by_state["may_apply"]), "")
    unknown = [f"{v.bug.id} needs {', '.join(v.notes)}" for v in by_state["unknown"]]
    applying = by_state["applies"]
    if applying:
        lines = [f"{len(applying)} of {len(verdicts)} known bugs apply to this recipe here: "
                 + ", ".join(f"{v.bug.id} ({v.bug.package} {v.installed})" for v in applying)]
        lines += ["- " + v.line(fix=False) for v in applying]
        lines += [f"not judged: {text}" for text in unknown]
        lines.append("Fix: " + "; ".join(f"{v.bug.fix()} ({v.bug.id})" for v in applying))
        raise Fail("\n".join(lines))
    if unknown:
        raise Skip(f"{len(verdicts) - len(unknown)} of {len(verdicts)} known bugs judged, none applies; "
                   f"cannot judge {'; '.join(unknown)}")
