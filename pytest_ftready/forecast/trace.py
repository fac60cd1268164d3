"""Will it fit? The peak memory of one training step, traced from the model's config alone.

The model is built on the meta device (no weights), the recipe's adapter, quantization,
QLoRA preparation, dtype, attention kernel, checkpointing, loss and optimizer are applied
through the same engine functions the real step uses, every tensor is then swapped for a fake
one (``FakeTensorMode``: shapes and dtypes, no bytes), and one real training step (forward,
backward, optimizer step) of the worst-case batch (micro_batch_size x max_length) runs on it
while a dispatch mode counts the bytes of every storage from its creation to its death. The
step is the trainer's (``forecast.trainers``: its loss, autocast and padding) on the device
the forecast is for. What cannot run on fake tensors is modelled (``forecast.storage``,
``forecast.trainers``) and said in ``Forecast.notes``.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from ..engine.memory import TensorBytes
from . import storage
from .trainers import Step, resolve

PHASES = ("forward", "backward", "optimizer")
CATEGORIES = ("weights", "gradients", "optimizer_state", "activations", "temporaries")


class ConfigUnavailable(Exception):
    """The model's config.json cannot be had here (offline, not cached, no file)."""


class TraceError(Exception):
    """The model could not be built from its config with the recipe's settings, or its step
    could not be traced on fake tensors (an op with data-dependent shapes...)."""


# ---- the model's config, without weights ----------------------------------------------------
# The sizes a forecast is made of: each must be the model's own (a class default is another model's)
# and a positive whole number (vocab_size 0 trips an assertion deep inside torch's Embedding).
SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


def forecast_config(recipe):
    """The model's ``PretrainedConfig`` from kilobytes: config.json of the local folder, the
    metadata of its GGUF file, or config.json alone from the hub at the pinned revision; its
    sizes checked (``checked_sizes``)."""
    config, source = _forecast_config(recipe)
    return checked_sizes(config, source)


