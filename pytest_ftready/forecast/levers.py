"""The one lever model: which levers a recipe can still pull, and what each saves.

``candidates`` lists the levers (each a recipe change, or an offload set-up no recipe key
names). Where the forecast runs, each lever's saving is TRACED: the recipe with the lever
pulled is forecast and compared with the recipe's own forecast (``traced_levers``); only
where no trace is possible (no config, a trace error, a lever no recipe key can express) the
saving is an ESTIMATE from a breakdown (``estimated_levers``). ``ftready-forecast``, the check
``model.memory_forecast``, ``levers.advice`` and the variants of ``levers.sweep`` all take
their levers from here, so one recipe and one lever give one figure everywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

from ..engine.breakdown import Breakdown
from ..machine.targets import Target
from .trace import Forecast, TraceError, forecast, forecast_config
from .trainers import Step, device_of, recipe_trainer, resolve

TRACED, ESTIMATE = "traced", "estimate"


@dataclass(frozen=True)
class ModelShape:
    """What the estimates need of the model besides the breakdown (0: not known)."""

    num_layers: int
    vocab_size: int = 0


@dataclass(frozen=True)
class Lever:
    name: str
    change: str  # what to write in the recipe (or the set-up, where no recipe key names it)
    cost: str
    saves_bytes: int
    how: str  # TRACED (the forecast of the recipe with the lever pulled) or ESTIMATE (from a breakdown)
    peak_bytes: Optional[int] = None  # the variant's forecast peak, where traced


@dataclass(frozen=True)
class Candidate:
    name: str
    change: str
    cost: str
    estimate: Callable[[Breakdown, ModelShape], Optional[int]]  # None: no estimate applies


def _dtype_bytes(recipe) -> int:
    return 4 if recipe.model.dtype == "float32" else 2


def candidates(recipe, p95_length: Optional[float] = None, recipe_loss: bool = True) -> list[Candidate]:
    """The levers this recipe can still pull, in the order the advice lists ties. ``recipe_loss``:
    whether the trainer's step computes the recipe's ``[training] loss`` (TRL computes its own)."""
    t, m, a, d = recipe.training, recipe.model, recipe.adapter, recipe.data
    tokens = t.micro_batch_size * d.max_length
    out = []

    def act(b: Breakdown, share: float) -> Optional[int]:
        return int(b.activation_bytes * share) if b.activation_bytes else None

    if not t.gradient_checkpointing:
        out.append(Candidate("activation checkpointing", "[training] gradient_checkpointing = true",
                             "~20-30% slower steps (recomputed forward)",
                             lambda b, s: act(b, 1 - 1 / max(1, s.num_layers))))
    if t.micro_batch_size > 1 and not t.optimizer_in_backward:  # stepping in the backward cannot accumulate
        half = t.micro_batch_size // 2
        out.append(Candidate("smaller micro-batch, more accumulation",
                             f"[training] micro_batch_size = {half}, gradient_accumulation_steps = "
                             f"{t.gradient_accumulation_steps * t.micro_batch_size // half}",
                             "same effective batch; lower utilization",
                             lambda b, s: act(b, 1 - half / t.micro_batch_size)))
    if p95_length and p95_length < d.max_length:
        shorter = max(16, int(2 ** (int(p95_length - 1).bit_length())))
        if shorter < d.max_length:
            out.append(Candidate("shorter max_length", f"[data] max_length = {shorter} (p95 of lengths is "
                                 f"{p95_length:.0f})",
                                 "rows above it are truncated", lambda b, s: act(b, 1 - shorter / d.max_length)))
    if t.loss == "full" and recipe_loss:
        chunks = recipe.training.loss_chunks
        # the full loss holds the logits in the compute dtype, their float32 copy and its gradient
        out.append(Candidate("chunked loss", "[training] loss = \"chunked\"",
                             "a little slower: each piece's logits are recomputed in the backward",
                             lambda b, s: (int(tokens * s.vocab_size * (_dtype_bytes(recipe) + 8) * (1 - 1 / chunks))
                                           if s.vocab_size else None)))
    if not t.optimizer_in_backward and t.gradient_accumulation_steps == 1:
        out.append(Candidate("optimizer in the backward", "[training] optimizer_in_backward = true",
                             "no gradient accumulation, no clipping over the whole model's gradients",
                             lambda b, s: b.gradient_bytes or None))
    if a.method == "none":
        out.append(Candidate("LoRA instead of full fine-tuning", "[adapter] method = \"lora\"",
                             "fewer trainable parameters",
                             lambda b, s: int((b.gradient_bytes + b.optimizer_state_bytes) * 0.98)))
    if a.method == "lora" and m.quantization == "none":
        out.append(Candidate("4-bit base (QLoRA)", "[model] quantization = \"4bit\"",
                             "needs bitsandbytes; slower matmuls, small quality cost",
                             lambda b, s: (max(0, int(b.weights_bytes - b.trainable_bytes - b.frozen_numel * 0.5))
                                           if b.weights_bytes else None)))
    if m.quantization != "none" and m.kbit_preparation != "off":
        out.append(Candidate("no QLoRA preparation", "[model] kbit_preparation = \"off\"",
                             "embeddings, head and norms stay in the compute dtype (what torchtune and litgpt do)",
                             lambda b, s: None))
    eight_bit = {"adamw": "adamw_8bit", "paged_adamw": "paged_adamw_8bit"}.get(t.optimizer)
    if eight_bit:
        out.append(Candidate("8-bit optimizer", f"[training] optimizer = \"{eight_bit}\"", "needs bitsandbytes",
                             lambda b, s: int(b.optimizer_state_bytes * 0.75) or None))
    paged = {"adamw": "paged_adamw", "adamw_8bit": "paged_adamw_8bit"}.get(t.optimizer)
    if paged:
        out.append(Candidate("paged optimizer", f"[training] optimizer = \"{paged}\"",
                             "needs bitsandbytes on CUDA; the state pages to host RAM when short (slower then)",
                             lambda b, s: b.optimizer_state_bytes or None))
    out.append(Candidate("optimizer state offload to the host", "DeepSpeed ZeRO-Offload / FSDP CPU offload",
                         "slower steps: measure it (levers.sweep)", lambda b, s: b.optimizer_state_bytes or None))
    return out


CHANGE = re.compile(r"^\[(?P<table>\w+)\]\s+(?P<pairs>.+?)(?:\s+\(.*\))?$")


def recipe_changes(change: str) -> Optional[list[tuple[str, str, Any]]]:
    """'[training] micro_batch_size = 2, gradient_accumulation_steps = 8' -> [(table, key,
    value)]; None when the change names no recipe key (an offload set-up, say)."""
    from ..recipe.schema import tomllib

    m = CHANGE.match(change.strip())
    if not m:
        return None
    try:
        values = tomllib.loads("\n".join(pair.strip() for pair in m.group("pairs").split(", ")))
    except tomllib.TOMLDecodeError:
        return None
    return [(m.group("table"), key, value) for key, value in values.items()]


def with_changes(recipe, changes: Sequence[tuple[str, str, Any]]):
    """The recipe with ``changes`` as (table, key, value) triples, validated like the recipe file."""
    from ..recipe.schema import with_changes as validated

    return validated(recipe, {f"{table}.{key}": value for table, key, value in changes}, "forecast lever")


def _largest_first(levers: list[Lever]) -> list[Lever]:
    return sorted(levers, key=lambda lv: lv.saves_bytes, reverse=True)


def estimated_levers(recipe, b: Breakdown, shape: ModelShape, p95_length: Optional[float] = None) -> list[Lever]:
    """Each lever's saving estimated from a breakdown (largest first): for where no forecast runs."""
    out = []
    for c in candidates(recipe, p95_length):
        saves = c.estimate(b, shape)
        if saves is not None:
            out.append(Lever(c.name, c.change, c.cost, saves, ESTIMATE))
    return _largest_first(out)


