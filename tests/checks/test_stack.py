"""Stack checks on fake machines (same Machine dataclasses the probes fill)."""

from __future__ import annotations

import json

import pytest

from pytest_ftready.checks.registry import REGISTRY, all_checks
from pytest_ftready.outcomes import Skip
from pytest_ftready.session.context import CheckContext
from pytest_ftready.recipe.schema import parse_recipe
from pytest_ftready.session.state import RunState
from tests.helpers import fails
from tests import fakes

BASE = """
[model]
path = "model"
dtype = "{dtype}"
attn_implementation = "{attn}"
quantization = "{quant}"
[data]
train = ["train.jsonl"]
[adapter]
method = "lora"
[training]
optimizer = "{optimizer}"
compile = {compile}
fp8 = {fp8}
[hardware]
device = "{device}"
[export]
format = "{export}"
"""


@pytest.fixture
def run(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "train.jsonl").write_text("{}\n")
    all_checks()

    def run_on(machine, check_id, model_type=None, **recipe):
        values = dict(dtype="bfloat16", attn="sdpa", quant="none", optimizer="adamw", compile="false", fp8="false",
                      device="auto", export="none") | recipe
        if model_type:
            (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": model_type}))
        parsed = parse_recipe(BASE.format(**values), tmp_path / "recipe.toml")
        state = RunState(artifacts_root=tmp_path / "arts", machine_factory=lambda: machine).recipe_state(parsed)
        ctx = CheckContext(state, REGISTRY[check_id])
        REGISTRY[check_id].body(ctx)
        return {m.name: m.value for m in ctx.measured}
    return run_on



def test_current_nvidia_machine_passes_everything(run):
    machine = fakes.nvidia(kernels=[("flash_attn", fakes.kernel("2.7.4"))])
    assert run(machine, "stack.driver")["driver_max_cuda"] == "12.4"
    run(machine, "stack.arch")
    run(machine, "stack.precision", fp8="true")
    measured = run(machine, "stack.kernels", attn="flash_attention_2")
    assert measured["kernels_required"] == "flash_attention_2"
    assert run(machine, "stack.kernels")["sdpa_backends"] == "flash, mem_efficient, math"


def test_driver_too_old_for_the_torch_cuda_build(run):
    old = fakes.nvidia(driver="535.104.05", driver_cuda=12020, torch_cuda="12.8", arches=fakes.CU128_ARCHES)
    # same major: minor-version compatibility runs it, but not torch.compile's JIT
    run(old, "stack.driver")
    fails(run, old, "stack.driver", "only through minor-version compatibility", ">= 570.26", "the cu121 wheel", compile="true")
    older = fakes.nvidia(driver="470.199.02", driver_cuda=11040, torch_cuda="12.4")
    fails(run, older, "stack.driver", "driver 470.199.02 supports CUDA up to 11.4 but torch 2.6.0+cu124 was built "
          "with CUDA 12.4: upgrade the driver to >= 550.54.14")


def test_gpu_arch_missing_from_the_build(run):
    rtx5090 = fakes.nvidia(name="NVIDIA GeForce RTX 5090", cc=(12, 0), memory=32 * fakes.GiB, driver="570.124.06",
                           driver_cuda=12080)
    fails(run, rtx5090, "stack.arch", "is sm_120 but torch 2.6.0+cu124 carries sm_50", "no kernel image is available",
          "CUDA >= 12.8 (e.g. the cu128 wheel)")
    p100 = fakes.nvidia(name="Tesla P100-PCIE-16GB", cc=(6, 0), torch_cuda="13.0", arches=("sm_75", "sm_80", "sm_90"))
    fails(run, p100, "stack.arch", "CUDA <= 12.9 (newer CUDA dropped this architecture)")
    a10 = fakes.nvidia(name="NVIDIA A10", cc=(8, 6), arches=("sm_80", "sm_90"))
    assert "binary compatible" in run(a10, "stack.arch")["arch_note"]


def test_bf16_on_a_turing_t4_and_fp8_on_an_a100(run):
    t4 = fakes.nvidia(name="Tesla T4", cc=(7, 5), memory=16 * fakes.GiB)
    fails(run, t4, "stack.precision", "Tesla T4 (compute capability 7.5, T4, RTX 20xx", "no native bfloat16",
          "counts emulation", 'use dtype = "float16"')
    run(t4, "stack.precision", dtype="float16")
    a100 = fakes.nvidia(name="NVIDIA A100-SXM4-80GB", cc=(8, 0))
    fails(run, a100, "stack.precision", "no native fp8: it needs compute capability 8.9", fp8="true")


def test_flash_attention_on_the_wrong_gpus(run):
    fa = [("flash_attn", fakes.kernel("2.7.4")), ("flash_attn_3", fakes.kernel("3.0.0b1"))]
    t4 = fakes.nvidia(name="Tesla T4", cc=(7, 5), kernels=fa)
    fails(run, t4, "stack.kernels", "flash_attention_2 needs compute capability 8.0 or newer; Tesla T4", "sdpa",
          dtype="float16", attn="flash_attention_2")
    a100 = fakes.nvidia(name="NVIDIA A100", cc=(8, 0), kernels=fa)
    fails(run, a100, "stack.kernels", "flash_attention_3 needs compute capability exactly 9.0", attn="flash_attention_3")
    h100 = fakes.nvidia(kernels=fa)
    run(h100, "stack.kernels", attn="flash_attention_3")
    fails(run, fakes.nvidia(), "stack.kernels", "flash_attn is not installed (pip install flash-attn", attn="flash_attention_2")
    broken = fakes.nvidia(kernels=[("flash_attn", fakes.kernel(error="import flash_attn failed: ImportError: undefined symbol"))])
    fails(run, broken, "stack.kernels", "undefined symbol", attn="flash_attention_2")
    fails(run, h100, "stack.kernels", "runs in float16 or bfloat16, the recipe trains in float32",
          attn="flash_attention_2", dtype="float32")


def test_qlora_on_rocm_with_a_bitsandbytes_build_lacking_rocm(run):
    mi300 = fakes.rocm(kernels=[("bitsandbytes", fakes.kernel("0.45.0", libs=("cpu", "cuda124")))])
    fails(run, mi300, "stack.kernels", "bitsandbytes 0.45.0 carries no ROCm library (native builds: cpu, cuda124)",
          "bitsandbytes >= 0.50.0", quant="4bit")
    good = fakes.rocm(kernels=[("bitsandbytes", fakes.kernel("0.50.2", libs=("cpu", "rocm64")))])
    run(good, "stack.kernels", quant="4bit")
    assert run(good, "stack.driver")["torch_hip"] == "6.2.41133"


def test_rocm_gfx1100_with_flash_attention(run):
    rdna3 = fakes.rocm(arch="gfx1100", name="AMD Radeon RX 7900 XTX", kernels=[("flash_attn", fakes.kernel())])
    fails(run, rdna3, "stack.kernels", "RX 7900 XTX/XT/GRE (RDNA3)", "forward-only", "FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE",
          attn="flash_attention_2")
    run(rdna3, "stack.arch")
    fails(run, fakes.rocm(arch="gfx1030", name="AMD Radeon RX 6800"), "stack.arch", "gfx1030", "not among the arches")


def test_nvml_absent_on_a_machine_with_a_cuda_torch(run):
    machine = fakes.cpu_only()
    with pytest.raises(Skip, match="trains on the CPU"):
        run(machine, "stack.driver")
    fails(run, machine, "stack.driver", "the recipe asks for cuda but no CUDA/ROCm or Apple GPU reachable",
          "NVML: NVML Shared Library Not Found", device="cuda")


def test_apple_bf16_needs_macos_14_and_mlx_architectures(run):
    fails(run, fakes.apple(macos="13.6"), "stack.precision", "MPS bfloat16 needs macOS 14.0 or newer; this Mac runs macOS 13.6")
    run(fakes.apple(macos="14.5"), "stack.precision")
    fails(run, fakes.apple(torch_version="2.2.2"), "stack.precision", "needs torch >= 2.3")
    mac = fakes.apple(mlx_lm="0.32.2")
    assert run(mac, "stack.mlx", device="mlx")["model_type"] == "llama"
    fails(run, mac, "stack.mlx", "does not implement model_type 'bert'", "Model type bert not supported",
          device="mlx", model_type="bert")
    fails(run, mac, "stack.mlx", "--export-gguf supports model types llama, mixtral, mistral", device="mlx",
          model_type="qwen3", export="gguf")
    run(mac, "stack.mlx", device="mlx", model_type="mistral", export="gguf")
    fails(run, fakes.apple(), "stack.mlx", "mlx-lm is not installed", device="mlx")
    fails(run, fakes.nvidia(), "stack.mlx", "MLX needs an Apple silicon Mac", device="mlx")


def test_cpu_only_machine_asking_for_flash_attention(run):
    machine = fakes.cpu_only(torch_version="2.6.0+cpu", torch_cuda=None)
    fails(run, machine, "stack.kernels", "needs flash attention 2 on an NVIDIA GPU or an AMD MI200/MI300",
          "runs on the CPU", 'use attn_implementation = "sdpa"', attn="flash_attention_2")
    fails(run, machine, "stack.kernels", "bitsandbytes", quant="4bit")
    run(machine, "stack.precision")
    assert run(machine, "stack.kernels")["kernels_required"] == "none"
