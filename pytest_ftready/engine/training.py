"""The training machinery the model, lifecycle, sustained and lever checks share: batches
from the encoder's output, the recipe's adapter / optimizer / schedule, one step, a
checkpoint with every piece of state, greedy generation, the packing comparison.
Plain Python over torch/transformers/peft; no pytest."""

from __future__ import annotations

import json
import math
import random
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from ..data.encoding import IGNORE_INDEX
from ..outcomes import Fail

STATE_FILE = "training_state.pt"
EXAMPLES_FILE = "examples.json"
REQUIRED_STATE = ("step", "optimizer", "scheduler", "rng.torch", "rng.python", "rng.numpy", "data_order")


class MissingState(Exception):
    """A checkpoint lacks a piece of the state a resume needs."""


# ---- seeds and batches --------------------------------------------------------------------
def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds CUDA / MPS generators


def collate(examples: Sequence, pad_id: int, pad_to: Optional[int] = None) -> dict:
    """Right-padded tensors; padding is masked from attention and loss."""
    import torch

    width = pad_to or max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        n = min(len(e.input_ids), width)
        ids[row, :n] = torch.tensor(e.input_ids[:n])
        labels[row, :n] = torch.tensor(e.labels[:n])
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def to_device(batch: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


class DataOrder:
    """Shuffled micro-batches from a seeded generator; its state is part of a checkpoint."""

    def __init__(self, n_examples: int, micro_batch: int, seed: int) -> None:
        import torch

        self.n = n_examples
        self.micro_batch = micro_batch
        self.generator = torch.Generator().manual_seed(seed)
        self.perm: list[int] = []
        self.pos = 0

    def next_indices(self) -> list[int]:
        import torch

        out = []
        while len(out) < self.micro_batch:
            if self.pos >= len(self.perm):
                self.perm = torch.randperm(self.n, generator=self.generator).tolist()
                self.pos = 0
            out.append(self.perm[self.pos])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "perm": list(self.perm), "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.perm, self.pos = list(state["perm"]), int(state["pos"])


# ---- model, optimizer, schedule ------------------------------------------------------------
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
    return LoraConfig(r=a.r, lora_alpha=a.alpha, lora_dropout=a.dropout, target_modules=list(a.target_modules),
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

        missing = [m for m in recipe.adapter.target_modules if not any(n.endswith(m) for n, _ in base.named_modules())]
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
def trainable(state, recipe=None) -> Iterator[Any]:
    """A freshly initialised trainable model for one check. LoRA reuses the session's base
    model and removes its layers afterwards; a full fine-tune trains a fresh copy.
    ``recipe``: a variant of the state's recipe (levers.sweep)."""
    from .loading import load_model
    from .memory import free_device_memory

    recipe = recipe or state.recipe
    seed_everything(recipe.training.seed)
    base = state.model if recipe.adapter.method == "lora" else load_model(recipe, state.device.torch_device)
    model = make_trainable(base, recipe)
    try:
        yield model
    finally:
        if recipe.adapter.method == "lora":
            release_trainable(model, recipe)
        del model
        free_device_memory(state.device.torch_device)


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


def next_batches(order: DataOrder, examples: Sequence, accumulation: int, pad_id: int) -> list[dict]:
    return [collate([examples[i] for i in order.next_indices()], pad_id) for _ in range(accumulation)]


# ---- checkpoint -----------------------------------------------------------------------------
def rng_state() -> dict:
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss],
             "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(folder: Path, model, optimizer, scheduler, order: DataOrder, step: int,
                    examples: Sequence) -> Path:
    """Weights or adapter, optimizer, scheduler, every RNG, data order, step, and the examples."""
    import torch

    from ..files import ensure_private_dir

    folder = ensure_private_dir(Path(folder))
    model.save_pretrained(ensure_private_dir(folder / "weights"))
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": rng_state(), "data_order": order.state_dict()}, folder / STATE_FILE)
    (folder / EXAMPLES_FILE).write_text(json.dumps([[list(e.input_ids), list(e.labels)] for e in examples]))
    return folder


def checkpoint_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def load_state(folder: Path) -> dict:
    """The saved training state; MissingState names the first piece that is absent."""
    import torch

    folder = Path(folder)
    if not (folder / "weights").is_dir():
        raise MissingState("weights (the adapter or model folder)")
    path = folder / STATE_FILE
    if not path.is_file():
        raise MissingState(STATE_FILE)
    state = torch.load(path, weights_only=True)
    for name in REQUIRED_STATE:
        node = state
        for part in name.split("."):
            if not isinstance(node, dict) or part not in node:
                raise MissingState(name)
            node = node[part]
    return state


@dataclass(frozen=True)
class PlainExample:
    input_ids: tuple
    labels: tuple


