"""The [distributed] table, how it resolves on a machine, the link facts, and how a failed
torchrun job is diagnosed: pure logic, no torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pytest_ftready.checks.distributed import applies, needs_gpu
from pytest_ftready.checks.registry import REGISTRY, all_checks
from pytest_ftready.engine.distributed.job import fake_capacity, kill_point
from pytest_ftready.engine.distributed.jobs import plan, visible_gpus
from pytest_ftready.engine.distributed.launcher import HINTS, RankOutcome, diagnose, job_processes, sweep, _stop
from pytest_ftready.engine.distributed.rank_worker import message_sizes
from pytest_ftready.machine.links import GpuLinks, expected_bandwidth, read_links, slowest_link
from pytest_ftready.recipe.schema import RecipeError
from tests.recipe.test_schema import GOOD, folder, parse  # noqa: F401 - folder is a fixture


def test_defaults_and_declared_table(folder):
    plain = parse(folder, GOOD)
    assert "distributed" not in plain.declared
    assert applies(plain).startswith("the recipe has no [distributed] table")
    recipe = parse(folder, GOOD + "[distributed]\nstrategy = \"fsdp\"\n")
    d = recipe.distributed
    assert (d.world_size, d.strategy, d.backend, d.nnodes, d.timeout_s) == (0, "fsdp", "auto", 1, 300.0)
    assert applies(recipe) is None
    assert applies(parse(folder, GOOD + "[distributed]\nworld_size = 1\n")).startswith("[distributed] world_size = 1")


@pytest.mark.parametrize("table, where, message", [
    ("strategy = \"zero3\"", "[distributed] strategy", "expected one of ddp, fsdp, got 'zero3'"),
    ("backend = \"ncll\"", "[distributed] backend", "did you mean 'nccl'?"),
    ("world_size = -2", "[distributed] world_size", "expected a non-negative integer, got -2"),
    ("timeout_s = 0", "[distributed] timeout_s", "expected a positive number"),
    ("nnodes = 2", "[distributed] rdzv_endpoint", "needs the rendezvous as \"host:port\""),
    ("wold_size = 2", "[distributed] wold_size", "did you mean world_size?"),
])
def test_bad_distributed_tables_name_the_key(folder, table, where, message):
    with pytest.raises(RecipeError) as info:
        parse(folder, GOOD + "[distributed]\n" + table + "\n")
    assert where in str(info.value) and message in str(info.value)


def test_nccl_on_the_cpu_is_refused_with_the_fix(folder):
    with pytest.raises(RecipeError, match=r"\[distributed\] backend: nccl needs CUDA/ROCm GPUs .* write backend = \"gloo\""):
        parse(folder, GOOD + "[hardware]\ndevice = \"cpu\"\n[distributed]\nbackend = \"nccl\"\n")


def test_items_carry_the_accelerator_marker_only_for_gpu_recipes(folder):
    all_checks()
    spec = REGISTRY["distributed.step"]
    assert spec.needs_accelerator(parse(folder, GOOD + "[distributed]\nbackend = \"nccl\"\n"))
    assert spec.needs_accelerator(parse(folder, GOOD + "[hardware]\ndevice = \"cuda\"\n[distributed]\n"))
    assert not spec.needs_accelerator(parse(folder, GOOD + "[distributed]\nbackend = \"gloo\"\nworld_size = 2\n"))
    assert not needs_gpu(parse(folder, GOOD))


def test_plan_resolves_world_size_and_backend(folder):
    auto = parse(folder, GOOD + "[distributed]\n")
    assert (plan(auto, "cuda", 8).world_size, plan(auto, "cuda", 8).backend) == (8, "nccl")
    assert (plan(auto, "cpu", 0).world_size, plan(auto, "cpu", 0).backend) == (1, "gloo")
    two = parse(folder, GOOD + "[distributed]\nworld_size = 2\n")
    assert plan(two, "cpu", 0).total_ranks == 2 and plan(two, "cpu", 0).reshard_world_size == 1
    with pytest.raises(ValueError, match="world_size = 2 but 1 GPU"):
        plan(two, "cuda", 1)
    with pytest.raises(ValueError, match="no backend for mps"):
        plan(two, "mps", 0)
    assert visible_gpus(8, {"CUDA_VISIBLE_DEVICES": "2,3"}) == 2 and visible_gpus(8, {}) == 8
    assert visible_gpus(8, {"CUDA_VISIBLE_DEVICES": "-1"}) == 0


def test_test_hooks_parse():
    env = {"FTREADY_TEST_RANK_CAPACITY": "1=1000, 3=5", "FTREADY_TEST_KILL_RANK": "1:collectives"}
    assert (fake_capacity(1, env), fake_capacity(3, env), fake_capacity(0, env)) == (1000, 5, None)
    assert (kill_point(1, env), kill_point(0, env), kill_point(1, {})) == ("collectives", "", "")


def test_message_sizes_double_from_one_mib():
    assert message_sizes(4 << 20) == [1 << 20, 2 << 20, 4 << 20]
    assert message_sizes(1 << 30)[-1] == 1 << 30 and len(message_sizes(1 << 30)) == 11
    assert message_sizes(1000) == [1 << 20]


# ---- link facts ---------------------------------------------------------------------------
def test_expected_bandwidth_from_facts():
    h100 = expected_bandwidth(GpuLinks(nvlink_version=6, nvlinks_active=18))
    assert h100.bytes_per_s == pytest.approx(450e9) and h100.link == "NVLink 4.0 x18" and "H100" in h100.source
    pcie = expected_bandwidth(GpuLinks(pcie_generation=4, pcie_width=16))
    assert pcie.bytes_per_s == pytest.approx(31.5e9, rel=0.01) and "PCI-SIG" in pcie.source
    unknown = expected_bandwidth(GpuLinks(nvlink_version=99, nvlinks_active=2))
    assert unknown.bytes_per_s is None and "does not list" in unknown.reason
    rank, slowest = slowest_link({0: GpuLinks(nvlink_version=6, nvlinks_active=18),
                                  1: GpuLinks(pcie_generation=3, pcie_width=8)})
    assert rank == 1 and slowest.link == "PCIe gen 3 x8"


class FakeNvml:
    """NVML's link queries for one GPU with two active NVLink 3.0 links, then none."""

    NVML_NVLINK_MAX_LINKS = 4
    NVML_FEATURE_ENABLED = 1

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetNvLinkState(self, handle, link):
        if link >= 3:
            raise self.NVMLError("Not Supported")
        return 1 if link < 2 else 0

    def nvmlDeviceGetNvLinkVersion(self, handle, link):
        return 4

    nvmlDeviceGetMaxPcieLinkGeneration = staticmethod(lambda h: 4)
    nvmlDeviceGetMaxPcieLinkWidth = staticmethod(lambda h: 16)
    nvmlDeviceGetCurrPcieLinkGeneration = staticmethod(lambda h: 1)
    nvmlDeviceGetCurrPcieLinkWidth = staticmethod(lambda h: 16)


