"""Checkpoints with every piece of state a resume needs (weights or adapter, optimizer,
scheduler, every RNG, data order, step), and the resume that continues from one (run by the
built-in engine's trainer in a fresh process: ``trainers.worker``)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..files import ensure_private_dir, make_private
from .batches import DataOrder, next_batches
from .trainable import (make_optimizer, make_scheduler, make_trainable, peft_quiet, release_trainable,
                        set_checkpointing, train_step)


STATE_FILE = "training_state.pt"
EXAMPLES_FILE = "examples.json"
REQUIRED_STATE = ("step", "optimizer", "scheduler", "rng.torch", "rng.python", "rng.numpy", "data_order")
# The files of a saved model or adapter that loading it needs (not README.md, generation_config.json
# or the tokenizer's): its config and its weights, whole or sharded.
MODEL_FILE_PATTERNS = ("adapter_config.json", "adapter_model.*", "config.json", "model*.safetensors*",
                       "pytorch_model*.bin*")


class MissingState(Exception):
    """A checkpoint lacks a piece of the state a resume needs."""


def rng_state() -> dict:
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    numpy_state: Any = np.random.get_state()  # a tuple (legacy=True, the default)
    kind, keys, pos, has_gauss, cached = numpy_state
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


    folder = ensure_private_dir(Path(folder))
    model.save_pretrained(ensure_private_dir(folder / "weights"))
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": rng_state(), "data_order": order.state_dict()}, folder / STATE_FILE)
    (folder / EXAMPLES_FILE).write_text(json.dumps([[list(e.input_ids), list(e.labels)] for e in examples]))
    make_private(folder)  # torch and save_pretrained write with the umask's mode
    return folder


def checkpoint_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def model_files(folder: Path) -> list[str]:
    """The files of ``folder`` that loading its model or adapter needs (``MODEL_FILE_PATTERNS``),
    in the order they were written (modification time, then name)."""
    found = {p for pattern in MODEL_FILE_PATTERNS for p in Path(folder).glob(pattern) if p.is_file()}
    return [p.name for p in sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))]


def resume_files(folder: Path) -> list[str]:
    """The files of the engine's complete checkpoint ``folder`` a resume needs, in the order
    ``save_checkpoint`` writes them: the weights or adapter, the training state, the examples."""
    return [f"weights/{name}" for name in model_files(Path(folder) / "weights")] + [STATE_FILE, EXAMPLES_FILE]


def load_state(folder: Path) -> dict:
    """The saved training state; MissingState names the first piece that is absent (a save
    interrupted mid-write leaves a folder without its later files)."""
    import torch

    folder = Path(folder)
    weights = folder / "weights"
    if not weights.is_dir():
        raise MissingState("weights (the adapter or model folder)")
    names = set(model_files(weights))
    if not names & {"adapter_config.json", "config.json"}:
        raise MissingState("weights/adapter_config.json or weights/config.json (the saved config)")
    if not names - {"adapter_config.json", "config.json"}:
        raise MissingState("weights/adapter_model.safetensors or weights/model.safetensors (the saved weights)")
    for name in (STATE_FILE, EXAMPLES_FILE):
        if not (folder / name).is_file():
            raise MissingState(name)
    path = folder / STATE_FILE
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
    return [PlainExample(tuple(ids), tuple(labels))
            for ids, labels in json.loads((Path(folder) / EXAMPLES_FILE).read_text())]


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




# ---- the resume experiment ------------------------------------------------------------------
@dataclass(frozen=True)
class StraightAndHalf:
    """``steps`` uninterrupted losses, and a second run of the first half saved to ``folder``."""

    straight_losses: list
    folder: Path
    steps: int
    checkpoint_bytes: int
    exact: bool  # CPU: the resumed losses must be equal; GPU kernels may differ in the last bits


def straight_and_half(recipe, examples: Sequence, pad_id: int, torch_device: str, shared_base, folder: Path,
                      steps: int, exact: bool = True) -> StraightAndHalf:
    """Losses of ``steps`` uninterrupted steps over ``examples``; then a second run of steps/2
    saved to ``folder``. Fails when the two runs differ before any resume (nothing could then be
    compared)."""
    from ..outcomes import Fail
    from .trainable import trainable

    t = recipe.training
    examples = list(examples)
    runs = []
    for length in (steps, steps // 2):
        with trainable(recipe, torch_device, shared_base) as model:
            optimizer = make_optimizer(model, recipe)
            scheduler = make_scheduler(optimizer, recipe, steps)
            order = DataOrder(len(examples), t.micro_batch_size, t.seed)
            losses = [train_step(model, optimizer, scheduler,
                                 next_batches(order, examples, t.gradient_accumulation_steps, pad_id), torch_device)
                      for _ in range(length)]
            if length == steps // 2:
                save_checkpoint(folder, model, optimizer, scheduler, order, length, examples)
            runs.append(losses)
    if compare_losses(runs[0][: steps // 2], runs[1], exact):
        raise Fail(f"two runs from the same seed differ before any resume ({runs[0][:steps // 2]} vs {runs[1]}): "
                   "training is not deterministic here, so resume cannot be checked"
                   + ("" if exact else " (set torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG)"))
    return StraightAndHalf(runs[0], Path(folder), steps, checkpoint_bytes(folder), exact)


def compare_losses(straight: Sequence[float], resumed: Sequence[float], exact: bool) -> str:
    """'' when they match, else what differs (a resumed run with fewer or more losses differs)."""
    if len(resumed) != len(straight):
        return (f"the resumed run returned {len(resumed)} loss(es) for the {len(straight)} step(s) after the "
                f"checkpoint: "
                "it stopped early or ran extra steps, so the saved step count or data position is wrong")
    tolerance = 0.0 if exact else 1e-3
    for i, (a, b) in enumerate(zip(straight, resumed)):
        if abs(a - b) > tolerance * max(1.0, abs(a)):
            return (f"step {i + 1} after the resume: loss {b:.6f}, uninterrupted {a:.6f} (difference "
                    f"{abs(a - b):.3g}); "
                    "check that the scheduler is built before the optimizer state is loaded, and that every RNG "
                    "(torch, python, numpy, data order) is restored")
    return ""
