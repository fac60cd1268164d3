"""Recipe files: TOML -> a frozen, validated ``Recipe``.

The schema is data (``SCHEMA`` below): every table and key with its kind, default and
meaning. Validation errors name the file, the table and key, what was expected, what was
found and what to write instead. This module imports neither pytest nor torch.
"""

from __future__ import annotations

import difflib
import glob
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyrsistent import PRecord, freeze, pmap, pvector
from pyrsistent import field as pfield

from ..files import pseudo_file_system
from ..kinds import KIND_NAMES
from . import tables

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

REQUIRED = object()
HEX40 = re.compile(r"^[0-9a-f]{40}$")


ONE_LINE = {c: f"\\x{c:02x}" for c in range(32)} | {10: "\\n", 13: "\\r", 9: "\\t"}
MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of settings; more is a file passed by mistake
# the name becomes a folder name (255 bytes at most on most file systems) and every test id's prefix
MAX_NAME_CHARS = 100
MAX_TEXT_CHARS = 4096  # any other string value
SHOWN_CHARS = 80  # of a value quoted in an error
# Every number the schema reads is bounded: past these a count or a length is no run's, and the
# arithmetic of the checks (timestamps, tensor sizes, step counts) overflows.
MOST_INT = 1 << 53  # counts of bytes or steps; floats stay exact below it
MOST_FLOAT = 1e15
MOST_SECONDS = 1e7  # about 116 days: any check's window or limit
SEED_MAX = 2 ** 32 - 1  # numpy's legacy generator (np.random.seed) takes no larger seed
GLOB_CHARS = re.compile(r"[*?[]")


class RecipeError(Exception):
    """A recipe that cannot be used; ``str()`` is one line that says how to fix it."""

    def __init__(self, path: Path | str, where: str, message: str) -> None:
        self.path = Path(path)
        self.where = where
        self.message = message
        location = f"{self.path} {_clip(where, SHOWN_CHARS * 2)}".rstrip()
        # one line, whatever the file holds: control characters in keys, values or paths are escaped
        super().__init__(_clip(f"Invalid recipe {location}: {message}".translate(ONE_LINE), 4000))


@dataclass(frozen=True)
class Key:
    """One recipe key: its kind decides parsing; the rest is documentation and limits."""

    kind: str  # str | bool | int | float | share | path | paths | strs | choice | table | skip | limits | thresholds
    default: Any = REQUIRED
    doc: str = ""
    choices: tuple[str, ...] = ()
    positive: bool = False  # int/float: > 0 (else >= 0)
    must_exist: bool = False  # path/paths: resolved against the recipe folder and checked
    globs: bool = False  # paths: an entry with * ? [ is a pattern (sorted matches), as Hugging Face data_files
    most: Any = None  # int/float: the largest value a run can mean (None: MOST_INT / MOST_FLOAT)
    unit: str = ""  # int/float: what the number counts, for messages


def _k(kind: str, default: Any = REQUIRED, doc: str = "", **kw: Any) -> Key:
    return Key(kind=kind, default=default, doc=doc, **kw)


DTYPES = ("float32", "float16", "bfloat16")
ATTN = ("eager", "sdpa", "flash_attention_2", "flash_attention_3")
CHAT_FORMATS = ("messages", "sharegpt", "alpaca")  # layouts always rendered through the chat template
FORMATS = ("auto", *CHAT_FORMATS, "prompt_completion", "text")
SERVING_ENGINES = ("none", "transformers", "llama.cpp", "ollama", "vllm", "mlx")
GGUF_ENGINES = ("llama.cpp", "ollama")
MERGE_WAYS = ("original", "dequantized", "quantized")  # [serving] merge_into (serving/merge.py)
# llama.cpp's quantization types (tools/quantize/quantize.cpp QUANT_OPTIONS, the common ones), as
# llama-quantize names them
GGUF_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1",
              "Q4_0", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K", "IQ4_NL", "IQ4_XS", "IQ3_M", "IQ3_XXS", "IQ2_M", "IQ2_XS")
ROLES = ("system", "user", "assistant", "tool", "developer")  # message roles chat templates know

