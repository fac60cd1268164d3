"""Each trainer's training step as the forecast traces it, keyed by the trainer's name.

A trainer's step differs from pytest-ftready's engine step in three ways that move its peak:
how its loss meets the vocabulary (TRL's chunked log-prob head), the autocast its Trainer runs
the forward under (TRL's bf16 default), and how its collator pads the worst-case micro-batch
(Axolotl to a multiple of 64, LLaMA-Factory to a multiple of 8). ``PATHS`` maps a trainer's
name to a small function that reads these from the recipe and the trainer's own config and
returns a ``StepPath``: adding a trainer is one function and one entry. What cannot be traced
here (a trainer that is not installed, a GPU kernel) is modelled, and the path's notes say
which part and how far it may be off.

A ``Step`` says whose step on which device: ``forecast.trace.forecast(recipe, step=...)`` traces
the ``StepPath`` it resolves to. Imports the engine and the recipe; never the trainers, the
session, the checks or pytest; a trainer's own package only where its code is traced."""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

ACCELERATORS = ("cuda", "rocm")
KERNEL_STAND_INS = ("_forward_tile", "_backward_tile", "_addmm_fp32")  # TRL's torch versions of its Triton kernels
TRL_BASE_CONFIG = "trl/trainer/base_config.py (bf16 defaults to not fp16)"
TRL_HEAD = ("trl/trainer/utils.py add_fused_lm_head and trl/kernels/chunked_logprob.py ChunkedLogProbFunction "
            "(TRL's SFTTrainer.compute_loss: model(..., fused_lm_head=True), -log_probs summed over trained tokens)")
TRL_CHUNKED = "trl/trainer/sft_trainer.py _chunked_cross_entropy_loss and _chunk (TRL 1.9, loss_type chunked_nll)"
TRL_TILE = (4096, 32768)  # TRL 1.16: TOKEN_CHUNK_SIZE tokens x _CHUNKED_LOGPROB_CHUNK_SIZE vocabulary columns
AXOLOTL_COLLATOR = "axolotl/core/builders/causal.py (pad_to_multiple_of, default 64; pad_to_sequence_len)"
AXOLOTL_DTYPE = "axolotl/utils/config/__init__.py resolve_dtype, core/builders/base.py _configure_precision_settings"
LLAMAFACTORY_COLLATOR = "llamafactory/train/sft/workflow.py (SFTDataCollatorWith4DAttentionMask, pad_to_multiple_of=8)"


@dataclass(frozen=True)
class Step:
    """Whose step, on which device: ``trainer`` is a key of ``PATHS``, ``device`` the kind it
    runs on (cpu, cuda, rocm, mps). A measured step also says what it ran: ``batch_tokens``, the
    token positions of its micro-batch as the trainer collated it (None: the worst case, rows of
    max_length); ``first_step``, the optimizer state created inside the step (a trainer's
    max_steps = 1 run) rather than held from an earlier one; ``accumulation``, micro-batches per
    optimizer step (None: the recipe's)."""

    trainer: str = "builtin"
    device: str = "cpu"
    batch_tokens: Optional[int] = None
    first_step: bool = False
    accumulation: Optional[int] = None

    @property
    def accelerator(self) -> bool:
        return self.device in ACCELERATORS


@dataclass(frozen=True)
class StepPath:
    """What the trace runs for a Step: ``rows`` x ``row_tokens`` per micro-batch, ``accumulation``
    micro-batches, the forward under ``autocast`` ("" none, else a dtype name), the loss ``loss``
    (a key of LOSSES). ``description`` names the path; ``notes`` say what is modelled or
    estimated rather than traced, and by how much it may be off."""

    step: Step
    rows: int
    row_tokens: int
    accumulation: int
    autocast: str = ""
    loss: str = "engine"
    description: str = ""
    notes: tuple[str, ...] = ()

    @property
    def batch_shape(self) -> tuple[int, int]:
        return self.rows, self.row_tokens

    def loss_of(self, model, batch: dict):
        """The loss of one micro-batch as this trainer computes it, its model's forward under the
        Trainer's mixed precision (``mixed_precision``)."""
        loss = LOSSES[self.loss]
        outside = bool(self.autocast) and loss.outside_forward(model)
        with mixed_precision(model, self.autocast), (_autocast(self.autocast) if outside else nullcontext()):
            return loss.loss_of(model, batch)

    def prepare(self, model) -> None:
        LOSSES[self.loss].prepare(model)

    def forward_module(self, model):
        """The module whose forward ends where the loss's own computation begins (the trace's phases)."""
        return LOSSES[self.loss].forward_module(model)

    def traced(self):
        """The context the trace runs in (a GPU kernel's footprint substituted for its CPU stand-in)."""
        return LOSSES[self.loss].traced(self)


