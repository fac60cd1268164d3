"""The model as the recipe trains it: LoRA adapter or full fine-tune, activation
checkpointing, QLoRA preparation (``[model] kbit_preparation``), the optimizer (optionally
stepped inside the backward, ``[training] optimizer_in_backward``) and schedule, the loss
(full logits or chunked, ``[training] loss``), and one optimizer step (with accumulation)."""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

from ..outcomes import Fail
from .batches import seed_everything, to_device


@contextmanager
def peft_quiet() -> Iterator[None]:
    """PeftModel.__init__ reads transformers' deprecated ``is_gradient_checkpointing`` (a
    FutureWarning since transformers 5.2): not the user's to fix, so not shown to them."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def lora_config(recipe):
    from peft import LoraConfig

    a = recipe.adapter
    return LoraConfig(r=a.r, lora_alpha=a.alpha, lora_dropout=a.dropout,
                      target_modules=a.target_regex or list(a.target_modules),
                      task_type="CAUSAL_LM")


def set_checkpointing(model, on: bool) -> None:
    """Activation checkpointing on or off (transformers >= 5.2 names it activation_checkpointing_*)."""
    if hasattr(model, "activation_checkpointing_enable"):
        if on:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.activation_checkpointing_disable()
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def kbit_preparation(recipe) -> bool:
    """Whether peft's ``prepare_model_for_kbit_training`` runs on the quantized base: ``auto``
    is the built-in engine's (and TRL's, the HF Trainer's) habit, on; a config imported from a
    trainer that does not prepare (torchtune, litgpt) says ``off``."""
    return recipe.model.quantization != "none" and recipe.model.kbit_preparation != "off"


def make_trainable(base, recipe):
    """Wrap the base model as the recipe trains it (LoRA adapter or full), in train mode, with
    the recipe's loss (``step_loss``) attached."""
    if recipe.training.gradient_checkpointing:
        set_checkpointing(base, True)
    if recipe.adapter.method == "lora":
        if kbit_preparation(recipe):
            from peft import prepare_model_for_kbit_training

            base = prepare_model_for_kbit_training(base,
                                                   use_gradient_checkpointing=recipe.training.gradient_checkpointing)
        from peft import get_peft_model

        names = [n for n, _ in base.named_modules()]
        missing = ([recipe.adapter.target_regex] if recipe.adapter.target_regex and not any(
            re.fullmatch(recipe.adapter.target_regex, n) for n in names) else
            [m for m in recipe.adapter.target_modules if not any(n.endswith(m) for n in names)])
        if missing:
            raise Fail(f"[adapter] target_modules {missing} match no module of this model; its linear "
                       f"layers are named like {_linear_names(base)[:8]}")
        with peft_quiet():
            model = get_peft_model(base, lora_config(recipe))
    else:
        model = base
        for p in model.parameters():
            p.requires_grad_(True)
    model.train()
    setattr(model, LOSS_ATTRIBUTE, loss_plan(recipe))
    return model


def _linear_names(model) -> list[str]:
    import torch

    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def release_trainable(model, recipe):
    """Undo make_trainable on the shared base model (remove LoRA layers, checkpointing)."""
    base = model.unload() if recipe.adapter.method == "lora" else model
    if "peft_config" in vars(base):  # peft < 0.21 leaves it on the unloaded model: the next adapter would warn
        del base.peft_config
    if recipe.training.gradient_checkpointing:
        set_checkpointing(base, False)
    base.eval()
    for p in base.parameters():
        p.requires_grad_(False)
    return base


@contextmanager
def trainable(recipe, torch_device: str, shared_base: Callable[[], Any]) -> Iterator[Any]:
    """A freshly initialised trainable model for one piece of work. LoRA wraps the session's
    base model (``shared_base()``) and removes its layers afterwards; a full fine-tune trains
    a fresh copy loaded for ``recipe`` (which may be a variant of the session's recipe)."""
    from .loading import load_model
    from .memory import free_device_memory

    seed_everything(recipe.training.seed)
    base = shared_base() if recipe.adapter.method == "lora" else load_model(recipe, torch_device)
    model = make_trainable(base, recipe)
    try:
        yield model
    finally:
        if recipe.adapter.method == "lora":
            release_trainable(model, recipe)
        del model
        free_device_memory(torch_device)


BITSANDBYTES_OPTIMIZERS = {"adamw_8bit": "AdamW8bit", "paged_adamw": "PagedAdamW", "paged_adamw_8bit": "PagedAdamW8bit"}