SCHEMA: dict[str, dict[str, Key]] = {
    "model": {
        "id": _k("str", "", "hub id, e.g. meta-llama/Llama-3.1-8B-Instruct (exactly one of id/path)"),
        "path": _k("path", "", "local model folder (exactly one of id/path)", must_exist=True),
        "revision": _k("str", "", "hub commit (40 hex); required with id"),
        "gguf_file": _k("str", "", "a .gguf file in the model folder/repo to load (dequantized by transformers)"),
        "dtype": _k("choice", "bfloat16", "training dtype", choices=DTYPES),
        "attn_implementation": _k("choice", "sdpa", "attention kernel", choices=ATTN),
        "quantization": _k("choice", "none", "bitsandbytes base quantization", choices=("none", "4bit", "8bit")),
        "trust_remote_code": _k("bool", False, "never true unless written here"),
        "license": _k("str", "", "overrides the license the model card declares"),
        "kbit_preparation": _k("choice", "auto", "peft's prepare_model_for_kbit_training on a quantized base "
                               "(auto: as the trainer does; TRL and the HF Trainer do, torchtune and litgpt do not)",
                               choices=("auto", "on", "off")),
    },
    "data": {
        "train": _k("paths", REQUIRED, "local jsonl/json/parquet/csv files, or glob patterns (data/*.jsonl)",
                    must_exist=True, globs=True),
        "format": _k("choice", "auto", "row layout; auto recognises each row from its fields",
                     choices=FORMATS),
        "train_on": _k(
            "choice", "assistant", "which tokens carry loss",
            choices=("assistant", "last_assistant", "completion", "all"),
        ),
        "max_length": _k("int", 2048, "tokens per example after truncation", positive=True, most=1 << 24,
                         unit="tokens (longer than any model's context)"),
        "packing": _k("bool", False, "pack several examples into one sequence"),
        "manifest": _k("path", "", "data manifest checked by repro.manifest"),
        "rights": _k("str", "", "why we may train on this data (privacy.license)"),
        "sample": _k("int", 16, "examples shown example by example", positive=True, most=1 << 20),
        "chat_template": _k("path", "", "a .jinja file overriding the tokenizer's template", must_exist=True),
        "add_special_tokens": _k("bool", False, "the trainer tokenizes rendered text adding BOS/EOS"),
        "stop_tokens": _k("strs", [], "extra end-of-turn tokens besides EOS"),
        "train_empty_reasoning": _k("bool", True, "whether an empty reasoning block (<think></think> with only "
                                    "whitespace between, a reasoning template's boilerplate for rows without "
                                    "reasoning) may carry loss; false: data.masking fails on rows that train one "
                                    "(LLaMA-Factory's enable_thinking: false masks it)"),
        "roles": _k("table", {}, "ShareGPT speaker names mapped to roles, e.g. { bot = \"assistant\" }"),
        "eval": _k("paths", [], "held-out evaluation files (jsonl/json/parquet/csv, or glob patterns) the run "
                   "evaluates on (eval_dataset); [] with eval_split = 0: the run evaluates nothing",
                   must_exist=True, globs=True),
        "eval_split": _k("share", 0.0, "share of the training rows held out for evaluation (LLaMA-Factory val_size, "
                         "Axolotl val_set_size, TRL test_split_size)"),
        "pipeline": _k("choice", "auto", "whose preprocessing and training step the checks run: auto = the "
                       "config's trainer where it is installed, else builtin (pytest-ftready's own)",
                       choices=("auto", "builtin", "trl", "axolotl", "llamafactory", "unsloth", "mlx")),
    },
    "adapter": {
        "method": _k("choice", "lora", "none = full fine-tune", choices=("none", "lora")),
        "r": _k("int", 16, "LoRA rank", positive=True, most=1 << 16),
        "alpha": _k("float", 32.0, "LoRA alpha", positive=True, most=1e6),
        "dropout": _k("share", 0.05, "LoRA dropout"),
        "target_modules": _k("strs", ["q_proj", "v_proj"], "modules that get adapters"),
        "target_regex": _k("str", "", "a regex peft full-matches against module names, instead of target_modules"),
    },
    "training": {
        "micro_batch_size": _k("int", 1, "examples per forward pass", positive=True, most=1 << 20),
        "gradient_accumulation_steps": _k("int", 1, "micro-batches per optimizer step", positive=True, most=1 << 20),
        "learning_rate": _k("float", 2e-4, "peak learning rate", most=1e3),
        "optimizer": _k("choice", "adamw", "optimizer", choices=("adamw", "adamw_8bit", "paged_adamw",
                                                                 "paged_adamw_8bit", "sgd", "adafactor")),
        "lr_scheduler": _k("choice", "linear", "schedule after warm-up", choices=("linear", "cosine", "constant")),
        "warmup_steps": _k("int", 0, "linear warm-up steps", most=1 << 40),
        "weight_decay": _k("float", 0.0, "AdamW weight decay", most=1e3),
        "gradient_checkpointing": _k("bool", False, "activation checkpointing"),
        "epochs": _k("float", 1.0, "passes over the data", positive=True, most=1e6, unit="epochs"),
        "seed": _k("int", 42, "seed for torch, python, numpy and data order", most=SEED_MAX,
                   unit="(numpy's range, which torch, python and numpy all take)"),
        "output_dir": _k("path", "runs", "where the run writes checkpoints and logs"),
        "save_steps": _k("int", 500, "optimizer steps between checkpoints", positive=True, most=1 << 40),
        "save_total_limit": _k("int", 3, "checkpoints kept", positive=True, most=1 << 20),
        "ddp_timeout_s": _k("float", 1800.0, "seconds a rank of a distributed run waits at a collective before the "
                            "process group's watchdog ends the job (transformers' ddp_timeout): rank 0's preprocessing "
                            "must end within it (data.loader)", positive=True, most=1e12),
        "compile": _k("bool", False, "torch.compile the model (needs triton on GPUs)"),
        "tf32": _k("bool", False, "allow TF32 matmuls (Ampere and newer)"),
        "fp8": _k("bool", False, "FP8 matmuls (torchao / Transformer Engine; Ada, Hopper and newer)"),
        "loss": _k("choice", "full", "how the loss meets the vocabulary: full logits, chunked (loss_chunks pieces), "
                   "fused_linear (Liger's fused linear cross-entropy) or cut_cross_entropy (Apple's CCE)",
                   choices=("full", "chunked", "fused_linear", "cut_cross_entropy")),
        "loss_chunks": _k("int", 8, "pieces the chunked loss computes logits for, one at a time", positive=True,
                          most=1 << 20),
        "loss_dtype": _k("choice", "float32", "dtype the full or chunked loss computes its logits and cross-entropy "
                         "in: float32 (upcast first, as transformers' loss does) or compute (the model's dtype, "
                         "as litgpt's bfloat16 chunked cross-entropy)", choices=("float32", "compute")),
        "optimizer_in_backward": _k("bool", False, "step each parameter's optimizer in its gradient hook (no "
                                    "whole-model gradients held)"),
        "activation_offloading": _k("bool", False, "saved activations moved to host memory between forward "
                                    "and backward"),
        "trainable": _k("strs", [], "full fine-tune of only the parameters whose names match these regexes "
                        "(freeze / unfrozen_parameters); [] = every parameter"),
        "eval_batch_size": _k("int", 0, "examples per evaluation forward pass (per_device_eval_batch_size); "
                              "0 = micro_batch_size"),
        "eval_accumulation_steps": _k("int", 0, "evaluation batches whose logits the trainer keeps on the device "
                                      "before moving them to host memory; 0 = unset: kept on the device until "
                                      "the whole eval set has run"),
        "prediction_loss_only": _k("bool", False, "evaluation keeps only the loss, never the logits"),
        "compute_metrics": _k("bool", False, "the trainer is handed a compute_metrics function (code, so never "
                              "in a trainer's config): evaluation keeps every eval batch's logits for it "
                              "unless prediction_loss_only"),
        "low_rank_optimizer": _k("choice", "none", "optimizer states kept in a low-rank projection (GaLore, APOLLO)",
                                 choices=("none", "galore", "apollo")),
    },
    "hardware": {
        "device": _k("choice", "auto", "where to train", choices=("auto", "cuda", "rocm", "mps", "cpu", "mlx")),
        "memory_headroom": _k("share", 0.10, "share of device memory to keep free"),
        "target": _k("str", "", "device to forecast memory for: a size like \"24GiB\" or a GPU name like \"RTX 4090\""),
    },
    "budget": {
        "max_hours": _k("float", 12.0, "wall-clock budget of the run", positive=True, most=87_600.0,
                        unit="hours (ten years)"),
        "disk_headroom": _k("share", 0.20, "share of free disk to keep"),
        "time_headroom": _k("share", 0.25, "margin for retries, on top of the ETA"),
        "eval_share": _k("share", 0.05, "share of training time spent evaluating"),
        "log_bytes": _k("int", 50_000_000, "bytes of logs the run writes"),
        "eval_bytes": _k("int", 50_000_000, "bytes of evaluation outputs the run writes"),
    },
    "checks": {
        "overfit_examples": _k("int", 8, "rows in the overfit sample", positive=True, most=1 << 16),
        "overfit_steps": _k("int", 200, "optimizer steps allowed to overfit", positive=True, most=1 << 20),
        "overfit_loss": _k("float", 0.1, "loss the overfit must reach", positive=True, most=1e6),
        "resume_steps": _k("int", 4, "steps of the resume check (even, >= 2)", positive=True, most=1 << 16),
        "sustained_seconds": _k("float", 300.0, "length of the sustained window", positive=True, most=MOST_SECONDS),
        "warmup_seconds": _k("float", 30.0, "warm-up before measuring", positive=False, most=MOST_SECONDS),
        "window_seconds": _k("float", 30.0, "length of one throughput window", positive=True, most=MOST_SECONDS),
        "max_throughput_drop": _k("share", 0.10, "allowed drop, best early window to last"),
        "max_temperature_c": _k("float", 87.0, "hottest allowed GPU temperature", positive=True, most=200.0),
        "max_truncated_share": _k("share", 0.05, "rows whose response truncation may cut"),
        "benchmark_rounds": _k("int", 3, "rounds of timed benchmarks", positive=True, most=1 << 16),
        "max_new_tokens": _k("int", 32, "tokens generated by lifecycle.generate", positive=True, most=1 << 20),
        "skip": _k("skip", {}, "check ids to leave out, each with a reason"),
        "time_limit_s": _k("float", 1800.0, "seconds any one check may run before it fails", positive=True,
                           most=MOST_SECONDS),
        "time_limits": _k("limits", {}, "seconds per check id, e.g. { \"lifecycle.resume\" = 600 }"),
        "max_regression": _k("thresholds", {}, "worst change allowed against --ftready-baseline, per measurement "
                             "kind, e.g. { peak_device_bytes = 0.10, tokens_per_s = 0.10 }", choices=KIND_NAMES),
    },
    "pins": {
        "lockfile": _k("path", "", "pip freeze / requirements / uv.lock / poetry.lock", must_exist=True),
        "packages": _k("table", {}, "package = version pins"),
    },
    "privacy": {
        "licenses": _k("strs", [], "model licenses this team accepts"),
        "scan": _k("strs", ["secrets", "pii"], "what to scan for"),
        "scan_paths": _k("paths", [], "artifacts to scan besides the training data"),
        "backups": _k("table", {}, "{ path = ..., encrypted = true }"),
        "retention_days": _k("int", 0, "days artifacts are kept (0 = not declared)", most=36_600),
        "allowlist": _k("path", "", "accepted findings, by fingerprint", must_exist=True),
    },
    "export": {
        "format": _k("choice", "none", "export after training", choices=("none", "safetensors", "gguf")),
    },
    # Unsloth's own run ([data] pipeline = "unsloth", trainers/unsloth.py, issue 39): what its script names.
    "unsloth": {
        "chat_template": _k("str", "", "the name handed to unsloth.chat_templates.get_chat_template (e.g. \"chatml\"); "
                            "\"\" = the model's own template"),
        "instruction_part": _k("str", "", "train_on_responses_only's instruction_part: the text opening a user turn "
                               "in the rendered template, e.g. \"<|im_start|>user\\n\""),
        "response_part": _k("str", "", "train_on_responses_only's response_part: the text opening an assistant "
                            "turn in the rendered template, e.g. \"<|im_start|>assistant\\n\""),
    },
    # How the trained model is served (checks/serving.py, issue 41): the serving checks apply where engine is set.
    "serving": {
        "engine": _k("choice", "none", "what serves the trained model: none (not declared: the serving checks are "
                     "skipped), transformers, llama.cpp (a GGUF), ollama (a GGUF with a Modelfile), vllm or mlx",
                     choices=SERVING_ENGINES),
        "quantization": _k("str", "", "the quantization it is served at: a llama.cpp type (Q4_K_M, Q8_0, F16 ...) "
                           "for llama.cpp and ollama; \"\" = 16-bit"),
        "modelfile": _k("path", "", "the Ollama Modelfile the team serves with (ollama)", must_exist=True),
        "chat_template": _k("path", "", "a .jinja chat template the server is given instead of the model's own "
                            "(vLLM --chat-template, llama.cpp --chat-template-file)", must_exist=True),
        "max_lora_rank": _k("int", 0, "vLLM's --max-lora-rank the deployment passes (0 = not passed: vLLM's default)",
                            most=1 << 16),
        "converter": _k("path", "", "llama.cpp's convert_hf_to_gguf.py (else $FTREADY_GGUF_CONVERTER, or the "
                        "llama-cpp-python source distribution found by lifecycle.gguf)", must_exist=True),
        "merge_into": _k("choice", "", "which base a LoRA adapter trained on a quantized base is merged into: "
                         "original (the checkpoint loaded unquantized: Axolotl merge_lora, LLaMA-Factory export), "
                         "dequantized (the quantized base dequantize()d: Unsloth merged_16bit) or quantized (peft "
                         "merge_and_unload on the 4-bit/8-bit base: Unsloth merged_4bit_forced); \"\" = original, "
                         "or the adapter served unmerged for vllm", choices=("", *MERGE_WAYS)),
    },
    # Multi-GPU readiness (checks/distributed.py, issue 17): the checks apply to recipes with this table.
    "distributed": {
        "world_size": _k("int", 0, "processes (GPUs) per node; 0 = the visible GPUs (1 on a CPU)", most=1 << 16),
        "strategy": _k("choice", "ddp", "data parallel: ddp (replicas) or fsdp (FSDP2 fully_shard)",
                       choices=("ddp", "fsdp")),
        "backend": _k("choice", "auto", "torch.distributed backend; auto = nccl on GPUs, gloo on the CPU",
                      choices=("auto", "nccl", "gloo")),
        "nnodes": _k("int", 1, "machines in the job (each runs the same command)", positive=True, most=1 << 16),
        "rdzv_endpoint": _k("str", "", "host:port of the rendezvous; required with nnodes > 1"),
        "timeout_s": _k("float", 300.0, "seconds a collective, or a rank without progress, may wait before "
                        "the job fails",
                        positive=True, most=MOST_SECONDS),
        "min_bandwidth_share": _k("share", 0.25, "large-message bus bandwidth below this share of the link's fails"),
        "zero_stage": _k("int", 0, "DeepSpeed ZeRO stage the trainer's config names (0 = none; 1 optimizer states, "
                         "2 + gradients, 3 + parameters sharded)"),
        "cpu_offload": _k("choice", "none", "what DeepSpeed / FSDP offloads to host memory",
                          choices=("none", "optimizer", "parameters", "both")),
    },
}
TOP_KEYS = {"name": _k("str", "", "recipe name; default: the file stem")}
SCAN_KINDS = ("secrets", "pii")