def load_examples(folder: Path) -> list[PlainExample]:
    return [PlainExample(tuple(i), tuple(l)) for i, l in json.loads((Path(folder) / EXAMPLES_FILE).read_text())]


def resume_and_train(recipe, base, folder: Path, steps: int, device: str, pad_id: int, total_steps: int,
                     restore_rng: bool = True, scheduler_first: bool = True) -> list[float]:
    """Load a checkpoint onto ``base`` and train ``steps`` more; returns their losses.
    ``restore_rng=False`` / ``scheduler_first=False`` reproduce the usual resume bugs (tests)."""
    state = load_state(folder)
    if recipe.adapter.method == "lora":
        from peft import PeftModel

        if recipe.training.gradient_checkpointing:
            set_checkpointing(base, True)
        with peft_quiet():
            model = PeftModel.from_pretrained(base, str(Path(folder) / "weights"), is_trainable=True)
    else:
        model = make_trainable(_load_full(recipe, folder, device), recipe)
    model.train()
    optimizer = make_optimizer(model, recipe)
    if scheduler_first:  # the LambdaLR must exist before the optimizer state is loaded
        scheduler = make_scheduler(optimizer, recipe, total_steps)
        optimizer.load_state_dict(state["optimizer"])
    else:
        optimizer.load_state_dict(state["optimizer"])
        scheduler = make_scheduler(optimizer, recipe, total_steps)
    scheduler.load_state_dict(state["scheduler"])
    examples = load_examples(folder)
    order = DataOrder(len(examples), recipe.training.micro_batch_size, recipe.training.seed)
    order.load_state_dict(state["data_order"])
    if restore_rng:
        set_rng_state(state["rng"])
    losses = []
    for _ in range(steps):
        batches = next_batches(order, examples, recipe.training.gradient_accumulation_steps, pad_id)
        losses.append(train_step(model, optimizer, scheduler, batches, device))
    if recipe.adapter.method == "lora":
        release_trainable(model, recipe)
    return losses


def _load_full(recipe, folder: Path, device: str):
    from transformers import AutoModelForCausalLM

    from .loading import torch_dtype

    model = AutoModelForCausalLM.from_pretrained(str(Path(folder) / "weights"), dtype=torch_dtype(recipe.model.dtype),
                                                 attn_implementation=recipe.model.attn_implementation)
    return model.to(device)


# ---- generation ----------------------------------------------------------------------------
def greedy(model, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids, pad_id: int, device: str) -> list[int]:
    import torch

    model.eval()
    with torch.no_grad():
        ids = torch.tensor([list(prompt_ids)], device=device)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=sorted(stop_ids), pad_token_id=pad_id, use_cache=True)
    return out[0, ids.shape[1]:].tolist()


# ---- packing -------------------------------------------------------------------------------
@dataclass(frozen=True)
class PackingResult:
    examples: int
    max_difference: float
    tolerance: float


def per_token_losses(model, input_ids, labels, position_ids=None, attention_mask=None):
    import torch

    with torch.no_grad():
        logits = model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                       use_cache=False).logits.float()
    shift_logits, shift_labels = logits[:, :-1], labels[:, 1:]
    return torch.nn.functional.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]),
                                             shift_labels.reshape(-1), ignore_index=IGNORE_INDEX,
                                             reduction="none").view(shift_labels.shape)


def packing_mismatch(model, examples: Sequence, max_length: int, device: str) -> PackingResult:
    """Pack as many examples as fit in ``max_length`` (position ids restart per example, the
    first label of each masked) and compare each example's summed loss with its own forward."""
    import torch

    chosen, used = [], 0
    for e in examples:
        if used + e.length <= max_length:
            chosen.append(e)
            used += e.length
        if len(chosen) == 8:
            break
    if len(chosen) < 2:
        return PackingResult(len(chosen), 0.0, 0.0)
    was_training = model.training
    model.eval()
    ids, labels, pos, bounds = [], [], [], []
    for e in chosen:
        start = len(ids)
        ids += list(e.input_ids)
        labels += [IGNORE_INDEX] + list(e.labels[1:])
        pos += list(range(e.length))
        bounds.append((start, len(ids)))
    t = lambda xs: torch.tensor([xs], device=device)  # noqa: E731
    packed = per_token_losses(model, t(ids), t(labels), position_ids=t(pos))[0]
    worst = 0.0
    for e, (start, end) in zip(chosen, bounds):
        alone = per_token_losses(model, t(list(e.input_ids)), t(list(e.labels)))[0].sum().item()
        together = packed[start:end - 1].sum().item()
        worst = max(worst, abs(alone - together) / max(1.0, abs(alone)))
    model.train(was_training)
    dtype = next(model.parameters()).dtype
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    return PackingResult(len(chosen), worst, tolerance)