def optimizer_factory(recipe, learning_rate: Optional[float] = None) -> Callable[[list], Any]:
    """params -> the recipe's optimizer over them."""
    import torch

    lr = recipe.training.learning_rate if learning_rate is None else learning_rate
    name, decay = recipe.training.optimizer, recipe.training.weight_decay
    if name == "adamw":
        return lambda params: torch.optim.AdamW(params, lr=lr, weight_decay=decay)
    if name == "sgd":
        return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return lambda params: Adafactor(params, lr=lr, scale_parameter=False, relative_step=False)
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise Fail(f"optimizer = \"{name}\" needs bitsandbytes: pip install 'pytest-ftready[quant]'") from None
    cls = getattr(bnb.optim, BITSANDBYTES_OPTIMIZERS[name])
    return lambda params: cls(params, lr=lr, weight_decay=decay)


def make_optimizer(model, recipe, learning_rate: Optional[float] = None, factory=None):
    """The recipe's optimizer over the trainable parameters; with ``optimizer_in_backward`` one
    optimizer per parameter, stepped by the parameter's gradient hook (``in_backward``).
    ``factory``: params -> optimizer, instead of the recipe's (the forecast's storage models)."""
    params = [p for p in model.parameters() if p.requires_grad]
    factory = factory or optimizer_factory(recipe, learning_rate)
    if recipe.training.optimizer_in_backward:
        return in_backward(params, factory)
    return factory(params)


def in_backward(params: list, factory: Callable[[list], Any]):
    """An optimizer stepped inside the backward, as torchtune's ``optimizer_in_bwd`` does: one
    optimizer per parameter, run by the parameter's post-accumulate-grad hook, which then frees
    the gradient, so no whole-model set of gradients is ever held. The returned object is a
    ``torch.optim.Optimizer`` (schedulers, ``state_dict`` and ``load_state_dict`` work on it; its
    learning rate is handed to each parameter's optimizer); its ``step()`` steps only the
    gradients no hook consumed (none after a backward). Gradient accumulation cannot combine
    with it (each gradient is applied as soon as it exists)."""
    import torch

    class OptimizerInBackward(torch.optim.Optimizer):
        def __init__(self) -> None:
            self.per_parameter = {p: factory([p]) for p in params}
            first = next(iter(self.per_parameter.values()), None)
            defaults = dict(first.defaults) if first is not None else {"lr": 0.0}
            super().__init__(params, defaults)
            self._share_state()
            self.hooks = [p.register_post_accumulate_grad_hook(self._step_parameter) for p in params]

        def _share_state(self) -> None:  # one state table: state_dict() sees every parameter's state
            for optimizer in self.per_parameter.values():
                optimizer.state = self.state

        def _step_parameter(self, p) -> None:
            optimizer = self.per_parameter[p]
            for group in optimizer.param_groups:
                group["lr"] = self.param_groups[0]["lr"]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        @torch.no_grad()
        def step(self, closure=None):
            for p in self.per_parameter:
                if p.grad is not None:
                    self._step_parameter(p)
            return None

        def load_state_dict(self, state_dict) -> None:
            super().load_state_dict(state_dict)
            self._share_state()

    return OptimizerInBackward()


def make_scheduler(optimizer, recipe, total_steps: int, constant: bool = False):
    import torch

    warmup = recipe.training.warmup_steps
    kind = "constant" if constant else recipe.training.lr_scheduler

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / (warmup + 1)
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 1.0 - progress if kind == "linear" else 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


LOSS_ATTRIBUTE = "ftready_loss"  # make_trainable leaves the recipe's LossPlan on the model it returns
LOGIT_SCALING = ("final_logit_softcapping", "logit_scale", "logits_scaling")  # heads that are more than a linear layer


@dataclass(frozen=True)
class LossPlan:
    """How the loss meets the vocabulary: ``full`` (the model's own loss over all logits) or
    ``chunked`` (logits of ``chunks`` pieces of the sequence, one at a time: each piece is
    recomputed in the backward, so at most one piece's logits live); ``fused_linear`` (Liger)
    and ``cut_cross_entropy`` (Apple's CCE) call their GPU kernels. ``dtype``: the full and
    chunked losses upcast the logits to ``float32`` first, or stay in the ``compute`` dtype."""

    kind: str = "full"
    chunks: int = 1
    dtype: str = "float32"


def loss_plan(recipe) -> LossPlan:
    t = recipe.training
    return LossPlan(t.loss, t.loss_chunks if t.loss == "chunked" else 1, t.loss_dtype)


