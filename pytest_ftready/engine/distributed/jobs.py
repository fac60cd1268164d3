"""The jobs of one recipe's distributed checks, each launched at most once per session:
``run`` (join, collectives, step, straight run with a sharded checkpoint), ``resume`` (a
fresh job continues that checkpoint) and ``reshard`` (another world size loads it)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from .job import CHECKPOINT_DIR, TRAIN_DIR, WORST_DIR, JobSpec, save_examples
from .launcher import JobResult, launch

GIB = 1 << 30
GLOO_MAX_BYTES = 4 << 20  # gloo moves bytes through the CPU: a few MiB say enough
IDLE_GRACE_S = 30.0  # beyond timeout_s, so a rank's own collective timeout reports first


@dataclass(frozen=True)
class Plan:
    """How the recipe's [distributed] table resolves on this machine."""

    world_size: int  # processes per node
    nnodes: int
    backend: str
    strategy: str
    device_kind: str
    timeout_s: float

    @property
    def total_ranks(self) -> int:
        return self.world_size * self.nnodes

    @property
    def reshard_world_size(self) -> int:
        """The other world size a checkpoint must load with: half the ranks (at least one)."""
        return max(1, self.world_size // 2)


def visible_gpus(machine_gpus: int, environ: Optional[Mapping[str, str]] = None) -> int:
    """GPUs this process may use: CUDA/HIP_VISIBLE_DEVICES narrow what NVML lists."""
    environ = environ if environ is not None else os.environ
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        if name in environ:
            return len([d for d in environ[name].split(",") if d.strip() and d.strip() != "-1"])
    return machine_gpus


def plan(recipe, device_kind: str, gpus: int) -> Plan:
    """Resolve world_size (0 = the visible GPUs; 1 on a CPU) and backend (auto = nccl on GPUs,
    gloo on the CPU). Raises ValueError with a fix-it message when the table cannot work here."""
    d = recipe.distributed
    if device_kind in ("mps", "mlx"):
        raise ValueError(f"torch.distributed has no backend for {device_kind}; to rehearse the job on this machine "
                         "set [hardware] device = \"cpu\" and [distributed] backend = \"gloo\"")
    on_gpu = device_kind in ("cuda", "rocm")
    backend = d.backend if d.backend != "auto" else ("nccl" if on_gpu else "gloo")
    if backend == "nccl" and not on_gpu:
        raise ValueError("[distributed] backend = \"nccl\" needs CUDA/ROCm GPUs; this run is on the CPU")
    world = d.world_size or (gpus if on_gpu else 1)
    if on_gpu and world > gpus:
        raise ValueError(f"[distributed] world_size = {world} but {gpus} GPU(s) are visible to this process; "
                         "lower world_size or check CUDA_VISIBLE_DEVICES")
    return Plan(world, d.nnodes, backend, d.strategy, device_kind, d.timeout_s)


class DistributedJobs:
    """Launches each job once and remembers its result (a failure included)."""

    def __init__(self, recipe, plan: Plan, folder: Path, examples: Sequence, pad_id: int, resume_steps: int,
                 progress: Optional[Callable[[str], None]] = None) -> None:
        self.recipe = recipe
        self.progress = progress
        self.plan = plan
        self.folder = Path(folder)
        self.examples = list(examples)
        self.pad_id = pad_id
        self.steps = max(2, resume_steps // 2 * 2)
        self._results: dict[str, JobResult] = {}

    def spec(self, mode: str, world_size: Optional[int] = None, **extra) -> JobSpec:
        p = self.plan
        world = world_size or p.world_size
        threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or max(1, (os.cpu_count() or 1) // world)
        return JobSpec(recipe=str(self.recipe.source), mode=mode, world_size=world, nnodes=p.nnodes, backend=p.backend,
                       strategy=p.strategy, device_kind=p.device_kind, timeout_s=p.timeout_s, pad_id=self.pad_id,
                       steps=self.steps, threads=threads,
                       collective_max_bytes=GIB if p.device_kind != "cpu" else GLOO_MAX_BYTES,
                       data_dir=str(self.folder), rdzv_endpoint=self.recipe.distributed.rdzv_endpoint, **extra)

    def _launch(self, mode: str, spec: JobSpec) -> JobResult:
        if mode not in self._results:
            self._results[mode] = launch(spec, self.folder / mode, self.plan.timeout_s + IDLE_GRACE_S,
                                         progress=self.progress)
        return self._results[mode]

    def run(self) -> JobResult:
        """Join, collectives, the worst-case step, and K straight steps saving after K/2."""
        if "run" not in self._results:
            t = self.recipe.training
            per_step = t.micro_batch_size * self.plan.total_ranks
            longest = sorted(self.examples, key=lambda e: len(e.input_ids), reverse=True)[:per_step]
            shutil.rmtree(self.folder / CHECKPOINT_DIR, ignore_errors=True)  # a previous session's
            save_examples(self.folder / WORST_DIR, longest)
            save_examples(self.folder / TRAIN_DIR,
                          self.examples[: max(2, per_step * t.gradient_accumulation_steps * self.steps)])
        return self._launch("run", self.spec("run"))

    def resume(self) -> JobResult:
        """A fresh torchrun job continues the run's checkpoint for the remaining steps."""
        return self._launch("resume", self.spec("resume"))

    def reshard(self) -> JobResult:
        """Another world size loads the run's checkpoint and compares the weights."""
        saved = next(iter(self.run().per_rank("train").values()), {}).get("saved_fingerprints", {})
        return self._launch("reshard", self.spec("reshard", world_size=self.plan.reshard_world_size,
                                                 saved_world_size=self.plan.world_size, saved_fingerprints=saved))
