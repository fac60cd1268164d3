"""LLaMA-Factory: the YAML of ``llamafactory-cli train config.yaml`` and the
``dataset_info.json`` in its ``dataset_dir`` (default ``data``). Only ``stage: sft`` is a
supervised fine-tune. LLaMA-Factory formats chats with its own ``template`` (Python, not the
tokenizer's Jinja), so the checks verify the tokenizer's template and say so."""

from __future__ import annotations

import json
from pathlib import Path

from .base import Builder, data_files_in
from .common import (map_optimizer, map_scheduler, mixed_precision_dtype, note_meanings,
                     packing_meaning, put_if, put_many)

TITLE = "LLaMA-Factory"
DEFAULTS = {"cutoff_len": 2048, "finetuning_type": "lora", "lora_rank": 8, "lora_dropout": 0.0,
            "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "learning_rate": 5e-5,
            "num_train_epochs": 3.0, "seed": 42, "save_steps": 500, "dataset_dir": "data"}
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION = {"fa2": "flash_attention_2", "sdpa": "sdpa", "disabled": "eager"}
OPENAI_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
MEANING = {
    "packing": packing_meaning("LLaMA-Factory"),
    "deepspeed": "memory checks measure one device without DeepSpeed sharding or offload: their peak is the "
                 "unsharded upper bound; stack, data and masking checks are unaffected",
    "max_steps": "LLaMA-Factory stops after max_steps; headroom.time and headroom.disk budget the epochs instead",
    "max_samples": "LLaMA-Factory trains on the first max_samples rows of each dataset; the checks read every row",
    "use_dora": "DoRA adds memory and compute: model.step_memory measures plain LoRA",
    "use_rslora": "rank-stabilised LoRA scales updates differently: model.overfit trains plain LoRA",
    "additional_target": "fully trained extra modules are not built by the checks: memory is under-counted",
    "use_unsloth": "Unsloth kernels change memory and speed: model.step_memory measures plain PEFT",
    "enable_liger_kernel": "Liger kernels change memory and speed: model.step_memory measures plain transformers",
    "warmup_ratio": "warm-up as a ratio is not translated: model.overfit uses warmup_steps",
    "adapter_name_or_path": "training continues an existing adapter: the checks start a fresh one",
    "neat_packing": "contamination-free packing: data.packing verifies the checks' own packing",
    "default_system": "LLaMA-Factory inserts a system message the rows do not have",
}


