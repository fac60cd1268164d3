"""Distributed checks: the recipe as a torchrun job (DDP or FSDP2) on every rank. One job per
session runs the join, the collectives, the worst-case step and a straight run with a sharded
checkpoint; ``distributed.resume`` adds a fresh job that continues it and one with another
world size that loads it. The checks read the jobs' per-rank figures and judge them."""

from __future__ import annotations

from ..engine.distributed import applies
from ..engine.distributed.launcher import JobResult
from ..outcomes import Fail, Skip
from ..units import human_bytes
from .registry import STAGES, check


COMPARE_FROM_BYTES = 64 << 20  # smaller messages are latency-bound: their bus bandwidth says little about the link


def needs_gpu(recipe) -> bool:
    """NCCL, or a recipe written for GPUs: the items carry the accelerator marker."""
    return recipe.distributed.backend == "nccl" or recipe.hardware.device in ("cuda", "rocm")


def finished(job: JobResult, phase: str, what: str) -> dict[int, dict]:
    """Every rank's figures of ``phase``; the job's failure when a rank did not finish it."""
    if job.stopped_in(phase):
        raise Fail(f"{what}: {job.failure.text() if job.failure else ''}")  # stopped_in: a failure
    return job.per_rank(phase)


@check("distributed.launch", stage=STAGES["distributed"], applies=applies, accelerator=needs_gpu,
       requires=("data.masking",))
def launch(ctx) -> None:
    """torchrun starts every rank, they join and finish; a dead or stuck rank is named with its last lines."""
    jobs = ctx.state.distributed_jobs
    job = jobs.run()
    ctx.measure("torchrun_command", job.command_text(), "")
    ctx.measure("world_size", job.world_size, "ranks")
    ctx.measure("job_seconds", job.seconds, "s")
    joined = job.per_rank("join")
    ctx.measure("backend", jobs.plan.backend, "")
    if joined:
        ctx.measure("slowest_join_seconds", max(f["join_seconds"] for f in joined.values()), "s")
    if job.leftovers:
        ctx.measure("processes_left_behind", job.leftovers, "processes")
    if job.failure is not None:
        raise Fail(f"the torchrun job ({job.world_size} ranks) failed"
                   + (f" and left {job.leftovers} process(es) behind (killed)" if job.leftovers else "")
                   + f": {job.failure.text()}")


@check("distributed.collectives", stage=STAGES["distributed"] + 1, applies=applies, accelerator=needs_gpu,
       requires=("data.masking",))
def collectives(ctx) -> None:
    """all_reduce and all_gather bus bandwidth per message size; large messages near the link's bandwidth."""
    from ..machine.links import GpuLinks, slowest_link

    jobs = ctx.state.distributed_jobs
    job = jobs.run()
    per_rank = finished(job, "collectives", "the collectives did not complete")
    ctx.measure("ranks_measured", len(per_rank), "ranks")
    best: dict[str, tuple[int, float]] = {}
    for op in ("all_reduce", "all_gather"):
        sizes = [row["bytes"] for row in next(iter(per_rank.values()))[op]]
        # a ring runs at its slowest rank: the lowest bus bandwidth over ranks, per size
        curve = [min(figures[op][i]["bus_bytes_per_s"] for figures in per_rank.values()) for i in range(len(sizes))]
        ctx.series(f"{op}_bus_bytes_per_s", curve)
        ctx.measure(f"{op}_largest_message", sizes[-1], "bytes")
        ctx.measure(f"{op}_bus_bandwidth", curve[-1], "bytes/s")
        best[op] = (sizes[-1], curve[-1])
    links = {r: GpuLinks(**f["links"]) for r, f in job.per_rank("join").items() if f.get("links")}
    if not links:
        why = ("gloo on the CPU has no GPU link to compare with" if jobs.plan.device_kind == "cpu" else
               "NVML gave no link facts for these GPUs (ROCm, or NVML not readable)")
        raise Skip(f"bus bandwidth not compared with a link: {why}; the figures are recorded")
    rank, expected = slowest_link(links)
    largest = min(size for size, _ in best.values())
    if largest < COMPARE_FROM_BYTES:
        raise Skip(f"bus bandwidth not compared with the link: the largest message that fit ({human_bytes(largest)}) "
                   f"is latency-bound; comparing needs {human_bytes(COMPARE_FROM_BYTES)} or more free on every GPU "
                   "(the figures are recorded)")
    if expected.bytes_per_s is None:
        raise Skip(f"bus bandwidth not compared with the link: {expected.reason} (the figures are recorded)")
    ctx.measure("link", f"rank {rank}: {expected.link}", "")
    ctx.measure("link_bandwidth", expected.bytes_per_s, "bytes/s", estimate=True)
    share = ctx.recipe.distributed.min_bandwidth_share
    slow = {op: bw for op, (_, bw) in best.items() if bw < share * expected.bytes_per_s}
    for op, (_, bw) in best.items():
        ctx.measure(f"{op}_share_of_link", bw / expected.bytes_per_s, "share")
    if slow:
        op, bw = min(slow.items(), key=lambda item: item[1])
        raise Fail(f"{op} of {human_bytes(best[op][0])} reaches {bw / 1e9:.1f} GB/s bus bandwidth, under "
                   f"{share:.0%} of what rank {rank}'s link should give ({expected.link}: "
                   f"{expected.bytes_per_s / 1e9:.0f} GB/s; {expected.source}). Check NCCL_P2P_DISABLE is not set, "
                   "`nvidia-smi topo -m` for the path between the GPUs, and NCCL_DEBUG=INFO for the transport")


