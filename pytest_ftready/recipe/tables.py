"""The recipe's tables as a type checker sees them. Generated from ``schema.SCHEMA`` by
``python -m pytest_ftready.recipe.write_tables``: do not edit; regenerate after changing SCHEMA.

At run time each table is a frozen ``pyrsistent.PRecord`` of a subclass of its class here, built
by ``schema`` with one field per key."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from pyrsistent import PRecord


class ModelTable(PRecord):
    """[model]"""

    id: str
    """hub id, e.g. meta-llama/Llama-3.1-8B-Instruct (exactly one of id/path)"""
    path: Path | str
    """local model folder (exactly one of id/path)"""
    revision: str
    """hub commit (40 hex); required with id"""
    gguf_file: str
    """a .gguf file in the model folder/repo to load (dequantized by transformers)"""
    dtype: Literal['float32', 'float16', 'bfloat16']
    """training dtype"""
    attn_implementation: Literal['eager', 'sdpa', 'flash_attention_2', 'flash_attention_3']
    """attention kernel"""
    quantization: Literal['none', '4bit', '8bit']
    """bitsandbytes base quantization"""
    trust_remote_code: bool
    """never true unless written here"""
    license: str
    """overrides the license the model card declares"""
    kbit_preparation: Literal['auto', 'on', 'off']
    """peft's prepare_model_for_kbit_training on a quantized base (auto: as the trainer does; TRL and the HF Trainer
    do, torchtune and litgpt do not)"""


class DataTable(PRecord):
    """[data]"""

    train: Sequence[Path]
    """local jsonl/json/parquet/csv files, or glob patterns (data/*.jsonl)"""
    format: Literal['auto', 'messages', 'sharegpt', 'alpaca', 'prompt_completion', 'text']
    """row layout; auto recognises each row from its fields"""
    train_on: Literal['assistant', 'last_assistant', 'completion', 'all']
    """which tokens carry loss"""
    max_length: int
    """tokens per example after truncation"""
    packing: bool
    """pack several examples into one sequence"""
    manifest: Path | str
    """data manifest checked by repro.manifest"""
    rights: str
    """why we may train on this data (privacy.license)"""
    sample: int
    """examples shown example by example"""
    chat_template: Path | str
    """a .jinja file overriding the tokenizer's template"""
    add_special_tokens: bool
    """the trainer tokenizes rendered text adding BOS/EOS"""
    stop_tokens: Sequence[str]
    """extra end-of-turn tokens besides EOS"""
    train_empty_reasoning: bool
    """whether an empty reasoning block (<think></think> with only whitespace between, a reasoning template's
    boilerplate for rows without reasoning) may carry loss; false: data.masking fails on rows that train one
    (LLaMA-Factory's enable_thinking: false masks it)"""
    roles: Mapping[str, Any]
    """ShareGPT speaker names mapped to roles, e.g. { bot = "assistant" }"""
    eval: Sequence[Path]
    """held-out evaluation files (jsonl/json/parquet/csv, or glob patterns) the run evaluates on (eval_dataset); []
    with eval_split = 0: the run evaluates nothing"""
    eval_split: float
    """share of the training rows held out for evaluation (LLaMA-Factory val_size, Axolotl val_set_size, TRL
    test_split_size)"""
    pipeline: Literal['auto', 'builtin', 'trl', 'axolotl', 'llamafactory', 'unsloth', 'mlx']
    """whose preprocessing and training step the checks run: auto = the config's trainer where it is installed, else
    builtin (pytest-ftready's own)"""


class AdapterTable(PRecord):
    """[adapter]"""

    method: Literal['none', 'lora']
    """none = full fine-tune"""
    r: int
    """LoRA rank"""
    alpha: float
    """LoRA alpha"""
    dropout: float
    """LoRA dropout"""
    target_modules: Sequence[str]
    """modules that get adapters"""
    target_regex: str
    """a regex peft full-matches against module names, instead of target_modules"""


class TrainingTable(PRecord):
    """[training]"""

    micro_batch_size: int
    """examples per forward pass"""
    gradient_accumulation_steps: int
    """micro-batches per optimizer step"""
    learning_rate: float
    """peak learning rate"""
    optimizer: Literal['adamw', 'adamw_8bit', 'paged_adamw', 'paged_adamw_8bit', 'sgd', 'adafactor']
    """optimizer"""
    lr_scheduler: Literal['linear', 'cosine', 'constant']
    """schedule after warm-up"""
    warmup_steps: int
    """linear warm-up steps"""
    weight_decay: float
    """AdamW weight decay"""
    gradient_checkpointing: bool
    """activation checkpointing"""
    epochs: float
    """passes over the data"""
    seed: int
    """seed for torch, python, numpy and data order"""
    output_dir: Path | str
    """where the run writes checkpoints and logs"""
    save_steps: int
    """optimizer steps between checkpoints"""
    save_total_limit: int
    """checkpoints kept"""
    ddp_timeout_s: float
    """seconds a rank of a distributed run waits at a collective before the process group's watchdog ends the job
    (transformers' ddp_timeout): rank 0's preprocessing must end within it (data.loader)"""
    compile: bool
    """torch.compile the model (needs triton on GPUs)"""
    tf32: bool
    """allow TF32 matmuls (Ampere and newer)"""
    fp8: bool
    """FP8 matmuls (torchao / Transformer Engine; Ada, Hopper and newer)"""
    loss: Literal['full', 'chunked', 'fused_linear', 'cut_cross_entropy']
    """how the loss meets the vocabulary: full logits, chunked (loss_chunks pieces), fused_linear (Liger's fused
    linear cross-entropy) or cut_cross_entropy (Apple's CCE)"""
    loss_chunks: int
    """pieces the chunked loss computes logits for, one at a time"""
    loss_dtype: Literal['float32', 'compute']
    """dtype the full or chunked loss computes its logits and cross-entropy in: float32 (upcast first, as
    transformers' loss does) or compute (the model's dtype, as litgpt's bfloat16 chunked cross-entropy)"""
    optimizer_in_backward: bool
    """step each parameter's optimizer in its gradient hook (no whole-model gradients held)"""
    activation_offloading: bool
    """saved activations moved to host memory between forward and backward"""
    trainable: Sequence[str]
    """full fine-tune of only the parameters whose names match these regexes (freeze / unfrozen_parameters); [] =
    every parameter"""
    eval_batch_size: int
    """examples per evaluation forward pass (per_device_eval_batch_size); 0 = micro_batch_size"""
    eval_accumulation_steps: int
    """evaluation batches whose logits the trainer keeps on the device before moving them to host memory; 0 = unset:
    kept on the device until the whole eval set has run"""
    prediction_loss_only: bool
    """evaluation keeps only the loss, never the logits"""
    compute_metrics: bool
    """the trainer is handed a compute_metrics function (code, so never in a trainer's config): evaluation keeps
    every eval batch's logits for it unless prediction_loss_only"""
    low_rank_optimizer: Literal['none', 'galore', 'apollo']
    """optimizer states kept in a low-rank projection (GaLore, APOLLO)"""


class HardwareTable(PRecord):
    """[hardware]"""

    device: Literal['auto', 'cuda', 'rocm', 'mps', 'cpu', 'mlx']
    """where to train"""
    memory_headroom: float
    """share of device memory to keep free"""
    target: str
    """device to forecast memory for: a size like "24GiB" or a GPU name like "RTX 4090\""""


class BudgetTable(PRecord):
    """[budget]"""

    max_hours: float
    """wall-clock budget of the run"""
    disk_headroom: float
    """share of free disk to keep"""
    time_headroom: float
    """margin for retries, on top of the ETA"""
    eval_share: float
    """share of training time spent evaluating"""
    log_bytes: int
    """bytes of logs the run writes"""
    eval_bytes: int
    """bytes of evaluation outputs the run writes"""


class ChecksTable(PRecord):
    """[checks]"""

    overfit_examples: int
    """rows in the overfit sample"""
    overfit_steps: int
    """optimizer steps allowed to overfit"""
    overfit_loss: float
    """loss the overfit must reach"""
    resume_steps: int
    """steps of the resume check (even, >= 2)"""
    sustained_seconds: float
    """length of the sustained window"""
    warmup_seconds: float
    """warm-up before measuring"""
    window_seconds: float
    """length of one throughput window"""
    max_throughput_drop: float
    """allowed drop, best early window to last"""
    max_temperature_c: float
    """hottest allowed GPU temperature"""
    max_truncated_share: float
    """rows whose response truncation may cut"""
    benchmark_rounds: int
    """rounds of timed benchmarks"""
    max_new_tokens: int
    """tokens generated by lifecycle.generate"""
    skip: Mapping[str, str]
    """check ids to leave out, each with a reason"""
    time_limit_s: float
    """seconds any one check may run before it fails"""
    time_limits: Mapping[str, float]
    """seconds per check id, e.g. { "lifecycle.resume" = 600 }"""
    max_regression: Mapping[str, float]
    """worst change allowed against --ftready-baseline, per measurement kind, e.g. { peak_device_bytes = 0.10,
    tokens_per_s = 0.10 }"""


class PinsTable(PRecord):
    """[pins]"""

    lockfile: Path | str
    """pip freeze / requirements / uv.lock / poetry.lock"""
    packages: Mapping[str, Any]
    """package = version pins"""


class PrivacyTable(PRecord):
    """[privacy]"""

    licenses: Sequence[str]
    """model licenses this team accepts"""
    scan: Sequence[str]
    """what to scan for"""
    scan_paths: Sequence[Path]
    """artifacts to scan besides the training data"""
    backups: Mapping[str, Any]
    """{ path = ..., encrypted = true }"""
    retention_days: int
    """days artifacts are kept (0 = not declared)"""
    allowlist: Path | str
    """accepted findings, by fingerprint"""


class ExportTable(PRecord):
    """[export]"""

    format: Literal['none', 'safetensors', 'gguf']
    """export after training"""


class UnslothTable(PRecord):
    """[unsloth]"""

    chat_template: str
    """the name handed to unsloth.chat_templates.get_chat_template (e.g. "chatml"); "" = the model's own template"""
    instruction_part: str
    """train_on_responses_only's instruction_part: the text opening a user turn in the rendered template, e.g.
    "<|im_start|>user\\n\""""
    response_part: str
    """train_on_responses_only's response_part: the text opening an assistant turn in the rendered template, e.g.
    "<|im_start|>assistant\\n\""""


class ServingTable(PRecord):
    """[serving]"""

    engine: Literal['none', 'transformers', 'llama.cpp', 'ollama', 'vllm', 'mlx']
    """what serves the trained model: none (not declared: the serving checks are skipped), transformers, llama.cpp
    (a GGUF), ollama (a GGUF with a Modelfile), vllm or mlx"""
    quantization: str
    """the quantization it is served at: a llama.cpp type (Q4_K_M, Q8_0, F16 ...) for llama.cpp and ollama; "" =
    16-bit"""
    modelfile: Path | str
    """the Ollama Modelfile the team serves with (ollama)"""
    chat_template: Path | str
    """a .jinja chat template the server is given instead of the model's own (vLLM --chat-template, llama.cpp
    --chat-template-file)"""
    max_lora_rank: int
    """vLLM's --max-lora-rank the deployment passes (0 = not passed: vLLM's default)"""
    converter: Path | str
    """llama.cpp's convert_hf_to_gguf.py (else $FTREADY_GGUF_CONVERTER, or the llama-cpp-python source distribution
    found by lifecycle.gguf)"""
    merge_into: Literal['', 'original', 'dequantized', 'quantized']
    """which base a LoRA adapter trained on a quantized base is merged into: original (the checkpoint loaded
    unquantized: Axolotl merge_lora, LLaMA-Factory export), dequantized (the quantized base dequantize()d: Unsloth
    merged_16bit) or quantized (peft merge_and_unload on the 4-bit/8-bit base: Unsloth merged_4bit_forced); "" =
    original, or the adapter served unmerged for vllm"""


class DistributedTable(PRecord):
    """[distributed]"""

    world_size: int
    """processes (GPUs) per node; 0 = the visible GPUs (1 on a CPU)"""
    strategy: Literal['ddp', 'fsdp']
    """data parallel: ddp (replicas) or fsdp (FSDP2 fully_shard)"""
    backend: Literal['auto', 'nccl', 'gloo']
    """torch.distributed backend; auto = nccl on GPUs, gloo on the CPU"""
    nnodes: int
    """machines in the job (each runs the same command)"""
    rdzv_endpoint: str
    """host:port of the rendezvous; required with nnodes > 1"""
    timeout_s: float
    """seconds a collective, or a rank without progress, may wait before the job fails"""
    min_bandwidth_share: float
    """large-message bus bandwidth below this share of the link's fails"""
    zero_stage: int
    """DeepSpeed ZeRO stage the trainer's config names (0 = none; 1 optimizer states, 2 + gradients, 3 + parameters
    sharded)"""
    cpu_offload: Literal['none', 'optimizer', 'parameters', 'both']
    """what DeepSpeed / FSDP offloads to host memory"""


TABLE_TYPES: dict[str, type[PRecord]] = {
    'model': ModelTable,
    'data': DataTable,
    'adapter': AdapterTable,
    'training': TrainingTable,
    'hardware': HardwareTable,
    'budget': BudgetTable,
    'checks': ChecksTable,
    'pins': PinsTable,
    'privacy': PrivacyTable,
    'export': ExportTable,
    'unsloth': UnslothTable,
    'serving': ServingTable,
    'distributed': DistributedTable,
}
