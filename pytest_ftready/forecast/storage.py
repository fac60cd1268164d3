"""What cannot run on fake tensors, modelled from its documented storage and memory behaviour:
bitsandbytes' quantized weights (4-bit nf4 with double quantization, LLM.int8), its 8-bit and
paged optimizers, and the GPU loss kernels (Liger's fused linear cross-entropy, Apple's Cut
Cross-Entropy). Each model says its source in the note the forecast prints."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

NF4_BLOCK = 64  # bitsandbytes 4-bit: one absmax per 64 weights
NESTED_BLOCK = 256  # double quantization: one fp32 absmax per 256 first-level absmax
OPTIM_8BIT_BLOCK = 256  # bitsandbytes 8-bit optimizers: blockwise state, one fp32 absmax per 256
OPTIM_8BIT_MIN_SIZE = 4096  # bitsandbytes keeps 32-bit state for tensors smaller than this
CCE_PIECE_TOKENS = 128  # Cut Cross-Entropy's logits never leave on-chip tiles: traced in pieces of at most 128 tokens
BITSANDBYTES_STATE = "https://huggingface.co/docs/bitsandbytes/main/en/optimizers"
PAGED_SOURCE = ("bitsandbytes paged optimizers (https://huggingface.co/docs/bitsandbytes/main/en/optimizers; "
                "QLoRA, arXiv:2305.14314, section 3: state in CUDA unified memory, evicted to host RAM under pressure)")
LIGER_SOURCE = ("Liger-Kernel fused_linear_cross_entropy (https://github.com/linkedin/Liger-Kernel, "
                "ops/fused_linear_cross_entropy.py: chunk = next_pow2(ceil(tokens / ceil(vocab / hidden))))")
CCE_SOURCE = "Cut Cross-Entropy (Wijmans et al., arXiv:2411.09009; https://github.com/apple/ml-cross-entropy)"


# ---- quantized weights, modelled from their storage format -----------------------------------
def quantized_storage_bytes(numel: int, out_features: int, quantization: str) -> int:
    """Bytes bitsandbytes stores for one quantized weight of ``numel`` elements.
    4bit (nf4, double quantization, as loading.quantization_config asks): packed 2 weights per
    byte, one uint8 absmax per 64-weight block, one fp32 absmax per 256 blocks, the 16-entry
    fp32 nf4 code and an fp32 offset. 8bit (LLM.int8): one int8 per weight, one fp32 scale per row."""
    if quantization == "4bit":
        blocks = math.ceil(numel / NF4_BLOCK)
        return math.ceil(numel / 2) + blocks + 4 * math.ceil(blocks / NESTED_BLOCK) + 16 * 4 + 4
    if quantization == "8bit":
        return numel + 4 * out_features
    raise ValueError(f"no storage format for quantization {quantization!r}")


@functools.lru_cache(maxsize=None)
def _dequantized_matmul():
    """bitsandbytes' matmul for a frozen quantized weight (``MatMul4Bit``): the forward and the
    backward each dequantize the whole weight to the compute dtype (a temporary); with
    ``keep_input`` the input stays alive for the backward, as MatMul4Bit's ``ctx.tensors = (A, B)``
    keeps it whenever the input needs a gradient (bitsandbytes/autograd/_functions.py)."""
    import torch

    class DequantizedMatmul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, shape, bias, keep_input):
            weight = torch.empty(shape, dtype=x.dtype, device=x.device)  # the dequantized copy
            ctx.shape = shape
            if keep_input and ctx.needs_input_grad[0]:
                ctx.save_for_backward(x)
            return torch.nn.functional.linear(x, weight, bias)

        @staticmethod
        def backward(ctx, grad):
            weight = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)
            return grad @ weight, None, None, None

    return DequantizedMatmul


@functools.lru_cache(maxsize=None)
def _stored_linear_class():
    import torch

    class StoredLinear(torch.nn.Linear):
        """A frozen linear layer holding bitsandbytes' storage (packed weight + quantization
        state as buffers) and computing like bitsandbytes (dequantize, matmul)."""

        def __init__(self, source: torch.nn.Linear, quantization: str) -> None:
            torch.nn.Module.__init__(self)
            self.in_features, self.out_features = source.in_features, source.out_features
            numel = self.in_features * self.out_features
            if quantization == "4bit":
                blocks = math.ceil(numel / NF4_BLOCK)
                weight = torch.empty((math.ceil(numel / 2), 1), dtype=torch.uint8, device="meta")
                self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device="meta"))
                self.register_buffer("nested_absmax", torch.empty(math.ceil(blocks / NESTED_BLOCK),
                                                                  dtype=torch.float32, device="meta"))
                self.register_buffer("code", torch.empty(16, dtype=torch.float32, device="meta"))
                self.register_buffer("offset", torch.empty(1, dtype=torch.float32, device="meta"))
            else:
                weight = torch.empty((self.out_features, self.in_features), dtype=torch.int8, device="meta")
                self.register_buffer("scales", torch.empty(self.out_features, dtype=torch.float32, device="meta"))
            self.weight = torch.nn.Parameter(weight, requires_grad=False)
            self.bias = source.bias
            self.keep_input = quantization == "4bit"

        def forward(self, x):
            return _dequantized_matmul().apply(x, (self.out_features, self.in_features), self.bias, self.keep_input)

    return StoredLinear


def quantize_for_forecast(model, quantization: str) -> int:
    """Swap the linear layers bitsandbytes would quantize (transformers' own rule: not the
    output embedding, not tied weights) for their stored form; returns the quantized weights."""
    import torch
    from transformers.quantizers.base import get_keys_to_not_convert

    keep = get_keys_to_not_convert(model)
    stored = _stored_linear_class()
    count = 0
    for name, module in list(model.named_modules()):
        if not isinstance(module, torch.nn.Linear) or any(
                name == k or name.endswith("." + k) or name.startswith(k + ".") for k in keep):
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, stored(module, quantization))
        count += module.in_features * module.out_features
    setattr(model, "is_loaded_in_4bit" if quantization == "4bit" else "is_loaded_in_8bit", True)
    return count


# ---- optimizers that cannot run on fake tensors, modelled -------------------------------------
@dataclass(frozen=True)
class OptimizerModel:
    """bitsandbytes' optimizer state as stored: ``eight_bit`` (two uint8 states with one fp32
    absmax per 256, 32-bit below 4096 elements) or two fp32 states; ``paged``: the state lives
    in CUDA unified memory outside torch's allocator, evicted to host RAM under pressure."""

    eight_bit: bool
    paged: bool

    def note(self, name: str) -> str:
        state = ("2 x uint8 per weight + one fp32 absmax per 256 (fp32 state below 4096 elements)" if self.eight_bit
                 else "2 x fp32 per weight")
        where = (f"; paged: the state is counted apart from the peak, in unified memory the driver pages out "
                 f"to host RAM when the device runs short ({PAGED_SOURCE})" if self.paged else "")
        return f"{name} (bitsandbytes) modelled from its state format: {state} ({BITSANDBYTES_STATE}){where}"


