"""Value translations the three trainers share: optimizer and scheduler names (the
transformers ``optim`` / ``lr_scheduler_type`` vocabulary), mixed-precision flags to a dtype."""

from __future__ import annotations

import re
from typing import Any, Optional

from .base import Builder

# transformers' OptimizerNames -> the recipe's optimizers; anything else is named as approximated.
OPTIMIZERS = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw", "adamw": "adamw",
    "adamw_torch_xla": "adamw", "adamw_apex_fused": "adamw", "paged_adamw_32bit": "adamw",
    "adamw_8bit": "adamw_8bit", "adamw_bnb_8bit": "adamw_8bit", "paged_adamw_8bit": "adamw_8bit",
    "sgd": "sgd", "adafactor": "adafactor",
}
SCHEDULERS = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant",
              "cosine_with_restarts": "cosine", "cosine_with_min_lr": "cosine"}


def packing_meaning(trainer: str) -> str:
    """What packing changes in the checks' meaning, for one trainer."""
    return ("data.masking verifies each row's labels before packing; data.packing checks with the plugin's own "
            f"packer that packed examples do not attend to each other, not with {trainer}'s packer")


NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def put_if(b: Builder, source: str, table: str, key: str) -> None:
    """Map ``source`` when the config sets it (the trainer's default equals the recipe's)."""
    put_many(b, table, [(source, key)])


def put_many(b: Builder, table: str, pairs, defaults: Optional[dict] = None) -> None:
    """(source, recipe key) pairs into ``table``: the config's value when set, else the trainer's
    default from ``defaults`` (when it differs from the recipe's), else nothing. Numbers written
    as strings (YAML reads ``1e-2`` as a string; the trainers' parsers convert it) are converted."""
    for source, key in pairs:
        value = b.get(source)
        if value is not None and value != "auto":
            b.put(source, table, key, float(value) if isinstance(value, str) and NUMBER.match(value) else value)
        elif defaults and source in defaults:
            b.put(f"{source} (default {defaults[source]})", table, key, defaults[source])


def note_meanings(b: Builder, meanings: dict[str, str]) -> None:
    """Name each set key whose value changes what the checks mean, with what is and is not checked."""
    for key, text in meanings.items():
        if text and b.has(key) and b.get(key) not in (False, "keep_start", "bfd"):
            b.caveat(key, text)


def map_optimizer(b: Builder, source: str, name: Any) -> None:
    name = str(name).lower()
    if name.startswith("paged_"):
        b.caveat(source, f"{name!r} pages optimizer state to host memory: model.step_memory measures it on the device")
    _map_name(b, source, name, "optimizer", OPTIMIZERS, "adamw",
              "is measured as AdamW: optimizer-state memory in model.step_memory is AdamW's")


def map_scheduler(b: Builder, source: str, name: Any) -> None:
    _map_name(b, source, str(name).lower(), "lr_scheduler", SCHEDULERS, "linear",
              "is approximated by a linear schedule in model.overfit")


def _map_name(b: Builder, source: str, name: str, key: str, names: dict, fallback: str, approximated: str) -> None:
    mapped = names.get(name)
    if mapped is None:
        b.caveat(source, f"{name!r} {approximated}")
    b.put(source, "training", key, mapped or fallback)


def mixed_precision_dtype(b: Builder, bf16_key: str, fp16_key: str) -> Optional[str]:
    """The dtype the mixed-precision flags imply (bf16 -> bfloat16, fp16 -> float16), mapped."""
    bf16, fp16 = b.get(bf16_key), b.get(fp16_key)
    if bf16 is True or bf16 == "auto":
        b.put(bf16_key, "model", "dtype", "bfloat16")
        return "bfloat16"
    if fp16 is True:
        b.put(fp16_key, "model", "dtype", "float16")
        return "float16"
    return None
