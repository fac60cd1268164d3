"""The peak memory of mlx-lm's training step, forecast from the model's config.json alone (no
weights, no mlx): what ``mx.get_peak_memory()`` reports for one iteration of ``mlx_lm lora``.

- weights at their bits: the model's dtype, or an mlx-lm quantized checkpoint's ``bits`` plus
  its per-group scale and bias (two values of the model's dtype per ``group_size`` weights);
- what trains: LoRA ``rank x (in + out)`` per adapted linear layer of the last ``num_layers``
  blocks (float32, as mlx-lm creates them), DoRA's magnitude vector besides, or the blocks'
  weights themselves (full); one gradient each; the optimizer's state (Adam/AdamW two moments,
  Muon one, SGD none, Adafactor its row and column factors);
- activations at the batch and length mlx-lm pads to (``1 + 32 x ceil(longest / 32)``, at most
  ``max_seq_length``; the step sees one token fewer): per token, each block from the first one
  that trains on keeps its inputs, projections, MLP intermediates and attention weights
  (``BLOCK_H`` hidden-sized, ``BLOCK_I`` MLP-sized values, two heads x length score rows); with
  ``grad_checkpoint`` each block keeps its input only and one block is recomputed at a time; the
  loss keeps ``LOGIT_COPIES`` vocabulary-sized rows (logits, log-softmax, their gradients, the
  masked cross-entropy).

The coefficients were read off MLX's CPU backend here (mlx 0.32.4, the tiny Llama at batch 1, 4
and 8, with and without grad_checkpoint) and are held against a 135M model's measured peak by
tests/trainers/test_mlx_forecast.py. What only a Mac shows: Metal's allocator rounds buffers and
keeps a cache (``mx.get_cache_memory``), neither counted here. Imports nothing outside the
package."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

BLOCK_H = 9  # hidden-sized values a block keeps per token (norm inputs/outputs, q, attention out, residuals ...)
BLOCK_I = 4  # MLP-sized values (gate, up, silu(gate), their product)
LOGIT_COPIES = 5  # vocabulary-sized rows the loss keeps per token
LORA_BYTES = 4  # mlx-lm's LoRA A and B are float32 (mx.random.uniform, mx.zeros)
STATES = {"adam": 2, "adamw": 2, "muon": 1, "sgd": 0, "adafactor": 0}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class MlxForecast:
    weights_bytes: int
    trainable_bytes: int  # the trained parameters (LoRA/DoRA, or the blocks' weights)
    gradient_bytes: int
    optimizer_state_bytes: int
    activation_bytes: int
    tokens: int  # token positions of the step (batch x padded length - 1)
    full: bool = False  # full fine-tune: the trained weights are among the weights (not counted twice)

    @property
    def peak_bytes(self) -> int:
        return (self.weights_bytes + (0 if self.full else self.trainable_bytes) + self.gradient_bytes
                + self.optimizer_state_bytes + self.activation_bytes)


def padded_length(longest: int, max_seq_length: int) -> int:
    """The length mlx-lm pads a batch to (tuner/trainer.py iterate_batches)."""
    return min(1 + 32 * math.ceil(longest / 32), max_seq_length)


def shape(config: dict) -> dict:
    """The sizes the forecast needs from a Llama-style config.json (text_config where nested)."""
    c = config.get("text_config") or config
    h, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or h // heads)
    return {"h": h, "layers": int(c["num_hidden_layers"]), "vocab": int(c["vocab_size"]),
            "inter": int(c.get("intermediate_size") or 4 * h), "heads": heads,
            "kv": int(c.get("num_key_value_heads") or heads), "head_dim": head_dim,
            "tied": bool(config.get("tie_word_embeddings", c.get("tie_word_embeddings", False)))}


def linears(s: dict) -> list[tuple[int, int]]:
    """(in, out) of a block's linear layers (the ones mlx-lm adapts without lora keys)."""
    h, q, kv, i = s["h"], s["heads"] * s["head_dim"], s["kv"] * s["head_dim"], s["inter"]
    return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]