def checked_sizes(config, source: Optional[Path]):
    """``config`` when each of SIZE_KEYS it has is a positive integer and, where ``source`` (its
    config.json) is given and is not a composite (text_config) config, written there (under its
    name or an alias); else a TraceError naming the file and the key."""
    import json

    raw = {}
    if source is not None:
        try:
            raw = json.loads(source.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            raw = {}
    where = source or "the model's config"
    aliases = getattr(config, "attribute_map", {}) or {}
    for key in SIZE_KEYS:
        if not hasattr(config, key):
            continue
        # attribute_map: the standard name -> the model's own (GPT-2's num_hidden_layers -> n_layer)
        names = {key, *(own for standard, own in aliases.items() if standard == key),
                 *(standard for standard, own in aliases.items() if own == key)}
        if isinstance(raw, dict) and raw and "text_config" not in raw and not names & set(raw):
            raise TraceError(f"{where} lacks {key}: the forecast would use {type(config).__name__}'s default of "
                             f"{getattr(config, key)!r}, another model's size; write this model's {key} "
                             f"into config.json")
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TraceError(f"{where} {key} = {value!r}: expected a positive whole number (the model's "
                             f"{key.replace('_', ' ')}); fix config.json (save_pretrained writes it)")
    return config


def _forecast_config(recipe):
    from transformers import AutoConfig

    m = recipe.model
    trust = m.trust_remote_code
    if m.path:
        folder = Path(m.path)
        if (folder / "config.json").is_file():
            try:
                return AutoConfig.from_pretrained(str(folder), trust_remote_code=trust), folder / "config.json"
            except Exception as exc:  # noqa: BLE001 - not JSON, an unknown model_type, a value its class refuses
                first = " ".join(line.strip() for line in str(exc).strip().splitlines())[:300]
                raise ConfigUnavailable(f"{folder / 'config.json'} cannot be read as a model config "
                                        f"({type(exc).__name__}: {first}): fix or restore it") from None
        if m.gguf_file:  # reads the GGUF header (metadata), not the tensors
            return AutoConfig.from_pretrained(str(folder), gguf_file=m.gguf_file, trust_remote_code=trust), None
        raise ConfigUnavailable(f"[model] path {folder} has no config.json (and no gguf_file is named)")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ConfigUnavailable("reading config.json from the hub needs huggingface_hub: "
                                "pip install 'pytest-ftready[hub]'") from None
    try:
        if trust:  # the config's own code comes with it (kilobytes too)
            return AutoConfig.from_pretrained(m.id, revision=m.revision, trust_remote_code=True), None
        path = hf_hub_download(m.id, "config.json", revision=m.revision)
    except Exception as exc:  # offline, not cached, gated, no such revision: all mean "no config"
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigUnavailable(f"config.json of {m.id}@{m.revision} is not cached and the hub cannot give it "
                                f"({type(exc).__name__}: {first}); run once with network, or set "
                                f"[model] path") from None
    try:
        return AutoConfig.from_pretrained(str(Path(path).parent)), Path(path)
    except Exception as exc:  # noqa: BLE001 - a cached config.json its class refuses
        first = " ".join(line.strip() for line in str(exc).strip().splitlines())[:300]
        raise ConfigUnavailable(f"{path} (config.json of {m.id}@{m.revision}) cannot be read as a model config "
                                f"({type(exc).__name__}: {first})") from None


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
    paged_state_bytes: int = 0  # a paged optimizer's state: unified memory, outside the peak (storage.PAGED_SOURCE)
    step: Step = Step()  # whose step on which device was traced
    path: str = ""  # that step's path in words (forecast.trainers.StepPath.description)

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

    from ..engine.loading import torch_dtype

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
    from ..engine.trainable import make_optimizer

    name = recipe.training.optimizer
    modelled = storage.OPTIMIZER_MODELS.get(name)
    if modelled is not None:
        notes.append(modelled.note(name))
        return make_optimizer(model, recipe, factory=storage.modelled_optimizer_factory(modelled,
                                                                                        recipe.training.learning_rate))
    optimizer = make_optimizer(model, recipe)
    if foreach and name in ("adamw", "sgd"):
        # on CUDA/ROCm torch's default is the multi-tensor (foreach) path, with its temporaries
        per_parameter = getattr(optimizer, "per_parameter", None)  # optimizer_in_backward
        for one in per_parameter.values() if per_parameter is not None else [optimizer]:
            for group in one.param_groups:
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


def forecast(recipe, config=None, accelerator_optimizer: bool = False, step: Optional[Step] = None) -> Forecast:
    """Trace one steady-state training step of ``recipe`` on fake tensors and return its peak
    memory by category. ``step``: whose step on which device (forecast.trainers.Step; by
    default the engine's, on CUDA with ``accelerator_optimizer`` (its optimizer as torch runs it
    there: foreach), else on the CPU). Raises ConfigUnavailable, TraceError, or training.Fail
    (e.g. a target module the model lacks)."""
    step = step or Step("builtin", "cuda" if accelerator_optimizer else "cpu")
    with _third_party_quiet():
        return _forecast(recipe, config, step)


def _forecast(recipe, config, step: Step) -> Forecast:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..engine.batches import seed_everything
    from ..engine.trainable import (LOSS_ATTRIBUTE, LossPlan, kbit_preparation, make_scheduler, make_trainable,
                                    train_step)

    notes: list[str] = []
    started = time.perf_counter()
    config = config if config is not None else forecast_config(recipe)
    try:
        path = resolve(recipe, step, config)
    except ImportError as exc:  # a trainer's package that breaks on import
        raise TraceError(f"{step.trainer}'s step cannot be modelled here: {type(exc).__name__}: {exc}") from None
    base = _meta_model(recipe, config, notes)
    parameters = sum(p.numel() for p in base.parameters())
    quantization = recipe.model.quantization
    quantized = 0
    if quantization != "none":
        quantized = storage.quantize_for_forecast(base, quantization)
        notes.append("4-bit nf4 weights (bitsandbytes cannot run on fake tensors) modelled from their storage "
                     "format: 0.5 byte per weight + 1 byte absmax per 64 (double quantization) + 4 bytes per "
                     "16384; dequantized to the compute dtype per layer in forward and backward"
                     if quantization == "4bit" else
                     "8-bit weights (bitsandbytes LLM.int8 cannot run on fake tensors) modelled from their storage "
                     "format: 1 byte per weight + a 4-byte scale per row; its matmul temporaries taken as one "
                     "dequantized layer in forward and backward, like 4-bit's")
    seed_everything(recipe.training.seed)
    model = make_trainable(base, recipe)
    if kbit_preparation(recipe):
        notes.append("QLoRA preparation (peft prepare_model_for_kbit_training, [model] kbit_preparation) keeps "
                     "the layers it does not quantize (embeddings, output head, norms) in float32, so the "
                     "activations after them run in float32 too")
    path.prepare(model)
    batch_shape = path.batch_shape
    loss = recipe.training.loss if path.loss == "engine" else "full"
    if loss in ("fused_linear", "cut_cross_entropy"):
        text = getattr(config, "text_config", None) or config
        pieces, note = storage.modelled_loss_chunks(loss, batch_shape[0] * batch_shape[1], int(text.vocab_size),
                                                    int(text.hidden_size), batch_shape[1])
        setattr(model, LOSS_ATTRIBUTE, LossPlan("chunked", pieces))
        notes.append(note)
    elif loss == "chunked":
        notes.append(f"loss chunked: logits of {recipe.training.loss_chunks} pieces of the sequence, one at a time "
                     f"(each recomputed in the backward), traced as the engine runs it")
    notes += path.notes
    if recipe.training.compile:
        notes.append("[training] compile: torch.compile's memory effect (fused kernels saving fewer "
                     "intermediates) is not modelled; the step is traced as eager PyTorch runs it")
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
            optimizer = _optimizer(model, recipe, step.accelerator, notes)
            scheduler = make_scheduler(optimizer, recipe, total_steps=1, constant=True)
            # a first step creates its optimizer state in its optimizer step: traced there
            state = [] if step.first_step else optimizer_state_tensors(optimizer, trainable)
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

            forward_module = path.forward_module(model)
            hooks = [forward_module.register_forward_pre_hook(lambda module, args: tracker.mark("forward")),
                     forward_module.register_forward_hook(forward_end), optimizer.register_step_pre_hook(before_step),
                     optimizer.register_step_post_hook(after_step)]
            with path.traced(), tracker.watching():
                train_step(model, optimizer, scheduler, [batch], "cpu", loss_of=path.loss_of)
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
    if path.accumulation > 1:
        later = _later_micro_batch_peak(tracker, grads, forward_ends[0], optimizer_starts[0])
        if later[0] > tracker.peak:
            _, peak_event, serials, extra_bytes = later
            phase = ("forward" if peak_event <= forward_ends[0] else "backward") + " of a later micro-batch"
        notes.append("gradient accumulation: a later micro-batch of the step is derived from the traced one "
                     "(every gradient held from its start, the previous output alive until the new forward returns)")
    modelled = storage.OPTIMIZER_MODELS.get(recipe.training.optimizer)
    paged = modelled is not None and modelled.paged
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
        optimizer_state_bytes=0 if paged else state_bytes + sums["optimizer_state"],
        paged_state_bytes=state_bytes + sums["optimizer_state"] if paged else 0, activation_bytes=sums["activations"],
        temporary_bytes=sums["temporaries"], peak_phase=phase,
        tokens=batch_shape[0] * batch_shape[1], build_seconds=build_seconds,
        trace_seconds=trace_seconds, notes=tuple(notes), step=step, path=path.description)


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
    from ..engine.memory import peak_memory
    from ..engine.trainable import attention_of, make_optimizer, make_scheduler, train_step, trainable

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


