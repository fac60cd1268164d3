"""Will it fit? The peak memory of one training step, forecast from the model's config alone.

The model is built on the meta device (no weights), the recipe's adapter, quantization,
dtype, attention kernel and checkpointing are applied through the same engine functions the
real step uses, every tensor is then swapped for a fake one (``FakeTensorMode``: shapes and
dtypes, no bytes), and one real training step (forward, backward, optimizer step) of the
worst-case batch (micro_batch_size x max_length) runs on it while a dispatch mode counts the
bytes of every storage from its creation to its death. What cannot run on fake tensors is
modelled from its storage format and said so in ``Forecast.notes``: bitsandbytes 4-bit
(nf4, double quantization) and 8-bit weights, and the 8-bit optimizer's state.

Plain Python over torch/transformers/peft; no pytest. The check ``model.memory_forecast`` and
the command ``ftready-forecast`` share ``forecast_report`` and ``render``.
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from ..machine.targets import Target, TargetError, resolve_target
from ..units import human_bytes
from .memory import TensorBytes

NF4_BLOCK = 64  # bitsandbytes 4-bit: one absmax per 64 weights
NESTED_BLOCK = 256  # double quantization: one fp32 absmax per 256 first-level absmax
OPTIM_8BIT_BLOCK = 256  # bitsandbytes 8-bit optimizers: blockwise state, one fp32 absmax per 256
OPTIM_8BIT_MIN_SIZE = 4096  # bitsandbytes keeps 32-bit state for tensors smaller than this
PHASES = ("forward", "backward", "optimizer")
CATEGORIES = ("weights", "gradients", "optimizer_state", "activations", "temporaries")


class ConfigUnavailable(Exception):
    """The model's config.json cannot be had here (offline, not cached, no file)."""


class TraceError(Exception):
    """The model could not be built from its config with the recipe's settings, or its step
    could not be traced on fake tensors (an op with data-dependent shapes...)."""