def breakdown_of(f: Forecast) -> Breakdown:
    """The forecast as a Breakdown, for the estimate of a lever no recipe key can express (a
    paged optimizer's state is already off the device's peak: not counted)."""
    return Breakdown(f.weights_bytes, f.frozen_parameters, f.trainable_bytes, f.trainable_bytes,
                     f.optimizer_state_bytes, f.peak_bytes)


def traced_levers(recipe, config, base: Forecast, shape: ModelShape,
                  p95_length: Optional[float]) -> tuple[list[Lever], list[str]]:
    """Each lever forecast by tracing the recipe with it pulled (largest saving first), and why
    any could not be; a lever no recipe key expresses keeps its estimate from the forecast's breakdown.
    The variants are the same trainer's step on the same device as ``base``."""
    from ..outcomes import Fail
    from ..recipe.schema import RecipeError

    out, problems = [], []
    step = base.step
    recipe_loss = resolve(recipe, step, config).loss == "engine"
    for c in candidates(recipe, p95_length, recipe_loss):
        changes = recipe_changes(c.change)
        if changes is None:
            saves = c.estimate(breakdown_of(base), shape)
            if saves is not None:
                out.append(Lever(c.name, c.change, c.cost, saves, ESTIMATE, base.peak_bytes - saves))
            continue
        try:
            variant = forecast(with_changes(recipe, changes), config, step=step)
        except (TraceError, Fail, RecipeError) as exc:
            problems.append(f"{c.name}: {exc}")
            continue
        out.append(Lever(c.name, c.change, c.cost, base.peak_bytes - variant.peak_bytes, TRACED, variant.peak_bytes))
    return _largest_first(out), problems