def _record_class(table: str, keys: dict[str, Key]) -> type[PRecord]:
    # a subclass of the table's generated class (recipe/tables.py), so its type is what a type checker reads;
    # a table not generated yet gets a plain PRecord, so write_tables can run (test_tables.py fails until it has)
    fields: dict[str, Any] = {name: pfield() for name in keys}
    return type(f"{table.capitalize()}Table", (tables.TABLE_TYPES.get(table, PRecord),), fields)


TABLE_CLASSES = {table: _record_class(table, keys) for table, keys in SCHEMA.items()}


class Recipe(PRecord):
    """The frozen recipe: ``recipe.data.max_length``, ``recipe.model.path`` ... (the tables' types:
    ``recipe/tables.py``, generated from SCHEMA)."""

    name = pfield(type=str)
    source: Path = pfield()  # the TOML file
    folder: Path = pfield()  # the folder the relative paths were resolved against
    model: tables.ModelTable = pfield()
    data: tables.DataTable = pfield()
    adapter: tables.AdapterTable = pfield()
    training: tables.TrainingTable = pfield()
    hardware: tables.HardwareTable = pfield()
    budget: tables.BudgetTable = pfield()
    checks: tables.ChecksTable = pfield()
    pins: tables.PinsTable = pfield()
    privacy: tables.PrivacyTable = pfield()
    export: tables.ExportTable = pfield()
    origin: Any = pfield(initial=None)  # importers.Translation when read from a trainer's config, else None
    distributed: tables.DistributedTable = pfield()
    unsloth: tables.UnslothTable = pfield()
    serving: tables.ServingTable = pfield()
    declared: frozenset[str] = pfield()  # frozenset of the tables written in the file (the rest are defaults)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready form (paths as strings) for artifacts."""
        out: dict[str, Any] = {"name": self.name, "source": str(self.source)}
        for table in SCHEMA:
            out[table] = {k: _plain(v) for k, v in getattr(self, table).items()}
        if self.origin is not None:
            out["translation"] = self.origin.to_dict()
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "PVector":
        return [_plain(v) for v in value]
    return value


