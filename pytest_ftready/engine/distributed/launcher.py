"""Start one torchrun job, watch it, and say what happened to every rank.

The job is ``python -m torch.distributed.run --nproc-per-node=N ... -m
pytest_ftready.engine.distributed.rank_worker RECIPE MODE JOB_DIR`` in a session of its own.
torchrun writes each local rank's stdout/stderr under ``JOB_DIR/logs`` (``--log-dir``,
``--redirects 3``); each rank writes ``rank-N.json`` after every phase. The launcher kills
the job when no rank has made progress for the timeout, then sweeps every process that
carries the job's token in its environment, so nothing is left behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ...files import ensure_private_dir
from .job import JOB_TOKEN_ENV, LOG_DIR, TORCHRUN_LOG, JobSpec, rank_file

WORKER = "pytest_ftready.engine.distributed.rank_worker"
POLL_S = 0.2
TERM_GRACE_S = 10.0  # torchrun forwards SIGTERM to its workers and waits for them

# (pattern in a rank's output or torchrun's, hint): the usual causes of a rank that cannot join or dies.
HINTS = (
    (r"Signal 9|SIGKILL|exitcode\s*:\s*-9", "the rank was killed with SIGKILL: usually the kernel's OOM killer "
     "(host memory; see `dmesg`), or a scheduler or person killing it"),
    (r"OutOfMemoryError|out of memory", "the rank ran out of device memory: shard more (strategy = \"fsdp\"), lower "
     "micro_batch_size or max_length, or turn on gradient_checkpointing"),
    (r"NCCL.*(unhandled system error|P2P|peer access|cudaIpc)|P2P", "GPU peer-to-peer failed: try NCCL_P2P_DISABLE=1 "
     "(a driver, IOMMU or ACS setting often blocks P2P); NCCL_DEBUG=INFO shows the transport"),
    (r"NET/IB|ibv_|InfiniBand|mlx5", "InfiniBand failed: check NCCL_IB_HCA, or try NCCL_IB_DISABLE=1 to fall back "
     "to sockets"),
    (r"NCCL|nccl", "NCCL failed: run with NCCL_DEBUG=INFO; across machines set NCCL_SOCKET_IFNAME to the interface "
     "the nodes share (e.g. eth0), and check NCCL_P2P_DISABLE / NCCL_IB_DISABLE"),
    (r"[Gg]loo|connectFullMesh", "gloo could not connect the ranks: set GLOO_SOCKET_IFNAME to the interface the ranks "
     "share (e.g. lo on one machine, eth0 across machines)"),
    (r"Connection refused|Connection reset|No route to host|rendezvous|RendezvousTimeoutError|timed out",
     "the ranks could not reach each other or the rendezvous: check rdzv_endpoint / MASTER_ADDR:MASTER_PORT, the "
     "firewall on that port, and NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME"),
)


@dataclass
class RankOutcome:
    rank: int
    report: dict  # what the rank wrote to rank-N.json (empty: it never started)
    last_lines: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.report.get("phase") == "finished"

    @property
    def phase(self) -> str:
        return self.report.get("phase", "before start")

    def figures(self, phase: str) -> Optional[dict]:
        return self.report.get("phases", {}).get(phase)


@dataclass
class Failure:
    """The rank that stopped the job, where, why, and what to try."""

    rank: Optional[int]
    phase: str
    cause: str
    last_lines: list[str]
    hints: list[str]

    def text(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "the job"
        lines = "\n".join(f"    {line}" for line in self.last_lines[-8:]) or "    (no output)"
        hints = "".join(f"\n  hint: {h}" for h in self.hints)
        source = f"rank {self.rank}" if self.rank is not None else "torchrun"
        return f"{who} failed in phase '{self.phase}': {self.cause}\n  last lines of {source}:\n{lines}{hints}"


@dataclass
class JobResult:
    mode: str
    command: list[str]
    world_size: int
    exit_code: Optional[int]
    timed_out: bool
    seconds: float
    ranks: dict[int, RankOutcome]
    failure: Optional[Failure]
    leftovers: int  # processes of the job still alive after it ended, killed by the sweep
    folder: Path

    @property
    def ok(self) -> bool:
        return self.failure is None

    def command_text(self) -> str:
        return " ".join(self.command)

    def per_rank(self, phase: str) -> dict[int, dict]:
        """{rank: figures} of the ranks that finished ``phase``."""
        return {r: figures for r, o in sorted(self.ranks.items()) if (figures := o.figures(phase)) is not None}

    def stopped_in(self, phase: str) -> bool:
        """The job failed before every rank (of this node's view) finished ``phase``."""
        return self.failure is not None and any(o.figures(phase) is None for o in self.ranks.values())


def torchrun_command(spec: JobSpec, folder: Path) -> list[str]:
    """The torchrun command line of a job (also what the README tells teams to launch with)."""
    rendezvous = (["--standalone"] if spec.nnodes == 1 else
                  ["--rdzv-backend=c10d", f"--rdzv-endpoint={spec.rdzv_endpoint}", f"--rdzv-id=ftready-{spec.mode}",
                   f"--rdzv-conf=join_timeout={max(1, int(spec.timeout_s))}"])  # a missing node fails, not waits 900 s
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={spec.nnodes}",
            f"--nproc-per-node={spec.world_size}", *rendezvous, "--max-restarts=0", "--monitor-interval=0.5",
            f"--log-dir={folder / LOG_DIR}", "--redirects=3", "-m", WORKER, spec.recipe, spec.mode, str(folder)]