def translate(b: Builder) -> None:
    stage = b.get("stage", "sft")
    if stage != "sft":
        raise b.fail("stage", f"{stage!r} is not supervised fine-tuning: the checks cover stage: sft")
    b.mapped.append(("stage", "(sft)"))
    b.get("do_train")
    b.model("model_name_or_path", b.get("model_name_or_path"), b.get("model_revision"))
    if b.has("model_revision"):
        b.mapped.append(("model_revision", "[model] revision"))
    if mixed_precision_dtype(b, "bf16", "fp16") is None:
        b.tables.setdefault("model", {})["dtype"] = "float32"
    flash = b.get("flash_attn", "auto")
    if flash in ATTENTION:
        b.put("flash_attn", "model", "attn_implementation", ATTENTION[flash])
    put_if(b, "trust_remote_code", "model", "trust_remote_code")
    bits = b.get("quantization_bit")
    if bits in (4, 8):
        b.put("quantization_bit", "model", "quantization", f"{bits}bit")
        method = b.get("quantization_method", "bnb")
        if method != "bnb":
            b.caveat("quantization_method", f"{method!r}: the checks quantize with bitsandbytes")
    elif bits is not None:
        raise b.fail("quantization_bit", f"expected 4 or 8, got {bits!r}")

    kind = b.get("finetuning_type", DEFAULTS["finetuning_type"])
    if kind == "lora":
        b.put("finetuning_type", "adapter", "method", "lora")
        rank = b.get("lora_rank", DEFAULTS["lora_rank"])
        b.put("lora_rank", "adapter", "r", rank)
        b.put("lora_alpha", "adapter", "alpha", b.get("lora_alpha", rank * 2))
        b.put("lora_dropout", "adapter", "dropout", b.get("lora_dropout", DEFAULTS["lora_dropout"]))
        target = b.get("lora_target", "all")
        if target == "all":
            b.put("lora_target", "adapter", "target_modules", list(ALL_LINEAR))
            b.caveat("lora_target", f"'all' linear layers, read as {ALL_LINEAR} (Llama-style names); for another "
                     "architecture set [adapter] target_modules in ftready.toml")
        else:
            names = [t.strip() for t in (target.split(",") if isinstance(target, str) else target) if t.strip()]
            b.put("lora_target", "adapter", "target_modules", names)
    elif kind == "full":
        b.put("finetuning_type", "adapter", "method", "none")
    else:
        b.put("finetuning_type", "adapter", "method", "none")
        b.caveat("finetuning_type", f"{kind!r} trains only some layers: the checks measure a full fine-tune, "
                 "an upper bound on memory")

    _data(b)

    put_many(b, "training", [("per_device_train_batch_size", "micro_batch_size"),
                             ("gradient_accumulation_steps", "gradient_accumulation_steps"),
                             ("learning_rate", "learning_rate"), ("num_train_epochs", "epochs"), ("seed", "seed"),
                             ("save_steps", "save_steps"), ("save_total_limit", "save_total_limit"),
                             ("warmup_steps", "warmup_steps"), ("weight_decay", "weight_decay"),
                             ("output_dir", "output_dir"), ("tf32", "tf32")], DEFAULTS)
    b.put("disable_gradient_checkpointing", "training", "gradient_checkpointing",
          not b.get("disable_gradient_checkpointing", False))
    if b.has("optim"):
        map_optimizer(b, "optim", b.get("optim"))
    if b.has("lr_scheduler_type"):
        map_scheduler(b, "lr_scheduler_type", b.get("lr_scheduler_type"))
    note_meanings(b, MEANING)


def _data(b: Builder) -> None:
    names = b.get("dataset")
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not names:
        raise b.fail("dataset", "missing; expected the dataset names of dataset_info.json, e.g. dataset: my_chats")
    folder = b.local_path(b.get("dataset_dir", DEFAULTS["dataset_dir"]))
    info_path = folder / "dataset_info.json"
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise b.fail("dataset_dir", f"{info_path} not found: LLaMA-Factory reads the datasets' descriptions there; "
                     "set dataset_dir to the folder holding dataset_info.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise b.fail("dataset_dir", f"{info_path} cannot be read as JSON: {exc}") from None
    files: list[Path] = []
    for name in names:
        where = f"dataset {name!r}"
        entry = info.get(name)
        if not isinstance(entry, dict):
            raise b.fail("dataset", f"{name!r} is not described in {info_path}; known: {', '.join(sorted(info))}")
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
        for key in ("hf_hub_url", "ms_hub_url", "script_url", "cloud_file_name"):
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
            if key not in ("file_name", "formatting", "columns", "tags", "hf_hub_url", "ms_hub_url", "script_url",
                           "cloud_file_name"):
                b.not_checked(f"{info_path.name} {name}.{key}", "dataset option the checks do not apply")
    if not files:
        return  # named in caveats; Builder.finish asks for [data] train in ftready.toml
    b.put("dataset + dataset_info.json", "data", "train", [str(f) for f in files])
    b.tables["data"]["format"] = "messages"
    if b.get("train_on_prompt", False):
        b.put("train_on_prompt", "data", "train_on", "all")
    elif b.get("mask_history", False):
        b.put("mask_history", "data", "train_on", "last_assistant")
    else:
        b.put("train_on_prompt (false)", "data", "train_on", "assistant")
    b.put("cutoff_len", "data", "max_length", b.get("cutoff_len", DEFAULTS["cutoff_len"]))
    b.put("packing", "data", "packing", bool(b.get("packing", False) or b.get("neat_packing", False)))
    template = b.get("template")
    if template:
        b.caveat("template", f"LLaMA-Factory renders with its own {template!r} template (Python, not the tokenizer's "
                 "Jinja): data.template and data.masking verify the model's chat template; if they differ, save a "
                 "Jinja equivalent and set [data] chat_template in ftready.toml")