@check("distributed.step", stage=STAGES["distributed"] + 2, applies=applies, accelerator=needs_gpu,
       requires=("data.masking",))
def step(ctx) -> None:
    """One DDP/FSDP2 step of the worst-case batch on every rank: per-rank peak fits, ranks agree."""
    per_rank = finished(ctx.state.distributed_jobs.run(), "step", "the distributed step did not complete")
    ctx.measure("ranks_measured", len(per_rank), "ranks")
    headroom = ctx.recipe.hardware.memory_headroom
    over = []
    for rank, f in per_rank.items():
        ctx.measure(f"rank{rank}_peak", f["peak_bytes"], "bytes")
        ctx.measure(f"rank{rank}_step_seconds", f["step_seconds"], "s")
        usable = int(f["capacity_bytes"] * (1 - headroom)) if f.get("capacity_bytes") else None
        if usable is not None and f["peak_bytes"] > usable:
            over.append(f"rank {rank} needs {human_bytes(f['peak_bytes'])} but has {human_bytes(usable)} "
                        f"({human_bytes(f['capacity_bytes'])} from {f['capacity_source']}, less the {headroom:.0%} "
                        "memory_headroom)")
    slowest = max(per_rank, key=lambda r: per_rank[r]["step_seconds"])
    fastest = min(per_rank, key=lambda r: per_rank[r]["step_seconds"])
    ctx.measure("peak_method", per_rank[slowest]["peak_method"], "")
    ctx.measure("max_rank_peak", max(f["peak_bytes"] for f in per_rank.values()), "bytes")
    ctx.measure("slowest_rank", slowest, "rank")
    ctx.measure("slowest_step_seconds", per_rank[slowest]["step_seconds"], "s")
    ctx.measure("step_time_spread", per_rank[slowest]["step_seconds"] / max(per_rank[fastest]["step_seconds"], 1e-9),
                "ratio")
    if over:
        raise Fail("the worst-case step does not fit on every rank: " + "; ".join(over)
                   + (". Shard the model (strategy = \"fsdp\")" if ctx.recipe.distributed.strategy == "ddp" else "")
                   + ", or lower micro_batch_size / max_length, or turn on gradient_checkpointing")
    disagree = [(rank, key, f[key]) for rank, f in per_rank.items() for key in ("gradients_differ", "params_differ")
                if f.get(key)]
    if disagree:
        rank, key, names = disagree[0]
        what = "gradients" if key == "gradients_differ" else "parameters"
        raise Fail(f"after the step rank {rank}'s {what} differ from rank 0's ({len(names)} tensors, e.g. {names[0]}): "
                   "the ranks no longer train one model (parameters not broadcast at start, or a module outside "
                   "the DDP/FSDP wrapper)")
    for rank, f in per_rank.items():
        if "shard_elements_total" in f and f["shard_elements_total"] != f["full_elements"]:
            raise Fail(f"the FSDP shards hold {f['shard_elements_total']} elements across ranks but the model has "
                       f"{f['full_elements']}: parameters are missing from the shards (seen on rank {rank})")


@check("distributed.resume", stage=STAGES["distributed"] + 3, applies=applies, accelerator=needs_gpu,
       requires=("data.masking",))
def resume(ctx) -> None:
    """A sharded checkpoint resumes in a fresh torchrun job with the straight run's losses, and loads
    with another world size."""
    jobs = ctx.state.distributed_jobs
    straight_runs = finished(jobs.run(), "train", "the straight run with a sharded checkpoint did not complete")
    half = jobs.steps // 2
    resumed = finished(jobs.resume(), "resume", "the resume in a fresh torchrun job failed")
    exact = jobs.plan.device_kind == "cpu"
    tolerance = 0.0 if exact else 1e-3
    worst = 0.0
    for rank, figures in resumed.items():
        straight = straight_runs[rank]["losses"][half:]
        if len(figures["losses"]) != len(straight):
            raise Fail(f"rank {rank} returned {len(figures['losses'])} loss(es) after the resume for the "
                       f"{len(straight)} "
                       f"step(s) the straight run made after step {half}: the resumed job stopped early or ran extra "
                       "steps (the saved step count or data position is wrong)")
        for i, (a, b) in enumerate(zip(straight, figures["losses"])):
            worst = max(worst, abs(a - b))
            if abs(a - b) > tolerance * max(1.0, abs(a)):
                raise Fail(f"rank {rank}, step {half + i + 1} after the resume: loss {b:.6f}, uninterrupted "
                           f"{a:.6f}: the "
                           "sharded checkpoint does not carry the whole training state (optimizer, schedule, data "
                           "order, every rank's RNG)")
    ctx.measure("resume_max_loss_difference", worst, "nats")
    ctx.measure("resumed_ranks", len(resumed), "ranks")
    ctx.measure("resumed_steps", len(next(iter(resumed.values()))["losses"]) if resumed else 0, "steps")
    other = jobs.plan.reshard_world_size
    ctx.measure("reshard_world_size", other, "ranks")
    reshard = jobs.reshard()
    if reshard.failure is not None:
        raise Fail(f"the checkpoint written by {jobs.plan.world_size} ranks does not load with {other}: "
                   f"{reshard.failure.text()}")
    figures = next(iter(reshard.per_rank("reshard").values()))
    if figures["weights_differ"]:
        raise Fail(f"loaded with {other} rank(s), {len(figures['weights_differ'])} of {figures['weights_compared']} "
                   f"trainable tensors differ from the saved ones, e.g. {figures['weights_differ'][0]}")
    if not figures["loss_finite"]:
        raise Fail(f"loaded with {other} rank(s), the next step's loss is {figures['loss']}")