def test_read_links_through_nvml():
    links = read_links(FakeNvml(), handle=object())
    assert (links.nvlink_version, links.nvlinks_active, links.pcie_generation, links.pcie_generation_now) == (4, 2, 4, 1)
    assert expected_bandwidth(links).link == "NVLink 3.0 x2"


# ---- diagnosis -------------------------------------------------------------------------------
def outcome(rank, phase, done=(), error=None, lines=()):
    report = {"phase": phase, "done": list(done), "phases": {p: {} for p in done}}
    if error:
        report["error"] = error
    return RankOutcome(rank, report, list(lines))


def test_a_clean_job_has_no_failure():
    ranks = {r: outcome(r, "finished", ["join"]) for r in range(2)}
    assert diagnose(ranks, 2, 0, False, 10, "") is None


def test_the_killed_rank_is_the_root_cause_with_hints():
    text = ("Root Cause (first observed failure):\n[0]:\n  time : x\n  host : h\n  rank      : 1 (local_rank: 1)\n"
            "  exitcode  : -9 (pid: 123)\n")
    ranks = {0: outcome(0, "collectives", ["join"]), 1: outcome(1, "collectives", ["join"], lines=["last words"])}
    failure = diagnose(ranks, 2, 1, False, 10, text)
    assert (failure.rank, failure.phase, failure.cause) == (1, "collectives", "killed by signal SIGKILL")
    assert failure.last_lines == ["last words"] and "OOM killer" in failure.hints[0]
    assert "rank 1 failed in phase 'collectives'" in failure.text()


