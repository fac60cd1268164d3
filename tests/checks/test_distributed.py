"""The distributed checks on this CPU: two gloo ranks through torchrun, the shipped
tiny-multi example, a rank killed mid-collective, a rank given too little memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail, Skip
from tests.helpers import outcomes

ROOT = Path(__file__).resolve().parents[2]
MULTI = ROOT / "examples" / "tiny-multi" / "recipe.toml"
FOUR = ("distributed.launch", "distributed.collectives", "distributed.step", "distributed.resume")


@pytest.fixture
def multi_recipe(tiny_example) -> Path:
    """examples/tiny-multi/recipe.toml beside a private copy of the tiny model and data."""
    text = MULTI.read_text().replace('"../tiny/model"', '"model"').replace('"../tiny/data/train.jsonl"',
                                                                           '"data/train.jsonl"')
    path = tiny_example / "recipe.toml"
    path.write_text(text.replace("timeout_s = 60", "timeout_s = 30"))
    return path


@pytest.fixture
def make_multi_state(multi_recipe, tmp_path, real_machine, edit_recipe):
    """``make_multi_state(**recipe_edits)``: the tiny-multi recipe's RecipeState, in-process."""
    from pytest_ftready.checks.registry import all_checks
    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.session.state import RunState

    all_checks()

    def make(**edits):
        if edits:
            edit_recipe(multi_recipe, **edits)
        run = RunState(artifacts_root=tmp_path / "arts", machine_factory=lambda: real_machine)
        return run.recipe_state(load_recipe(multi_recipe))
    return make


def processes_of(folder: Path) -> list:
    """Live processes whose command line names ``folder`` (torchrun and its ranks do)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(folder) in part for part in (proc.info["cmdline"] or [])):
            found.append(proc)
    return found


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_the_four_checks_pass_through_the_plugin(pytester, multi_recipe):
    result = pytester.runpytest_subprocess(f"--ftready={multi_recipe}", "-k", "distributed.", "--junitxml=out.xml",
                                           "-p", "no:cacheprovider")
    cases = outcomes(pytester.path / "out.xml")
    expected = {name: "passed" for name in FOUR} | {"distributed.collectives": "skipped"}  # gloo: no link to compare
    assert {name: cases[name][0] for name in FOUR} == expected, result.stdout.str()[-3000:]
    assert "gloo on the CPU has no GPU link to compare with; the figures are recorded" in \
        cases["distributed.collectives"][1]
    assert set(cases) == set(FOUR)  # one launch served all four; nothing else selected
    props = {p.get("name"): p.get("value") for p in case_properties(pytester.path / "out.xml", "distributed.launch")}
    command = props["torchrun_command"]
    assert "-m torch.distributed.run" in command and "--nproc-per-node=2" in command
    assert "-m pytest_ftready.engine.distributed.rank_worker" in command
    step = {p.get("name"): p.get("value") for p in case_properties(pytester.path / "out.xml", "distributed.step")}
    assert int(step["rank0_peak[bytes]"]) > 0 and int(step["rank1_peak[bytes]"]) > 0
    assert step["slowest_rank[rank]"] in ("0", "1")
    resume = {p.get("name"): p.get("value") for p in case_properties(pytester.path / "out.xml", "distributed.resume")}
    assert float(resume["resume_max_loss_difference[nats]"]) == 0.0


def case_properties(path: Path, case_name: str):
    """The <property> elements of one JUnit test case."""
    import xml.etree.ElementTree as ET

    for case in ET.parse(path).getroot().iter("testcase"):
        if case.get("name") == case_name:
            return case.iter("property")
    raise KeyError(case_name)


@pytest.mark.faults_slow  # a torchrun job with a rank killed: CI's second line (pytest tests -m "slow or faults_slow")
def test_a_rank_killed_mid_collective_is_named_and_leaves_no_process(make_multi_state, run_check, monkeypatch):
    state = make_multi_state()
    monkeypatch.setenv("FTREADY_TEST_KILL_RANK", "1:collectives")
    with pytest.raises(Fail) as launch:
        run_check(state, "distributed.launch")
    message = str(launch.value)
    # torchrun lists rank 1's SIGKILL, or only rank 0's lost connection (whichever it saw first)
    assert ("rank 1 failed in phase 'collectives': killed by signal SIGKILL" in message
            or "rank 1 failed in phase 'collectives': died without an error of its own" in message), message
    assert "killed by the test hook in collectives" in message  # rank 1's last line, attributed to it
    assert "OOM killer" in message  # the likely cause
    job = state.distributed_jobs.run()
    assert not job.timed_out  # torchrun noticed the death; the watchdog never had to fire
    assert processes_of(job.folder) == []
    logs = [p for p in (job.folder / "logs").rglob("*") if p.is_file()]
    assert logs and all(p.stat().st_mode & 0o077 == 0 for p in logs)  # the ranks' logs are owner-only
    with pytest.raises(Fail, match="the collectives did not complete: rank 1 failed"):
        run_check(state, "distributed.collectives")


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_an_fsdp_rank_with_too_little_memory_fails_the_step_naming_it(make_multi_state, run_check, monkeypatch):
    state = make_multi_state(strategy='"fsdp"')
    monkeypatch.setenv("FTREADY_TEST_RANK_CAPACITY", "1=1000000")
    with pytest.raises(Fail) as step:
        run_check(state, "distributed.step")
    message = str(step.value)
    assert "does not fit on every rank: rank 1 needs" in message
    assert "has 878.91 KiB (976.56 KiB from FTREADY_TEST_RANK_CAPACITY (test hook)" in message
    assert "rank 0" not in message
    run_check(state, "distributed.launch")  # the job itself was fine
    figures = state.distributed_jobs.run().per_rank("step")
    for rank in (0, 1):  # FSDP2 really sharded: half the weights per rank, shards add up, ranks agree
        assert figures[rank]["strategy"] == "fsdp" and figures[rank]["params_differ"] == []
        assert figures[rank]["shard_elements_total"] == figures[rank]["full_elements"]
        assert figures[rank]["weights_bytes"] < figures[rank]["full_elements"] * 4


@pytest.mark.faults_slow  # a rendezvous left to time out: CI's second line (pytest tests -m "slow or faults_slow")
def test_a_node_that_never_joins_fails_the_rendezvous_within_the_timeout(tmp_path):
    """nnodes = 2 but only this node starts: torchrun's rendezvous gives up after timeout_s."""
    import socket

    from pytest_ftready.engine.distributed.job import JobSpec
    from pytest_ftready.engine.distributed.launcher import launch

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spec = JobSpec(recipe=str(MULTI), mode="run", world_size=1, nnodes=2, backend="gloo", strategy="ddp",
                   device_kind="cpu", timeout_s=1, pad_id=0, steps=2, threads=1, collective_max_bytes=1 << 20,
                   rdzv_endpoint=f"127.0.0.1:{port}")
    job = launch(spec, tmp_path / "job", idle_timeout_s=60)
    assert not job.timed_out and job.exit_code != 0
    assert "the rendezvous timed out: not every node joined within timeout_s" in job.failure.cause
    assert "RendezvousTimeoutError" in "\n".join(job.failure.last_lines)
    assert any("rdzv_endpoint" in hint for hint in job.failure.hints)
    assert processes_of(job.folder) == []


