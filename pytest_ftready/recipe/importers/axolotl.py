"""Axolotl: its YAML config (``axolotl train config.yml``), read with Axolotl's key names and
defaults (0.19: sequence_len 512, no adapter = full fine-tune, gradient checkpointing off).
Axolotl itself is never imported (it pins other transformers/TRL versions)."""

from __future__ import annotations

from pathlib import Path

from .base import Builder
from .common import (map_optimizer, map_scheduler, mixed_precision_dtype, note_meanings,
                     packing_meaning, put_if, put_many)

TITLE = "Axolotl"
DEFAULTS = {"sequence_len": 512, "micro_batch_size": 1, "gradient_accumulation_steps": 1, "num_epochs": 1.0,
            "gradient_checkpointing": False,
            "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "output_dir": "./model-out"}
# Llama-style linear layer names: what lora_target_linear selects on Llama/Qwen/Mistral models.
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION = {"flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "eager_attention": "eager"}
CHAT_TYPES = ("chat_template", "chat_template.default")
DATASET_KEYS_READ = {"path", "type", "data_files", "ds_type", "split", "field_messages", "roles_to_train",
                     "train_on_eos", "message_property_mappings", "message_field_role", "message_field_content",
                     "field", "chat_template", "name"}
MEANING = {
    "sample_packing": packing_meaning("Axolotl"),
    "deepspeed": "memory checks measure one device without DeepSpeed sharding or offload: their peak is the "
                 "unsharded upper bound; stack, data and masking checks are unaffected",
    "fsdp": "memory checks measure one device without FSDP sharding: their peak is the unsharded upper bound",
    "fsdp_config": "memory checks measure one device without FSDP sharding: their peak is the unsharded upper bound",
    "max_steps": "Axolotl stops after max_steps; headroom.time and headroom.disk budget the epochs instead",
    "xformers_attention": "xformers attention is measured as sdpa",
    "s2_attention": "shifted-sparse attention is measured as sdpa",
    "flex_attention": "flex attention is measured as sdpa",
    "unsloth_lora_mlp": "Unsloth kernels change memory and speed: model.step_memory measures plain PEFT",
    "liger_rms_norm": "Liger kernels change memory and speed: model.step_memory measures plain transformers",
    "special_tokens": "tokens Axolotl adds or replaces are not applied: an eos_token here is read as an extra "
                      "stop token ([data] stop_tokens)",
    "tokens": "tokens Axolotl adds to the vocabulary are not added by the checks",
    "tokenizer_config": "the checks load the tokenizer of base_model",
    "warmup_ratio": "warm-up as a ratio is not translated: model.overfit uses warmup_steps",
    "peft_use_dora": "DoRA adds memory and compute: model.step_memory measures plain LoRA",
    "peft_use_rslora": "rank-stabilised LoRA scales updates differently: model.overfit trains plain LoRA",
    "lora_modules_to_save": "fully trained extra modules are not built by the checks: memory is under-counted",
    "default_system_message": "Axolotl inserts a system message the rows do not have: data.masking verifies the rows "
                              "as they are",
    "saves_per_epoch": "checkpoint frequency per epoch is not translated: headroom.disk counts save_total_limit",
}


def translate(b: Builder) -> None:
    b.model("base_model", b.get("base_model"), b.get("revision_of_model"))
    if b.has("revision_of_model"):
        b.mapped.append(("revision_of_model", "[model] revision"))
    for key in ("base_model_config", "model_type", "tokenizer_type", "load_in_8bit", "load_in_4bit", "adapter"):
        b.get(key)
    precision = mixed_precision_dtype(b, "bf16", "fp16")
    if precision is None and b.get("bf16") is None and b.get("fp16") is None:
        b.tables.setdefault("model", {})["dtype"] = "bfloat16"  # Axolotl's default bf16: auto
        b.mapped.append(("bf16 (default auto)", "[model] dtype"))
    elif precision is None:
        b.tables.setdefault("model", {})["dtype"] = "float32"
    attention = [key for key in ATTENTION if b.get(key)]
    if attention:
        b.put(attention[0], "model", "attn_implementation", ATTENTION[attention[0]])
    put_if(b, "trust_remote_code", "model", "trust_remote_code")

    adapter = b.get("adapter")
    if adapter in ("lora", "qlora"):
        b.put("adapter", "adapter", "method", "lora")
        if adapter == "qlora" or b.get("load_in_4bit"):
            b.put("adapter" if adapter == "qlora" else "load_in_4bit", "model", "quantization", "4bit")
        elif b.get("load_in_8bit"):
            b.put("load_in_8bit", "model", "quantization", "8bit")
        put_many(b, "adapter", [("lora_r", "r"), ("lora_alpha", "alpha"), ("lora_dropout", "dropout")], DEFAULTS)
        if b.get("lora_target_linear"):
            b.put("lora_target_linear", "adapter", "target_modules", list(ALL_LINEAR))
            b.caveat("lora_target_linear", f"all linear layers, read as {ALL_LINEAR} (Llama-style names); for "
                     "another architecture set [adapter] target_modules in ftready.toml")
        elif b.get("lora_target_modules"):
            b.put("lora_target_modules", "adapter", "target_modules", list(b.get("lora_target_modules")))
    elif adapter:
        raise b.fail("adapter", f"expected lora or qlora (or no adapter for a full fine-tune), got {adapter!r}")
    else:
        b.put("adapter (absent)", "adapter", "method", "none")

    _datasets(b)

    put_many(b, "training", [("micro_batch_size", "micro_batch_size"),
                             ("gradient_accumulation_steps", "gradient_accumulation_steps"),
                             ("learning_rate", "learning_rate"), ("num_epochs", "epochs"),
                             ("gradient_checkpointing", "gradient_checkpointing"), ("output_dir", "output_dir"),
                             ("seed", "seed"), ("save_steps", "save_steps"), ("save_total_limit", "save_total_limit"),
                             ("warmup_steps", "warmup_steps"), ("weight_decay", "weight_decay"), ("tf32", "tf32"),
                             ("torch_compile", "compile")], DEFAULTS)
    if b.has("optimizer"):
        map_optimizer(b, "optimizer", b.get("optimizer"))
    if b.has("lr_scheduler"):
        map_scheduler(b, "lr_scheduler", b.get("lr_scheduler"))
    note_meanings(b, MEANING)
    special = b.get("special_tokens")
    if isinstance(special, dict) and special.get("eos_token"):
        b.put("special_tokens.eos_token", "data", "stop_tokens", [special["eos_token"]])


def _datasets(b: Builder) -> None:
    entries = b.get("datasets")
    if not isinstance(entries, list) or not entries:
        raise b.fail("datasets", "expected a list of datasets with path and type, e.g. "
                     "[{path: data/train.jsonl, type: chat_template}]")
    files: list[Path] = []
    kinds: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"datasets[{i}]"
        if not isinstance(entry, dict):
            raise b.fail(where, f"expected a mapping with path and type, got {entry!r}")
        found = _entry_files(b, where, entry)
        kind = entry.get("type")
        if kind in CHAT_TYPES:
            kinds.add("messages")
            field = entry.get("field_messages", "messages")
            if field != "messages":
                b.caveat(f"{where}.field_messages", f"messages are read from {field!r} by Axolotl; the checks read "
                         "'messages': data.format fails until the rows use it")
            for key in ("message_property_mappings", "message_field_role", "message_field_content"):
                if key in entry:
                    b.caveat(f"{where}.{key}", "renamed message fields are not applied: the checks read "
                             "role and content")
            roles = entry.get("roles_to_train", ["assistant"])
            if sorted(roles) != ["assistant"]:
                b.caveat(f"{where}.roles_to_train", f"{roles} trained by Axolotl; data.masking verifies that only "
                         "assistant turns are trained")
            eos = entry.get("train_on_eos", "turn")
            if eos not in ("turn", "last"):
                b.caveat(f"{where}.train_on_eos", f"{eos!r}: data.masking expects every trained turn's stop token "
                         "trained and reports the difference")
            if entry.get("chat_template"):
                b.caveat(f"{where}.chat_template", "a per-dataset template is not applied: the checks use one template")
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
    if not files:
        return  # named in caveats; Builder.finish asks for [data] train in ftready.toml
    if len(kinds) > 1:
        raise b.fail("datasets", "chat_template and completion datasets mixed: the checks read one row format; "
                     "check them as two configs")
    fmt = kinds.pop()
    b.put("datasets[].path", "data", "train", [str(f) for f in files])
    b.tables["data"]["format"] = fmt
    b.tables["data"]["train_on"] = "assistant" if fmt == "messages" else "all"
    b.mapped.append(("datasets[].type", "[data] format, train_on"))
    b.put("sequence_len", "data", "max_length", b.get("sequence_len", DEFAULTS["sequence_len"]))
    b.put("sample_packing", "data", "packing", bool(b.get("sample_packing", False)))
    template, jinja = b.get("chat_template"), b.get("chat_template_jinja")
    if jinja:
        candidate = b.local_path(str(jinja)) if len(str(jinja)) < 4096 and "\n" not in str(jinja) else None
        if candidate is not None and candidate.is_file():
            b.put("chat_template_jinja", "data", "chat_template", str(jinja))
        else:
            b.caveat("chat_template_jinja", "an inline template is not applied: save it as a .jinja file and set "
                     "[data] chat_template in ftready.toml")
    elif template and template != "tokenizer_default" and not str(template).startswith("tokenizer_default"):
        b.caveat("chat_template", f"Axolotl renders with its built-in {template!r} template, which the checks cannot "
                 "load without Axolotl: they verify the model's own template; save Axolotl's template as a .jinja "
                 "file and set [data] chat_template in ftready.toml to verify that one")


def _entry_files(b: Builder, where: str, entry: dict) -> list[Path]:
    data_files = entry.get("data_files")
    if data_files:
        items = data_files if isinstance(data_files, list) else [data_files]
        return [b.local_path(str(item)) for item in items]
    path = entry.get("path")
    return b.local_files(where + ".path", path) if isinstance(path, str) else []
