"""TRL: the YAML that ``trl sft --config`` reads (``ScriptArguments``, ``SFTConfig``,
``ModelConfig`` and ``DatasetMixtureConfig`` fields in one mapping), and the recipes built on
TRL (alignment-handbook). With TRL installed, TRL's own parser (``TrlParser`` over those
dataclasses) gives the defaults and the keys it knows, so they are TRL's; without TRL the
rows of ``keys/trl.toml`` do. Either way the rows say what each key becomes: a run without
``use_peft`` is a full fine-tune, without ``assistant_only_loss`` it trains every token."""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path
from typing import Any, Optional

from .base import Builder, first_row, row_format, safe_yaml
from .common import (SHARED_HANDLERS, accelerate_settings, chat_template_value, lora_targets, peft_default_targets,
                     read_accelerate)
from .table import Row, read_config

TITLE = "TRL (trl sft --config)"
DATASET_ENTRY_KEYS = ("path", "data_files", "split", "name", "data_dir")


def ask_trl(raw: dict) -> Optional[tuple[dict, frozenset, str]]:
    """TRL's own reading of ``raw``: (every field's value, config over TRL's default; the keys
    TRL's parser knows; TRL's version), or None without TRL."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import trl
            from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, SFTConfig, TrlParser
    except ImportError:
        return None
    parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig, DatasetMixtureConfig))
    known = frozenset(action.dest for action in parser._actions)
    parser.set_defaults_with_config(**{k: v for k, v in raw.items() if k in known})
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            namespace, _ = parser.parse_known_args([])
    except SystemExit:  # argparse refused a value (a choice, a type)
        raise ValueError(errors.getvalue().strip().splitlines()[-1] if errors.getvalue().strip()
                         else "refused") from None
    values = {k: v for k, v in vars(namespace).items() if v is not None}
    return values, known, trl.__version__


def translate(b: Builder) -> None:
    read_config(b, "trl", HANDLERS, ask_trl, "parser", "trl sft")
    _data(b)
    _precision_note(b)


def _dtype(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    if value in ("float32", "float16", "bfloat16"):
        b.put(name, "model", "dtype", value)
        return
    saved = _checkpoint_dtype(b)
    b.put(name, "model", "dtype", saved or "bfloat16")
    b.caveat(name.split(" ")[0], f"{value!r} loads the checkpoint's own dtype"
             + (f" ({saved}, from its config.json)" if saved else ": not readable here, the checks load bfloat16"))


def _checkpoint_dtype(b: Builder) -> Optional[str]:
    folder = b.tables.get("model", {}).get("path") or b.raw.get("model_name_or_path") or ""
    try:
        config = json.loads((b.local_path(str(folder)) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    dtype = config.get("dtype") or config.get("torch_dtype")
    return dtype if dtype in ("float32", "float16", "bfloat16") else None


def _quantization(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    if value and b.raw.get("use_peft"):
        b.put(name, "model", "quantization", "4bit" if name.startswith("load_in_4bit") else "8bit")
    elif value:
        b.caveat(name, "a quantized base without use_peft cannot be fully fine-tuned (TRL fails): set use_peft: true")
    else:
        b.mapped.append((name, "(off)"))


def _adapter(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    b.put(name, "adapter", "method", "lora" if value else "none")
    if value and not b.raw.get("lora_target_modules"):
        peft_default_targets(b, "lora_target_modules")


def _targets(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    lora_targets(b, name, value, ("all-linear",))


def _recorded(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    """Keys read together after the walk (data layout and loss flags): _data resolves them."""


def _chat_template(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    text = str(value)
    local = b.local_path(text) if "\n" not in text and "{" not in text else None
    if local is not None and local.is_dir():
        found = [p for p in (local / "chat_template.jinja",) if p.is_file()]
        if found:
            b.put(f"{name} (its chat_template.jinja)", "data", "chat_template", str(found[0]))
        else:
            b.caveat(name, f"{text!r} is a tokenizer folder without chat_template.jinja: the checks use the "
                     "model's own template; point [data] chat_template in ftready.toml at the .jinja file")
        return
    chat_template_value(b, name, value)


def _tokenizer(b: Builder, row, name: str, value: Any, default: bool) -> None:
    """tokenizer_name_or_path (older recipes built on TRL): the tokenizer, and its chat template,
    from another repository than the model's."""
    text = str(value or "")
    if not text:
        b.mapped.append((name, "(unset: the model's tokenizer)"))
        return
    local = b.local_path(text)
    template: Path | str | None = (next((p for p in (local / "chat_template.jinja",) if p.is_file()), None)
                                   if local.is_dir() else None)
    if template is None and local.is_dir():
        try:
            inline = json.loads((local / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template")
        except (OSError, ValueError):
            inline = None
        if isinstance(inline, str) and inline:
            chat_template_value(b, name, inline)
            template = "inline"
    if template is not None and template != "inline":
        b.put(f"{name} (its chat_template.jinja)", "data", "chat_template", str(template))
    what = ("the rows are rendered with its chat template ([data] chat_template); the checks still tokenize with "
            "the model's tokenizer, so a different vocabulary or special tokens are not reflected: point [model] "
            "path in ftready.toml at a folder holding both" if template is not None else
            f"the rows are rendered with {text!r}'s chat template, which is not readable here: data.template and "
            "data.masking verify the model's own; save that template as a .jinja file and set [data] chat_template "
            "in ftready.toml")
    b.caveat(name, f"the tokenizer comes from {text!r}, not the model ({row.versions}; {row.source}): {what}")


def _spectrum(b: Builder, row, name: str, value: Any, default: bool) -> None:
    """spectrum_config_path: only the parameters its unfrozen_parameters regexes match are trained."""
    import yaml

    path = b.local_path(str(value))
    try:
        listed = (safe_yaml(path.read_text(encoding="utf-8"), path) or {}).get("unfrozen_parameters")
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
        listed = None
    if isinstance(listed, list) and listed and all(isinstance(p, str) for p in listed):
        b.put(f"{name} (its {len(listed)} unfrozen_parameters)", "training", "trainable", listed)
        b.caveat(name, memory=True, text=f"Spectrum: every parameter frozen but those matching the {len(listed)} "
                 f"unfrozen_parameters of {value!r}, carried as [training] trainable ({row.versions}; {row.note})")
    else:
        b.caveat(name, memory=True, text=f"Spectrum trains only the parameters {value!r} lists (unfrozen_parameters), "
                 "which is not readable here: the checks train every parameter, over-counting gradients and "
                 "optimizer states by the frozen share (x3 their bytes with AdamW); set [training] trainable in "
                 f"ftready.toml to its unfrozen_parameters ({row.source})")


def _add_special_tokens(b: Builder, row, name: str, value: Any, default: bool) -> None:
    """dataset_kwargs.add_special_tokens (TRL 0.8 to 0.14): BOS/EOS added when tokenizing the formatted text."""
    b.put(name, "data", "add_special_tokens", bool(value))
    b.caveat(name, f"{value!r} (TRL 0.8 to 0.14: {row.versions.split(': ', 1)[-1]}): carried as [data] "
             f"add_special_tokens = {str(bool(value)).lower()}, the meaning the config was written with; {row.note}, "
             f"so a run on the installed TRL tokenizes as it does by default ({row.source})")


def _append_concat_token(b: Builder, row, name: str, value: Any, default: bool) -> None:
    b.caveat(name, f"{value!r}: {row.versions}; the plugin's packer separates rows its own way and {row.note}")


def _accelerate(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    config = read_accelerate(b, str(value), bundled=_bundled_accelerate(str(value)))
    accelerate_settings(b, name, value, config)


def _bundled_accelerate(name: str) -> Optional[str]:
    """The text of TRL's bundled accelerate config ``name`` (zero2, fsdp2, ...), when TRL is installed."""
    try:
        from importlib import resources

        candidate = resources.files("trl.accelerate_configs").joinpath(f"{name}.yaml")
        return candidate.read_text(encoding="utf-8") if candidate.is_file() else None
    except (ImportError, OSError):
        return None


def _mixed_precision(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    b.mapped.append((name, "(autocast: see the note on [model] dtype)"))


def _precision_note(b: Builder) -> None:
    """bf16/fp16 autocast over the weights' dtype (TRL: bf16 unset means on unless fp16)."""
    fp16 = bool(b.raw.get("fp16"))
    bf16 = b.raw.get("bf16")
    bf16 = (not fp16) if bf16 is None else bool(bf16)
    dtype = b.tables.get("model", {}).get("dtype")
    if (bf16 or fp16) and dtype == "float32":
        flag = "fp16" if fp16 else "bf16" + (" (TRL's default: on)" if b.raw.get("bf16") is None else "")
        b.caveat("bf16" if not fp16 else "fp16", memory=True, text=f"{flag} autocast over float32 weights: the checks "
                 f"run the step in "
                 "float32 without autocast, so activation memory is over-counted (up to 2x); set dtype: bfloat16 "
                 "to load the weights in bf16 as most recipes do")


def _data(b: Builder) -> None:
    files: list[Path] = []
    sources: list[str] = []
    mixture = b.raw.get("datasets") or []
    for i, entry in enumerate(mixture if isinstance(mixture, list) else []):
        where = f"datasets[{i}]"
        if not isinstance(entry, dict):
            raise b.fail(where, f"expected a mapping with path and data_files, got {entry!r}")
        found = _entry_files(b, where, entry)
        files += found
        sources += [f"{where}.data_files" if entry.get("data_files") else f"{where}.path"] * bool(found)
        if entry.get("split", "train") != "train":
            b.caveat(f"{where}.split", "the checks read every row of the files, whatever the split")
        for key in entry:
            if key not in DATASET_ENTRY_KEYS:
                b.not_checked(f"{where}.{key}", "dataset option the checks do not apply (they read every row)")
    name = b.raw.get("dataset_name")
    if name and not mixture:
        found = b.local_files("dataset_name", name)
        files += found
        sources += ["dataset_name"] * bool(found)
    elif name:
        b.caveat("dataset_name", "TRL ignores dataset_name when datasets is given")
    for key in ("dataset_mixture", "dataset_mixer"):  # alignment-handbook: hub datasets with weights
        if b.raw.get(key):
            b.caveat(key, "hub datasets (a mixture): the checks read local files only; set [data] train in "
                     "ftready.toml to a local copy of the rows")
    if b.raw.get("dataset_mixer"):
        _handbook_packing(b)
    if files:
        b.put(" + ".join(dict.fromkeys(sources)), "data", "train", [str(f) for f in files])
    text_field = b.raw.get("dataset_text_field") or "text"
    fmt = row_format(first_row(files), text_field)
    assistant_only = bool(b.raw.get("assistant_only_loss", False))
    completion_only = b.raw.get("completion_only_loss")
    if fmt is None and not files:
        fmt = "messages"
        b.caveat("datasets", "no local rows to read the format from: assumed chat messages (set [data] format "
                 "and train_on in ftready.toml otherwise)")
    if fmt == "messages":
        b.put("assistant_only_loss", "data", "train_on", "assistant" if assistant_only else "all")
        if completion_only:
            b.caveat("completion_only_loss", "applies to prompt-completion rows only; these rows are chat messages")
    elif fmt == "prompt_completion":
        b.put("completion_only_loss", "data", "train_on", "all" if completion_only is False else "completion")
        if assistant_only:
            b.caveat("assistant_only_loss", "TRL refuses assistant_only_loss on non-conversational rows")
    elif fmt == "text":
        b.put("dataset_text_field", "data", "train_on", "all")
        if text_field != "text":
            b.caveat("dataset_text_field", f"rows are read from their {text_field!r} field by TRL; "
                     "the checks read 'text'")
    if fmt != "text" and text_field != "text":
        b.not_checked("dataset_text_field", f"read by TRL for plain-text rows only; these rows are {fmt}")
    if fmt:
        b.tables.setdefault("data", {})["format"] = fmt
    b.tables.setdefault("data", {})["pipeline"] = "trl"  # the examples are TRL's own (trainers/trl.py)
    b.mapped.append(("(trl sft)", "[data] pipeline"))


# alignment-handbook's scripts/run_sft.py while recipes named their data dataset_mixer (2023-11 to
# 2025-07) built SFTTrainer(..., packing=True) whatever the config said.
HANDBOOK_RUN_SFT = ("https://github.com/huggingface/alignment-handbook/blob/e911214761ee2432b77406558adba3c4ab5a4fe9/"
                    "scripts/run_sft.py")


def _handbook_packing(b: Builder) -> None:
    """A dataset_mixer config is an alignment-handbook recipe of the era whose run_sft.py packed
    every run: read as packed, with a note naming the script (a fork may differ)."""
    written = b.raw.get("packing")
    b.put("dataset_mixer (alignment-handbook's run_sft.py)", "data", "packing", True)
    b.caveat("dataset_mixer", "an alignment-handbook recipe (dataset_mixer): the handbook's scripts/run_sft.py of "
             f"that era passes packing=True to SFTTrainer{'' if written is None else f', over packing: {written}'} "
             f"({HANDBOOK_RUN_SFT}), so the checks pack; if your script does not, set [data] packing = false in "
             "ftready.toml", memory=True)


def _entry_files(b: Builder, where: str, entry: dict) -> list[Path]:
    path, data_files = entry.get("path"), entry.get("data_files")
    if data_files:
        items = data_files if isinstance(data_files, list) else (
            [v for vs in data_files.values() for v in (vs if isinstance(vs, list) else [vs])]
            if isinstance(data_files, dict) else [data_files])
        base = b.local_path(entry.get("data_dir") or ".")
        local = [(base / str(item)).resolve() for item in items]
        if all(p.is_file() for p in local):
            return local
        b.caveat(f"{where}.data_files", "not local files (on the hub?): the checks read local files only; "
                 "set [data] train in ftready.toml to a local copy")
        return []
    return b.local_files(where + ".path", path) if isinstance(path, str) else []


HANDLERS = {**SHARED_HANDLERS, "dtype": _dtype, "quantization": _quantization, "adapter": _adapter,
            "targets": _targets, "datasets": _recorded, "data_flag": _recorded, "chat_template": _chat_template,
            "accelerate": _accelerate, "mixed_precision": _mixed_precision, "tokenizer": _tokenizer,
            "spectrum": _spectrum, "add_special_tokens": _add_special_tokens,
            "append_concat_token": _append_concat_token}