OPTIMIZER_MODELS = {"adamw_8bit": OptimizerModel(True, False), "paged_adamw": OptimizerModel(False, True),
                    "paged_adamw_8bit": OptimizerModel(True, True)}


@functools.lru_cache(maxsize=None)
def _modelled_adamw_class():
    import torch

    class ModelledAdamW(torch.optim.Optimizer):
        """bitsandbytes AdamW's memory (8-bit or 32-bit state), updated in place by one fused kernel."""

        def __init__(self, params, lr: float, eight_bit: bool) -> None:
            super().__init__(params, {"lr": lr})
            self.eight_bit = eight_bit

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if not state:
                        state["step"] = torch.zeros((), dtype=torch.float32)
                        if not self.eight_bit or p.numel() < OPTIM_8BIT_MIN_SIZE:
                            state["state1"] = torch.zeros_like(p, dtype=torch.float32)
                            state["state2"] = torch.zeros_like(p, dtype=torch.float32)
                        else:
                            blocks = math.ceil(p.numel() / OPTIM_8BIT_BLOCK)
                            state["state1"] = torch.zeros_like(p, dtype=torch.uint8)
                            state["state2"] = torch.zeros_like(p, dtype=torch.uint8)
                            state["absmax1"] = torch.zeros(blocks, dtype=torch.float32)
                            state["absmax2"] = torch.zeros(blocks, dtype=torch.float32)
                    state["step"] += 1
                    p.add_(p.grad, alpha=-group["lr"])
            return None

    return ModelledAdamW


def modelled_optimizer_factory(model: OptimizerModel, lr: float):
    """params -> an optimizer holding ``model``'s state (for engine.trainable.make_optimizer)."""
    cls = _modelled_adamw_class()
    return lambda params: cls(params, lr=lr, eight_bit=model.eight_bit)


# ---- loss kernels that cannot run here, modelled ---------------------------------------------------
def modelled_loss_chunks(kind: str, tokens: int, vocab_size: int, hidden_size: int, max_length: int) -> tuple[int, str]:
    """(pieces of the sequence the trace computes logits for, one at a time; the note) for a GPU
    loss kernel: Liger's chunk rule keeps a chunk's logits about the size of the hidden states;
    CCE keeps only on-chip tiles, traced as pieces of at most 128 tokens (never larger than Liger's)."""
    factor = math.ceil(vocab_size / hidden_size)
    chunk = 1 << max(0, math.ceil(tokens / factor) - 1).bit_length()
    liger = min(max_length, math.ceil(tokens / chunk))
    if kind == "fused_linear":
        return liger, (f"loss fused_linear (Liger's Triton kernel, GPU only) modelled as logits computed in "
                       f"{liger} pieces of the sequence, Liger's chunk rule ({LIGER_SOURCE})")
    pieces = min(max_length, max(liger, math.ceil(tokens / CCE_PIECE_TOKENS)))
    return pieces, (f"loss cut_cross_entropy (Triton kernel, GPU only) modelled as logits computed in {pieces} "
                    f"pieces of the sequence: it never holds the logits outside on-chip tiles ({CCE_SOURCE})")