PROGRESS_EVERY_S = 10.0


def launch(spec: JobSpec, folder: Path, idle_timeout_s: float, env: Optional[dict] = None,
           progress: Optional[Callable[[str], None]] = None) -> JobResult:
    """Run the job; kill it when no rank progressed for ``idle_timeout_s``; never leave a process.
    ``progress`` gets a line every few seconds saying where each rank is."""
    folder = ensure_private_dir(Path(folder))
    for old in folder.glob("rank-*.json"):
        old.unlink()
    shutil.rmtree(folder / LOG_DIR, ignore_errors=True)
    spec.write(folder)
    token = uuid.uuid4().hex
    command = torchrun_command(spec, folder)
    environ = {**(env if env is not None else os.environ), JOB_TOKEN_ENV: token, "PYTHONUNBUFFERED": "1",
               "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    started = time.monotonic()
    timed_out = False
    leftovers = 0
    with open(folder / TORCHRUN_LOG, "wb") as log:
        # umask: the ranks' logs and checkpoint shards are owner-only, like every other artifact
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environ, start_new_session=True,
                                umask=0o077)
        try:
            last_progress, seen, reported = time.monotonic(), 0.0, time.monotonic()
            while proc.poll() is None:
                time.sleep(POLL_S)
                if progress is not None and time.monotonic() - reported > PROGRESS_EVERY_S:
                    reported = time.monotonic()
                    where = ", ".join(f"rank {r} {_read_report(folder, r).get('phase', 'starting')}"
                                      for r in range(spec.world_size))
                    progress(f"torchrun {spec.mode} job, {reported - started:.0f} s: {where}")
                newest = _newest_mtime(folder)
                if newest > seen:
                    seen, last_progress = newest, time.monotonic()
                elif time.monotonic() - last_progress > idle_timeout_s:
                    timed_out = True
                    break
        finally:  # also on Ctrl-C or a pytest-timeout: the job never outlives the check
            _stop(proc)
            leftovers = sweep(token)
    seconds = time.monotonic() - started
    world = spec.world_size * spec.nnodes
    # this node sees its own ranks' files; on one node every rank must have reported
    ranks = {r: RankOutcome(r, _read_report(folder, r), _last_lines(folder, r, spec.world_size)) for r in range(world)
             if spec.nnodes == 1 or rank_file(folder, r).exists()}
    failure = diagnose(ranks, len(ranks) if spec.nnodes > 1 else world, proc.returncode, timed_out, idle_timeout_s,
                       (folder / TORCHRUN_LOG).read_text(encoding="utf-8", errors="replace"), spec.backend)
    return JobResult(spec.mode, command, world, proc.returncode, timed_out, seconds, ranks, failure, leftovers, folder)


def _newest_mtime(folder: Path) -> float:
    newest = 0.0
    for path in [*folder.glob("rank-*.json"), *(folder / LOG_DIR).rglob("*.log")]:
        try:
            newest = max(newest, path.stat().st_mtime)
        except OSError:
            pass
    return newest


def _stop(proc: subprocess.Popen) -> None:
    """End torchrun's whole session: SIGTERM (torchrun stops its workers), then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def job_processes(token: str) -> list:
    """Live processes (of this user) whose environment carries the job's token."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get(JOB_TOKEN_ENV) == token:
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
            continue
    return found


def sweep(token: str) -> int:
    """Kill what is left of a job (torchrun's workers live in sessions of their own, so a dead
    torchrun can leave them behind); returns how many there were."""
    import psutil

    leftovers = job_processes(token)
    for proc in leftovers:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(leftovers, timeout=5)
    return len(leftovers)