# ---- the model's config, without weights ----------------------------------------------------
def forecast_config(recipe):
    """The model's ``PretrainedConfig`` from kilobytes: config.json of the local folder, the
    metadata of its GGUF file, or config.json alone from the hub at the pinned revision."""
    from transformers import AutoConfig

    m = recipe.model
    trust = m.trust_remote_code
    if m.path:
        folder = Path(m.path)
        if (folder / "config.json").is_file():
            return AutoConfig.from_pretrained(str(folder), trust_remote_code=trust)
        if m.gguf_file:  # reads the GGUF header (metadata), not the tensors
            return AutoConfig.from_pretrained(str(folder), gguf_file=m.gguf_file, trust_remote_code=trust)
        raise ConfigUnavailable(f"[model] path {folder} has no config.json (and no gguf_file is named)")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ConfigUnavailable("reading config.json from the hub needs huggingface_hub: "
                                "pip install 'pytest-ftready[hub]'") from None
    try:
        if trust:  # the config's own code comes with it (kilobytes too)
            return AutoConfig.from_pretrained(m.id, revision=m.revision, trust_remote_code=True)
        path = hf_hub_download(m.id, "config.json", revision=m.revision)
    except Exception as exc:  # offline, not cached, gated, no such revision: all mean "no config"
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigUnavailable(f"config.json of {m.id}@{m.revision} is not cached and the hub cannot give it "
                                f"({type(exc).__name__}: {first}); run once with network, or set [model] path") from None
    return AutoConfig.from_pretrained(str(Path(path).parent))


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
    backward each dequantize the whole weight to the compute dtype (a temporary); nothing is
    saved for the backward."""
    import torch

    class DequantizedMatmul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, shape, bias):
            weight = torch.empty(shape, dtype=x.dtype, device=x.device)  # the dequantized copy
            ctx.shape = shape
            return torch.nn.functional.linear(x, weight, bias)

        @staticmethod
        def backward(ctx, grad):
            weight = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)
            return grad @ weight, None, None

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

        def forward(self, x):
            return _dequantized_matmul().apply(x, (self.out_features, self.in_features), self.bias)

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


# ---- an optimizer that cannot run on fake tensors, modelled -------------------------------------
@functools.lru_cache(maxsize=None)
def _adamw_8bit_class():
    import torch

    class AdamW8bitState(torch.optim.Optimizer):
        """bitsandbytes AdamW8bit's memory: two uint8 states per weight with one fp32 absmax per
        256 (32-bit states below 4096 elements), updated in place by a fused kernel."""

        def __init__(self, params, lr: float) -> None:
            super().__init__(params, {"lr": lr})

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if not state:
                        state["step"] = torch.zeros((), dtype=torch.float32)
                        if p.numel() < OPTIM_8BIT_MIN_SIZE:
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

    return AdamW8bitState


# ---- the forecast ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Forecast:
    """One step's memory on the training device, by category, at the peak of live tensors."""

    model_type: str
    parameters: int  # of the base model (before the adapter)
    quantized_parameters: int
    trainable_parameters: int
    frozen_parameters: int  # of the base model
    weights_bytes: int  # every parameter and buffer, as stored (frozen, trainable, quantized)
    trainable_bytes: int  # of which trainable
    gradient_bytes: int  # live at the peak
    optimizer_state_bytes: int  # live at the peak
    activation_bytes: int  # saved by the forward, live at the peak
    temporary_bytes: int  # everything else live at the peak (workspaces, dequantized weights...)
    peak_phase: str  # forward | backward | optimizer
    tokens: int  # micro_batch_size x max_length
    build_seconds: float
    trace_seconds: float
    notes: tuple[str, ...] = ()

    @property
    def peak_bytes(self) -> int:
        """Weights plus every live tensor at the peak."""
        return (self.weights_bytes + self.gradient_bytes + self.optimizer_state_bytes + self.activation_bytes
                + self.temporary_bytes)

    def categories(self) -> dict[str, int]:
        return {"weights": self.weights_bytes, "gradients": self.gradient_bytes,
                "optimizer_state": self.optimizer_state_bytes, "activations": self.activation_bytes,
                "temporaries": self.temporary_bytes}


def _meta_model(recipe, config, notes: list[str]):
    import torch
    from transformers import AutoModelForCausalLM

    from .loading import torch_dtype

    m = recipe.model
    attn = m.attn_implementation
    if attn.startswith("flash_attention"):
        # flash-attention kernels keep O(length) per head, like SDPA's flash kernel traced here
        notes.append(f"attention {attn} traced as sdpa (same O(length) memory per head; the kernel itself "
                     f"cannot run on fake tensors)")
        attn = "sdpa"
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(m.dtype), attn_implementation=attn,
                                                     trust_remote_code=m.trust_remote_code)
    except (ValueError, ImportError, KeyError) as exc:  # e.g. an attention kernel this architecture lacks
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise TraceError(f"{config.model_type} cannot be built with dtype {m.dtype} and attn_implementation "
                         f"{m.attn_implementation}: {type(exc).__name__}: {first}") from None
    model.config.use_cache = False
    return model


def _materialize(model) -> list:
    """Inside FakeTensorMode: every parameter, buffer and meta tensor attribute becomes a fake
    tensor of its shape, dtype and requires_grad (tied weights stay tied). Returns them."""
    import torch

    made: dict[int, Any] = {}

    def fake(t, parameter: bool):
        if id(t) not in made:
            new = torch.empty(t.shape, dtype=t.dtype)
            made[id(t)] = torch.nn.Parameter(new, requires_grad=t.requires_grad) if parameter else new
        return made[id(t)]

    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = fake(p, True)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = fake(b, False)
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and value.device.type == "meta":
                setattr(module, name, fake(value, False))
    return list(made.values())


