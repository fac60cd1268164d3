"""TRL: the YAML that ``trl sft --config`` reads (``ScriptArguments``, ``SFTConfig``,
``ModelConfig`` and ``DatasetMixtureConfig`` fields in one mapping). Absent keys take TRL's
own defaults (TRL 1.16), not the recipe's: a run without ``use_peft`` is a full fine-tune,
without ``assistant_only_loss`` it trains on every token of a chat."""

from __future__ import annotations

from pathlib import Path

from .base import Builder, first_row, row_format
from .common import (map_optimizer, map_scheduler, note_meanings, packing_meaning, put_if, put_many)

TITLE = "TRL (trl sft --config)"
# The SFTConfig / TrainingArguments defaults that differ from the recipe's (TRL 1.16).
DEFAULTS = {"max_length": 1024, "learning_rate": 2e-5, "per_device_train_batch_size": 8,
            "gradient_accumulation_steps": 1, "num_train_epochs": 3.0, "gradient_checkpointing": True,
            "seed": 42, "save_steps": 500, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
            "output_dir": "trainer_output", "dtype": "float32"}
# Keys recognised as TRL's that change what a check means: named with what is still checked.
MEANING = {
    "packing": packing_meaning("TRL"),
    "deepspeed": "memory checks measure one device without DeepSpeed sharding or offload: their peak is the "
                 "unsharded upper bound; stack, data and masking checks are unaffected",
    "fsdp": "memory checks measure one device without FSDP sharding: their peak is the unsharded upper bound",
    "max_steps": "TRL stops after max_steps; headroom.time and headroom.disk budget the epochs instead",
    "use_liger_kernel": "Liger kernels change memory and speed: model.step_memory measures plain transformers",
    "padding_free": "padding-free batches are flattened by TRL's collator: data.masking verifies each example's "
                    "labels, the memory checks measure padded batches",
    "packing_strategy": "the checks pack with their own greedy packer; TRL's strategy decides which rows share "
                        "a sequence, not the labels data.masking verifies",
    "truncation_mode": "keep_end cuts the start of long rows: data.masking reports truncation assuming keep_start",
    "eos_token": "TRL replaces the tokenizer's EOS with it: read as an extra stop token ([data] stop_tokens)",
    "use_dora": "DoRA adds memory and compute: model.step_memory measures plain LoRA",
    "use_rslora": "rank-stabilised LoRA scales updates differently: model.overfit trains plain LoRA",
    "lora_target_parameters": "LoRA on parameters (MoE experts) is not built by the checks",
    "lora_modules_to_save": "fully trained extra modules are not built by the checks: memory is under-counted",
    "completion_only_loss": "",
    "dataset_text_field": "",
    "model_init_kwargs": "extra from_pretrained arguments are not applied by the checks",
    "dataset_kwargs": "skip_prepare_dataset and other dataset_kwargs are not applied by the checks",
    "warmup_ratio": "warm-up as a ratio is not translated: model.overfit uses warmup_steps",
}


