"""What the three importers share: value translations (transformers' ``optim`` and
``lr_scheduler_type`` names, precision flags, attention names, LoRA targets), the memory levers
(low-rank optimizers, DeepSpeed / FSDP / accelerate launch configs into ``[distributed]``), chat
templates given as text, and the table handlers (``SHARED_HANDLERS``) those rows name."""

from __future__ import annotations

import json
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from .base import Builder, read_side_toml, safe_yaml, side_toml
from .modules import LLAMA_LINEAR, EveryLinear

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

# transformers' OptimizerNames (and the trainers' own) -> the recipe's optimizers; anything else
# is named as measured like AdamW.
OPTIMIZERS = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw", "adamw": "adamw",
    "adamw_torch_xla": "adamw", "adamw_apex_fused": "adamw", "adamw_torch_npu_fused": "adamw",
    "adamw_8bit": "adamw_8bit", "adamw_bnb_8bit": "adamw_8bit", "adamw_bnb": "adamw_8bit",
    "paged_adamw_8bit": "paged_adamw_8bit", "paged_adamw_32bit": "paged_adamw", "paged_adamw": "paged_adamw",
    "sgd": "sgd", "adafactor": "adafactor",
}
# Low-rank optimizer-state projections (transformers' optim names): the state is projected, the
# update is the base optimizer's.
LOW_RANK = {"galore_adamw": ("galore", "adamw"), "galore_adamw_8bit": ("galore", "adamw_8bit"),
            "galore_adafactor": ("galore", "adafactor"), "galore_adamw_layerwise": ("galore", "adamw"),
            "galore_adamw_8bit_layerwise": ("galore", "adamw_8bit"),
            "galore_adafactor_layerwise": ("galore", "adafactor"),
            "apollo_adamw": ("apollo", "adamw"), "apollo_adamw_layerwise": ("apollo", "adamw")}
NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
SCHEDULERS = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant",
              "cosine_with_restarts": "cosine", "cosine_with_min_lr": "cosine"}


def map_optimizer(b: Builder, source: str, name: Any) -> None:
    name = str(name).lower()
    if name in LOW_RANK:
        low_rank(b, source, *LOW_RANK[name])
        return
    _map_name(b, source, name, "optimizer", OPTIMIZERS, "adamw",
              "is measured as AdamW: optimizer-state memory in model.step_memory is AdamW's (2 fp32 states "
              "per trained parameter; a one-state or factored optimizer holds less)")


def low_rank(b: Builder, source: str, method: str, base: str) -> None:
    """GaLore / APOLLO: optimizer states in a low-rank projection of each matrix."""
    b.put(source, "training", "low_rank_optimizer", method)
    b.put(source, "training", "optimizer", base)
    b.caveat(source.split(" ")[0], memory=True, text=f"{method} keeps optimizer states in a low-rank projection: "
             f"carried as [training] "
             f"low_rank_optimizer = \"{method}\"; where the forecast cannot model it, optimizer-state memory is "
             "over-counted by up to the full-rank states (2 x 4 bytes per projected parameter with AdamW)")


def map_scheduler(b: Builder, source: str, name: Any) -> None:
    _map_name(b, source, str(name).lower(), "lr_scheduler", SCHEDULERS, "linear",
              "is approximated by a linear schedule in model.overfit")


def _map_name(b: Builder, source: str, name: str, key: str, names: dict, fallback: str, approximated: str) -> None:
    mapped = names.get(name)
    if mapped is None:
        b.caveat(source, f"{name!r} {approximated}")
    b.put(source, "training", key, mapped or fallback)


def add_stop_tokens(b: Builder, source: str, tokens: list) -> None:
    """Extra end-of-turn tokens ([data] stop_tokens), merged across the keys that name them."""
    current = list(b.tables.get("data", {}).get("stop_tokens", []))
    b.put(source, "data", "stop_tokens", current + [str(t) for t in tokens if str(t) not in current])