ACCELERATE_AMP = ("accelerate/accelerator.py prepare_model: model.forward = "
                  "convert_outputs_to_fp32(autocast(forward)), "
                  "the mixed precision of every transformers.Trainer")


def _autocast(dtype: str):
    import torch

    return torch.autocast("cpu", dtype=getattr(torch, dtype))


@contextmanager
def mixed_precision(model, dtype: str) -> Iterator[None]:
    """``model.forward`` as accelerate prepares it for a Trainer's mixed precision (ACCELERATE_AMP):
    run under autocast to ``dtype``, its half-precision outputs (the logits) copied to float32.
    Traced on CPU fake tensors, so the CPU's autocast op lists stand for the device's."""
    if not dtype:
        yield
        return
    from accelerate.utils import convert_outputs_to_fp32

    own = vars(model).get("forward")  # a forward patched on the instance (TRL's heads on a model without an adapter)
    model.forward = convert_outputs_to_fp32(_autocast(dtype)(model.forward))
    try:
        yield
    finally:
        if own is None:
            del model.forward  # the class's forward again
        else:
            model.forward = own


# ---- the losses -------------------------------------------------------------------------------
class EngineLoss:
    """The recipe's ``[training] loss`` as the engine runs it (engine.trainable.step_loss): the
    model's own loss for ``full``, the chunked loss, or the GPU kernels' models."""

    def prepare(self, model) -> None:
        pass

    def loss_of(self, model, batch: dict):
        from ..engine.trainable import step_loss

        return step_loss(model, batch)

    def outside_forward(self, model) -> bool:
        """Whether the loss is computed outside the model's forward (the engine's pieces), where a
        trainer's patched forward (Liger's, CCE's) computes it inside, under its autocast."""
        from ..engine.trainable import LOSS_ATTRIBUTE

        plan = getattr(model, LOSS_ATTRIBUTE, None)
        return plan is not None and plan.kind != "full"

    def traced(self, path: StepPath):
        return nullcontext()

    def forward_module(self, model):
        from ..engine.trainable import loss_forward_module

        return loss_forward_module(model)


def _full_plan(model) -> None:
    from ..engine.trainable import LOSS_ATTRIBUTE, LossPlan

    setattr(model, LOSS_ATTRIBUTE, LossPlan())  # the whole model's forward is the loss's forward


class TrlFusedLoss(EngineLoss):
    """TRL's own loss (TRL_HEAD): its fused LM head computes the log-probabilities, the entropy and
    the top-1 flags in tiles of the vocabulary; on CUDA/ROCm its Triton kernels fold each tile in
    place (``triton_footprint``), elsewhere its torch fallback runs and is traced as it is."""

    def prepare(self, model) -> None:
        from trl.trainer.utils import add_fused_lm_head

        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        add_fused_lm_head(base, outputs=("log_probs", "entropy", "is_top1"))  # as SFTTrainer.__init__ does
        _full_plan(model)

    def loss_of(self, model, batch: dict):
        outputs = model(**batch, use_cache=False, fused_lm_head=True)
        loss = -outputs.log_probs.sum() / outputs.label_mask.sum().clamp(min=1)
        # the figures TRL logs every step (entropy, mean_token_accuracy) are reduced from the head's outputs
        outputs.entropy.detach().sum(), outputs.is_top1.sum()
        return loss

    def traced(self, path: StepPath):
        return triton_footprint() if path.step.accelerator and triton_stand_ins() else nullcontext()


class TrlLogitsLoss(EngineLoss):
    """TRL before its fused head (1.9): the model's own loss over the full logits, then, without
    gradient, the entropy (TRL's ``entropy_from_logits``, 128 rows at a time) and the argmax over
    the shifted logits for its logged figures."""

    def prepare(self, model) -> None:
        _full_plan(model)

    def loss_of(self, model, batch: dict):
        import torch
        from trl.trainer.utils import entropy_from_logits

        outputs = model(**batch, use_cache=False)
        with torch.no_grad():
            shifted = outputs.logits[..., :-1, :]
            mask = batch["labels"][..., 1:] != -100
            (entropy_from_logits(shifted) * mask).sum(), ((shifted.argmax(dim=-1) == batch["labels"][..., 1:])
                                                          & mask).sum()
        return outputs.loss