def translate(b: Builder) -> None:
    b.model("model_name_or_path", b.get("model_name_or_path"), b.get("model_revision", "main"))
    if b.has("model_revision"):
        b.mapped.append(("model_revision", "[model] revision"))
    dtype = b.get("dtype", DEFAULTS["dtype"])  # TRL loads the weights in `dtype`; bf16/fp16 only autocast
    if dtype in ("float32", "float16", "bfloat16"):
        b.put("dtype", "model", "dtype", dtype)
    else:
        b.caveat("dtype", f"{dtype!r} loads the checkpoint's own dtype; the checks load bfloat16")
        b.tables.setdefault("model", {})["dtype"] = "bfloat16"
    for flag in ("bf16", "fp16"):
        if b.get(flag):
            b.caveat(flag, f"{flag} autocast over {dtype} weights: the checks run the step in {dtype} without "
                     "autocast, so activation memory is over-counted")
    put_if(b, "attn_implementation", "model", "attn_implementation")
    put_if(b, "trust_remote_code", "model", "trust_remote_code")
    if b.get("load_in_4bit", False):
        b.put("load_in_4bit", "model", "quantization", "4bit")
    elif b.get("load_in_8bit", False):
        b.put("load_in_8bit", "model", "quantization", "8bit")
    for key in ("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage"):
        if b.has(key):
            b.caveat(key, "the checks quantize with nf4 and double quantization whatever this says")

    peft = bool(b.get("use_peft", False))
    b.put("use_peft", "adapter", "method", "lora" if peft else "none")
    if peft:
        put_many(b, "adapter", [("lora_r", "r"), ("lora_alpha", "alpha"), ("lora_dropout", "dropout")], DEFAULTS)
        targets = b.get("lora_target_modules")
        if isinstance(targets, str):
            targets = [targets]
        if targets:
            b.put("lora_target_modules", "adapter", "target_modules", list(targets))
        else:
            b.caveat("lora_target_modules", "unset: PEFT picks the architecture's defaults; the checks use "
                     "[adapter] target_modules = [\"q_proj\", \"v_proj\"] (PEFT's Llama default)")

    _data(b)

    put_many(b, "training", [("per_device_train_batch_size", "micro_batch_size"),
                             ("gradient_accumulation_steps", "gradient_accumulation_steps"),
                             ("learning_rate", "learning_rate"), ("num_train_epochs", "epochs"),
                             ("gradient_checkpointing", "gradient_checkpointing"), ("seed", "seed"),
                             ("output_dir", "output_dir"), ("save_steps", "save_steps"),
                             ("save_total_limit", "save_total_limit"), ("warmup_steps", "warmup_steps"),
                             ("weight_decay", "weight_decay"), ("torch_compile", "compile"), ("tf32", "tf32")],
             DEFAULTS)
    if not b.has("save_total_limit"):
        b.caveat("save_total_limit", "unset: TRL keeps every checkpoint; headroom.disk counts the recipe's "
                 "default of 3 (set [training] save_total_limit in ftready.toml to budget more)")
    map_optimizer(b, "optim" if b.has("optim") else "optim (default adamw_torch_fused)",
                  b.get("optim", "adamw_torch_fused"))
    map_scheduler(b, "lr_scheduler_type" if b.has("lr_scheduler_type") else "lr_scheduler_type (default linear)",
                  b.get("lr_scheduler_type", "linear"))
    if b.get("use_cpu", False):
        b.put("use_cpu", "hardware", "device", "cpu")
    note_meanings(b, MEANING)
    if b.has("eos_token"):
        b.put("eos_token", "data", "stop_tokens", [b.get("eos_token")])


def _data(b: Builder) -> None:
    files: list[Path] = []
    sources: list[str] = []
    mixture = b.get("datasets") or []
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
            if key not in ("path", "data_files", "split", "name", "data_dir"):
                b.not_checked(f"{where}.{key}", "dataset option the checks do not apply (they read every row)")
    name = b.get("dataset_name")
    if name and not mixture:
        found = b.local_files("dataset_name", name)
        files += found
        sources += ["dataset_name"] * bool(found)
    elif name:
        b.caveat("dataset_name", "TRL ignores dataset_name when datasets is given")
    if b.has("dataset_config"):
        b.not_checked("dataset_config", "hub dataset configuration")
    for key in ("dataset_train_split", "dataset_test_split", "dataset_streaming"):
        b.get(key)
    if files:
        b.put(" + ".join(dict.fromkeys(sources)), "data", "train", [str(f) for f in files])
    text_field = b.get("dataset_text_field", "text")
    fmt = row_format(first_row(files), text_field)
    assistant_only = bool(b.get("assistant_only_loss", False))
    completion_only = b.get("completion_only_loss")
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
    if fmt:
        b.tables["data"]["format"] = fmt
    b.tables.setdefault("data", {})["pipeline"] = "trl"  # the examples are TRL's own (engine/trl_pipeline.py)
    b.mapped.append(("(trl sft)", "[data] pipeline"))
    put_many(b, "data", [("max_length", "max_length")], DEFAULTS)
    b.put("packing", "data", "packing", bool(b.get("packing", False)))
    template = b.get("chat_template_path")
    if template:
        if Path(str(template)).suffix in (".jinja", ".j2"):
            b.put("chat_template_path", "data", "chat_template", template)
        else:
            b.caveat("chat_template_path", "a tokenizer folder's template: the checks use the model's template; "
                     "point [data] chat_template in ftready.toml at the .jinja file")


def _entry_files(b: Builder, where: str, entry: dict) -> list[Path]:
    path, data_files = entry.get("path"), entry.get("data_files")
    if data_files:
        items = data_files if isinstance(data_files, list) else (
            [v for vs in data_files.values() for v in (vs if isinstance(vs, list) else [vs])]
            if isinstance(data_files, dict) else [data_files])
        base = b.local_path(entry.get("data_dir") or ".")
        return [(base / str(item)).resolve() for item in items]
    return b.local_files(where + ".path", path) if isinstance(path, str) else []