def _clip(text: str, most: int) -> str:
    """``text``, or its start and how long it was: an error quotes a value, never megabytes of it."""
    return text if len(text) <= most else f"{text[:most]}... ({len(text):,} characters in all)"


def _describe(value: Any) -> str:
    return f"{_clip(repr(value), SHOWN_CHARS)} ({type(value).__name__})"


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long, a NUL byte: not an existing file
        return False


def _shown(text: object) -> str:
    return _clip(repr(text), SHOWN_CHARS)


def did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else f"; valid keys: {', '.join(sorted(options))}"


class _Parser:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.folder = path.parent

    def fail(self, where: str, message: str) -> RecipeError:
        return RecipeError(self.path, where, message)

    def value(self, table: str, name: str, key: Key, raw: Any) -> Any:
        where = f"[{table}] {name}"
        kind = key.kind
        if kind == "str":
            if not isinstance(raw, str):
                raise self.fail(where, f"expected a string, got {_describe(raw)}")
            if len(raw) > MAX_TEXT_CHARS:
                raise self.fail(where, f"expected at most {MAX_TEXT_CHARS:,} characters, got {_describe(raw)}")
            return raw
        if kind == "bool":
            if not isinstance(raw, bool):
                raise self.fail(where, f"expected true or false, got {_describe(raw)}")
            return raw
        if kind == "int":
            if isinstance(raw, bool) or not isinstance(raw, int):
                raise self.fail(where, f"expected {'a positive' if key.positive else 'a non-negative'} integer, got "
                                f"{_describe(raw)}")
            if raw < (1 if key.positive else 0):
                raise self.fail(where, f"expected {'a positive' if key.positive else 'a non-negative'} "
                                f"integer, got {raw}")
            return self.at_most(where, raw, key, MOST_INT)
        if kind in ("float", "share"):
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise self.fail(where, f"expected a number, got {_describe(raw)}")
            raw = float(raw)
            if not math.isfinite(raw):
                raise self.fail(where, f"expected a finite number, got {raw}")
            if kind == "share" and not 0.0 <= raw < 1.0:
                raise self.fail(where, f"expected a share between 0 and 1 (e.g. 0.1 for 10%), got {raw}")
            if key.positive and raw <= 0:
                raise self.fail(where, f"expected a positive number, got {raw}")
            if raw < 0:
                raise self.fail(where, f"expected a non-negative number, got {raw}")
            return self.at_most(where, raw, key, MOST_FLOAT)
        if kind == "choice":
            if raw not in key.choices:
                hint = difflib.get_close_matches(str(raw), key.choices, n=1, cutoff=0.5)
                extra = f"; did you mean {hint[0]!r}?" if hint else ""
                shown = ", ".join(c or '""' for c in key.choices)
                raise self.fail(where, f"expected one of {shown}, got {_describe(raw)}{extra}")
            return raw
        if kind == "strs":
            if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
                raise self.fail(where, f"expected a list of strings like [\"a\", \"b\"], got {_describe(raw)}")
            return pvector(raw)
        if kind == "path":
            if not isinstance(raw, str):
                raise self.fail(where, f"expected a path string, got {_describe(raw)}")
            return self.path_value(where, raw, key)
        if kind == "paths":
            items = [raw] if isinstance(raw, str) else raw
            if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
                raise self.fail(where, f"expected a list of path strings, got {_describe(raw)}")
            if key.default is REQUIRED and not items:
                raise self.fail(where, "expected at least one file, got an empty list")
            found: dict = {}  # in order, each file once (two patterns may match the same file)
            for item in items:
                for path in self.path_values(where, item, key):
                    found.setdefault(path, None)
            return pvector(found)
        if kind == "table":
            if not isinstance(raw, dict):
                raise self.fail(where, f"expected a table like {{ key = \"value\" }}, got {_describe(raw)}")
            return freeze(raw)
        if kind == "skip":
            return self.skip_value(where, raw)
        if kind == "limits":
            if not isinstance(raw, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                    and 0 < v < math.inf
                                                    and v <= MOST_SECONDS for v in raw.values()):
                raise self.fail(where, f'expected check ids with positive seconds up to {MOST_SECONDS:,.0f}, e.g. '
                                '{ "lifecycle.resume" = 600 }, '
                                f"got {_describe(raw)}")
            return pmap({k: float(v) for k, v in raw.items()})
        if kind == "thresholds":
            return self.thresholds_value(where, raw, key.choices)
        raise AssertionError(f"unknown key kind {kind}")  # a schema bug, not user input

    def at_most(self, where: str, raw: Any, key: Key, most: Any) -> Any:
        """``raw`` when within the key's bound, else a RecipeError saying the bound."""
        most = key.most if key.most is not None else most
        if raw > most:
            unit = f" {key.unit}" if key.unit else ""
            raise self.fail(where, f"expected at most {most:,}{unit}, got {_clip(f'{raw:,}', SHOWN_CHARS)}: "
                            f"write a value of at most {most:,}")
        return raw

    def path_value(self, where: str, raw: str, key: Key) -> Path | str:
        if raw == "":
            return ""
        try:
            resolved = (self.folder / Path(raw).expanduser()).resolve()
            exists = resolved.exists()
        except RuntimeError as exc:  # a symlink loop (Python < 3.13), or no home folder for "~"
            raise self.fail(where, f"{_shown(raw)} cannot be resolved ({exc}): point it at the real file, "
                            "not at a link that leads back to itself") from None
        except (OSError, ValueError) as exc:  # ELOOP (Python >= 3.13), a name too long, a NUL byte, no permission
            reason = getattr(exc, "strerror", None) or str(exc)
            raise self.fail(where, f"{_shown(raw)} cannot be looked up ({reason}): write the path of a file "
                            "this user can read, relative to the recipe's folder") from None
        if key.must_exist and not exists:
            raise self.fail(where, f"{_shown(raw)} does not exist (looked for {_clip(str(resolved), 300)}); "
                            "fix the path, relative to the recipe's folder")
        # reading a FIFO blocks, a device never ends
        if key.must_exist and not (resolved.is_file() or resolved.is_dir()):
            raise self.fail(where, f"{_shown(raw)} is not a regular file (a FIFO, socket or device): write it to a "
                            "file on disk and point the recipe at that file")
        if pseudo_file_system(resolved):
            raise self.fail(where, f"{_shown(raw)} lies in a pseudo file system (/proc, /sys, /dev: a "
                            f"process's memory, "
                            "a device or a kernel table), not a file of yours: point it at a regular file or folder")
        return resolved

    def path_values(self, where: str, raw: str, key: Key) -> list:
        """One entry of a ``paths`` list: its file, or with ``key.globs`` the sorted files a pattern
        matches (a file whose name holds * ? [ literally is taken as it is)."""
        if not (key.globs and GLOB_CHARS.search(raw)) or _exists(self.folder / raw):
            return [self.path_value(where, raw, key)]
        pattern = str(self.folder / Path(raw).expanduser())
        matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
        if not matches:
            raise self.fail(where, f"the pattern {_shown(raw)} matches no file (looked for {_clip(pattern, 300)}); "
                            "fix the pattern, relative to the recipe's folder")
        return [self.path_value(where, str(p), key) for p in matches]

    def skip_value(self, where: str, raw: Any) -> Any:
        if isinstance(raw, list) and all(isinstance(v, str) for v in raw):
            return pmap({v: "left out by the recipe's [checks] skip" for v in raw})
        if isinstance(raw, dict) and all(isinstance(v, str) and v for v in raw.values()):
            return pmap(raw)
        raise self.fail(where, 'expected check ids with reasons, e.g. skip = { "sustained.thermal" = "no NVML here" }, '
                        f"or a list of ids; got {_describe(raw)}")

    def thresholds_value(self, where: str, raw: Any, kinds: tuple[str, ...]) -> Any:
        if not isinstance(raw, dict):
            raise self.fail(where, f"expected a table like {{ {kinds[0]} = 0.10 }}, got {_describe(raw)}")
        for name, share in raw.items():
            if name not in kinds:
                raise self.fail(f"{where}.{name}", "unknown measurement kind" + did_you_mean(name, list(kinds)))
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= MOST_FLOAT:
                raise self.fail(f"{where}.{name}", "expected a non-negative share of change (0.10 = 10% worse), "
                                f"got {_describe(share)}")
        return pmap({name: float(share) for name, share in raw.items()})

    def table(self, table: str, raw: Any) -> PRecord:
        keys = SCHEMA[table]
        if not isinstance(raw, dict):
            raise self.fail(f"[{table}]", f"expected a table, got {_describe(raw)}")
        for name in raw:
            if name not in keys:
                raise self.fail(f"[{table}] {name}", "unknown key" + did_you_mean(name, list(keys)))
        values = {}
        for name, key in keys.items():
            if name in raw:
                values[name] = self.value(table, name, key, raw[name])
            elif key.default is REQUIRED:
                raise self.fail(f"[{table}] {name}", f"missing; expected {key.doc}")
            elif key.kind == "path" and key.default:
                values[name] = self.path_value(f"[{table}] {name}", key.default, Key(kind="path"))
            else:
                values[name] = freeze(key.default)
        return TABLE_CLASSES[table](**values)


