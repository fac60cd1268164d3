"""LLaMA-Factory: the YAML of ``llamafactory-cli train config.yaml`` and the
``dataset_info.json`` in its ``dataset_dir`` (default ``data``), read key by key through
``keys/llamafactory.toml`` (with transformers' TrainingArguments rows). Only ``stage: sft`` is
a supervised fine-tune. LLaMA-Factory formats chats with its own ``template`` (Python, not the
tokenizer's Jinja), so the checks verify the tokenizer's template and say so.

Where LLaMA-Factory is installed, the config is first parsed by its own argument dataclasses
(``HfArgumentParser`` over ``hparams.parser._TRAIN_ARGS``, as ``llamafactory-cli train`` parses
it, with their ``__post_init__`` checks), so the defaults and the keys are the installed
LLaMA-Factory's and a config its parser refuses is refused with its message; without it, the
table's rows."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import warnings
from pathlib import Path
from typing import Any, Optional

from .base import Builder, data_files_in
from .common import SHARED_HANDLERS, lora_targets
from .table import Row, installed, load_table, plain, read_config, table_section

TITLE = "LLaMA-Factory"
DATASET_DIR = "data"
OPENAI_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
MEDIA_COLUMNS = ("images", "videos", "audios")
ENTRY_KEYS = ("file_name", "formatting", "columns", "tags", "hf_hub_url", "ms_hub_url", "om_hub_url", "script_url",
              "cloud_file_name")
SHAPING_KEYS = ("formatting", "columns", "tags", "ranking")  # what of a dataset entry shapes the examples


def ask_llamafactory(raw: dict, unparsed: tuple = ()) -> Optional[tuple[dict, frozenset, str]]:
    """LLaMA-Factory's own parsing of ``raw``: (every argument's value, the keys its dataclasses
    know, its version), or None without LLaMA-Factory. Its own argument dataclasses (model, data,
    finetuning, generating) parse the config with their checks; its TrainingArguments give their
    defaults only (their checks are the machine's: bf16 on a CPU, a DeepSpeed install), and
    ``unparsed`` keys (the sharding ones) are left to the importer. A config its parser refuses
    raises ValueError with its message."""
    if not installed("llamafactory"):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import llamafactory
        from llamafactory.hparams.parser import _TRAIN_ARGS, HfArgumentParser
        from transformers import TrainingArguments
    own = [cls for cls in _TRAIN_ARGS if not issubclass(cls, TrainingArguments)]
    values = {f.name: plain(_default(f)) for cls in _TRAIN_ARGS if cls not in own
              for f in dataclasses.fields(cls) if f.init}
    known = frozenset([*values, *(f.name for cls in own for f in dataclasses.fields(cls) if f.init)])
    args = {k: v for k, v in raw.items() if k in known and k not in values and k not in unparsed}
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parsed = HfArgumentParser(own).parse_dict(args, allow_extra_keys=True)
    except (ValueError, TypeError) as exc:
        raise ValueError(" ".join(str(exc).split())) from None
    values.update({f.name: plain(getattr(obj, f.name)) for obj in parsed for f in dataclasses.fields(obj) if f.init})
    return {k: v for k, v in values.items() if v is not None}, known, llamafactory.__version__


def _default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def translate(b: Builder) -> None:
    sharding = tuple(k for k, cls in load_table("llamafactory").run.listed if cls == "sharding")
    read_config(b, "llamafactory", HANDLERS, lambda raw: ask_llamafactory(raw, sharding), "argument parser",
                "llamafactory-cli train")
    _data(b)
    _finetuning(b)
    _multimodal_template(b)
    _serving(b)


# infer_backend (hparams/model_args.py): the engine `llamafactory-cli chat/api` serves the model with
SERVING_BACKENDS = {"huggingface": "transformers", "vllm": "vllm"}
VLLM_MAX_LORA_RANK = 32  # LLaMA-Factory's vllm_max_lora_rank default (hparams/model_args.py), passed to vLLM


def _serving(b: Builder) -> None:
    """infer_backend names the serving engine ([serving] engine); with vllm, vllm_max_lora_rank is
    the --max-lora-rank LLaMA-Factory starts vLLM with (its default 32)."""
    backend = b.raw.get("infer_backend")
    if backend is None:
        return
    engine = SERVING_BACKENDS.get(str(backend).lower())
    if engine is None:
        b.caveat("infer_backend", f"{backend!r}: no serving check knows this backend; [serving] engine stays unset")
        return
    b.put("infer_backend", "serving", "engine", engine)
    if engine == "vllm":
        rank = b.raw.get("vllm_max_lora_rank", VLLM_MAX_LORA_RANK)
        b.put("vllm_max_lora_rank", "serving", "max_lora_rank",
              b.integer("vllm_max_lora_rank", rank, "a LoRA rank such as 32", low=1))


def _multimodal_template(b: Builder) -> None:
    """A template LLaMA-Factory builds with a multimodal plugin: with a vision-language model it
    trains media rows and freezes the vision tower and projector (its defaults), which the text
    checks neither load nor count; said in a note naming the template."""
    template = b.raw.get("template")
    plugin = _multimodal_plugin(str(template)) if template else None
    if plugin:
        b.caveat("template", f"{template!r} is one of LLaMA-Factory's multimodal templates ({plugin}): with a "
                 "vision-language model LLaMA-Factory loads its vision tower and projector, frozen by default "
                 "(freeze_vision_tower, freeze_multi_modal_projector), and trains image/video/audio rows; the checks "
                 "judge text rows on the language model only, so with such a model memory is under-counted by the "
                 "vision weights and media rows are not judged (with a text model of this family nothing changes)",
                 memory=True)


def _multimodal_plugin(template: str) -> Optional[str]:
    """The multimodal plugin LLaMA-Factory builds ``template`` with (the installed LLaMA-Factory's
    registry, else ``[multimodal_templates]`` of keys/llamafactory.toml), or None."""
    if installed("llamafactory"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from llamafactory.data.template import TEMPLATES
        found = TEMPLATES.get(template)
        name = type(found.mm_plugin).__name__ if found is not None else ""
        return name if name and name != "BasePlugin" else None
    listed = table_section("llamafactory", "multimodal_templates")["names"]
    return "its multimodal plugin" if template in listed else None


def _quantization(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    if value not in (4, 8):
        raise b.fail("quantization_bit", f"expected 4 or 8, got {value!r}")
    b.put(name, "model", "quantization", f"{value}bit")


def _recorded(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    """Keys read together after the walk (adapter shape, data): _finetuning and _data resolve them."""


def _freeze(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    if default:  # LLaMA-Factory's own default (its parser was asked): _finetuning reads it where it applies
        return
    if (b.raw.get("finetuning_type") or "lora") != "freeze":
        b.caveat(name, f"ignored by LLaMA-Factory: finetuning_type is {b.raw.get('finetuning_type') or 'lora'}, "
                 "not freeze")


def _lora_alpha(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    rank = b.raw.get("lora_rank") or 8
    b.put(name, "adapter", "alpha", rank * 2 if default else value)


def _targets(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    names = [t.strip() for t in (value.split(",") if isinstance(value, str) else value) if str(t).strip()]
    lora_targets(b, name, names, ("all",), "llamafactory")


def _packing(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    b.put(name, "data", "packing", bool(value) or bool(b.raw.get("packing")) or bool(b.raw.get("neat_packing")))
    if value and name.startswith("neat_packing"):
        b.caveat("neat_packing", "packed rows do not attend to each other: data.packing verifies the plugin's "
                 "own packing of the same rows")
    elif value:
        b.caveat(name, "data.masking verifies each row's labels before packing; data.packing checks with the "
                 "plugin's own packer, not LLaMA-Factory's")


def _finetuning(b: Builder) -> None:
    """finetuning_type with the freeze / LLaMA-Pro keys: what is trained."""
    kind = b.raw.get("finetuning_type") or "lora"
    if kind in ("lora", "oft"):
        b.put("finetuning_type", "adapter", "method", "lora")
        if kind == "oft":
            b.caveat("finetuning_type", "OFT adapters are measured as LoRA of the same targets (oft_rank is not "
                     "a LoRA rank): adapter memory may differ by the two methods' parameter counts")
    elif kind in ("full", "freeze"):
        b.put("finetuning_type", "adapter", "method", "none")
    else:
        raise b.fail("finetuning_type", f"expected lora, oft, freeze or full, got {kind!r}")
    if kind != "freeze":
        return
    layers = b.integer("freeze_trainable_layers", b.raw.get("freeze_trainable_layers", 2), "a layer count (n > 0: the "
                       "last n layers, n < 0: the first -n)", low=-(1 << 20), high=1 << 20)
    if layers == 0:
        raise b.fail("freeze_trainable_layers", "expected a layer count other than 0 (n > 0: the last n layers, n < 0: "
                     "the first -n), got 0: write how many layers freeze tuning trains")
    modules = str(b.raw.get("freeze_trainable_modules", "all"))
    total = _layer_count(b)
    if b.raw.get("use_llama_pro"):
        b.caveat("use_llama_pro", memory=True, text=f"LLaMA-Pro adds {abs(layers)} copied blocks and trains only them: "
                 f"the checks do "
                 "not expand the model, so weights are under-counted by those blocks and trained parameters by "
                 "everything else frozen; set [training] trainable in ftready.toml to the new blocks' names")
        return
    if total is None:
        b.caveat("freeze_trainable_layers", f"freeze tuning trains the {'last' if layers > 0 else 'first'} "
                 f"{abs(layers)} layers ({modules} modules): the layer count is not readable here (a hub model), so "
                 "[training] trainable is unset and the checks train every parameter (an upper bound); set it in "
                 "ftready.toml, e.g. trainable = [\"model\\\\.layers\\\\.(30|31)\\\\.\"]")
        return
    picked = list(range(total - layers, total)) if layers > 0 else list(range(-layers))
    suffix = "" if modules == "all" else r"(" + "|".join(m.strip() for m in modules.split(",")) + r")"
    pattern = r".*\.layers\.(" + "|".join(map(str, picked)) + r")\..*" + suffix + r".*"
    b.put("freeze_trainable_layers", "training", "trainable", [pattern])


def _layer_count(b: Builder):
    folder = b.tables.get("model", {}).get("path")
    if not folder:
        return None
    try:
        config = json.loads((b.local_path(str(folder)) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    count = config.get("num_hidden_layers")
    return count if isinstance(count, int) else None


def _data(b: Builder) -> None:
    names = b.raw.get("dataset")
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if names and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise b.fail("dataset", f"expected dataset names of dataset_info.json (\"my_chats\" or \"a,b\" or a list), "
                     f"got {type(names).__name__}: write dataset: my_chats")
    if not isinstance(b.raw.get("dataset_dir") or DATASET_DIR, str):
        raise b.fail("dataset_dir", f"expected the folder holding dataset_info.json (a path), got "
                     f"{type(b.raw['dataset_dir']).__name__}: write dataset_dir: data")
    if not names:
        what = "" if b.raw.get("do_train") else " (no do_train either: an inference, evaluation or export config?)"
        raise b.fail("dataset", f"missing{what}; a training config names the datasets of dataset_info.json, "
                     "e.g. dataset: my_chats")
    folder = b.local_path(b.raw.get("dataset_dir") or DATASET_DIR)
    info_path = folder / "dataset_info.json"
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        b.caveat("dataset_dir", f"{info_path} not found (LLaMA-Factory reads the datasets' descriptions there): "
                 "the datasets cannot be read; set [data] train in ftready.toml, or dataset_dir to the folder "
                 "holding dataset_info.json")
        b.inputs["dataset_entry_unreadable"] = (
            f"LLaMA-Factory's own pipeline reads the config's datasets as {info_path} describes them, and it cannot "
            f"be read (FileNotFoundError); set dataset_dir in {b.path.name} to the folder holding dataset_info.json")
        info = None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise b.fail("dataset_dir", f"{info_path} cannot be read as JSON: {exc}") from None
    if info is not None and not isinstance(info, dict):
        raise b.fail("dataset_dir", f"{info_path} holds a JSON {type(info).__name__}; LLaMA-Factory reads an object "
                     "there, one description per dataset name ({\"my_chats\": {\"file_name\": ...}})")
    if info is not None:
        _dataset_entry(b, names, info, info_path)
    files: list[Path] = []
    known = info if info is not None else {}
    for name in names if info is not None else []:
        where = f"dataset {name!r}"
        entry = known.get(name)
        if name in known and not isinstance(entry, dict):
            raise b.fail("dataset", f"{info_path.name} {name}: expected a mapping like {{\"file_name\": "
                         f"\"chats.jsonl\", \"formatting\": \"sharegpt\"}}, got {type(entry).__name__}: write "
                         "the dataset's description as LLaMA-Factory's data/README describes it")
        if not isinstance(entry, dict):
            raise b.fail("dataset", f"{name!r} is not described in {info_path}; known: {', '.join(sorted(known))}")
        if not isinstance(entry.get("file_name", ""), str):
            raise b.fail("dataset", f"{info_path.name} {name}.file_name: expected a file name (a string), got "
                         f"{type(entry['file_name']).__name__}: write the rows' file, relative to {folder}")
        for part in ("columns", "tags"):
            if not isinstance(entry.get(part, {}), dict):
                raise b.fail("dataset", f"{info_path.name} {name}.{part}: expected a mapping like "
                             f"{{\"messages\": \"conversations\"}}, got {type(entry[part]).__name__}: write "
                             f"{part} as LLaMA-Factory's data/README describes it")
        media = [c for c in MEDIA_COLUMNS if c in entry.get("columns", {})]
        if media:
            raise b.fail("dataset", f"{name!r} has {', '.join(media)} columns in {info_path.name}: multimodal "
                         "training, which the text checks cannot judge; this config is refused")
        formatting = entry.get("formatting", "alpaca")
        columns = entry.get("columns", {})
        tags = {**{"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt"},
                **entry.get("tags", {})}
        if formatting != "sharegpt":
            b.caveat(where, f"formatting {formatting!r} rows are assembled by LLaMA-Factory: this dataset is left out "
                     "of the data checks")
            continue
        if columns.get("messages", "conversations") != "messages" or any(tags[k] != v for k, v in OPENAI_TAGS.items()):
            b.caveat(where, "sharegpt rows with other column or tag names than messages/role/content/user/assistant "
                     "are left out of the data checks (the checks read OpenAI-style messages)")
            continue
        for key in ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name"):
            if entry.get(key):
                b.caveat(where, f"{key}: a remote dataset is left out of the data checks")
                break
        else:
            local = folder / entry.get("file_name", "")
            if local.is_file():
                files.append(local)
            elif local.is_dir():
                files += data_files_in(local)
            else:
                raise b.fail("dataset", f"{name!r}: file_name {entry.get('file_name')!r} not found in {folder}")
        for key in entry:
            if key not in ENTRY_KEYS:
                b.not_checked(f"{info_path.name} {name}.{key}", "dataset option the checks do not apply")
    if files:
        b.put("dataset + dataset_info.json", "data", "train", [str(f) for f in files])
    b.tables.setdefault("data", {})["format"] = "messages"
    if b.raw.get("train_on_prompt", False):
        b.put("train_on_prompt", "data", "train_on", "all")
    elif b.raw.get("mask_history", False):
        b.put("mask_history", "data", "train_on", "last_assistant")
    else:
        b.put("train_on_prompt (default False)", "data", "train_on", "assistant")


def _dataset_entry(b: Builder, names: list, info: dict, info_path: Path) -> None:
    """What of the datasets' descriptions shapes the examples, for LLaMA-Factory's own run: the
    checks hand it their rows as one dataset described the same way."""
    shapes = {json.dumps({k: info[n][k] for k in SHAPING_KEYS if k in info[n]}, sort_keys=True)
              for n in names if isinstance(info.get(n), dict)}
    if len(shapes) == 1:
        b.inputs["dataset_entry"] = json.loads(shapes.pop())
    elif shapes:
        b.inputs["dataset_entry_mixed"] = (
            f"{b.path}: datasets {', '.join(names)} are described with {len(shapes)} different formattings, columns "
            f"or tags in {info_path}; the checks hand every training file to LLaMA-Factory as one dataset: keep one "
            "description per config")


def _thinking(b: Builder, row: Row, name: str, value: Any, default: bool) -> None:
    """enable_thinking: LLaMA-Factory's ReasoningTemplate puts the empty <think> block of an answer
    without reasoning in the response (true, its default) or in the prompt (false: no loss)."""
    b.put(name, "data", "train_empty_reasoning", value is not False)
    if value is False:
        b.caveat(name, "LLaMA-Factory puts a reasoning template's empty <think> block in the prompt and strips the "
                 "answers' reasoning; data.masking judges the labels of the pipeline it runs: LLaMA-Factory's own "
                 "where it is installed, else the model's Jinja template, which may train the block",
                 handed=b.runs.get(name) == "handed")


HANDLERS = {**SHARED_HANDLERS, "mixed_precision": SHARED_HANDLERS["precision"], "quantization": _quantization,
            "finetuning": _recorded, "freeze": _freeze, "lora_alpha": _lora_alpha, "targets": _targets,
            "datasets": _recorded, "train_on": _recorded, "packing": _packing,
            "thinking": _thinking}
