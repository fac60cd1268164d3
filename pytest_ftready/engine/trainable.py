"""The model as the recipe trains it: LoRA adapter or full fine-tune, activation
checkpointing, the optimizer and schedule, and one optimizer step (with accumulation)."""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
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
    return LoraConfig(r=a.r, lora_alpha=a.alpha, lora_dropout=a.dropout, target_modules=a.target_regex or list(a.target_modules),
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


def make_trainable(base, recipe):
    """Wrap the base model as the recipe trains it (LoRA adapter or full), in train mode."""
    if recipe.training.gradient_checkpointing:
        set_checkpointing(base, True)
    if recipe.adapter.method == "lora":
        if recipe.model.quantization != "none":
            from peft import prepare_model_for_kbit_training

            base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=recipe.training.gradient_checkpointing)
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
    return model


def _linear_names(model) -> list[str]:
    import torch

    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def release_trainable(model, recipe):
    """Undo make_trainable on the shared base model (remove LoRA layers, checkpointing)."""
    base = model.unload() if recipe.adapter.method == "lora" else model
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


def make_optimizer(model, recipe, learning_rate: Optional[float] = None):
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    lr = recipe.training.learning_rate if learning_rate is None else learning_rate
    name = recipe.training.optimizer
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=recipe.training.weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False)
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise Fail("optimizer = \"adamw_8bit\" needs bitsandbytes: pip install 'pytest-ftready[quant]'") from None
    return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=recipe.training.weight_decay)


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


def train_step(model, optimizer, scheduler, batches: Sequence[dict], device: str) -> float:
    """One optimizer step over ``batches`` (gradient accumulation); returns the mean loss."""
    total = 0.0
    for batch in batches:
        out = model(**to_device(batch, device), use_cache=False)
        loss = out.loss / len(batches)
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