def chat_template_value(b: Builder, source: str, value: Any) -> None:
    """A chat template given as a .jinja path (kept) or as template text (written to a file
    beside the config, under .ftready/templates/, so the checks render with it)."""
    text = str(value or "")
    if not text:
        b.caveat(source, "chat_template: jinja without a template: the checks use the tokenizer's own")
        return
    if "\n" not in text and "{%" not in text and "{{" not in text:
        path = b.local_path(text)
        if path.is_file():
            b.put(source, "data", "chat_template", str(path))
            return
        b.caveat(source, f"{text!r} is neither a local template file nor template text: the checks use the "
                 "tokenizer's own template; set [data] chat_template in ftready.toml")
        return
    from ...files import write_private

    target = b.folder / ".ftready" / "templates" / f"{b.path.stem}.{source.split(' ')[0]}.jinja"
    try:
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            write_private(target, text)  # atomic: never a half-written template
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        side = side_toml(b.path)
        if side is not None and "chat_template" in (read_side_toml(side).get("data") or {}):
            b.caveat(source, f"the inline template cannot be saved as {target} ({reason}): the side file's [data] "
                     "chat_template is the one the checks render with")
            return
        raise b.fail(source.split(" ")[0], f"its inline chat template cannot be saved as {target} ({reason}), where "
                     f"the checks render with it: make {b.folder} writable for this user, or save the template as "
                     "a .jinja file and write [data] chat_template = \"that.jinja\" in ftready.toml") from None
    b.put(f"{source} (inline template, saved as {target.relative_to(b.folder)})", "data", "chat_template", str(target))


ZERO_SHARDS = {1: "optimizer states", 2: "optimizer states and gradients", 3: "optimizer states, gradients and weights"}


def distributed_deepspeed(b: Builder, source: str, value: Any) -> None:
    """A DeepSpeed config (a JSON path, or the mapping itself) into [distributed] zero_stage,
    cpu_offload and strategy (ZeRO-3 shards like FSDP, ZeRO-1/2 replicate the weights like DDP).
    A path that exists is read as is; one of the configs the trainers ship is read from the
    installed trainer's checkout, else from ``keys/deepspeed.toml``; any other is read from its name."""
    config, how = (value, "inline") if isinstance(value, dict) else (None, "")
    if config is None:
        path = b.local_path(str(value))
        try:
            config, how = json.loads(path.read_text(encoding="utf-8")), str(value)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            config, how = bundled_deepspeed(str(value))
    if isinstance(config, dict):
        zero = config.get("zero_optimization") or {}
        if not isinstance(zero, dict):
            raise b.fail(f"{source} zero_optimization", f"expected a mapping like {{\"stage\": 2}}, got "
                         f"{type(zero).__name__}: write DeepSpeed's zero_optimization section as a mapping")
        stage = b.integer(f"{source} zero_optimization.stage" + (f" (in {how})" if how != "inline" else ""),
                          zero.get("stage", 0) or 0, "a DeepSpeed ZeRO stage", high=3)
        offload = [part for part, key in (("optimizer", "offload_optimizer"), ("parameters", "offload_param"))
                   if _offload_device(zero.get(key)) in ("cpu", "nvme")]
    else:  # neither a file here nor one the trainers ship: read from its name
        name = Path(str(value)).name.lower()
        match = re.search(r"(?:zero|z)_?(\d)", name)
        stage = int(match.group(1)) if match else 0
        offload = (["optimizer", "parameters"] if "offload_all" in name
                   else ["parameters"] if "offload_param" in name else ["optimizer"] if "offload" in name else [])
        b.caveat(source, f"{value!r} is neither a local file nor a DeepSpeed config the trainers ship: ZeRO stage "
                 f"{stage} and offload {offload or 'none'} are read from its name; copy the JSON beside the config "
                 "to have it read")
    _distributed(b, source, "fsdp" if stage == 3 else "ddp", offload, f"DeepSpeed ZeRO-{stage}"
                 + (f" ({how})" if how and how != str(value) else ""))
    read = f"{source} (read from {how})" if how not in ("", "inline", str(value)) else source
    b.put(read, "distributed", "zero_stage", stage)
    if stage:
        b.caveat(source, memory=True, text=f"ZeRO-{stage} shards the {ZERO_SHARDS[stage]} across the GPUs: where the "
                 f"forecast does not "
                 "model the sharding, the single-device memory checks over-count them by up to (1 - 1/world_size)")


def _offload_device(section: Any) -> str:
    """The device of a DeepSpeed offload section ({"device": "cpu"}), "none" when unset or not a mapping."""
    return str(section.get("device", "none")).lower() if isinstance(section, dict) else "none"


BUNDLED_ROOTS = {"axolotl": 2, "llamafactory": 2}  # src/<package>/__init__.py: the checkout is two folders up


@lru_cache(maxsize=None)
def _bundled_table() -> dict[str, dict]:
    rows = tomllib.loads((Path(__file__).with_name("keys") / "deepspeed.toml").read_text(encoding="utf-8"))["config"]
    return {row["path"]: row for row in rows}


