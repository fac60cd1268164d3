"""The sustained run: the recipe's real step trained for a sustained window while telemetry
is sampled; tokens/s per window, the drop from the best early window, throttling and its
reasons, model FLOPs utilization."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..machine.compat import load
from .batches import worst_case_batch
from .trainable import make_optimizer, make_scheduler, train_step, trainable

SERIES = ("temperature_c", "sm_clock_mhz", "mem_clock_mhz", "power_w", "cpu_percent")


@dataclass(frozen=True)
class Step:
    end_s: float  # seconds since the measured window began
    seconds: float
    positions: int  # token positions processed (padded batch)
    tokens: int  # real (non-pad) tokens


def windows(steps: list[Step], window_s: float) -> list[float]:
    """Token positions per second in consecutive windows of ``window_s`` (by step end time)."""
    if not steps:
        return []
    out, bucket, n = [], 0, 1
    busy = 0.0
    for step in steps:
        while step.end_s > n * window_s:
            if busy:
                out.append(bucket / busy)
            bucket, busy, n = 0, 0.0, n + 1
        bucket += step.positions
        busy += step.seconds
    if busy:
        out.append(bucket / busy)
    return out


def throughput_drop(rates: list[float]) -> tuple[float, int]:
    """(drop from the best early window to the last, index of that best window). Early: first third."""
    if len(rates) < 2:
        return 0.0, 0
    early = rates[: max(1, len(rates) // 3)]
    best = max(range(len(early)), key=lambda i: early[i])
    return max(0.0, (early[best] - rates[-1]) / early[best]), best


@dataclass(frozen=True)
class ThermalVerdict:
    max_temperature_c: float | None
    throttled: list[tuple[str, float]]  # (reason, first time seen in seconds)
    thermal_or_power: list[tuple[str, float]]


def thermal_verdict(samples: list[tuple[float, dict]]) -> ThermalVerdict:
    kinds = load("nvml")["kinds"]
    temps = [r["temperature_c"] for _, r in samples if "temperature_c" in r]
    first: dict[str, float] = {}
    for t, reading in samples:
        for reason in reading.get("throttle_reasons", []):
            if reason not in kinds["benign"]:
                first.setdefault(reason, t)
    throttled = sorted(first.items(), key=lambda kv: kv[1])
    serious = [(r, t) for r, t in throttled if r in kinds["thermal"] or r in kinds["power"]]
    return ThermalVerdict(max(temps) if temps else None, throttled, serious)


@dataclass(frozen=True)
class SustainedRun:
    steps: list  # [Step]
    rates: list  # token positions per second in each window
    samples: list  # telemetry [(seconds, reading)]
    missing: list  # what telemetry could not read here
    parameters: int
    telemetry_overhead: float
    series: dict  # metric -> values sampled over time


def run_sustained(recipe, examples: Sequence, pad_id: int, device: str, shared_base: Callable[[], Any],
                  warmup_s: float, total_s: float, window_s: float, sources, missing: Sequence[str] = (),
                  progress: Optional[Callable[[str], None]] = None) -> SustainedRun:
    """Train the recipe's real step for warm-up + ``total_s`` seconds with telemetry sampling.
    Every step runs the worst-case batch (micro_batch x max_length of the longest rows), so
    windows do identical work and a drop is the machine's, not the data's."""
    from ..machine.telemetry import Sampler

    batch = worst_case_batch(examples, recipe.training.micro_batch_size, recipe.data.max_length, pad_id)
    positions, tokens = int(batch["input_ids"].numel()), int(batch["attention_mask"].sum())
    steps: list[Step] = []
    with trainable(recipe, device, shared_base) as model:
        params = sum(p.numel() for p in model.parameters())
        optimizer = make_optimizer(model, recipe)
        scheduler = make_scheduler(optimizer, recipe, 10 ** 9, constant=True)
        sync = _synchronizer(device)
        deadline = time.perf_counter() + warmup_s
        while time.perf_counter() < deadline:
            train_step(model, optimizer, scheduler, [batch], device)
        sync()
        with Sampler(sources, interval_s=max(0.2, min(1.0, total_s / 50))) as sampler:
            start = time.perf_counter()
            while time.perf_counter() - start < total_s:
                t0 = time.perf_counter()
                train_step(model, optimizer, scheduler, [batch], device)
                sync()
                t1 = time.perf_counter()
                steps.append(Step(t1 - start, t1 - t0, positions, tokens))
                if progress:
                    progress(f"sustained.throughput {t1 - start:.0f}/{total_s:.0f} s, "
                             f"{positions / (t1 - t0):,.0f} tokens/s")
    return SustainedRun(steps, windows(steps, window_s), list(sampler.samples), list(missing), params,
                        sampler.overhead_share, {m: sampler.series(m) for m in SERIES if sampler.series(m)})


def _synchronizer(device: str):
    import torch

    if device.startswith("cuda"):
        return torch.cuda.synchronize
    if device.startswith("mps"):
        return torch.mps.synchronize
    return lambda: None


def model_flops_utilization(machine, dtype: str, params: int, tokens_per_s: float) -> float | None:
    """6 x parameters FLOPs per token against the device's dense peak (facts), None if unknown."""
    gpu = machine.gpus[0] if machine.gpus else None
    if gpu is None:
        return None
    row = next((r for r in load("compute")["peak_tflops"] if r["match"] in gpu.name), None)
    peak = row.get(dtype) if row else None
    if not peak:
        return None
    return 6 * params * tokens_per_s / (peak * 1e12)
