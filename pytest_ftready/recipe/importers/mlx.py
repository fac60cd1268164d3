"""mlx-lm: its LoRA config (``mlx_lm lora -c lora_config.yaml``), read key by key through
``keys/mlx.toml``. Where mlx-lm is installed its ``CONFIG_DEFAULTS`` (``mlx_lm/lora.py``) give
the defaults, read from its source file (mlx-lm is not imported: that imports mlx); without it,
the table's rows (mlx-lm 0.32.2: lora on the last 16 blocks, rank 8, scale 20, batch 4, 1,000
iterations, Adam at 1e-5, max_seq_length 2048, no prompt masking).

An mlx-lm recipe trains on Apple's MLX: ``[hardware] device = "mlx"``. The data folder's
``train.jsonl`` is the training data, ``valid.jsonl`` the evaluation data; the row layout
(``messages``, ``prompt``/``completion``, ``text``, or the ``*_feature`` names) and
``mask_prompt`` decide what is trained: the last message of a chat row (not every assistant
turn), the completion, or everything."""

from __future__ import annotations

import ast
import json
from typing import Any, Optional

from .base import Builder, first_row, row_format
from .common import SHARED_HANDLERS, lora_targets, map_optimizer
from .table import Row, installed, read_config

TITLE = "mlx-lm (mlx_lm lora -c)"
# Keys only an mlx-lm LoRA config has (with ``model`` and ``data``, which the others do not use
# at the top level as plain strings): enough to tell it apart from Axolotl, LLaMA-Factory and TRL.
MLX_KEYS = ("fine_tune_type", "num_layers", "lora_parameters", "iters", "mask_prompt", "grad_checkpoint",
            "resume_adapter_file", "adapter_path", "max_seq_length", "steps_per_eval", "val_batches", "save_every")
FEATURES = {"prompt_feature": "prompt", "completion_feature": "completion", "chat_feature": "messages",
            "text_feature": "text"}
OPTIMIZERS = {"adam": "adamw", "adamw": "adamw", "sgd": "sgd", "adafactor": "adafactor"}
SCHEDULES = {"cosine_decay": "cosine", "linear_schedule": "linear", "exponential_decay": "linear",
             "step_decay": "linear", "join_schedules": "linear"}


def is_mlx(raw: dict) -> bool:
    """An mlx-lm LoRA config: ``model`` a string and two or more of its own keys (one alone, like
    ``max_seq_length``, could be anyone's), or ``lora_parameters`` / ``fine_tune_type`` (no other
    trainer has them)."""
    own = [key for key in MLX_KEYS if key in raw]
    return isinstance(raw.get("model", ""), str) and ("lora_parameters" in raw or "fine_tune_type" in raw
                                                      or len(own) >= 2)


def installed_defaults() -> Optional[tuple[dict, str]]:
    """(CONFIG_DEFAULTS of the installed mlx-lm, its version), read from ``mlx_lm/lora.py``'s
    source without importing it; None where mlx-lm is not installed or the file has no literal
    CONFIG_DEFAULTS."""
    if not installed("mlx_lm"):
        return None
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(next(iter(spec.submodule_search_locations))) / "lora.py"
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
        value = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "CONFIG_DEFAULTS" for t in node.targets))
        defaults = ast.literal_eval(value)
    except (OSError, SyntaxError, ValueError, StopIteration):
        return None
    return dict(defaults), importlib.metadata.version("mlx-lm")


def ask_mlx(raw: dict) -> Optional[tuple[dict, frozenset, str]]:
    """mlx-lm's own defaults for ``raw`` (what ``mlx_lm lora`` fills in for absent keys), the keys
    it reads, its version; None without mlx-lm."""
    found = installed_defaults()
    if found is None:
        return None
    defaults, version = found
    return defaults, frozenset([*defaults, *FEATURES, "hf_dataset"]), version


def translate(b: Builder) -> None:
    b.put("(mlx-lm trains with MLX)", "hardware", "device", "mlx")
    read_config(b, "mlx", HANDLERS, ask_mlx, "CONFIG_DEFAULTS", "mlx_lm lora")
    _finish(b)


def _number(b: Builder, key: str) -> Optional[int]:
    value = b.raw.get(key)
    return b.integer(key, value, f"{key} as a whole number", low=-1) if value is not None else None