def _read_report(folder: Path, rank: int) -> dict:
    import json

    try:
        return json.loads(rank_file(folder, rank).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _last_lines(folder: Path, rank: int, per_node: int, count: int = 12) -> list[str]:
    """The last lines a rank wrote (stdout, then stderr) from torchrun's per-rank log files
    (kept per local rank: the rank file says which local rank a rank had)."""
    local = _read_report(folder, rank).get("local_rank", rank % per_node)
    lines: list[str] = []
    for name in ("stdout.log", "stderr.log"):
        for path in sorted((folder / LOG_DIR).rglob(f"attempt_*/{local}/{name}")):
            text = path.read_text(encoding="utf-8", errors="replace")
            lines += [line for line in text.splitlines() if line.strip() and "Loading weights" not in line]
    return lines[-count:]


ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
EXIT = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)")
# errors a rank gets because a PEER died: never the root cause while a rank died silently
PEER_LOST = re.compile(r"[Cc]onnection (reset|closed) by peer|Broken pipe|[Rr]ead error|recvBytes|"
                       r"communicator was aborted|[Ss]ocket [Tt]imeout|remote worker", re.S)


def _signal_name(code: int) -> str:
    return signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)


def _culprit(ranks: dict[int, RankOutcome], torchrun_text: str) -> Optional[tuple[Optional[RankOutcome], int, str]]:
    """(outcome, rank, cause) of the rank that stopped a job which ended on its own."""
    codes = {int(r): int(c) for r, c in EXIT.findall(torchrun_text)}
    # a rank killed by a signal torchrun did not send (SIGTERM is torchrun stopping the others)
    killed = sorted(r for r, c in codes.items() if c < 0 and -c != signal.SIGTERM)
    if killed:
        return ranks.get(killed[0]), killed[0], f"killed by signal {_signal_name(codes[killed[0]])}"
    errored = sorted((o for o in ranks.values() if o.report.get("error")), key=lambda o: len(o.report.get("done", [])))
    own = [o for o in errored if not PEER_LOST.search(o.report["error"]["message"])]
    silent = [o for o in ranks.values() if o.report and not o.finished and not o.report.get("error")]
    if errored and not own and silent:  # the others lost their connection to a rank that vanished
        o = silent[0]
        return o, o.rank, (f"died without an error of its own in '{o.phase}' (killed by a signal such as SIGKILL?) "
                           f"while rank {errored[0].rank} lost its connection to it")
    if own or errored:
        o = (own or errored)[0]
        return o, o.rank, f"{o.report['error']['type']}: {o.report['error']['message']}"
    root = ROOT_CAUSE.search(torchrun_text)
    if root:
        rank, code = int(root.group(1)), int(root.group(2))
        how = f"exited with code {code}" if code >= 0 else f"killed by signal {_signal_name(code)}"
        return ranks.get(rank), rank, how
    return None


def diagnose(ranks: dict[int, RankOutcome], world: int, exit_code: Optional[int], timed_out: bool,
             idle_timeout_s: float, torchrun_text: str, backend: str = "gloo") -> Optional[Failure]:
    """None when every rank finished; else the rank that stopped the job and why: a rank killed
    by a signal before the ranks that then lost it, a rank's own error before errors it caused."""
    if not timed_out and exit_code == 0 and len(ranks) == world and all(o.finished for o in ranks.values()):
        return None
    culprit = None if timed_out else _culprit(ranks, torchrun_text)
    if timed_out:
        stuck = [o for o in ranks.values() if not o.finished]
        outcome = min(stuck, key=lambda o: len(o.report.get("done", [])), default=None)
        rank = outcome.rank if outcome else None
        cause = (f"no rank made progress for {idle_timeout_s:.0f} s (timeout_s): a hang; ranks "
                 + ", ".join(f"{o.rank} in '{o.phase}'" for o in stuck) + "; the job was killed")
    elif culprit is not None:
        outcome, rank, cause = culprit
    else:
        missing = [r for r in range(world) if r not in ranks or not ranks[r].report]
        outcome = next((o for o in ranks.values() if not o.finished), None)
        rank = missing[0] if missing else (outcome.rank if outcome else None)
        cause = (f"torchrun exited with code {exit_code}" +
                 (f"; rank(s) {missing} never started" if missing else "") +
                 ("; the rendezvous timed out: not every node joined within timeout_s"
                  if "RendezvousTimeoutError" in torchrun_text else ""))
    # no rank to quote (none started, e.g. the rendezvous failed): quote torchrun itself
    last = outcome.last_lines if outcome else [line for line in torchrun_text.splitlines() if line.strip()][-8:]
    phase = outcome.phase if outcome else "launch"
    haystack = "\n".join([cause, *last, *(torchrun_text.splitlines()[-40:])])
    hints = [hint for pattern, hint in HINTS if re.search(pattern, haystack)]
    if timed_out or phase == "join":  # the ranks may not reach each other: the backend's socket hints
        network = [hint for _, hint in HINTS[-3:] if hint.startswith(("NCCL" if backend == "nccl" else "gloo",
                                                                      "the ranks"))]
        hints += [hint for hint in network if hint not in hints]
    return Failure(rank, phase, cause, last, hints[:3])