def step_loss(model, batch: dict):
    """The mean loss of one batch over its trained tokens, as the model's ``LossPlan`` computes it."""
    plan = getattr(model, LOSS_ATTRIBUTE, None) or LossPlan()
    if plan.kind == "full" and plan.dtype == "float32":  # the model's own loss (transformers upcasts the logits)
        return model(**batch, use_cache=False).loss
    import torch

    if plan.kind == "full":  # every logit held in the compute dtype, the cross-entropy run in it too
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
        labels = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:]
        trained = (labels != -100).sum().clamp(min=1)
        return torch.nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100,
                                                 reduction="sum") / trained

    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    scaled = {k: v for k, v in vars(causal_lm.config).items() if k in LOGIT_SCALING and v not in (None, 1, 1.0)}
    if scaled:
        raise Fail(f"[training] loss = \"{plan.kind}\" computes the logits as the output layer alone, but "
                   f"{causal_lm.config.model_type} scales them ({scaled}): use loss = \"full\"")
    inputs = {k: v for k, v in batch.items() if k != "labels"}  # position_ids of packed rows too
    hidden = loss_forward_module(model)(**inputs, use_cache=False).last_hidden_state
    head = causal_lm.get_output_embeddings()
    labels = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:]  # the next token's label
    trained = (labels != -100).sum().clamp(min=1)
    if plan.kind == "chunked":
        return _chunked_loss(hidden, head, labels, plan.chunks, plan.dtype == "float32") / trained
    return _kernel_loss(plan.kind, hidden, head, labels) / trained


def loss_forward_module(model):
    """The module whose forward ``step_loss`` runs: the model itself for the full loss (its
    forward returns the loss or the logits); the decoder for the others (the loss follows it,
    piece by piece)."""
    plan = getattr(model, LOSS_ATTRIBUTE, None) or LossPlan()
    if plan.kind == "full":
        return model
    return (model.get_base_model() if hasattr(model, "get_base_model") else model).get_decoder()


def _chunk_loss(hidden, weight, bias, labels, upcast: bool = True):
    import torch

    logits = torch.nn.functional.linear(hidden, weight, bias)
    logits = logits.float() if upcast else logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100,
                                             reduction="sum")


def _chunked_loss(hidden, head, labels, chunks: int, upcast: bool = True):
    from torch.utils.checkpoint import checkpoint

    total = None
    for h, y in zip(hidden.chunk(chunks, dim=1), labels.chunk(chunks, dim=1)):
        part = checkpoint(_chunk_loss, h, head.weight, head.bias, y, upcast, use_reentrant=False)
        total = part if total is None else total + part
    return total


def _kernel_loss(kind: str, hidden, head, labels):
    """Liger's fused linear cross-entropy or Apple's Cut Cross-Entropy: Triton kernels, CUDA only."""
    if hidden.device.type != "cuda":
        raise Fail(f"[training] loss = \"{kind}\" runs a Triton kernel on an NVIDIA GPU; on "
                   f"{hidden.device.type} use loss = \"chunked\" (the same memory behaviour, computed in pieces)")
    flat, flat_labels = hidden.flatten(0, -2), labels.flatten()
    try:
        if kind == "fused_linear":
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

            return LigerFusedLinearCrossEntropyLoss(reduction="sum")(head.weight, flat, flat_labels, head.bias)
        from cut_cross_entropy import linear_cross_entropy

        return linear_cross_entropy(flat, head.weight, flat_labels, bias=head.bias, reduction="sum")
    except ImportError:
        package = "liger-kernel" if kind == "fused_linear" else "cut-cross-entropy"
        raise Fail(f"[training] loss = \"{kind}\" needs {package}: pip install {package}") from None


def train_step(model, optimizer, scheduler, batches: Sequence[dict], device: str,
               loss_of: Callable[[Any, dict], Any] = step_loss) -> float:
    """One optimizer step over ``batches`` (gradient accumulation); returns the mean loss.
    ``loss_of(model, batch)``: the loss of one batch (the forecast traces trainers' own losses)."""
    total = 0.0
    for batch in batches:
        loss = loss_of(model, to_device(batch, device)) / len(batches)
        loss.backward()
        total += float(loss.detach())
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return total




def num_layers(model) -> int:
    return num_layers_of(getattr(model, "config", None))


def num_layers_of(config) -> int:
    """Decoder layers of a model config (a multimodal config's text_config)."""
    config = getattr(config, "text_config", None) or config
    return int(getattr(config, "num_hidden_layers", 1) or 1)


@contextmanager
def attention_of(shared_model, attn_implementation: str) -> Iterator[None]:
    """The session's shared base model (None: nothing shared) with ``attn_implementation`` for
    the block: a variant may use another kernel than the recipe the model was loaded for."""
    before = shared_model.config._attn_implementation if shared_model is not None else None
    if shared_model is not None and before != attn_implementation:
        shared_model.set_attn_implementation(attn_implementation)
    try:
        yield
    finally:
        if shared_model is not None and shared_model.config._attn_implementation != before:
            shared_model.set_attn_implementation(before)


def param_fingerprints(model, trainable: bool) -> dict[str, tuple[float, float]]:
    """A cheap per-parameter fingerprint (sum and sum of squares), not a copy of the weights."""
    import torch

    with torch.no_grad():
        return {n: (float(p.float().sum()), float(p.float().pow(2).sum()))
                for n, p in model.named_parameters() if p.requires_grad == trainable}