def _data(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    if b.raw.get("hf_dataset"):
        b.mapped.append((name, "(hf_dataset wins)"))
        return
    if not isinstance(value, str) or not value:
        raise b.fail("data", f"expected a folder with train.jsonl (and valid.jsonl, test.jsonl) or a hub dataset name, "
                     f"got {value!r}")
    folder = b.local_path(value)
    if not folder.is_dir():
        b.caveat(name.split(" ")[0], f"{value!r} is not a local folder (a hub dataset?): the checks read local rows; "
                 "set [data] train in ftready.toml to a local copy of its train split")
        return
    train = folder / "train.jsonl"
    if not train.is_file():
        raise b.fail("data", f"{folder} has no train.jsonl: mlx-lm reads train.jsonl, valid.jsonl and test.jsonl from "
                     "the data folder and stops with 'Training set not found or empty'; name the training file "
                     "train.jsonl")
    b.put(name, "data", "train", [str(train)])
    valid = folder / "valid.jsonl"
    if valid.is_file():
        b.put(f"{name} (valid.jsonl)", "data", "eval", [str(valid)])


def _hf_dataset(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    b.caveat(name.split(" ")[0], "hub datasets are not read by the checks (local rows only): set [data] train in "
             "ftready.toml to a local copy of the train split")


def _feature(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    key = name.split(" ")[0]
    if value != FEATURES.get(key, value):
        b.caveat(key, f"mlx-lm reads the rows' {value!r} as {FEATURES[key]!r}: the checks read the rows with "
                 f"mlx-lm's own dataset classes, the built-in engine's reading needs {FEATURES[key]!r}")
    else:
        b.mapped.append((name, "(the row layout mlx-lm reads)"))


def _mask_prompt(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    """Read in ``_finish`` with the row layout; noted here as mapped."""
    b.mapped.append((name, "[data] train_on (with the row layout)"))


def _fine_tune_type(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    if value in ("lora", "dora"):
        b.put(name, "adapter", "method", "lora")
        if value == "dora":
            b.caveat(name.split(" ")[0], "DoRA: each adapted layer also learns a magnitude vector and recomputes the "
                     "weight's norm every step; mlx-lm's own step measures it, the built-in engine's runs plain LoRA",
                     memory=True)
    elif value == "full":
        b.put(name, "adapter", "method", "none")
    else:
        raise b.fail("fine_tune_type", f"expected lora, dora or full, got {value!r} (mlx-lm stops with 'Received "
                     "unknown fine-tune-type')")


def _num_layers(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    count = b.integer(name.split(" ")[0], value, "the blocks that get adapters (-1: every block)", low=-1)
    layers = _model_layers(b)
    if layers is not None and count > layers:
        raise b.fail("num_layers", f"{count} blocks asked, but the model has {layers} (num_hidden_layers in its "
                     f"config.json): mlx-lm stops with 'Requested to train {count} layers but the model only has "
                     f"{layers} layers'; set num_layers: {layers} or -1")
    if count == -1 or (layers is not None and count == layers):
        b.mapped.append((name, "(every block)"))
        return
    b.mapped.append((name, f"(the last {count} blocks)"))
    b.caveat(name.split(" ")[0], f"adapters on the last {count} blocks only"
             + (f" of {layers}" if layers else "") + ": mlx-lm's own step measures that; the built-in engine and the "
             "torch forecast count adapters on every block (they over-count)", memory=True)


def _model_config(b: Builder) -> Optional[dict]:
    model = b.tables.get("model", {}).get("path") or b.raw.get("model")
    if not isinstance(model, str):
        return None
    try:
        return json.loads((b.local_path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _model_layers(b: Builder) -> Optional[int]:
    config = _model_config(b)
    layers = (config or {}).get("num_hidden_layers") or (config or {}).get("text_config", {}).get("num_hidden_layers")
    return int(layers) if isinstance(layers, int) else None


def _lora_parameters(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    if not isinstance(value, dict):
        raise b.fail("lora_parameters", f"expected a mapping of rank, scale, dropout (and keys), got {value!r}")
    if "scale" not in value:
        hint = " (mlx-lm's LoRA takes scale, not alpha)" if "alpha" in value else ""
        raise b.fail("lora_parameters", f"no scale{hint}: mlx-lm stops with \"LoRA config is missing required key "
                     "'scale'\"; write lora_parameters: {rank: 8, scale: 20.0, dropout: 0.0}")
    rank = b.integer("lora_parameters.rank", value.get("rank", 8), "the LoRA rank", low=1)
    scale = float(value["scale"])
    b.put(f"{name}.rank", "adapter", "r", rank)
    # mlx-lm adds scale * (x @ A @ B); peft adds (alpha / r) * (x @ A @ B): alpha = scale * rank
    b.put(f"{name}.scale (x rank: peft's alpha)", "adapter", "alpha", scale * rank)
    b.put(f"{name}.dropout", "adapter", "dropout", float(value.get("dropout", 0.0)))
    keys = value.get("keys")
    if keys:
        leaves = sorted({str(k).rsplit(".", 1)[-1] for k in keys})
        b.put(f"{name}.keys", "adapter", "target_modules", leaves)
    else:
        lora_targets(b, f"{name}.keys (unset: every linear layer of the block)", "all-linear", ("all-linear",))
    for extra in sorted(set(value) - {"rank", "scale", "dropout", "keys"}):
        b.not_checked(f"{name}.{extra}", "not a LoRA parameter mlx-lm reads")


def _iters(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    iters = b.integer(name.split(" ")[0], value, "micro-batch iterations", low=1)
    b.tables.setdefault("_mlx", {})["iters"] = iters  # epochs once the rows are counted (_finish)
    b.mapped.append((name, "[training] epochs (iterations x batch / rows)"))


def _save_every(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    every = b.integer(name.split(" ")[0], value, "iterations between saves", low=1)
    accumulation = _number(b, "grad_accumulation_steps") or 1
    b.put(name, "training", "save_steps", max(1, every // accumulation))
    if accumulation > 1:
        b.caveat(name.split(" ")[0], f"counts iterations (micro-batches): every {every} is an update every "
                 f"{every / accumulation:g} with grad_accumulation_steps {accumulation}")


def _optimizer(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    text = str(value).lower()
    if text == "muon":
        b.put(name, "training", "optimizer", "adamw")
        b.caveat(name.split(" ")[0], "Muon (orthogonalised momentum) is measured by mlx-lm's own step; the built-in "
                 "engine's run and the forecast count AdamW's two states (an over-count of one state)", memory=True)
        return
    if text not in OPTIMIZERS:
        raise b.fail("optimizer", f"expected adam, adamw, muon, sgd or adafactor, got {value!r}")
    map_optimizer(b, name, OPTIMIZERS[text])
    if text == "adam":
        b.caveat(name.split(" ")[0], "Adam without weight decay: the engine's AdamW with [training] weight_decay 0 is "
                 "the same update")


def _lr_schedule(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    if not value:
        b.put(name, "training", "lr_scheduler", "constant")
        return
    if not isinstance(value, dict) or "name" not in value:
        raise b.fail("lr_schedule", f"expected {{name: cosine_decay, arguments: [...], warmup: N}}, got {value!r}")
    kind = str(value["name"])
    b.put(f"{name}.name", "training", "lr_scheduler", SCHEDULES.get(kind, "linear"))
    if kind not in SCHEDULES:
        b.caveat("lr_schedule", f"{kind!r}: not a schedule the plugin knows; read as linear")
    if value.get("warmup"):
        b.put(f"{name}.warmup", "training", "warmup_steps", b.integer("lr_schedule.warmup", value["warmup"],
                                                                      "warm-up iterations"))


def _finish(b: Builder) -> None:
    """What needs several keys at once: the row layout and mask_prompt into [data] format and
    train_on, and iters into epochs."""
    data = b.tables.setdefault("data", {})
    features = {key: b.raw.get(key, plain) for key, plain in FEATURES.items()}
    row = first_row([b.local_path(str(p)) for p in data.get("train", [])])
    fmt: Optional[str]
    if row is not None and all(k in row for k in (features["prompt_feature"], features["completion_feature"])):
        fmt = "prompt_completion"
    elif row is not None and features["chat_feature"] in row:
        fmt = "messages"
    elif row is not None and features["text_feature"] in row:
        fmt = "text"
    else:
        fmt = row_format(row)
    mask = bool(b.raw.get("mask_prompt", False))
    if fmt == "text" and mask:
        raise b.fail("mask_prompt", "true on text rows: mlx-lm stops with 'Prompt masking not supported for text "
                     "dataset'; remove mask_prompt or write prompt/completion rows")
    if fmt:
        data["format"] = fmt
        masked = "last_assistant" if fmt == "messages" else "completion"
        data["train_on"] = masked if mask and fmt != "text" else "all"
        b.mapped.append(("mask_prompt", f"[data] train_on = {data['train_on']!r} ({fmt} rows)"))
        if fmt == "messages" and mask:
            b.caveat("mask_prompt", "mlx-lm trains the last message of each chat row only (its offset is the length "
                     "of every message before it): earlier assistant turns are context, not trained")
    if b.raw.get("lr_schedule") is None and "lr_scheduler" not in b.tables.get("training", {}):
        b.put("lr_schedule (unset: the learning rate is constant)", "training", "lr_scheduler", "constant")
    iters = b.tables.pop("_mlx", {}).get("iters")
    rows = _rows(b)
    if iters and rows:
        t = b.tables.setdefault("training", {})
        examples = iters * int(t.get("micro_batch_size", 4))
        b.tables["training"]["epochs"] = max(examples / rows, 1e-6)


def _rows(b: Builder) -> int:
    count = 0
    for path in b.tables.get("data", {}).get("train", []):
        try:
            with open(b.local_path(str(path)), encoding="utf-8") as handle:
                count += sum(1 for line in handle if line.strip())
        except OSError:
            return 0
    return count


HANDLERS = {**SHARED_HANDLERS, "data": _data, "hf_dataset": _hf_dataset, "feature": _feature,
            "mask_prompt": _mask_prompt, "fine_tune_type": _fine_tune_type, "num_layers": _num_layers,
            "lora_parameters": _lora_parameters, "iters": _iters, "save_every": _save_every,
            "mlx_optimizer": _optimizer, "lr_schedule": _lr_schedule}

__all__ = ["TITLE", "is_mlx", "translate"]