def parse_recipe(text: str, path: Path | str) -> Recipe:
    """Validate TOML text as the recipe at ``path`` (used for messages and relative paths)."""
    path = Path(path).resolve()
    parser = _Parser(path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise parser.fail("", f"not valid TOML: {exc}") from None
    return validate_recipe(raw, path)


def validate_recipe(raw: dict, path: Path | str, origin: Any = None) -> Recipe:
    """Validate TOML-shaped tables (from a recipe.toml or an importer) as the recipe at ``path``."""
    path = Path(path).resolve()
    parser = _Parser(path)
    for name in raw:
        if name not in SCHEMA and name not in TOP_KEYS:
            what = f"[{name}]" if isinstance(raw[name], dict) else name
            raise parser.fail(what, "unknown table or key" + did_you_mean(name, [*SCHEMA, *TOP_KEYS]))
    if "data" not in raw:
        raise parser.fail("[data]", "missing; a recipe needs at least [data] train = [\"path/to/train.jsonl\"]")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise parser.fail("name", f"expected letters, digits, '.', '_' or '-', got {_describe(name)}")
    if len(name) > MAX_NAME_CHARS:  # it names the artifacts folder and prefixes every test id
        raise parser.fail("name", f"expected at most {MAX_NAME_CHARS} characters (it names the artifacts folder), "
                          f"got {len(name):,}: write a short name")
    tables = {table: parser.table(table, raw.get(table, {})) for table in SCHEMA}
    _cross_checks(parser, tables)
    return Recipe(name=name, source=path, folder=path.parent, origin=origin,
                  declared=frozenset(t for t in raw if t in SCHEMA), **tables)


def _cross_checks(parser: _Parser, t: dict[str, PRecord]) -> None:
    model, data, adapter, training, privacy = t["model"], t["data"], t["adapter"], t["training"], t["privacy"]
    if bool(model.id) == bool(model.path):
        raise parser.fail("[model]", "expected exactly one of id (a hub id) or path (a local folder), "
                          f"got {'both' if model.id else 'neither'}")
    if model.id and not model.revision:
        raise parser.fail("[model] revision", f"missing; a hub id needs the commit to train on: look it up with "
                          f"`huggingface-cli repo info {model.id}` (sha) and write revision = \"<40-hex sha>\"")
    if model.path and not Path(model.path).is_dir():
        raise parser.fail("[model] path", f"{model.path} is not a folder; point it at the folder holding config.json")
    if data.format in CHAT_FORMATS and data.train_on == "completion":
        raise parser.fail("[data] train_on", "'completion' goes with format = \"prompt_completion\"; "
                          f"for {data.format} use \"assistant\" or \"last_assistant\"")
    if data.format in ("prompt_completion", "text") and data.train_on in ("assistant", "last_assistant"):
        want = "completion" if data.format == "prompt_completion" else "all"
        raise parser.fail("[data] train_on", f"{data.train_on!r} needs conversations (format = \"messages\", "
                          f"\"sharegpt\", \"alpaca\" or \"auto\"); for {data.format} write train_on = \"{want}\"")
    if data.format == "text" and data.train_on != "all":
        raise parser.fail("[data] train_on", "format = \"text\" trains on every token: write train_on = \"all\"")
    bad_roles = {k: v for k, v in data.roles.items() if v not in ROLES}
    if bad_roles:
        speaker, role = next(iter(bad_roles.items()))
        raise parser.fail(f"[data] roles.{speaker}", f"expected one of {', '.join(ROLES)}, got {_describe(role)}")
    if adapter.method == "none" and model.quantization != "none":
        raise parser.fail("[model] quantization", "a quantized base cannot be fully fine-tuned; "
                          "use [adapter] method = \"lora\" (QLoRA) or quantization = \"none\"")
    _regex(parser, "[adapter] target_regex", [adapter.target_regex] if adapter.target_regex else [],
           "peft full-matches it against module names, e.g. \".*\\.(q_proj|v_proj)\"")
    _regex(parser, "[training] trainable", training.trainable,
           "each is searched in parameter names, e.g. \"model\\.layers\\.(30|31)\\.\"")
    if adapter.method == "lora" and not adapter.target_modules and not adapter.target_regex:
        raise parser.fail("[adapter] target_modules", "expected at least one module name, e.g. "
                          "[\"q_proj\", \"v_proj\"]")
    if training.optimizer_in_backward and training.gradient_accumulation_steps > 1:
        raise parser.fail("[training] optimizer_in_backward", "steps each parameter as soon as its gradient exists, "
                          "so it cannot accumulate gradients over micro-batches: write gradient_accumulation_steps "
                          "= 1, or optimizer_in_backward = false")
    if training.loss_dtype != "float32" and training.loss not in ("full", "chunked"):
        raise parser.fail("[training] loss_dtype", f"applies to loss = \"full\" or \"chunked\"; {training.loss} runs "
                          "its kernel's own precision: remove loss_dtype, or write loss = \"full\" or \"chunked\"")
    if training.learning_rate < 0:
        raise parser.fail("[training] learning_rate", f"expected a non-negative number, got {training.learning_rate}")
    bad = [s for s in privacy.scan if s not in SCAN_KINDS]
    if bad:
        raise parser.fail("[privacy] scan", f"unknown scan {bad[0]!r}; expected some of {', '.join(SCAN_KINDS)}")
    backups = privacy.backups
    if backups:
        unknown = [k for k in backups if k not in ("path", "encrypted")]
        if unknown:
            raise parser.fail("[privacy] backups", f"unknown key {unknown[0]!r}; expected path and encrypted")
        if not isinstance(backups.get("encrypted"), bool) or not isinstance(backups.get("path"), str):
            raise parser.fail("[privacy] backups", "expected { path = \"backups/\", encrypted = true }")
        parser.path_value("[privacy] backups path", backups["path"], Key(kind="path"))
    if privacy.allowlist and not Path(privacy.allowlist).is_file():
        raise parser.fail("[privacy] allowlist", f"{privacy.allowlist} is a folder; point it at a text file of "
                          "accepted fingerprints, one a line")
    _distributed_checks(parser, t)
    _unsloth_checks(parser, t)
    _serving_checks(parser, t["serving"])
    pins = t["pins"].packages
    bad_pins = [k for k, v in pins.items() if not isinstance(v, str)]
    if bad_pins:
        raise parser.fail(f"[pins] packages.{bad_pins[0]}", f"expected a version string like \"2.5.1\", got "
                          f"{_describe(pins[bad_pins[0]])}")


def _regex(parser: _Parser, where: str, patterns: Any, example: str) -> None:
    """Each of ``patterns`` compiles as a Python regular expression, else a RecipeError at ``where``."""
    for pattern in patterns:
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            raise parser.fail(where, f"{_shown(pattern)} is not a regular expression ({exc}): {example}; "
                              "escape a literal . ( [ with a backslash") from None


UNSLOTH_TEMPLATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_. -]*")  # "vicuna old" has a space