def shape_of(config) -> ModelShape:
    from ..engine.trainable import num_layers_of

    text = getattr(config, "text_config", None) or config
    return ModelShape(num_layers_of(config), int(getattr(text, "vocab_size", 0) or 0))


@dataclass(frozen=True)
class Report:
    recipe_name: str
    forecast: Forecast
    target: Optional[Target]
    headroom: float
    levers: tuple = ()
    problems: tuple = ()  # levers whose variant could not be forecast: why
    # what the levers are traced with (report_levers): the recipe, its config, the p95 of lengths
    recipe: Any = field(default=None, compare=False, repr=False)
    config: Any = field(default=None, compare=False, repr=False)
    p95_length: Optional[float] = None

    @property
    def need_bytes(self) -> Optional[int]:
        return self.target.need_bytes(self.forecast.peak_bytes) if self.target else None

    @property
    def usable_bytes(self) -> Optional[int]:
        return self.target.usable_bytes(self.headroom) if self.target else None

    @property
    def fits(self) -> Optional[bool]:
        need, usable = self.need_bytes, self.usable_bytes
        return None if need is None or usable is None else need <= usable


def with_levers(report: Report) -> Report:
    """The report with every lever traced (once: a report that has them is returned as it is)."""
    if report.levers or report.problems:
        return report
    found, problems = traced_levers(report.recipe, report.config, report.forecast, shape_of(report.config),
                                    report.p95_length)
    return replace(report, levers=tuple(found), problems=tuple(problems))


def forecast_report(recipe, target: Optional[Target], config=None, p95_length: Optional[float] = None,
                    levers: bool = True, trainer: Optional[str] = None) -> Report:
    """The forecast of ``trainer``'s step (default: the one the team launches,
    ``trainers.recipe_trainer``) on the target's device, judged against ``target`` less the
    recipe's memory_headroom; when it does not fit (and ``levers``), each lever traced. The one
    code path of the check and the command."""
    config = config if config is not None else forecast_config(recipe)
    base = forecast(recipe, config, step=Step(trainer or recipe_trainer(recipe), device_of(target)))
    report = Report(recipe.name, base, target, recipe.hardware.memory_headroom, recipe=recipe, config=config,
                    p95_length=p95_length)
    return with_levers(report) if levers and report.fits is False else report