def forecast(config: dict, args: dict, batch: int, longest: int) -> MlxForecast:
    """The step of mlx-lm ``args`` (its config's keys, CONFIG_DEFAULTS filled in) on ``batch``
    rows whose longest has ``longest`` tokens, for the model of ``config`` (its config.json)."""
    s = shape(config)
    dtype = DTYPE_BYTES.get(str(config.get("torch_dtype") or config.get("dtype") or "float32"), 4)
    quant = config.get("quantization") or {}
    block_weights = sum(a * b for a, b in linears(s)) + 2 * s["h"]
    embedding = s["vocab"] * s["h"] * (1 if s["tied"] else 2)
    per_weight = (quant["bits"] / 8 + 2 * dtype / quant.get("group_size", 64)) if quant else dtype
    weights = int((s["layers"] * (block_weights - 2 * s["h"]) + embedding) * per_weight
                  + (s["layers"] * 2 + 1) * s["h"] * dtype)
    layers = s["layers"] if args.get("num_layers", 16) in (-1, None) else min(int(args["num_layers"]), s["layers"])
    kind = args.get("fine_tune_type", "lora")
    if kind == "full":
        trainable = layers * block_weights * dtype
    else:
        rank = int((args.get("lora_parameters") or {}).get("rank", 8))
        trainable = layers * sum(rank * (a + b) for a, b in linears(s)) * LORA_BYTES
        if kind == "dora":
            trainable += layers * sum(b for _, b in linears(s)) * LORA_BYTES
    states = STATES.get(str(args.get("optimizer", "adam")).lower(), 2)
    length = padded_length(longest, int(args.get("max_seq_length", 2048)))
    tokens = batch * (length - 1)
    block = (BLOCK_H * s["h"] + BLOCK_I * s["inter"] + 2 * s["heads"] * (length - 1)) * dtype
    kept = s["h"] * dtype * layers + block if args.get("grad_checkpoint") else block * layers
    activations = tokens * (kept + LOGIT_COPIES * s["vocab"] * dtype)
    return MlxForecast(weights, trainable, trainable, states * trainable, activations, tokens, full=kind == "full")


def forecast_folder(model: Path, args: dict, batch: int, longest: int) -> Optional[MlxForecast]:
    """``forecast`` for the model folder ``model``; None where its config.json is not readable."""
    try:
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
        return forecast(config, args, batch, longest)
    except (OSError, ValueError, KeyError):
        return None


def recipe_args(recipe) -> dict:
    """mlx-lm's keys for ``recipe`` without mlx-lm: the config's own (an mlx-lm recipe), else the
    recipe's adapter and training keys in mlx-lm's names."""
    origin = recipe.origin if recipe.origin is not None and recipe.origin.format == "mlx" else None
    own = (lambda key, default: origin.value(key, default)) if origin else (lambda key, default: default)
    a, t = recipe.adapter, recipe.training
    return {"num_layers": own("num_layers", -1), "fine_tune_type": own("fine_tune_type", "lora" if a.method == "lora"
                                                                       else "full"),
            "lora_parameters": {"rank": a.r}, "optimizer": own("optimizer", "adamw"),
            "grad_checkpoint": t.gradient_checkpointing, "max_seq_length": recipe.data.max_length}


def forecast_text(recipe, target) -> tuple[str, Optional[bool]]:
    """``ftready-forecast`` for an MLX recipe: mlx-lm's step at the recipe's batch and its
    max_seq_length (the worst case the run may see) against ``target``'s usable memory (a Mac's
    unified memory less what macOS keeps, less memory_headroom); (text, fits or None)."""
    from ..units import human_bytes

    if not recipe.model.path:
        return "mlx-lm step: not forecast (a hub model: its config.json is not on this machine)", None
    t = recipe.training
    found = forecast_folder(Path(recipe.model.path), recipe_args(recipe), t.micro_batch_size, recipe.data.max_length)
    if found is None:
        return f"mlx-lm step: not forecast ({recipe.model.path}/config.json is not readable)", None
    text = (f"mlx-lm step (forecast/mlx.py, config.json alone): {human_bytes(found.peak_bytes)} at batch "
            f"{t.micro_batch_size} x {recipe.data.max_length} tokens (weights {human_bytes(found.weights_bytes)}, "
            f"trained {human_bytes(found.trainable_bytes)} + gradients and optimizer state "
            f"{human_bytes(found.gradient_bytes + found.optimizer_state_bytes)}, activations "
            f"{human_bytes(found.activation_bytes)})")
    if target is None:
        return text, None
    usable = target.usable_bytes(recipe.hardware.memory_headroom)
    fits = found.peak_bytes <= usable
    return (text + f"; {target.name}: MLX may use {human_bytes(usable)} (less the "
            f"{recipe.hardware.memory_headroom:.0%} memory_headroom): " + ("fits" if fits else "does NOT fit")), fits