def bundled_deepspeed(value: str) -> tuple[Optional[dict], str]:
    """(config, where it was read) of a DeepSpeed config a trainer ships, named as a config names
    it (``.../deepspeed_configs/zero2.json``: its folder and file name), or (None, "")."""
    parts = Path(value.replace("\\", "/")).parts
    row = next((r for n in (3, 2) for r in [_bundled_table().get("/".join(parts[-n:]))] if r), None)
    if row is None:
        return None, ""
    checkout = _installed_checkout(row["trainer"])
    if checkout is not None and (checkout / row["path"]).is_file():
        try:
            return (json.loads((checkout / row["path"]).read_text(encoding="utf-8")),
                    f"the installed {row['trainer']}'s {checkout / row['path']}")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            pass
    zero = {"stage": row["stage"], "offload_optimizer": {"device": row["offload_optimizer"]},
            "offload_param": {"device": row["offload_param"]}}
    return {"zero_optimization": zero}, f"{row['trainer']}'s bundled {row['path']}, as {row['source']} has it"


def _installed_checkout(trainer: str) -> Optional[Path]:
    """The source checkout of an installed trainer (an editable install), without importing it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(trainer)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).resolve().parents[BUNDLED_ROOTS[trainer]]


def distributed_fsdp(b: Builder, source: str, options: dict) -> None:
    """FSDP settings (offload_params / fsdp_offload_params) into [distributed]."""
    offload = any(str(options.get(k, "")).lower() in ("true", "1") for k in ("offload_params", "fsdp_offload_params"))
    _distributed(b, source, "fsdp", ["optimizer", "parameters"] if offload else [], "FSDP")
    b.caveat(source.split(" ")[0], memory=True, text="FSDP shards the weights, gradients and optimizer states across "
             "the GPUs: where "
             "the forecast does not model the sharding, the single-device memory checks over-count them by up to "
             "(1 - 1/world_size)")


def _distributed(b: Builder, source: str, strategy: str, offload: list, what: str) -> None:
    b.put(source, "distributed", "strategy", strategy)
    cpu = "both" if len(offload) == 2 else offload[0] if offload else "none"
    b.put(source, "distributed", "cpu_offload", cpu)
    if offload:
        b.caveat(source.split(" ")[0], memory=True, text=f"{what} offloads {' and '.join(offload)} to host "
                 f"memory: carried as "
                 f"[distributed] cpu_offload = \"{cpu}\"; the device-memory checks measure them on the device "
                 "(an upper bound) and host memory must hold them")


def read_accelerate(b: Builder, value: str, bundled: Optional[str] = None) -> Optional[dict]:
    """An accelerate launch config: a local YAML path, else a trainer's bundled one (its text)."""
    import yaml

    path = b.local_path(value)
    try:
        text = path.read_text(encoding="utf-8") if path.is_file() else bundled
        config = safe_yaml(text, path) if text else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return config if isinstance(config, dict) else None


def accelerate_settings(b: Builder, source: str, value: Any, config: Optional[dict]) -> None:
    """An accelerate config's distributed_type (DEEPSPEED / FSDP / MULTI_GPU) into [distributed]."""
    name = str(value)
    if config is None:  # read its name: zero1/2/3, fsdp*, multi_gpu, single_gpu
        match = re.search(r"zero_?(\d)", name)
        kind = "DEEPSPEED" if match else "FSDP" if "fsdp" in name else "MULTI_GPU" if "multi" in name else "NO"
        config = {"distributed_type": kind, "deepspeed_config": {"zero_stage": int(match.group(1)) if match else 0}}
        b.caveat(source, f"{name!r} is neither a local file nor a bundled config here: read from its name as {kind}")
    kind = str(config.get("distributed_type", "NO")).upper()
    if kind == "DEEPSPEED":
        ds = config.get("deepspeed_config") or {}
        if not isinstance(ds, dict):
            raise b.fail(f"{source} deepspeed_config", f"expected a mapping like {{zero_stage: 2}}, got "
                         f"{type(ds).__name__}: write accelerate's deepspeed_config section as a mapping")
        zero = {"stage": ds.get("zero_stage", 0)}
        for part in ("optimizer", "param"):
            zero[f"offload_{part}"] = {"device": ds.get(f"offload_{part}_device", "none")}
        distributed_deepspeed(b, source, {"zero_optimization": zero})
    elif kind == "FSDP":
        distributed_fsdp(b, source, config.get("fsdp_config") or {})
    elif kind in ("MULTI_GPU", "MULTI_NPU", "MULTI_XPU"):
        _distributed(b, source, "ddp", [], "DDP")
    else:
        b.mapped.append((source, "(one process)"))
    processes = config.get("num_processes")
    if isinstance(processes, int) and processes > 0 and kind != "NO":
        b.put(source, "distributed", "world_size", processes)


