"""Recipes from the configs teams already have: a TRL ``trl sft --config`` YAML (and the
recipes built on TRL), an Axolotl YAML, a LLaMA-Factory YAML (+ its ``dataset_info.json``), an
mlx-lm LoRA YAML (``mlx_lm lora -c``).
The format is recognised from the file's keys. Each trainer's keys are data
(``keys/<trainer>.toml``: the trainer's defaults, aliases, what each key does, its class and
its source); ``table.apply`` walks a config through its table so that every key is
translated, noted or refused, and each importer's handlers do what a value map cannot. A side
``ftready.toml`` adds and overrides what those files cannot say (thresholds, privacy policy, a
local model path), and the result goes through the recipe schema's validation.
``Recipe.origin`` keeps the translation: which key became which, each key's class, the notes,
what the side file overrode.

Where the trainer is installed, its own parser is asked too, lazily, when its config is read
(TRL's ``TrlParser``, Axolotl's ``validate_config``, LLaMA-Factory's ``HfArgumentParser`` over its
argument classes, mlx-lm's ``CONFIG_DEFAULTS``); where it is not, the files are read against the
key tables alone. Imports nothing outside ``recipe``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..schema import Recipe, RecipeError
from . import axolotl, llamafactory, mlx, trl
from .base import Builder, SideFileNeeded, Translation, read_yaml

IMPORTERS = {"trl": trl, "axolotl": axolotl, "llamafactory": llamafactory, "mlx": mlx}
# Keys only one trainer's config has: enough to tell the three apart.
AXOLOTL_KEYS = ("base_model", "micro_batch_size", "sequence_len", "sample_packing", "num_epochs")
LLAMAFACTORY_KEYS = ("stage", "finetuning_type", "cutoff_len", "dataset_dir", "lora_rank", "lora_target", "template")
TRL_KEYS = ("model_name_or_path", "dataset_name", "use_peft", "assistant_only_loss", "completion_only_loss",
            "max_length", "per_device_train_batch_size")


# LLaMA-Factory v1 (``model`` + ``train_dataset``, ``dist_config``): a different schema, not read yet.
LLAMAFACTORY_V1_KEYS = ("train_dataset", "model_class", "dist_config")


def detect(raw: dict) -> str | None:
    """Which trainer wrote this mapping: "axolotl", "llamafactory", "trl", "mlx", or None. An
    mlx-lm config (``model`` and ``data`` with its own keys: ``mlx.is_mlx``) is told by keys no
    other trainer's config has, and only where none of theirs is there."""
    if "model" in raw and any(key in raw for key in LLAMAFACTORY_V1_KEYS):
        return "llamafactory_v1"
    if mlx.is_mlx(raw) and not any(key in raw for key in (*AXOLOTL_KEYS, *LLAMAFACTORY_KEYS, *TRL_KEYS)):
        return "mlx"
    if any(key in raw for key in AXOLOTL_KEYS):
        return "axolotl"
    if any(key in raw for key in LLAMAFACTORY_KEYS) or isinstance(raw.get("dataset"), str):
        return "llamafactory"
    if any(key in raw for key in TRL_KEYS):
        return "trl"
    return None


def load_config(path: Path | str, standing_in: Optional[dict] = None) -> Recipe:
    """Read a trainer's YAML config as a validated Recipe (with ``origin`` set); ``standing_in``:
    side-file keys not yet written (``Builder.finish``)."""
    path = Path(path).resolve()
    raw = read_yaml(path)
    fmt = detect(raw)
    if fmt is None:
        raise RecipeError(path, "", "not a TRL, Axolotl or LLaMA-Factory config, nor mlx-lm's (none of base_model, "
                          "model_name_or_path with stage/finetuning_type, model_name_or_path with SFTConfig keys, or "
                          "model with mlx-lm's fine_tune_type/num_layers/lora_parameters/iters); "
                          "pass a recipe.toml or one of those configs")
    if fmt == "llamafactory_v1":
        raise RecipeError(path, "train_dataset", "a LLaMA-Factory v1 config (model / train_dataset / dist_config), "
                          "whose keys the plugin does not read yet: check the run with a recipe.toml, or with the "
                          "same run written as a LLaMA-Factory 0.9 config (model_name_or_path, dataset, stage)")
    module = IMPORTERS[fmt]
    builder = Builder(path, raw, fmt, module.TITLE)
    builder.note_unexpanded()
    module.translate(builder)
    return builder.finish(standing_in)


__all__ = ["SideFileNeeded", "Translation", "detect", "load_config"]