class TrlChunkedLoss(EngineLoss):
    """TRL 1.9's default ``loss_type = "chunked_nll"`` (TRL_CHUNKED): the model's forward patched,
    as TRL patches it, to run the decoder, sort the trained positions to the front and compute
    TRL's own ``_chunk`` (float32 logits of 256 tokens, their log-softmax, entropy and argmax)
    under gradient checkpointing, one chunk at a time. The loop is TRL's, its bounds those of the
    worst case (every position trained): TRL's reads the trained count from the data, which fake
    tensors do not hold."""

    def prepare(self, model) -> None:
        import torch
        from torch.utils.checkpoint import checkpoint
        from transformers.modeling_outputs import CausalLMOutputWithPast
        from trl.trainer.sft_trainer import _CHUNKED_LM_HEAD_CHUNK_SIZE, _chunk

        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config, size = base.config, _CHUNKED_LM_HEAD_CHUNK_SIZE

        def chunked_forward(*args, labels=None, **kwargs):
            kwargs.pop("use_cache", None)
            hidden_states = base.base_model(*args, use_cache=False, **kwargs).last_hidden_state
            hidden = hidden_states[..., :-1, :].reshape(-1, hidden_states.size(-1))
            shifted = labels[..., 1:].reshape(-1)
            order = (shifted != -100).to(torch.int8).argsort(descending=True, stable=True)
            hidden, shifted = hidden[order], shifted[order]
            head = base.get_output_embeddings()
            loss = hidden.new_zeros((), dtype=torch.float32)
            for start in range(0, math.ceil(shifted.numel() / size) * size, size):
                part, _, _ = checkpoint(_chunk, hidden[start:start + size], head.weight, head.bias,
                                        shifted[start:start + size], getattr(config, "logit_scale", 1.0),
                                        getattr(config, "final_logit_softcapping", None), use_reentrant=False)
                loss = loss + part
            return CausalLMOutputWithPast(loss=loss / shifted.numel())

        base.forward = chunked_forward  # as TRL's _patch_chunked_ce_lm_head replaces it
        _full_plan(model)

    def forward_module(self, model):
        return (model.get_base_model() if hasattr(model, "get_base_model") else model).base_model

    def loss_of(self, model, batch: dict):
        return model(**batch, use_cache=False).loss


LOSSES: dict[str, EngineLoss] = {"engine": EngineLoss(), "trl_fused": TrlFusedLoss(), "trl_chunked": TrlChunkedLoss(),
                                 "trl_logits": TrlLogitsLoss()}


@contextmanager
def triton_footprint() -> Iterator[None]:
    """TRL's chunked log-prob head as its Triton kernels run it on CUDA/ROCm, from its source: the
    forward kernel folds each tile into per-token statistics and the backward kernel overwrites
    the tile with its gradient, both in place; the gradient GEMMs accumulate into float32 with
    ``out_dtype`` (no float32 copies of their inputs). The torch stand-ins TRL runs elsewhere
    (``_forward_tile``, ``_backward_tile``, ``_addmm_fp32``) are swapped for ones that allocate
    nothing while the step is traced; the tile buffer, the casts of the hidden states and of each
    weight chunk, and the float32 gradient accumulators stay as TRL allocates them."""
    from trl.kernels import chunked_logprob as kernel

    saved = {name: getattr(kernel, name) for name in KERNEL_STAND_INS}

    def in_place(*args, **kwargs) -> None:
        return None

    for name in KERNEL_STAND_INS:
        setattr(kernel, name, in_place)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(kernel, name, value)


def trl_loss_kind() -> str:
    """The loss paths the installed TRL has: "fused" (its fused LM head, TRL_HEAD), "chunked"
    (TRL 1.9's chunked_nll beside the full logits), "logits" (the full logits only), "" where
    TRL is not installed."""
    try:
        from trl.trainer.utils import add_fused_lm_head  # noqa: F401
        return "fused"
    except ImportError:
        pass
    try:
        from trl.trainer.sft_trainer import _CHUNKED_LM_HEAD_CHUNK_SIZE, _chunk  # noqa: F401
        return "chunked"
    except ImportError:
        pass
    try:
        from trl.trainer.utils import entropy_from_logits  # noqa: F401
        return "logits"
    except ImportError:
        return ""