def _optimizer(model, recipe, foreach: bool, notes: list[str]):
    from .trainable import make_optimizer

    if recipe.training.optimizer == "adamw_8bit":
        notes.append("adamw_8bit (bitsandbytes) modelled from its state format: 2 x uint8 per weight + one fp32 "
                     "absmax per 256 (fp32 state below 4096 elements)")
        params = [p for p in model.parameters() if p.requires_grad]
        return _adamw_8bit_class()(params, lr=recipe.training.learning_rate)
    optimizer = make_optimizer(model, recipe)
    if foreach and recipe.training.optimizer in ("adamw", "sgd"):
        # on CUDA/ROCm torch's default is the multi-tensor (foreach) path, with its temporaries
        for group in optimizer.param_groups:
            group["foreach"] = True
    return optimizer


def optimizer_state_tensors(optimizer, trainable: Sequence) -> list:
    """Create the optimizer's state as a training run holds it from the second step on (an
    update with zero gradients) and return its tensors: the step measured or forecast is a
    steady-state step, with the state alive through forward and backward."""
    import torch

    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return [v for per_param in optimizer.state.values() for v in per_param.values() if isinstance(v, torch.Tensor)]


def _later_micro_batch_peak(tracker: TensorBytes, grads: set, forward_end: int, optimizer_start: int):
    """The peak of a later micro-batch of an accumulating step, from the trace of the first:
    every gradient is held from the start (a new one is a transient added in place), and
    train_step's previous output (logits, loss) lives until the new forward returns.
    Returns (live bytes, event, serials live then, transient bytes)."""
    grads = {g for g in grads if g is not None}
    delta = [0] * (tracker.event + 2)
    grad_delta = [0] * (tracker.event + 2)
    for serial, (born, died, nbytes) in enumerate(zip(tracker.born, tracker.died, tracker.nbytes)):
        for table in (delta, grad_delta) if serial in grads else (delta,):
            table[born] += nbytes
            if died != math.inf:
                table[int(died)] -= nbytes
    held = sum(tracker.nbytes[g] for g in grads)
    previous = [s for s in tracker.live_at(optimizer_start) if s not in grads]
    previous_bytes = sum(tracker.nbytes[s] for s in previous)
    transient = {tracker.born[g]: tracker.nbytes[g] for g in grads}
    best = (0, 0)
    live = grad_live = 0
    for event in range(1, optimizer_start + 1):
        live += delta[event]
        grad_live += grad_delta[event]
        total = live - grad_live + held + transient.get(event, 0) + (previous_bytes if event <= forward_end else 0)
        if total > best[0]:
            best = (total, event)
    total, event = best
    serials = set(tracker.live_at(event)) | grads | (set(previous) if event <= forward_end else set())
    return total, event, sorted(serials), transient.get(event, 0)


