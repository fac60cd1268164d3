"""What every rank of a readiness job runs, started by torchrun:

    python -m torch.distributed.run ... -m pytest_ftready.engine.distributed.rank_worker RECIPE MODE JOB_DIR

MODE ``run``: join; all_reduce and all_gather bus bandwidth over message sizes; one DDP or
FSDP2 step of the recipe's model on the worst-case batch (peak memory, step time, gradients
or shards compared across ranks); a straight run of K steps saving a sharded checkpoint
(torch.distributed.checkpoint) after K/2. MODE ``resume``: a fresh job loads it and trains
K/2 more. MODE ``reshard``: another world size loads it and checks the weights.

Each rank writes ``rank-N.json`` in JOB_DIR after every phase (what it measured, the phase
it is in, its error), so the launcher can tell which rank stopped where."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from ...files import write_json
from .job import CHECKPOINT_DIR, TRAIN_DIR, WORST_DIR, JobSpec, fake_capacity, kill_point, rank_file

MIB = 1 << 20


class Rank:
    """This process's place in the job, and its report file."""

    def __init__(self, folder: Path, spec: JobSpec) -> None:
        self.folder = folder
        self.data = Path(spec.data_dir or folder)
        self.spec = spec
        self.rank = int(os.environ.get("RANK", 0))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        self.report: dict[str, Any] = {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.world,
                                       "host": socket.gethostname(), "pid": os.getpid(), "mode": spec.mode,
                                       "phase": "start", "done": [], "phases": {}}
        self.device = "cpu"
        self.save()

    def save(self) -> None:
        write_json(rank_file(self.folder, self.rank), self.report)

    def phase(self, name: str, work: Callable[[], dict]) -> dict:
        """Run one phase: announce it (file and stdout), record its figures or its error."""
        self.report["phase"] = name
        self.save()
        print(f"[ftready rank {self.rank}] {name}: start", flush=True)
        started = time.perf_counter()
        try:
            figures = work()
        except BaseException as exc:
            self.report["error"] = {"phase": name, "type": type(exc).__name__,
                                    "message": (str(exc).strip().splitlines() or [""])[0][:500],
                                    "traceback": traceback.format_exc().strip().splitlines()[-12:]}
            self.save()
            raise
        figures["seconds"] = time.perf_counter() - started
        self.report["phases"][name] = figures
        self.report["done"].append(name)
        self.save()
        print(f"[ftready rank {self.rank}] {name}: done in {figures['seconds']:.2f} s", flush=True)
        return figures

    def maybe_die(self, phase: str) -> None:
        """Test-only (FTREADY_TEST_KILL_RANK): die here the way an OOM-killed rank dies."""
        if kill_point(self.rank) == phase:
            print(f"[ftready rank {self.rank}] killed by the test hook in {phase}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


# ---- join -----------------------------------------------------------------------------------
def join(rank: Rank) -> dict:
    import torch
    import torch.distributed as dist

    spec = rank.spec
    if spec.device_kind in ("cuda", "rocm"):
        torch.cuda.set_device(rank.local_rank)
        rank.device = f"cuda:{rank.local_rank}"
    started = time.perf_counter()
    dist.init_process_group(spec.backend, timeout=timedelta(seconds=spec.timeout_s),
                            device_id=torch.device(rank.device) if rank.device != "cpu" else None)
    token = torch.ones(1, device=rank.device)
    dist.all_reduce(token)  # every rank is reachable: the first real collective
    if int(token.item()) != rank.world:
        raise RuntimeError(f"all_reduce of ones over {rank.world} ranks gave {token.item()}")
    figures = {"join_seconds": time.perf_counter() - started, "device": rank.device, "backend": spec.backend}
    if rank.device != "cpu":
        figures["device_name"] = torch.cuda.get_device_name(rank.local_rank)
        if torch.version.cuda:
            from ...machine.links import read_links_of_torch_device

            figures["links"] = read_links_of_torch_device(rank.local_rank).to_dict()
    return figures


# ---- collectives ------------------------------------------------------------------------------
def message_sizes(max_bytes: int) -> list[int]:
    """1 MiB doubling up to ``max_bytes`` (at least one size)."""
    sizes, size = [], MIB
    while size <= max(max_bytes, MIB):
        sizes.append(size)
        size *= 2
    return sizes


def collectives(rank: Rank) -> dict:
    """Bus bandwidth of all_reduce and all_gather per message size (nccl-tests' convention)."""
    import torch
    import torch.distributed as dist

    n, device = rank.world, rank.device
    cap = rank.spec.collective_max_bytes
    if device != "cpu":
        free, _ = torch.cuda.mem_get_info()
        # all_gather holds the input and the output of one size; every rank must run the same
        # sizes (or the collectives would not match), so the smallest cap wins
        agreed = torch.tensor([min(cap, free // 4)], dtype=torch.int64, device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        cap = int(agreed.item())
    results: dict[str, list] = {"all_reduce": [], "all_gather": []}
    iterations = 5 if device != "cpu" else 2
    for index, size in enumerate(message_sizes(cap)):
        if index == 1:
            rank.maybe_die("collectives")
        elements = size // 4
        buffer = torch.ones(elements, dtype=torch.float32, device=device)
        chunk = torch.ones(elements // n, dtype=torch.float32, device=device)
        gathered = torch.empty(chunk.numel() * n, dtype=torch.float32, device=device)
        # the lambdas run within this iteration, before the del after the loop (ruff reads the del as unbinding)
        for name, run, factor in (("all_reduce", lambda: dist.all_reduce(buffer), 2 * (n - 1) / n),  # noqa: F821
                                  ("all_gather", lambda: dist.all_gather_into_tensor(gathered, chunk),  # noqa: F821
                                   (n - 1) / n)):
            run()  # warm-up: the first call of a size sets up buffers and channels
            _sync(device)
            dist.barrier()
            started = time.perf_counter()
            for _ in range(iterations):
                run()
            _sync(device)
            seconds = (time.perf_counter() - started) / iterations
            moved = size if name == "all_reduce" else gathered.numel() * 4  # all_gather: the gathered tensor
            results[name].append({"bytes": moved, "seconds": seconds, "bus_bytes_per_s": moved / seconds * factor})
        del buffer, chunk, gathered
    return results


def _sync(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


# ---- the model under DDP / FSDP2 ----------------------------------------------------------------
def wrap(model, rank: Rank):
    """DDP replicas, or FSDP2: fully_shard every transformer block, then the root."""
    if rank.spec.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[rank.local_rank] if rank.device != "cpu" else None)
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6 kept FSDP2 under _composable
        from torch.distributed._composable.fsdp import fully_shard

    mesh = init_device_mesh("cuda" if rank.device != "cpu" else "cpu", (rank.world,))
    blocks = {name for m in model.modules() for name in (getattr(m, "_no_split_modules", None) or ())}
    for module in list(model.modules()):
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def fresh_model(rank: Rank, recipe):
    """The recipe's trainable model (engine.loading / engine.trainable), seeded, wrapped.
    FSDP loads on the CPU and lets fully_shard move each block's shards to the GPU, so a model
    larger than one GPU can be checked (bitsandbytes models load where they will run)."""
    from ..loading import load_model
    from ..trainable import make_trainable
    from ..batches import seed_everything

    seed_everything(recipe.training.seed)
    shard_from_cpu = rank.spec.strategy == "fsdp" and recipe.model.quantization == "none"
    return wrap(make_trainable(load_model(recipe, "cpu" if shard_from_cpu else rank.device), recipe), rank)


def local_tensor(p):
    return p.to_local() if hasattr(p, "to_local") else p


def full_tensor(p):
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def fingerprints(named, of: Callable) -> dict[str, list[float]]:
    """Sum and sum of squares per tensor: enough to tell ranks apart, cheap to gather."""
    import torch

    with torch.no_grad():
        out = {}
        for name, p in named:
            t = of(p)
            if t is not None:
                t = t.detach().float()
                out[name] = [float(t.sum()), float(t.pow(2).sum())]
        return out


def differs_from_rank0(mine: dict, rank: Rank, tolerance: float) -> list[str]:
    """Names whose fingerprint on this rank differs from rank 0's (gathered to every rank)."""
    import torch.distributed as dist

    everyone: list = [None] * rank.world
    dist.all_gather_object(everyone, mine)
    return differing(mine, everyone[0], tolerance)


def differing(mine: dict, reference: dict, tolerance: float, both_ways: bool = False) -> list[str]:
    """Names whose fingerprints differ beyond ``tolerance`` (relative), or that one side lacks."""
    names = set(mine) | (set(reference) if both_ways else set())
    return sorted(name for name in names if name not in reference or name not in mine
                  or any(abs(a - b) > tolerance * max(1.0, abs(b)) for a, b in zip(mine[name], reference[name])))


def rank_batches(order, examples, rank: Rank, recipe) -> list[dict]:
    """This rank's micro-batches of the next global step (a DistributedSampler-like slice)."""
    from ..batches import collate

    mb = recipe.training.micro_batch_size
    out = []
    for _ in range(recipe.training.gradient_accumulation_steps):
        indices = order.next_indices()[rank.rank * mb:(rank.rank + 1) * mb]
        out.append(collate([examples[i] for i in indices], rank.spec.pad_id))
    return out


def worst_batch(rank: Rank, recipe) -> dict:
    """This rank's slice of the longest examples, padded to max_length."""
    from ..batches import collate
    from ..checkpoint import load_examples

    examples = load_examples(rank.data / WORST_DIR)
    mb = recipe.training.micro_batch_size
    mine = [examples[(rank.rank * mb + i) % len(examples)] for i in range(mb)]
    return collate(mine, rank.spec.pad_id, pad_to=recipe.data.max_length)


def capacity_bytes(rank: Rank):
    fake = fake_capacity(rank.rank)
    if fake is not None:
        return fake, "FTREADY_TEST_RANK_CAPACITY (test hook)"
    if rank.device != "cpu":
        import torch

        return int(torch.cuda.mem_get_info()[1]), "torch.cuda.mem_get_info total"
    import psutil

    return psutil.virtual_memory().total // rank.local_world, "host memory / ranks on this node"


def step(rank: Rank, recipe) -> dict:
    """One optimizer step of the worst-case batch: peak memory, time, consistency across ranks."""
    import torch

    from ..memory import free_device_memory, peak_memory
    from ..trainable import make_optimizer, make_scheduler, train_step

    exact = rank.device == "cpu"
    model = fresh_model(rank, recipe)
    optimizer = make_optimizer(model, recipe)
    scheduler = make_scheduler(optimizer, recipe, total_steps=2, constant=True)
    grads: dict = {}
    optimizer.register_step_pre_hook(lambda *_: grads.update(  # runs in the step, before the del of the model
        fingerprints(model.named_parameters(),  # noqa: F821
                     lambda p: None if p.grad is None else local_tensor(p.grad))))
    batch = worst_batch(rank, recipe)
    rank.maybe_die("step")
    with peak_memory(rank.device, count_tensors=rank.device == "cpu") as peak:
        loss = train_step(model, optimizer, scheduler, [batch], rank.device)
    weights = sum(local_tensor(p).numel() * p.element_size() for p in model.parameters())
    peak_bytes = peak.device_reserved_bytes if peak.device_reserved_bytes is not None else weights + peak.tensor_bytes
    capacity, capacity_source = capacity_bytes(rank)
    figures: dict[str, Any] = {
        "loss": loss, "peak_bytes": peak_bytes, "peak_host_bytes": peak.host_bytes, "weights_bytes": weights,
        "peak_method": "allocator reserved" if peak.device_reserved_bytes is not None else "weights + live tensors",
        "capacity_bytes": capacity, "capacity_source": capacity_source, "tokens": int(batch["input_ids"].numel()),
        "strategy": rank.spec.strategy,
    }
    tolerance = 0.0 if exact else 1e-5
    if rank.spec.strategy == "ddp":
        figures["gradients_compared"] = len(grads)
        figures["gradients_differ"] = differs_from_rank0(grads, rank, tolerance)
        figures["params_differ"] = differs_from_rank0(
            fingerprints(((n, p) for n, p in model.named_parameters() if p.requires_grad), lambda p: p), rank,
            tolerance)
    else:
        import torch.distributed as dist

        shard_elements = torch.tensor([sum(local_tensor(p).numel() for p in model.parameters())], device=rank.device)
        dist.all_reduce(shard_elements)
        figures["shard_elements_total"] = int(shard_elements.item())
        figures["full_elements"] = sum(p.numel() for p in model.parameters())
        figures["params_compared"] = sum(1 for p in model.parameters() if p.requires_grad)
        figures["params_differ"] = differs_from_rank0(
            fingerprints(((n, p) for n, p in model.named_parameters() if p.requires_grad), full_tensor), rank,
            tolerance)
    # a second, timed step: the first one paid for lazy initialisation
    import torch.distributed as dist

    dist.barrier()
    _sync(rank.device)
    started = time.perf_counter()
    train_step(model, optimizer, scheduler, [batch], rank.device)
    _sync(rank.device)
    figures["step_seconds"] = time.perf_counter() - started
    del model, optimizer
    free_device_memory(rank.device)
    return figures


# ---- sharded checkpoint -----------------------------------------------------------------------
def state_dicts(model, optimizer, recipe):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    adapter_only = recipe.adapter.method == "lora"  # the frozen base comes from the model files
    options = StateDictOptions(ignore_frozen_params=adapter_only, strict=not adapter_only)
    return {"model": get_model_state_dict(model, options=options),
            "optim": get_optimizer_state_dict(model, optimizer, options=options)}, options


def load_sharded(model, optimizer, recipe, folder: Path, extra: dict) -> None:
    """Load model, optimizer and ``extra`` (replicated plain state) from a DCP checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state, options = state_dicts(model, optimizer, recipe)
    state["extra"] = extra
    dcp.load(state, checkpoint_id=str(folder))
    set_model_state_dict(model, state["model"], options=options)
    set_optimizer_state_dict(model, optimizer, state["optim"], options=options)


def trainable_fingerprints(model) -> dict:
    return fingerprints(((n.replace("module.", "", 1), p) for n, p in model.named_parameters() if p.requires_grad),
                        full_tensor)


class Training:
    """A fresh trainable model with its optimizer, schedule and data order, as a run starts:
    the scheduler exists before any optimizer state is loaded (or the LR is wrong)."""

    def __init__(self, rank: Rank, recipe) -> None:
        from ..batches import DataOrder
        from ..checkpoint import load_examples
        from ..trainable import make_optimizer, make_scheduler

        t = recipe.training
        self.rank, self.recipe = rank, recipe
        self.examples = load_examples(rank.data / TRAIN_DIR)
        self.model = fresh_model(rank, recipe)
        self.optimizer = make_optimizer(self.model, recipe)
        self.scheduler = make_scheduler(self.optimizer, recipe, rank.spec.steps)
        self.order = DataOrder(len(self.examples), t.micro_batch_size * rank.world, t.seed)
        self.checkpoint = rank.data / CHECKPOINT_DIR

    def step(self) -> float:
        from ..trainable import train_step

        batches = rank_batches(self.order, self.examples, self.rank, self.recipe)
        return train_step(self.model, self.optimizer, self.scheduler, batches, self.rank.device)

    def extra(self, step: int) -> dict:
        """The replicated plain state saved beside the shards."""
        return {"step": step, "scheduler": self.scheduler.state_dict(), "data_order": self.order.state_dict()}

    def save(self, step: int) -> None:
        import torch
        import torch.distributed.checkpoint as dcp

        from ..checkpoint import rng_state

        state, _ = state_dicts(self.model, self.optimizer, self.recipe)
        state["extra"] = self.extra(step)
        dcp.save(state, checkpoint_id=str(self.checkpoint))
        torch.save(rng_state(), self.checkpoint / f"rng-rank{self.rank.rank}.pt")

    def load(self) -> int:
        """Model and optimizer shards, schedule and data order; returns the saved step."""
        extra = self.extra(0)
        load_sharded(self.model, self.optimizer, self.recipe, self.checkpoint, extra)
        self.scheduler.load_state_dict(extra["scheduler"])
        self.order.load_state_dict(extra["data_order"])
        return int(extra["step"])


def straight_run(rank: Rank, recipe) -> dict:
    """K steps from a fresh model; after K/2 a sharded checkpoint (model, optimizer; the
    schedule and data order replicated; every rank's RNG in its own file)."""
    run = Training(rank, recipe)
    losses, saved = [], {}
    for number in range(1, rank.spec.steps + 1):
        losses.append(run.step())
        if number == rank.spec.steps // 2:
            run.save(number)
            saved = trainable_fingerprints(run.model)
    return {"losses": losses, "saved_fingerprints": saved, "checkpoint": str(run.checkpoint)}


def resume(rank: Rank, recipe) -> dict:
    """A fresh job continues the checkpoint K/2 steps; the losses should be the straight run's."""
    import torch

    from ..checkpoint import set_rng_state

    run = Training(rank, recipe)
    at = run.load()
    set_rng_state(torch.load(run.checkpoint / f"rng-rank{rank.rank}.pt", weights_only=True))
    return {"losses": [run.step() for _ in range(rank.spec.steps - at)], "resumed_at": at}


def reshard(rank: Rank, recipe) -> dict:
    """Another world size loads the checkpoint: the weights must be the saved ones, and train."""
    import math

    run = Training(rank, recipe)
    run.load()
    differ = differing(trainable_fingerprints(run.model), rank.spec.saved_fingerprints, 1e-5, both_ways=True)
    loss = run.step()
    return {"weights_differ": differ, "weights_compared": len(rank.spec.saved_fingerprints), "loss": loss,
            "loss_finite": math.isfinite(loss), "saved_world_size": rank.spec.saved_world_size}


# ---- entry point ------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    recipe_path, mode, folder_arg = argv
    folder = Path(folder_arg)
    spec = JobSpec.read(folder)
    rank = Rank(folder, spec)
    import torch
    import torch.distributed as dist

    from ...recipe import load_recipe

    torch.set_num_threads(spec.threads)
    recipe = load_recipe(recipe_path)
    rank.phase("join", lambda: join(rank))
    try:
        if mode == "run":
            rank.phase("collectives", lambda: collectives(rank))
            rank.phase("step", lambda: step(rank, recipe))
            rank.phase("train", lambda: straight_run(rank, recipe))
        elif mode == "resume":
            rank.phase("resume", lambda: resume(rank, recipe))
        else:
            rank.phase("reshard", lambda: reshard(rank, recipe))
        dist.barrier()
        rank.report["phase"] = "finished"
        rank.save()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    raise SystemExit(record(main)(sys.argv[1:]))