def gpu_job(bus_bytes_per_s: float, links: dict, largest: int = 1 << 30):
    """The run job of two NVLink GPUs as the ranks would report it (no GPU here)."""
    from types import SimpleNamespace

    from pytest_ftready.engine.distributed.launcher import JobResult, RankOutcome

    rows = [{"bytes": largest, "seconds": 0.01, "bus_bytes_per_s": bus_bytes_per_s}]
    ranks = {r: RankOutcome(r, {"phase": "finished", "phases": {
        "join": {"backend": "nccl", "join_seconds": 0.1, "links": links},
        "collectives": {"all_reduce": rows, "all_gather": rows}}}) for r in (0, 1)}
    job = JobResult("run", ["torchrun"], 2, 0, False, 1.0, ranks, None, 0, Path("."))
    return SimpleNamespace(run=lambda: job, plan=SimpleNamespace(device_kind="cuda", backend="nccl"))


def test_collectives_far_below_the_link_fail_naming_it(make_multi_state, run_check):
    from pytest_ftready.machine.links import GpuLinks

    h100 = GpuLinks(nvlink_version=6, nvlinks_active=18).to_dict()
    state = make_multi_state()
    state.distributed_jobs = gpu_job(40e9, h100)  # 40 GB/s over 450 GB/s of NVLink 4.0 x18
    with pytest.raises(Fail, match=r"all_(reduce|gather) of 1.00 GiB reaches 40.0 GB/s bus bandwidth, under 25% of what "
                                   r"rank 0's link should give \(NVLink 4.0 x18: 450 GB/s; NVIDIA H100"):
        run_check(state, "distributed.collectives")
    state.distributed_jobs = gpu_job(380e9, h100)
    ctx = run_check(state, "distributed.collectives")
    shares = {m.name: m.value for m in ctx.measured}
    assert shares["all_reduce_share_of_link"] == pytest.approx(380 / 450)
    assert shares["link"] == "rank 0: NVLink 4.0 x18"
    state.distributed_jobs = gpu_job(4e9, h100, largest=16 << 20)  # too small to judge the link: no pass
    with pytest.raises(Skip, match=r"not compared with the link: the largest message that fit \(16.00 MiB\) is "
                                   r"latency-bound"):
        run_check(state, "distributed.collectives")