# Handlers (see table.apply) the three importers share: (builder, row, source name, value, is default).
def _optimizer(b: Builder, row, name: str, value: Any, default: bool) -> None:
    map_optimizer(b, name, value)


def _scheduler(b: Builder, row, name: str, value: Any, default: bool) -> None:
    map_scheduler(b, name, value)


def _deepspeed(b: Builder, row, name: str, value: Any, default: bool) -> None:
    distributed_deepspeed(b, name, value)


def _fsdp(b: Builder, row, name: str, value: Any, default: bool) -> None:
    key = name.split(" ")[0]
    if key == "fsdp_version" or (key == "fsdp_config" and (b.raw.get("fsdp") or not isinstance(value, dict))):
        b.mapped.append((name, "[distributed] strategy (fsdp)"))
        return
    if not value:
        b.mapped.append((name, "(off)"))
        return
    options = dict(value) if isinstance(value, dict) else {}
    if isinstance(value, (list, str)):  # fsdp: "full_shard auto_wrap offload" / [full_shard, offload]
        words = value if isinstance(value, list) else value.split()
        options["offload_params"] = "offload" in words
    if key == "fsdp" and isinstance(b.raw.get("fsdp_config"), dict):
        options.update(b.raw["fsdp_config"])
    distributed_fsdp(b, name, options)


def _stop_tokens(b: Builder, row, name: str, value: Any, default: bool) -> None:
    add_stop_tokens(b, name, value if isinstance(value, list) else [value])


def _save_steps(b: Builder, row, name: str, value: Any, default: bool) -> None:
    if isinstance(value, float) and value < 1:
        b.caveat(name.split(" ")[0], f"{value} of the total steps between checkpoints: headroom.disk counts "
                 "save_total_limit checkpoints whatever the cadence; [training] save_steps keeps its default")
    else:
        b.put(name, "training", "save_steps", b.integer(name.split(" ")[0], value,
                                                        "optimizer steps between checkpoints "
                                                         "(or a fraction below 1 of the total)", low=1))


def _eval_split(b: Builder, row, name: str, value: Any, default: bool) -> None:
    """LLaMA-Factory's val_size and Axolotl's val_set_size: a share of the rows below 1, a count of rows from 1."""
    value = float(value) if isinstance(value, str) and NUMBER.match(value) else value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1:
        b.caveat(name.split(" ")[0], f"{value:g} rows held out for evaluation (a count): [data] eval_split is a "
                 "share; model.eval_memory evaluates nothing unless you set it (rows / training rows)")
    elif value:
        b.put(name, "data", "eval_split", value)


def _warmup(b: Builder, row, name: str, value: Any, default: bool) -> None:
    value = float(value) if isinstance(value, str) and NUMBER.match(value) else value
    if isinstance(value, float) and 0 < value < 1:  # transformers 5 and Axolotl read a fraction as a ratio
        b.caveat(name.split(" ")[0], f"{value} of the total steps as warm-up (a ratio): model.overfit warms up "
                 "with [training] warmup_steps, which keeps 0")
    else:
        b.put(name, "training", "warmup_steps", b.integer(name.split(" ")[0], value, "warm-up optimizer steps "
                                                           "(or a ratio between 0 and 1)"))


def _save_total_limit(b: Builder, row, name: str, value: Any, default: bool) -> None:
    if value == "unset":
        b.caveat("save_total_limit", "unset: the trainer keeps every checkpoint; headroom.disk counts the recipe's "
                 "default of 3 (set [training] save_total_limit in ftready.toml to budget more)")
    else:
        b.put(name, "training", "save_total_limit", value)


def _model(b: Builder, row, name: str, value: Any, default: bool) -> None:
    b.model(name, value, None)


def _revision(b: Builder, row, name: str, value: Any, default: bool) -> None:
    if b.tables.get("model", {}).get("id"):
        b.put(name, "model", "revision", str(value))
    elif default:
        b.mapped.append((name, "(a local model: no revision)"))
    else:
        b.caveat(name.split(" ")[0], "a revision of a local model folder: the folder's files are what is checked")


def _low_rank(b: Builder, row, name: str, value: Any, default: bool) -> None:
    if value:
        low_rank(b, name, "galore" if name.startswith("use_galore") else "apollo",
                 b.tables.get("training", {}).get("optimizer", "adamw"))
    else:
        b.mapped.append((name, "(off)"))


# Strings written for "every linear layer" that are not the trainer's keyword: peft full-matches a string
# target as a regex against module names, so these match nothing (peft's keyword is "all-linear").
NOT_EVERY_LINEAR = frozenset({"all", "linear", "all_linear", "all-linear-layers", "all_linear_layers", "all-layers"})