def test_a_rank_that_vanished_is_blamed_not_the_peer_that_lost_it():
    """torchrun may observe the survivor's error first and call it the root cause."""
    lost = {"phase": "collectives", "type": "RuntimeError", "message": "[pair.cc:537] Read error: Connection reset by peer"}
    text = "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 1)\n"
    ranks = {0: outcome(0, "collectives", ["join"], error=lost), 1: outcome(1, "collectives", ["join"], lines=["bye"])}
    failure = diagnose(ranks, 2, 1, False, 10, text)
    assert failure.rank == 1 and failure.phase == "collectives"
    assert "died without an error of its own" in failure.cause and "rank 0 lost its connection" in failure.cause
    assert "OOM killer" in failure.hints[0]
    terminated = text + "[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -15 (pid: 2)\n"
    assert diagnose(ranks, 2, 1, False, 10, terminated).rank == 1  # SIGTERM is torchrun's own doing


def test_a_rank_error_names_the_rank_and_an_nccl_hint():
    error = {"phase": "join", "type": "DistNetworkError", "message": "NCCL error: unhandled system error (P2P)"}
    ranks = {0: outcome(0, "join", error=error), 1: outcome(1, "finished", ["join", "step"])}
    failure = diagnose(ranks, 2, 1, False, 10, "")
    assert failure.rank == 0 and "DistNetworkError" in failure.cause
    assert any("NCCL_P2P_DISABLE" in h for h in failure.hints)


def test_a_hang_names_the_rank_behind_and_socket_hints():
    ranks = {0: outcome(0, "step", ["join", "collectives"]), 1: outcome(1, "join")}
    failure = diagnose(ranks, 2, None, True, 30, "")
    assert failure.rank == 1 and "no rank made progress for 30 s" in failure.cause
    assert any("GLOO_SOCKET_IFNAME" in h for h in failure.hints)
    assert not any(h.startswith("NCCL") for h in failure.hints)
    nccl = diagnose(ranks, 2, None, True, 30, "", backend="nccl")
    assert any("NCCL_SOCKET_IFNAME" in h for h in nccl.hints) and not any(h.startswith("gloo") for h in nccl.hints)


def test_every_hint_names_what_to_try():
    for pattern, hint in HINTS:
        assert pattern and len(hint) > 40


# ---- no process left behind --------------------------------------------------------------------
def test_stop_and_sweep_leave_no_process_of_the_job(monkeypatch):
    """A parent in its own session whose child starts a session of its own (as torchrun's
    workers do): stopping the parent's group misses the child; the sweep finds it by token."""
    token = "test-" + str(os.getpid())
    child = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
             "start_new_session=True); time.sleep(60)")
    env = {**os.environ, "FTREADY_DISTRIBUTED_JOB": token}
    proc = subprocess.Popen([sys.executable, "-c", child], env=env, start_new_session=True)
    for _ in range(100):
        if len(job_processes(token)) == 2:
            break
        time.sleep(0.05)
    assert len(job_processes(token)) == 2
    _stop(proc)
    assert proc.returncode is not None
    assert sweep(token) == 1  # the grandchild in its own session survived the group kill
    assert job_processes(token) == []


@pytest.mark.faults_slow  # a job left silent until the watchdog kills it: CI's second line (pytest tests -m "slow or faults_slow")
def test_a_silent_job_is_killed_by_the_watchdog_and_swept(tmp_path, monkeypatch):
    """A stand-in for torchrun that starts a 'rank' in a session of its own and then hangs."""
    from pytest_ftready.engine.distributed import launcher
    from pytest_ftready.engine.distributed.job import JobSpec

    hang = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
            "start_new_session=True); time.sleep(60)")
    monkeypatch.setattr(launcher, "torchrun_command", lambda spec, folder: [sys.executable, "-c", hang])
    spec = JobSpec(recipe="r.toml", mode="run", world_size=2, nnodes=1, backend="gloo", strategy="ddp",
                   device_kind="cpu", timeout_s=1.0, pad_id=0, steps=2, threads=1, collective_max_bytes=1 << 20)
    monkeypatch.setattr(launcher, "PROGRESS_EVERY_S", 0.3)
    lines: list[str] = []
    job = launcher.launch(spec, tmp_path / "job", idle_timeout_s=1.0, progress=lines.append)
    assert job.timed_out and not job.ok
    assert lines and "torchrun run job" in lines[0] and "rank 0 starting, rank 1 starting" in lines[0]
    assert job.leftovers == 1  # the 'rank' in its own session, found by the job token
    assert "no rank made progress for 1 s (timeout_s): a hang; ranks 0 in 'before start', 1 in 'before start'" \
        in job.failure.cause
    assert any("GLOO_SOCKET_IFNAME" in hint for hint in job.failure.hints)