@contextmanager
def _third_party_quiet() -> Iterator[None]:
    """peft's QLoRA preparation calls transformers' deprecated gradient_checkpointing_enable
    without use_reentrant, so torch warns at every checkpointed layer: the real step warns
    the same, and neither is the user's to fix in a forecast."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*use_reentrant parameter should be passed.*", category=UserWarning)
        yield


def forecast(recipe, config=None, accelerator_optimizer: bool = False) -> Forecast:
    """Trace one steady-state training step of ``recipe`` on fake tensors and return its peak
    memory by category. ``accelerator_optimizer``: trace the optimizer as torch runs it on
    CUDA/ROCm (foreach). Raises ConfigUnavailable, TraceError, or training.Fail (e.g. a
    target module the model lacks)."""
    with _third_party_quiet():
        return _forecast(recipe, config, accelerator_optimizer)


def _forecast(recipe, config, accelerator_optimizer: bool) -> Forecast:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .batches import seed_everything
    from .trainable import make_scheduler, make_trainable, train_step

    notes: list[str] = []
    started = time.perf_counter()
    config = config if config is not None else forecast_config(recipe)
    base = _meta_model(recipe, config, notes)
    parameters = sum(p.numel() for p in base.parameters())
    quantization = recipe.model.quantization
    quantized = 0
    if quantization != "none":
        quantized = quantize_for_forecast(base, quantization)
        notes.append("4-bit nf4 weights (bitsandbytes cannot run on fake tensors) modelled from their storage "
                     "format: 0.5 byte per weight + 1 byte absmax per 64 (double quantization) + 4 bytes per "
                     "16384; dequantized to the compute dtype per layer in forward and backward"
                     if quantization == "4bit" else
                     "8-bit weights (bitsandbytes LLM.int8 cannot run on fake tensors) modelled from their storage "
                     "format: 1 byte per weight + a 4-byte scale per row; its matmul temporaries taken as one "
                     "dequantized layer in forward and backward, like 4-bit's")
    seed_everything(recipe.training.seed)
    model = make_trainable(base, recipe)
    if quantization != "none":
        notes.append("QLoRA preparation (peft prepare_model_for_kbit_training) keeps the layers it does not "
                     "quantize (embeddings, output head, norms) in float32")
    batch_shape = (recipe.training.micro_batch_size, recipe.data.max_length)
    positions = getattr(getattr(config, "text_config", None) or config, "max_position_embeddings", None)
    if positions and recipe.data.max_length > positions:
        notes.append(f"[data] max_length {recipe.data.max_length} exceeds the model's max_position_embeddings "
                     f"{positions}: traced as written, but the model was not trained on such positions")
    build_seconds = time.perf_counter() - started
    started = time.perf_counter()
    try:
        with FakeTensorMode(allow_non_fake_inputs=False):
            existing = _materialize(model)
            weights = sum(t.untyped_storage().nbytes() for t in existing)
            trainable = [p for p in model.parameters() if p.requires_grad]
            trainable_bytes = sum(p.untyped_storage().nbytes() for p in trainable)
            ids = torch.zeros(batch_shape, dtype=torch.long)
            batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
            optimizer = _optimizer(model, recipe, accelerator_optimizer, notes)
            scheduler = make_scheduler(optimizer, recipe, total_steps=1, constant=True)
            state = optimizer_state_tensors(optimizer, trainable)
            state_bytes = sum(t.untyped_storage().nbytes() for t in state)
            tracker = TensorBytes([*existing, *state, *batch.values()], scalar_reads=True)
            forward_ends: list[int] = []
            optimizer_starts: list[int] = []
            grads: set = set()
            states: set = set()

            def forward_end(module, args, output) -> None:
                forward_ends.append(tracker.event)
                tracker.mark("backward")

            def before_step(opt, args, kwargs) -> None:
                grads.update(tracker.serial_of(p.grad) for p in trainable if p.grad is not None)
                optimizer_starts.append(tracker.event)
                tracker.mark("optimizer")

            def after_step(opt, args, kwargs) -> None:
                states.update(tracker.serial_of(v) for s in opt.state.values() for v in s.values()
                              if isinstance(v, torch.Tensor))

            hooks = [model.register_forward_pre_hook(lambda module, args: tracker.mark("forward")),
                     model.register_forward_hook(forward_end), optimizer.register_step_pre_hook(before_step),
                     optimizer.register_step_post_hook(after_step)]
            with tracker.watching():
                train_step(model, optimizer, scheduler, [batch], "cpu")
            for hook in hooks:
                hook.remove()
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise TraceError(f"the training step of {config.model_type} cannot be traced on fake tensors: "
                         f"{type(exc).__name__}: {first}") from None
    trace_seconds = time.perf_counter() - started
    activations = set(tracker.live_at(forward_ends[0]))
    serials, extra_bytes, peak_event = tracker.live_at(tracker.peak_event), 0, tracker.peak_event
    phase = tracker.phase_at(tracker.peak_event, PHASES[0])
    if recipe.training.gradient_accumulation_steps > 1:
        later = _later_micro_batch_peak(tracker, grads, forward_ends[0], optimizer_starts[0])
        if later[0] > tracker.peak:
            _, peak_event, serials, extra_bytes = later
            phase = ("forward" if peak_event <= forward_ends[0] else "backward") + " of a later micro-batch"
        notes.append("gradient accumulation: a later micro-batch of the step is derived from the traced one "
                     "(every gradient held from its start, the previous output alive until the new forward returns)")
    sums = dict.fromkeys(("gradients", "optimizer_state", "activations", "temporaries"), 0)
    sums["temporaries"] = extra_bytes
    for serial in serials:
        kind = ("gradients" if serial in grads else "optimizer_state" if serial in states
                else "activations" if serial in activations else "temporaries")
        sums[kind] += tracker.nbytes[serial]
    return Forecast(
        model_type=str(config.model_type), parameters=parameters, quantized_parameters=quantized,
        trainable_parameters=sum(p.numel() for p in trainable), weights_bytes=weights,
        frozen_parameters=parameters if recipe.adapter.method == "lora" else 0,
        trainable_bytes=trainable_bytes, gradient_bytes=sums["gradients"],
        optimizer_state_bytes=state_bytes + sums["optimizer_state"], activation_bytes=sums["activations"],
        temporary_bytes=sums["temporaries"], peak_phase=phase,
        tokens=batch_shape[0] * batch_shape[1], build_seconds=build_seconds,
        trace_seconds=trace_seconds, notes=tuple(notes))


# ---- the real step, for the forecast's error ------------------------------------------------------
def full_batch(recipe, vocab_size: int) -> dict:
    """The worst-case batch the forecast traces, as real tensors: micro_batch_size rows of
    max_length tokens, every token attended and trained."""
    import torch

    generator = torch.Generator().manual_seed(recipe.training.seed)
    ids = torch.randint(0, vocab_size, (recipe.training.micro_batch_size, recipe.data.max_length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def measured_step_peak(state, recipe, torch_device: str, count_tensors: bool) -> int:
    """The real step's peak with the engine's own functions (trainable, optimizer, train_step,
    peak_memory) on the batch the forecast traces: weights + peak live tensor bytes on a CPU,
    ``max_memory_allocated`` on CUDA (the allocator's peak, weights included)."""
    from .memory import peak_memory
    from .trainable import attention_of, make_optimizer, make_scheduler, train_step, trainable

    shared = state.model if recipe.adapter.method == "lora" else None
    with attention_of(shared, recipe.model.attn_implementation), \
            trainable(recipe, torch_device, state.shared_base) as model:
        vocab = model.get_input_embeddings().weight.shape[0]
        batch = full_batch(recipe, vocab)
        optimizer = make_optimizer(model, recipe)
        scheduler = make_scheduler(optimizer, recipe, total_steps=1, constant=True)
        state = optimizer_state_tensors(optimizer, [p for p in model.parameters() if p.requires_grad])
        with peak_memory(torch_device, count_tensors=count_tensors) as peak:
            train_step(model, optimizer, scheduler, [batch] * min(2, recipe.training.gradient_accumulation_steps),
                       torch_device)
        if peak.device_allocated_bytes is not None:
            return int(peak.device_allocated_bytes)
        held = {t.untyped_storage()._cdata: t.untyped_storage().nbytes()
                for t in [*model.parameters(), *model.buffers(), *state]}
        return sum(held.values()) + peak.tensor_bytes


def error_share(forecast_bytes: int, measured_bytes: int) -> float:
    """(forecast - measured) / measured: positive when the forecast over-estimates."""
    return (forecast_bytes - measured_bytes) / measured_bytes


# ---- against a target, and the levers ---------------------------------------------------------------
@dataclass(frozen=True)
class LeverForecast:
    name: str
    change: str  # what to write in the recipe
    cost: str
    peak_bytes: int  # the variant's forecast tensor peak
    saves_bytes: int  # against the recipe's forecast peak
    traced: bool  # False: no recipe key to trace (offload): the breakdown's estimate


@dataclass(frozen=True)
class Report:
    recipe_name: str
    forecast: Forecast
    target: Optional[Target]
    headroom: float
    levers: tuple = ()
    problems: tuple = ()  # levers whose variant could not be forecast: why

    @property
    def need_bytes(self) -> Optional[int]:
        return self.target.need_bytes(self.forecast.peak_bytes) if self.target else None

    @property
    def usable_bytes(self) -> Optional[int]:
        return self.target.usable_bytes(self.headroom) if self.target else None

    @property
    def fits(self) -> Optional[bool]:
        return None if self.target is None else self.need_bytes <= self.usable_bytes


CHANGE = re.compile(r"^\[(?P<table>\w+)\]\s+(?P<pairs>.+?)(?:\s+\(.*\))?$")


def recipe_changes(change: str) -> Optional[list[tuple[str, str, Any]]]:
    """'[training] micro_batch_size = 2, gradient_accumulation_steps = 8' -> [(table, key,
    value)]; None when the change names no recipe key (an offload set-up, say)."""
    from ..recipe.schema import tomllib

    m = CHANGE.match(change.strip())
    if not m:
        return None
    try:
        values = tomllib.loads("\n".join(pair.strip() for pair in m.group("pairs").split(", ")))
    except tomllib.TOMLDecodeError:
        return None
    return [(m.group("table"), key, value) for key, value in values.items()]


def with_changes(recipe, changes: Sequence[tuple[str, str, Any]]):
    """The recipe with ``changes`` as (table, key, value) triples, validated like the recipe file."""
    from ..recipe.schema import with_changes as validated

    return validated(recipe, {f"{table}.{key}": value for table, key, value in changes}, "forecast lever")


def breakdown_of(f: Forecast):
    """The forecast as the measured step's Breakdown, for the lever rules of engine.breakdown."""
    from .breakdown import Breakdown

    return Breakdown(f.weights_bytes, f.frozen_parameters, f.trainable_bytes, f.trainable_bytes, f.optimizer_state_bytes,
                     f.peak_bytes)


def lever_forecasts(recipe, config, base: Forecast, num_layers: int, p95_length: Optional[float],
                    accelerator_optimizer: bool) -> tuple[list[LeverForecast], list[str]]:
    """The levers ``levers.advice`` would name for this recipe, each forecast by tracing the
    recipe with the lever pulled (largest saving first)."""
    from ..outcomes import Fail
    from ..recipe.schema import RecipeError
    from .breakdown import levers_for

    out, problems = [], []
    for lever in levers_for(recipe, breakdown_of(base), num_layers, p95_length):
        changes = recipe_changes(lever.change)
        if changes is None:
            out.append(LeverForecast(lever.name, lever.change, lever.cost, base.peak_bytes - lever.saves_bytes,
                                     lever.saves_bytes, traced=False))
            continue
        try:
            variant = forecast(with_changes(recipe, changes), config, accelerator_optimizer)
        except (TraceError, Fail, RecipeError) as exc:
            problems.append(f"{lever.name}: {exc}")
            continue
        out.append(LeverForecast(lever.name, lever.change, lever.cost, variant.peak_bytes,
                                 base.peak_bytes - variant.peak_bytes, traced=True))
    return sorted(out, key=lambda lv: lv.saves_bytes, reverse=True), problems


def forecast_report(recipe, target: Optional[Target], config=None, p95_length: Optional[float] = None,
                    levers: bool = True) -> Report:
    """The forecast, judged against ``target`` less the recipe's memory_headroom; when it does
    not fit (and ``levers``), each lever forecast. The one code path of the check and the command."""
    config = config if config is not None else forecast_config(recipe)
    on_accelerator = target is not None and target.kind in ("cuda", "rocm")
    base = forecast(recipe, config, on_accelerator)
    report = Report(recipe.name, base, target, recipe.hardware.memory_headroom)
    if levers and report.fits is False:
        from .trainable import num_layers_of

        found, problems = lever_forecasts(recipe, config, base, num_layers_of(config), p95_length, on_accelerator)
        report = replace(report, levers=tuple(found), problems=tuple(problems))
    return report


def render(report: Report) -> str:
    """The breakdown table, the verdict against the target, the levers and the notes."""
    f = report.forecast
    lines = [f"memory forecast for {report.recipe_name}: {f.model_type}, {f.parameters:,} parameters "
             f"({f.trainable_parameters:,} trainable), one micro-batch of {f.tokens:,} tokens "
             f"traced in {f.trace_seconds:.1f} s (estimate: no weights, fake tensors)"]
    width = max(len(name) for name in CATEGORIES)
    lines.append(f"  at the peak ({f.peak_phase}):")
    for name, value in f.categories().items():
        extra = f"  (trainable {human_bytes(f.trainable_bytes)})" if name == "weights" else ""
        lines.append(f"    {name:<{width}}  {human_bytes(value):>12}{extra}")
    lines.append(f"    {'peak tensors':<{width}}  {human_bytes(f.peak_bytes):>12}")
    t = report.target
    if t is None:
        lines.append("  no target: set [hardware] target = \"24GiB\" or a GPU name, or pass --target")
    else:
        lines.append(f"  target {t.name}: {human_bytes(t.capacity_bytes)}"
                     + (f" x {t.usable_share:.0%} usable" if t.usable_share < 1 else "")
                     + f", less {report.headroom:.0%} memory_headroom = {human_bytes(report.usable_bytes)} usable")
        lines.append(f"  needs {human_bytes(report.need_bytes)} = peak + {t.allocator_share:.0%} allocator overhead + "
                     f"{human_bytes(t.context_bytes)} runtime context (estimates from the facts table)")
        lines.append(f"  verdict: {'FITS' if report.fits else 'DOES NOT FIT'} "
                     f"({human_bytes(abs(report.usable_bytes - report.need_bytes))} "
                     f"{'to spare' if report.fits else 'short'})")
        if t.assumed:
            lines.append(f"  assumed: {t.assumed}")
    if report.levers:
        lines.append("  levers (each forecast by tracing the recipe with it pulled; largest saving first):")
        for lv in report.levers:
            need = t.need_bytes(lv.peak_bytes)
            verdict = "fits" if need <= report.usable_bytes else "still short"
            how = "forecast" if lv.traced else "estimate from the breakdown"
            lines.append(f"    - {lv.name}: {lv.change}; peak {human_bytes(lv.peak_bytes)}, saves "
                         f"{human_bytes(lv.saves_bytes)} ({how}), {verdict}; cost: {lv.cost}")
    for problem in report.problems:
        lines.append(f"  lever not forecast: {problem}")
    for note in f.notes:
        lines.append(f"  note: {note}")
    if t is not None:
        lines.append(f"  sources: {'; '.join(t.sources)}")
    return "\n".join(lines)


# ---- the command -----------------------------------------------------------------------------------
def main(argv: Optional[list[str]] = None) -> int:
    """ftready-forecast recipe.toml [--target "RTX 4090"]: 0 fits (or no target), 1 does not fit, 2 cannot tell."""
    from ..outcomes import Fail
    from ..recipe.schema import RecipeError, load_recipe

    parser = argparse.ArgumentParser(prog="ftready-forecast",
                                     description="forecast the peak memory of a recipe's training step from the "
                                                 "model's config alone (no weights), against a target device")
    parser.add_argument("recipe", help="recipe.toml")
    parser.add_argument("--target", default=None,
                        help='a size ("24GiB") or a device ("RTX 4090", "H100", "M3 Max 64GB"); '
                             "default: the recipe's [hardware] target")
    parser.add_argument("--no-levers", action="store_true", help="do not forecast the levers when it does not fit")
    args = parser.parse_args(argv)
    try:
        recipe = load_recipe(args.recipe)
        text = args.target or recipe.hardware.target
        where = "--target" if args.target else f"{args.recipe} [hardware] target"
        target = resolve_target(text, where) if text else None
        report = forecast_report(recipe, target, levers=not args.no_levers)
    except (RecipeError, TargetError, ConfigUnavailable, TraceError, Fail) as exc:
        print(f"ftready-forecast: {exc}", file=sys.stderr)
        return 2
    print(render(report))
    return 1 if report.fits is False else 0


if __name__ == "__main__":
    raise SystemExit(main())