def lora_targets(b: Builder, name: str, value: Any, every_linear: tuple = (), rule: str = "peft",
                 extra: tuple = ()) -> None:
    """LoRA targets: a list of module names, every linear layer (a value in ``every_linear``: the
    names are the model's own, picked by the trainer's ``rule`` once the model's folder is known,
    with ``extra`` modules besides), or a string peft full-matches as a regex (kept whole, never
    split into characters)."""
    if value in every_linear or (isinstance(value, list) and len(value) == 1 and value[0] in every_linear):
        b.put(name, "adapter", "target_modules", list(LLAMA_LINEAR))  # until finish reads the architecture
        architecture = b.raw.get("model_type") if b.format == "axolotl" else None
        b.every_linear = EveryLinear(name.split(" ")[0], rule, tuple(str(m) for m in extra),
                                     str(architecture) if architecture else "")
    elif isinstance(value, str) and value.strip().lower() in NOT_EVERY_LINEAR:
        said = ("set lora_target_linear: true" if b.format == "axolotl" else
                f"the trainer's keyword is {every_linear[0]!r}" if every_linear else "list the module names")
        raise b.fail(name.split(" ")[0], f"{value!r} is not a keyword for every linear layer here: peft full-matches "
                     f"a string against each module's name, so it matches none and the trainer stops ('Target "
                     f"modules {value} not found in the base model'); for every linear layer {said}")
    elif isinstance(value, str):
        b.put(name, "adapter", "target_regex", value)
        b.tables["adapter"]["target_modules"] = []
    else:
        b.put(name, "adapter", "target_modules", [str(v) for v in value])


def peft_default_targets(b: Builder, source: str) -> None:
    """LoRA without targets: peft picks the architecture's defaults (q_proj, v_proj on Llama)."""
    b.put(f"{source} (unset)", "adapter", "target_modules", ["q_proj", "v_proj"])
    b.caveat(source, "unset: peft picks the architecture's defaults; the checks use [\"q_proj\", \"v_proj\"] "
             "(peft's Llama default): set [adapter] target_modules in ftready.toml for another architecture")


ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash_attention_2",
             "flash_attention_3": "flash_attention_3", "flash": "flash_attention_2", "fa2": "flash_attention_2",
             "fa3": "flash_attention_3", "disabled": "eager", "auto": "sdpa"}


def attention(b: Builder, name: str, value: Any) -> None:
    """An attention kernel name into [model] attn_implementation (others measured as sdpa, said so)."""
    value = str(value)
    b.put(name, "model", "attn_implementation", ATTENTION.get(value, "sdpa"))
    if value not in ATTENTION:
        b.caveat(name.split(" ")[0], f"{value!r} attention is measured as sdpa (the checks run transformers' "
                 "built-in kernels): speed differs; memory is within a few percent for fused kernels")


def _attention(b: Builder, row, name: str, value: Any, default: bool) -> None:
    attention(b, name, value)


PRECISION = {"bf16": "bfloat16", "bfloat16": "bfloat16", "pure_bf16": "bfloat16", "fp16": "float16",
             "float16": "float16", "float32": "float32"}


def _precision(b: Builder, row, name: str, value: Any, default: bool) -> None:
    """Flags that load the weights in a dtype (Axolotl's bf16/fp16, LLaMA-Factory's compute dtype):
    a set flag names the dtype; bf16 false with no other flag set means float32."""
    key = name.split(" ")[0]
    if value in (True, "auto", "full"):
        b.put(name, "model", "dtype", PRECISION[key])
        if key == "pure_bf16":
            b.caveat(key, memory=True, text="pure bf16: trainable weights and optimizer states stay in bf16 (no "
                     "float32 master copy): "
                     "where the step keeps float32 trainable weights, their memory is over-counted by 2 bytes per "
                     "trained parameter, and updates smaller than bf16's precision are lost")
    elif value is False and key == "bf16" and not any(b.raw.get(k) for k in PRECISION if k != "bf16"):
        b.put(name, "model", "dtype", "float32")
    else:
        b.mapped.append((name, "(no dtype change)"))


SHARED_HANDLERS = {"attention": _attention, "precision": _precision, "optimizer": _optimizer, "scheduler": _scheduler,
                   "deepspeed": _deepspeed, "fsdp": _fsdp,
                   "stop_tokens": _stop_tokens, "save_steps": _save_steps, "warmup": _warmup,
                   "save_total_limit": _save_total_limit,
                   "model": _model, "revision": _revision, "low_rank": _low_rank,
                   "eval_split": _eval_split}