def triton_stand_ins() -> bool:
    """Whether the installed TRL's kernel module has the torch stand-ins ``triton_footprint`` swaps."""
    from trl.kernels import chunked_logprob as kernel

    return all(hasattr(kernel, name) for name in KERNEL_STAND_INS)


# ---- the trainers' paths ----------------------------------------------------------------------
def config_of(recipe, trainer: str) -> dict:
    """The trainer's own config (the file the recipe was read from), where the recipe is one; else {}."""
    origin = recipe.origin
    if origin is None or origin.format != trainer:
        return {}
    from ..recipe.importers.base import read_yaml

    raw = read_yaml(Path(origin.source))
    return raw if isinstance(raw, dict) else {}


def _up(tokens: int, multiple: Optional[int]) -> int:
    multiple = int(multiple or 1)
    return math.ceil(tokens / multiple) * multiple


def _row(step: Step, rows: int, worst: int) -> int:
    """Each row's tokens: the measured micro-batch's as the trainer collated it, else ``worst``
    (the worst case: max_length rows as the trainer pads them)."""
    return step.batch_tokens // rows if step.batch_tokens else worst


def _accumulation(recipe, step: Step) -> int:
    return step.accumulation or recipe.training.gradient_accumulation_steps


def _logits_bytes(recipe, config, tokens: int) -> int:
    """The full loss's logits term: the logits in the compute dtype, their float32 copy and its log-softmax."""
    text = getattr(config, "text_config", None) or config
    vocab = int(getattr(text, "vocab_size", 0) or 0)
    return tokens * vocab * ((4 if recipe.model.dtype == "float32" else 2) + 8)


def _tile_bytes(config, tokens: int, dtype: str, accelerator: bool) -> int:
    """TRL's fused head's tile (TRL_TILE) in ``dtype``; on a CPU also its torch fallback's float32
    temporaries over the vocabulary columns in use (eight of them, read from chunked_logprob.py)."""
    text = getattr(config, "text_config", None) or config
    rows, columns = min(tokens, TRL_TILE[0]), TRL_TILE[1]
    used = min(columns, int(getattr(text, "vocab_size", 0) or 0))
    return rows * columns * (4 if dtype == "float32" else 2) + (0 if accelerator else 8 * rows * used * 4)


def builtin_path(recipe, step: Step, config) -> StepPath:
    """pytest-ftready's engine: the micro-batch's rows padded to max_length, no autocast, the
    recipe's loss."""
    t = recipe.training
    return StepPath(step, t.micro_batch_size, recipe.data.max_length, _accumulation(recipe, step),
                    description=f"pytest-ftready engine on {step.device}: [training] loss = {t.loss}")