def _unsloth_checks(parser: _Parser, t: dict[str, PRecord]) -> None:
    """[unsloth] goes with [data] pipeline = "unsloth"; train_on_responses_only needs both parts."""
    u, data = t["unsloth"], t["data"]
    written = [k for k in ("chat_template", "instruction_part", "response_part") if u[k]]
    if data.pipeline != "unsloth":
        if written:
            raise parser.fail(f"[unsloth] {written[0]}", "applies to Unsloth's own run: write [data] pipeline = "
                              "\"unsloth\", or remove the [unsloth] table")
        return
    if u.chat_template and not UNSLOTH_TEMPLATE_NAME.fullmatch(u.chat_template):
        raise parser.fail("[unsloth] chat_template", f"expected a name from unsloth.chat_templates.CHAT_TEMPLATES "
                          f"(e.g. \"chatml\", \"llama-3.1\"), got {_describe(u.chat_template)}")
    if bool(u.instruction_part) != bool(u.response_part):
        have, lack = (("instruction_part", "response_part") if u.instruction_part
                      else ("response_part", "instruction_part"))
        raise parser.fail(f"[unsloth] {lack}", f"missing: Unsloth's train_on_responses_only takes {have} and {lack} "
                          "together, e.g. instruction_part = \"<|im_start|>user\\n\", response_part = "
                          "\"<|im_start|>assistant\\n\" for ChatML")
    if data.format in ("prompt_completion", "text") and data.train_on != "all":
        raise parser.fail("[data] format", f"{data.format!r} with train_on = {data.train_on!r}: Unsloth's run "
                          "trains rendered conversations (messages, sharegpt or alpaca rows) masked by "
                          "train_on_responses_only, or whole texts with train_on = \"all\"")
    if data.train_on == "last_assistant":
        raise parser.fail("[data] train_on", "Unsloth's train_on_responses_only trains every assistant turn, not the "
                          "last one only: write train_on = \"assistant\"")
    if data.train_on == "assistant" and not u.response_part:
        raise parser.fail("[unsloth] response_part", "missing: with train_on = \"assistant\" Unsloth masks through "
                          "train_on_responses_only, which needs the parts the rendered template opens turns with: "
                          "write instruction_part and response_part (ChatML: \"<|im_start|>user\\n\" and "
                          "\"<|im_start|>assistant\\n\"), or train_on = \"all\"")
    if data.train_on == "all" and u.response_part:
        raise parser.fail("[unsloth] response_part", "train_on = \"all\" trains every token, so "
                          "train_on_responses_only would not run: remove the parts, or write train_on = \"assistant\"")
    if data.packing:
        raise parser.fail("[data] packing", "Unsloth's train_on_responses_only masks unpacked rows: write packing = "
                          "false for [data] pipeline = \"unsloth\"")


