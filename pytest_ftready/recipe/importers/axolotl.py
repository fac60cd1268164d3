"""Axolotl: its YAML config (``axolotl train config.yml``), read key by key through
``keys/axolotl.toml`` (Axolotl's names, deprecated names and defaults: sequence_len 512,
no adapter = full fine-tune, gradient checkpointing off, cosine schedule, fused AdamW).

Where Axolotl is installed (its own environment: it pins other transformers/TRL versions), the
config is first read by Axolotl's own validation (``validate_config``: its pydantic input
config, with its defaults, aliases and deprecations), so the defaults and the keys are the
installed Axolotl's and a config it refuses is refused with its message; without it, the
table's rows. Importing Axolotl costs 15 to 60 s, paid once per process."""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import warnings
from pathlib import Path
from typing import Any, Optional

from .base import Builder, first_row
from .common import (SHARED_HANDLERS, add_stop_tokens, attention, chat_template_value, lora_targets,
                     peft_default_targets)
from .table import Row, installed, plain, read_config

TITLE = "Axolotl"
FLAGS = {"flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "eager_attention": "eager"}
CHAT_TYPES = ("chat_template", "chat_template.default")
DATASET_KEYS_READ = {"path", "type", "data_files", "ds_type", "split", "field_messages", "roles_to_train",
                     "train_on_eos", "message_property_mappings", "message_field_role", "message_field_content",
                     "field", "chat_template", "name", "chat_template_jinja", "field_thinking", "template_thinking_key",
                     "split_thinking"}
REASONING = "reasoning_content"  # the message key Axolotl and the reasoning templates (Qwen3, DeepSeek-R1) use
# dataset types that are not text SFT rows (Axolotl's preference / RL strategies)
PREFERENCE_TYPES = ("chatml.", "llama3.", "zephyr.", "user_defined.", "bradley_terry", "stepwise_supervised")


def ask_axolotl(raw: dict) -> Optional[tuple[dict, frozenset, str, list[str]]]:
    """Axolotl's own reading of ``raw``: (every field's value after its validation, the keys its
    input config knows with their aliases, Axolotl's version, what it warned of while validating),
    or None without Axolotl. A config Axolotl refuses raises ValueError with its message."""
    if not installed("axolotl"):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import axolotl
        from axolotl.utils.config import validate_config
        from axolotl.utils.dict import DictDefault
        from axolotl.utils.schemas.config import AxolotlInputConfig
    fields = AxolotlInputConfig.model_fields
    known = frozenset([*fields, *(f.alias for f in fields.values() if f.alias)])
    said = _Said()
    logger = logging.getLogger("axolotl")
    logger.addHandler(said)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values = dict(validate_config(DictDefault(copy.deepcopy(raw))))
    except (ValueError, TypeError, DeprecationWarning) as exc:  # pydantic's ValidationError is a ValueError
        raise ValueError(_refusal(exc)) from None
    finally:
        logger.removeHandler(said)
    return {k: plain(v) for k, v in values.items() if v is not None}, known, axolotl.__version__, said.lines


class _Said(logging.Handler):
    """What Axolotl warns of while it validates a config (its deprecations)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(" ".join(record.getMessage().split()))


def _refusal(exc: BaseException) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        return (f"{where}: " if where else "") + " ".join(str(first.get("msg", exc)).split())
    return " ".join(str(exc).split())


def translate(b: Builder) -> None:
    read_config(b, "axolotl", HANDLERS, ask_axolotl, "config validation", "axolotl train")
    _finish(b)


def _attention_flag(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    if not value:
        b.mapped.append((name, "(off)"))
    elif b.raw.get("attn_implementation"):
        b.caveat(name, "ignored: attn_implementation is set and wins")
    elif name in FLAGS:
        b.put(name, "model", "attn_implementation", FLAGS[name])
    else:
        attention(b, name, name.replace("_attention", ""))


def _quantization(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    if value and b.raw.get("adapter") in ("lora", "qlora"):
        b.put(name, "model", "quantization", "4bit" if name == "load_in_4bit" else "8bit")
    elif value:
        b.caveat(name, "a quantized base without an adapter cannot be fully fine-tuned: set adapter: qlora")
    else:
        b.mapped.append((name, "(off)"))


def _adapter(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    if value in ("lora", "qlora"):
        b.put(name, "adapter", "method", "lora")
        if not b.raw.get("lora_target_modules") and not b.raw.get("lora_target_linear"):
            peft_default_targets(b, "lora_target_modules")
        unset = [key for key in ("lora_r", "lora_alpha") if b.raw.get(key) is None]
        if unset:
            b.caveat(unset[0], f"{' and '.join(unset)} unset: Axolotl hands peft None (no rank, no scale), so its LoRA "
                     "layers cannot be built as written; the checks use the recipe's defaults (r 16, alpha 32): set "
                     f"{' and '.join(unset)} in the config")
        if value == "qlora" and not b.raw.get("load_in_8bit"):
            b.put(name, "model", "quantization", "4bit")
    elif value:
        raise b.fail("adapter", f"expected lora or qlora (or no adapter for a full fine-tune), got {value!r}")
    else:
        b.put(name if not default else "adapter (absent: full fine-tune)", "adapter", "method", "none")


def _targets(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    """Axolotl trains the union of every linear layer (lora_target_linear) and the modules named
    in lora_target_modules (a string there is one module name: Axolotl lists it with the others)."""
    if name == "lora_target_linear":
        if value:
            named = b.raw.get("lora_target_modules") or []
            lora_targets(b, name, "linear", ("linear",), "axolotl",
                         extra=tuple([named] if isinstance(named, str) else named))
        else:
            b.mapped.append((name, "(off)"))
    elif b.raw.get("lora_target_linear"):
        b.mapped.append((name, "[adapter] target_modules (with lora_target_linear: the union)"))
    else:
        lora_targets(b, name, value)


def _chat_template(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    if name == "chat_template_jinja" or value == "jinja":
        chat_template_value(b, "chat_template_jinja", b.raw.get("chat_template_jinja"))
    elif str(value).startswith("tokenizer_default"):
        b.mapped.append((name, "(the tokenizer's own template)"))
    else:
        b.caveat(name, f"Axolotl renders with its built-in {value!r} template, which the checks cannot load without "
                 "Axolotl: data.template and data.masking verify the model's own template; save Axolotl's template "
                 "as a .jinja file and set [data] chat_template in ftready.toml to verify that one")


def _special_tokens(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    if isinstance(value, dict) and value.get("eos_token"):
        add_stop_tokens(b, "special_tokens.eos_token", [value["eos_token"]])
    others = sorted(k for k in (value or {}) if k != "eos_token")
    if others:
        b.caveat(name, f"{', '.join(others)} set or added by Axolotl are not applied by the checks")


def _train_on_inputs(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    b.mapped.append((name, "[data] train_on (with datasets)"))


def _checkpointing(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    b.put(name, "training", "gradient_checkpointing", bool(value))
    if value in ("offload", "offload_disk"):
        b.put(name, "training", "activation_offloading", True)
        b.caveat(name, memory=True, text=f"{value!r} keeps the checkpoints off the device: carried as [training] "
                 f"activation_offloading; "
                 "where the forecast cannot model it the measured peak over-counts by the checkpointed activations")


def _datasets(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    entries = value
    if not isinstance(entries, list) or not entries:
        raise b.fail("datasets", "expected a list of datasets with path and type, e.g. "
                     "[{path: data/train.jsonl, type: chat_template}]")
    files: list[Path] = []
    kinds: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"datasets[{i}]"
        if not isinstance(entry, dict):
            raise b.fail(where, f"expected a mapping with path and type, got {entry!r}")
        kind = entry.get("type")
        if isinstance(kind, str) and (kind.startswith(PREFERENCE_TYPES) or kind in ("dpo", "kto", "orpo")):
            raise b.fail(f"{where}.type", f"{kind!r} is a preference/RL dataset strategy: the checks judge text "
                         "supervised fine-tuning, so this config is refused")
        found = _entry_files(b, where, entry)
        if kind in CHAT_TYPES or kind is None and entry.get("field_messages"):
            kinds.add("messages")
            _chat_entry(b, where, entry)
            _reasoning(b, where, entry, found)
        elif kind == "completion":
            kinds.add("text")
            if entry.get("field", "text") != "text":
                b.caveat(f"{where}.field", "completion text is read from 'text' by the checks")
        else:
            b.caveat(f"{where}.type", f"{kind!r} rows are formatted by Axolotl's own prompt strategy: "
                     "this dataset is left out of the data checks (stack, memory and lifecycle still use the others)")
            continue
        if entry.get("split", "train") != "train":
            b.caveat(f"{where}.split", "the checks read every row of the files")
        for key in entry:
            if key not in DATASET_KEYS_READ:
                b.not_checked(f"{where}.{key}", "dataset option the checks do not apply")
        files += found
    if len(kinds) > 1:
        raise b.fail("datasets", "chat_template and completion datasets mixed: the checks read one row format; "
                     "check them as two configs")
    fmt = kinds.pop() if kinds else None
    if fmt:  # the row format is known even when the rows are on the hub: a side file supplies local files
        data = b.tables.setdefault("data", {})
        data["format"] = fmt
        data["train_on"] = "assistant" if fmt == "messages" else "all"
        b.mapped.append(("datasets[].type", "[data] format, train_on"))
    if files:
        b.put("datasets[].path", "data", "train", [str(f) for f in files])


def _chat_entry(b: Builder, where: str, entry: dict) -> None:
    field = entry.get("field_messages", "messages")
    if field != "messages":
        b.caveat(f"{where}.field_messages", f"messages are read from {field!r} by Axolotl; the checks read "
                 "'messages': data.format fails until the rows use it")
    for key in ("message_property_mappings", "message_field_role", "message_field_content"):
        if key in entry:
            b.caveat(f"{where}.{key}", "renamed message fields are not applied: the checks read role and content")
    roles = entry.get("roles_to_train", ["assistant"])
    if sorted(roles) != ["assistant"]:
        b.caveat(f"{where}.roles_to_train", f"{roles} trained by Axolotl; data.masking verifies that only "
                 "assistant turns are trained")
    eos = entry.get("train_on_eos", "turn")
    if eos not in ("turn", "last"):
        b.caveat(f"{where}.train_on_eos", f"{eos!r}: data.masking expects every trained turn's stop token "
                 "trained and reports the difference")
    if entry.get("chat_template") and not str(entry["chat_template"]).startswith("tokenizer_default"):
        b.caveat(f"{where}.chat_template", "a per-dataset template is not applied: the checks use one template")


def _reasoning(b: Builder, where: str, entry: dict, files: list[Path]) -> None:
    """Axolotl's reasoning fields: each message's ``field_thinking`` is handed to the template as
    ``template_thinking_key`` and trained with the assistant turn it belongs to (the whole turn
    the template renders, reasoning included, is what data.masking expects trained)."""
    field = entry.get("field_thinking") or REASONING
    key = entry.get("template_thinking_key") or REASONING
    if entry.get("split_thinking"):
        b.caveat(f"{where}.split_thinking", "Axolotl splits a <think>...</think> block out of each assistant content "
                 f"into {key!r} (Qwen3 templates): the checks render the content as written, so where the template "
                 "renders reasoning apart (or drops it from earlier turns) data.masking sees other tokens")
    if field == key:
        if "field_thinking" in entry or "template_thinking_key" in entry:
            b.mapped.append((f"{where}.field_thinking", f"(the rows' {field!r} is what the template reads: "
                             f"rendered and "
                             "trained with the assistant turn, as data.masking expects)"))
        return
    row = first_row(files)
    messages = row.get(entry.get("field_messages", "messages")) if isinstance(row, dict) else None
    carried = isinstance(messages, list) and any(isinstance(m, dict) and field in m for m in messages)
    if not carried and isinstance(messages, list):
        b.mapped.append((f"{where}.field_thinking", f"(no message of the first row has {field!r}: nothing renamed)"))
        return
    b.caveat(f"{where}.field_thinking", f"Axolotl hands each message's {field!r} to the template as {key!r} and "
             "trains it with the assistant turn; the checks render the rows as written, where the template finds no "
             f"{key!r}: data.template and data.masking see the turns without their reasoning (fewer trained tokens "
             f"than Axolotl's). Name the field {key!r} in the rows to have it checked")


def _entry_files(b: Builder, where: str, entry: dict) -> list[Path]:
    data_files = entry.get("data_files")
    if data_files:
        items = data_files if isinstance(data_files, list) else [data_files]
        local = [b.local_path(str(item)) for item in items]
        if all(p.exists() for p in local):
            return local
        b.caveat(f"{where}.data_files", "not local files (on the hub?): the checks read local files only; "
                 "set [data] train in ftready.toml to a local copy")
        return []
    path = entry.get("path")
    return b.local_files(where + ".path", path) if isinstance(path, str) else []


def _finish(b: Builder) -> None:
    """What needs several keys at once: train_on_inputs over the datasets' train_on."""
    data = b.tables.setdefault("data", {})
    if b.raw.get("train_on_inputs") and data.get("format"):
        b.put("train_on_inputs", "data", "train_on", "all")


HANDLERS = {**SHARED_HANDLERS, "attention_flag": _attention_flag,
            "quantization": _quantization, "adapter": _adapter, "targets": _targets, "chat_template": _chat_template,
            "special_tokens": _special_tokens, "train_on_inputs": _train_on_inputs,
            "checkpointing": _checkpointing, "datasets": _datasets}