def trl_path(recipe, step: Step, config) -> StepPath:
    """TRL's SFTTrainer: bf16 autocast unless the config says otherwise (TRL_BASE_CONFIG); rows
    padded to max_length rounded up to ``pad_to_multiple_of`` (padding-free and BFD packing: one
    row of every token); its own loss (TRL_HEAD) where TRL is installed, else estimated."""
    from ..units import human_bytes

    cfg = config_of(recipe, "trl")
    fp16 = bool(cfg.get("fp16"))
    bf16 = (not fp16) if cfg.get("bf16") is None else bool(cfg.get("bf16"))
    autocast = "bfloat16" if bf16 else "float16" if fp16 else ""
    t = recipe.training
    packed = bool(cfg.get("padding_free")) or (recipe.data.packing and cfg.get("packing_strategy", "bfd")
                                                in ("bfd", "bfd_split"))
    rows = 1 if packed else t.micro_batch_size
    padded = _up(recipe.data.max_length, cfg.get("pad_to_multiple_of"))  # trainers.trl.worst_case_padding
    row = _row(step, rows, padded * t.micro_batch_size if packed else padded)
    notes = []
    if packed:
        notes.append(f"TRL padding-free: the micro-batch traced as one row of {row} tokens, attention as over one "
                     "sequence (flash attention's variable-length kernel holds the same O(length) state)")
    if t.loss != "full":
        notes.append(f"[training] loss = \"{t.loss}\" is the engine's; TRL's step computes its own loss")
    head = trl_loss_kind()
    smoothing = float(cfg.get("label_smoothing_factor") or 0) > 0
    liger = bool(cfg.get("use_liger_kernel"))
    # TRL 1.9's default is chunked_nll (nll with Liger's kernels), later ones nll
    loss_type = str(cfg.get("loss_type") or ("chunked_nll" if head == "chunked" and not liger else "nll"))
    if head == "fused" and loss_type in ("nll", "dft") and not smoothing:
        modelled = step.accelerator and triton_stand_ins()
        kernel = ("Triton kernels (in place, modelled)" if modelled else
                  "torch fallback (traced)")
        loss, said = "trl_fused", f"TRL's fused LM head, {kernel}"
        if modelled:
            notes.append("TRL's Triton kernels cannot run on fake tensors: their footprint is modelled from "
                         "trl/kernels/chunked_logprob.py (each tile folded and overwritten in place, float32 "
                         "accumulation without copies); on the GPU TRL scores only the trained positions, the worst "
                         "case trains every one")
        elif step.accelerator:
            dtype = autocast or recipe.model.dtype
            extra = _tile_bytes(config, rows * row, dtype, False) - _tile_bytes(config, rows * row, dtype, True)
            notes.append(f"ESTIMATE: this TRL's kernel module lacks the stand-ins the Triton footprint swaps "
                         f"({', '.join(KERNEL_STAND_INS)}): its torch fallback is traced, high on the GPU by up to "
                         f"its float32 temporaries ({human_bytes(extra)})")
    elif head == "chunked" and loss_type == "chunked_nll" and not liger:
        loss, said = "trl_chunked", "TRL's chunked_nll (float32 logits of 256 trained tokens at a time, recomputed)"
    elif head in ("chunked", "logits") and loss_type == "nll" and not (smoothing or liger):
        loss, said = "trl_logits", "TRL's full logits with its entropy and token accuracy over them"
    else:
        loss = "engine"
        bound = human_bytes(max(_logits_bytes(recipe, config, rows * row),
                                _tile_bytes(config, rows * row, autocast or recipe.model.dtype, step.accelerator)))
        why = ("TRL is not installed here" if not head else f"loss_type = {loss_type}"
               + (", label_smoothing_factor" if smoothing else "") + (", use_liger_kernel" if liger else ""))
        said = "TRL's loss estimated as transformers' full-logit loss"
        notes.append(f"ESTIMATE: {why}: TRL's loss is traced as transformers' full-logit loss; TRL's own path (its "
                     f"fused head's tile of {TRL_TILE[0]:,} tokens x {TRL_TILE[1]:,} logits, or the full logits "
                     f"and its entropy over them) may differ by up to the larger of the logits term and the "
                     f"tile's, {bound}")
    if autocast and recipe.model.dtype == "float32":
        notes.append(f"TRL's {autocast} autocast over float32 weights ({TRL_BASE_CONFIG}): each layer's weight cast "
                     f"per call, activations in {autocast}" + ("; traced with the CPU's autocast op lists (CUDA's "
                                                              "differ for a few float32 ops; not yet measured on a "
                                                              "GPU)" if step.accelerator else ""))
    return StepPath(step, rows, row, _accumulation(recipe, step), autocast, loss,
                    f"trl SFTTrainer on {step.device}: {said}" + (f", {autocast} autocast" if autocast else ""),
                    tuple(notes))


def axolotl_path(recipe, step: Step, config) -> StepPath:
    """Axolotl's Trainer: the model's own loss (the recipe's, from Axolotl's loss plugins), the
    autocast of its bf16/fp16 flags (AXOLOTL_DTYPE; bf16 "auto" is on where the GPU has bf16), rows
    padded by its collator (AXOLOTL_COLLATOR): to the longest row rounded up to
    ``pad_to_multiple_of`` (64), to sequence_len with ``pad_to_sequence_len`` (on with sample
    packing), unrounded with ``pad_to_sequence_len: false``."""
    cfg = config_of(recipe, "axolotl")
    t = recipe.training
    multiple = int(cfg.get("pad_to_multiple_of") or 64)
    to_length = cfg.get("pad_to_sequence_len")
    if to_length is None and cfg.get("sample_packing"):
        to_length = True
    length = recipe.data.max_length
    worst = _up(int(cfg.get("sequence_len") or length), multiple) if to_length else (
        _up(length, multiple) if to_length is None else length)
    row = _row(step, t.micro_batch_size, worst)
    bf16 = cfg.get("bf16", "auto")
    if bf16 == "auto":
        bf16 = step.accelerator and not cfg.get("fp16")
    autocast = "bfloat16" if bf16 is True else "float16" if cfg.get("fp16") else ""
    notes = [f"each row {row} tokens, as Axolotl's collator pads it ({AXOLOTL_COLLATOR})"]
    if cfg.get("sample_packing"):
        notes.append("sample packing: traced as micro_batch_size packed rows of sequence_len, attention as over one "
                     "sequence per row")
    if cfg.get("bf16", "auto") == "auto" and step.accelerator:
        notes.append("bf16: auto taken as on (the GPU has bf16: Ampere and newer)")
    return StepPath(step, t.micro_batch_size, row, _accumulation(recipe, step), autocast, "engine",
                    f"axolotl AxolotlTrainer on {step.device}: the model's loss, rows padded to {row}"
                    + (f", {autocast} autocast" if autocast else ""), tuple(notes))