def _serving_checks(parser: _Parser, serving: PRecord) -> None:
    engine = serving.engine
    if serving.modelfile and engine != "ollama":
        raise parser.fail("[serving] modelfile", f"a Modelfile is what Ollama reads, but engine is {engine!r}: write "
                          "engine = \"ollama\", or remove modelfile")
    if serving.max_lora_rank and engine != "vllm":
        raise parser.fail("[serving] max_lora_rank", f"is vLLM's --max-lora-rank, but engine is {engine!r}: write "
                          "engine = \"vllm\", or remove max_lora_rank")
    if engine == "none" and (serving.quantization or serving.chat_template or serving.converter or serving.merge_into):
        key = next(k for k in ("quantization", "chat_template", "converter", "merge_into") if serving[k])
        raise parser.fail(f"[serving] {key}", "set, but no engine: write engine = one of "
                          f"{', '.join(SERVING_ENGINES[1:])}, so the serving checks know what serves the model")
    if serving.converter and engine not in GGUF_ENGINES:
        raise parser.fail("[serving] converter", f"llama.cpp's GGUF converter is for engine llama.cpp or ollama, not "
                          f"{engine!r}: remove converter")
    if serving.quantization and engine in GGUF_ENGINES and serving.quantization.upper() not in GGUF_TYPES:
        raise parser.fail("[serving] quantization", f"{_shown(serving.quantization)} is not a llama.cpp quantization "
                          f"type; expected one of {', '.join(GGUF_TYPES)}"
                          + "".join(f" (did you mean {c}?)" for c in difflib.get_close_matches(
                              serving.quantization.upper(), GGUF_TYPES, n=1, cutoff=0.6)))