def llamafactory_path(recipe, step: Step, config) -> StepPath:
    """LLaMA-Factory's CustomSeq2SeqTrainer: the model's own loss, the autocast of its bf16/fp16
    flags (pure_bf16: bf16 weights, no autocast), rows padded to the longest row rounded up to a
    multiple of 8 (LLAMAFACTORY_COLLATOR)."""
    from ..units import human_bytes

    cfg = config_of(recipe, "llamafactory")
    t = recipe.training
    row = _row(step, t.micro_batch_size, _up(recipe.data.max_length, 8))
    autocast = "bfloat16" if cfg.get("bf16") else "float16" if cfg.get("fp16") else ""
    notes = [f"each row {row} tokens, as LLaMA-Factory's collator pads it ({LLAMAFACTORY_COLLATOR})"]
    if cfg.get("neat_packing"):
        mask = t.micro_batch_size * row * row * (4 if recipe.model.dtype == "float32" else 2)
        notes.append(f"ESTIMATE: neat_packing's 4D attention mask (micro_batch x {row} x {row} in the compute dtype, "
                     f"{human_bytes(mask)}) is not traced: the forecast may be low by up to that much")
    return StepPath(step, t.micro_batch_size, row, _accumulation(recipe, step), autocast, "engine",
                    f"llamafactory CustomSeq2SeqTrainer on {step.device}: the model's loss, rows padded to {row}"
                    + (f", {autocast} autocast" if autocast else ""), tuple(notes))


# A trainer's name (trainers.TRAINERS, the results' ``trainer`` field) -> its step as the forecast traces it.
PATHS: dict[str, Callable[[Any, Step, Any], StepPath]] = {
    "builtin": builtin_path,
    "trl": trl_path,
    "axolotl": axolotl_path,
    "llamafactory": llamafactory_path,
}


def resolve(recipe, step: Step, config) -> StepPath:
    """The StepPath of ``step`` for ``recipe``. A trainer with no model here is traced as the
    engine's step, and the path says so (its own kernels unmodelled, by an amount not known)."""
    path_of = PATHS.get(step.trainer)
    if path_of is not None:
        return path_of(recipe, step, config)
    path = builtin_path(recipe, step, config)
    return StepPath(step, path.rows, path.row_tokens, path.accumulation,
                    description=f"{step.trainer} on {step.device}: estimated as pytest-ftready's engine step",
                    notes=(f"ESTIMATE: no forecast model of {step.trainer}'s step (forecast.trainers.PATHS knows "
                           f"{', '.join(PATHS)}): traced as pytest-ftready's engine step; what {step.trainer} does "
                           "differently (its loss kernel, autocast, padding, checkpointing) is not modelled, and how "
                           "far that moves the peak is not known: judge by model.step_memory",))


def recipe_trainer(recipe) -> str:
    """The trainer whose step the team launches: the one ``[data] pipeline`` names, else the
    trainer whose config the recipe was read from (installed here or not), else the engine."""
    asked = recipe.data.pipeline
    if asked != "auto":
        return asked
    origin = recipe.origin
    return origin.format if origin is not None and origin.format in PATHS else "builtin"


def device_of(target) -> str:
    """The device kind a target's step runs on (cpu where there is no target)."""
    return target.kind if target is not None else "cpu"


def measured_step(trainer: str, device: str, batch_tokens: Optional[int]) -> Step:
    """The Step a trainer's measured step ran: the engine's as ``forecast.trace.measured_step_peak``
    runs it (steady state, the recipe's accumulation, rows of max_length); any other trainer's
    as ``trainers.hf.measure_step`` runs it, one ``max_steps = 1`` run (a first step, no
    accumulation) of the micro-batch it collated (``batch_tokens``)."""
    if trainer == "builtin":
        return Step("builtin", device)
    return Step(trainer, device, batch_tokens, first_step=True, accumulation=1)