def _distributed_checks(parser: _Parser, t: dict[str, PRecord]) -> None:
    d, device = t["distributed"], t["hardware"].device
    if d.backend == "nccl" and device in ("cpu", "mps", "mlx"):
        raise parser.fail("[distributed] backend", f"nccl needs CUDA/ROCm GPUs but [hardware] device = \"{device}\"; "
                          "write backend = \"gloo\" (or \"auto\") to run the ranks on the CPU")
    if d.zero_stage > 3:
        raise parser.fail("[distributed] zero_stage", f"expected 0, 1, 2 or 3 (DeepSpeed ZeRO stages), got "
                          f"{d.zero_stage}")
    if d.nnodes > 1 and not re.fullmatch(r"\[?[A-Za-z0-9_.:-]+\]?:\d+", d.rdzv_endpoint):
        raise parser.fail("[distributed] rdzv_endpoint", f"nnodes = {d.nnodes} needs the rendezvous as \"host:port\" "
                          f"reachable from every node (e.g. \"node0.cluster:29400\"), got {d.rdzv_endpoint!r}")


def is_commit_hash(revision: str) -> bool:
    return bool(HEX40.match(revision))


def key_location(name: str, path: Path | str, where: str) -> tuple[str, str]:
    """A recipe key as written in a variant: ``"micro_batch_size"`` (unique across tables) or
    ``"training.micro_batch_size"`` -> ``("training", "micro_batch_size")``."""
    if "." in name:
        table, _, key = name.partition(".")
        if table in SCHEMA and key in SCHEMA[table]:
            return table, key
    else:
        tables = [table for table, keys in SCHEMA.items() if name in keys]
        if len(tables) == 1:
            return tables[0], name
        if tables:
            raise RecipeError(path, f"{where} {name}", "is a key of " + ", ".join(f"[{t}]" for t in tables)
                              + f": write {tables[0]}.{name} (table.key)")
    every = [f"{t}.{k}" for t, keys in SCHEMA.items() for k in keys] + [k for keys in SCHEMA.values() for k in keys]
    raise RecipeError(path, f"{where} {name}", "unknown recipe key" + did_you_mean(name, every))


def validate_value(table: str, key: str, raw: Any, path: Path | str) -> Any:
    """``raw`` read as ``[table] key`` of the recipe at ``path`` (its kind, bounds and choices),
    or the RecipeError the file itself would get."""
    return _Parser(Path(path).resolve()).value(table, key, SCHEMA[table][key], raw)


def with_changes(recipe: Recipe, changes: dict[str, Any], where: str = "variant") -> Recipe:
    """The recipe with ``changes`` ({key: value}, keys as ``key_location`` reads them) applied
    and validated like the file itself: a value the schema refuses is a RecipeError."""
    parser = _Parser(Path(recipe.source))
    tables = {table: getattr(recipe, table) for table in SCHEMA}
    for name, raw in changes.items():
        table, key = key_location(name, recipe.source, where)
        value = parser.value(table, key, SCHEMA[table][key], _plain(raw) if isinstance(raw, Path) else raw)
        tables[table] = tables[table].set(key, value)
    _cross_checks(parser, tables)
    for table, record in tables.items():
        recipe = recipe.set(table, record)
    return recipe
