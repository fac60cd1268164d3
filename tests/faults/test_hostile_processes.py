"""Hostile machines and dying processes, one test each: any allocator's out-of-memory error
(one place decides, every check uses it), OS errors while writing with advice that fits them,
scratch folders of runs killed before they cleaned up (removed by the next run, only theirs),
and the owner-only files of a run's scratch folder."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_ftready.files import (OS_ERROR_ADVICE, make_private, os_error_advice, remove_dead_scratch, scratch_dir,
                                  scratch_prefix)
from pytest_ftready.outcomes import Fail, out_of_memory

MiB = 1 << 20


def _cpu_allocator_error() -> RuntimeError:
    import torch

    with pytest.raises(RuntimeError) as info:  # more than any machine has: the real CPU allocator refuses
        torch.empty(1 << 50, dtype=torch.uint8)
    return info.value


def _cuda_error():
    import torch

    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 4.00 GiB total capacity)")


# (id, the exception, whether it means out of memory, the words of its first line)
OOM_CASES = [
    ("cpu-allocator", _cpu_allocator_error, True, "DefaultCPUAllocator: can't allocate memory"),
    ("cuda", _cuda_error, True, "CUDA out of memory. Tried to allocate 20.00 MiB"),
    ("mps", lambda: RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.2 GB, "
                                 "max allowed: 18.13 GB). Tried to allocate 256 MB on private pool."),
     True, "MPS backend out of memory"),
    ("hip", lambda: RuntimeError("HIP out of memory. Tried to allocate 2.00 GiB"), True, "HIP out of memory"),
    ("cpu-allocator-windows", lambda: RuntimeError("[enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: "
                                                   "not enough memory: you tried to allocate 1024 bytes."),
     True, "not enough memory"),
    ("python-memory-error", lambda: MemoryError(), True, "MemoryError"),
    ("shape-mismatch-is-not", lambda: RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x64 and 32x64)"),
     False, ""),
    ("value-error-saying-memory-is-not", lambda: ValueError("out of memory"), False, ""),
]


@pytest.mark.parametrize("case, make, is_oom, words", OOM_CASES, ids=[c[0] for c in OOM_CASES])
def test_out_of_memory_is_recognised_from_every_allocator(case, make, is_oom, words):
    reason = out_of_memory(make())
    assert bool(reason) is is_oom and words in reason and "\n" not in reason


def test_cpu_allocator_out_of_memory_in_the_step_is_a_clear_failure(make_state, fails, monkeypatch):
    from pytest_ftready.engine import step

    def step_asking_for_a_petabyte(*args, **kwargs):  # the real allocator's error, as a huge micro-batch gets
        import torch

        torch.empty(1 << 50, dtype=torch.uint8)

    state = make_state()
    monkeypatch.setattr(step, "train_step", step_asking_for_a_petabyte)
    message = fails(state, "model.step_memory")
    assert message.startswith("out of memory on ") and "micro_batch_size 4 x max_length 128" in message
    assert "DefaultCPUAllocator: can't allocate memory" in message and "Levers for this recipe" in message
    assert state.step.out_of_memory


def test_out_of_memory_while_loading_the_model_says_so(make_state, fails, monkeypatch):
    from pytest_ftready.engine import loading

    def load_a_petabyte(recipe, device):
        import torch

        torch.empty(1 << 50, dtype=torch.uint8)

    monkeypatch.setattr(loading, "load_model", load_a_petabyte)
    message = fails(make_state(), "model.step_memory")
    assert message.startswith("out of memory loading the model from ") and "can't allocate memory" in message
    assert "quantization" in message and "\n" not in message


def test_an_error_that_is_not_out_of_memory_is_not_called_so(make_state, run_check, monkeypatch):
    from pytest_ftready.engine import step

    def broken_step(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x64 and 32x64)")

    state = make_state()
    monkeypatch.setattr(step, "train_step", broken_step)
    with pytest.raises(Exception) as info:  # not swallowed as out of memory: the fact remembers the real error
        run_check(state, "model.step_memory")
    assert "shapes cannot be multiplied" in str(info.value)


HUGE_BATCH = textwrap.dedent("""
    import resource, sys
    from pathlib import Path

    from pytest_ftready.checks.registry import REGISTRY, all_checks
    from pytest_ftready.machine.probes import read_machine
    from pytest_ftready.outcomes import Fail
    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.session.context import CheckContext
    from pytest_ftready.session.state import RunState

    all_checks()
    state = RunState(artifacts_root=Path(sys.argv[2]), machine_factory=read_machine).recipe_state(load_recipe(sys.argv[1]))
    state.model, state.digest  # loaded before the cap
    with open("/proc/self/statm") as handle:
        mapped = int(handle.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), resource.RLIM_INFINITY))  # 1 GiB more than now
    try:
        REGISTRY["model.step_memory"].body(CheckContext(state, REGISTRY["model.step_memory"]))
        print("PASSED")
    except Fail as exc:
        print("FAILED", str(exc).splitlines()[0])
""")


@pytest.mark.faults_slow
def test_micro_batch_100000_under_a_memory_cap_fails_as_out_of_memory(tiny_example, edit_recipe, tmp_path):
    recipe = edit_recipe(tiny_example / "recipe.toml", micro_batch_size="100000")
    proc = subprocess.run([sys.executable, "-c", HUGE_BATCH, str(recipe), str(tmp_path / "arts")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    out = proc.stdout.strip().splitlines()[-1]
    assert out.startswith("FAILED out of memory on ") and "micro_batch_size 100000 x max_length 128" in out, out
    assert "can't allocate memory" in out or "MemoryError" in out, out


# ---- OS errors while writing -----------------------------------------------------------
def _write_through_gate(path):
    from pytest_ftready.outputs.gate import Gate

    with pytest.raises(Fail) as info:
        Gate().write(path, "<p>report</p>")
    return str(info.value)


def test_a_name_too_long_for_the_file_system_says_to_shorten_it(tmp_path):
    path = tmp_path / ("n" * 300) / "report.html"
    message = _write_through_gate(path)
    assert message.endswith("File name too long; the name is longer than the file system allows: shorten the "
                            "recipe's name or the --ftready-artifacts path")
    assert "make room" not in message


def test_a_folder_where_the_file_goes_says_so(tmp_path):
    (tmp_path / "report.html").mkdir()
    message = _write_through_gate(tmp_path / "report.html")
    assert "Is a directory; a folder stands where the file goes" in message


def test_a_file_where_a_folder_is_needed_says_so(tmp_path):
    (tmp_path / "tiny").write_text("not a folder")
    message = _write_through_gate(tmp_path / "tiny" / "report.html")
    assert "a file stands where a folder is needed" in message and "make room" not in message


@pytest.mark.parametrize("code, words", [
    (errno.ENOSPC, "make room on that disk"), (errno.EDQUOT, "quota"), (errno.EROFS, "read-only"),
    (errno.EACCES, "may not write there"), (errno.EPERM, "refuses writes"), (errno.ENAMETOOLONG, "shorten"),
    (errno.EIO, "check that folder"),
], ids=lambda v: errno.errorcode.get(v, "") if isinstance(v, int) else "")
def test_os_error_advice_fits_the_error(code, words):
    advice = os_error_advice(OSError(code, os.strerror(code)))
    assert words in advice
    others = [text for other, text in OS_ERROR_ADVICE.items() if other != code]
    assert advice not in others or code in (errno.ENOTDIR, errno.EEXIST)  # each error its own advice


# ---- scratch folders of runs that died --------------------------------------------------
SCRATCH_AND_SLEEP = ("import sys, time; from pathlib import Path; from pytest_ftready.files import scratch_dir; "
                     "print(scratch_dir(Path(sys.argv[1])), flush=True); time.sleep(600)")


def _run_with_scratch(parent):
    proc = subprocess.Popen([sys.executable, "-c", SCRATCH_AND_SLEEP, str(parent)], stdout=subprocess.PIPE, text=True)
    folder = proc.stdout.readline().strip()
    proc.stdout.close()
    assert folder, "the run made no scratch folder"
    (parent / folder / "adapter_model.safetensors").write_bytes(b"weights")
    return proc, parent / folder


def test_a_run_killed_with_sigkill_has_its_scratch_removed_by_the_next_run(tmp_path):
    proc, folder = _run_with_scratch(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    mine = scratch_dir(tmp_path)
    assert not folder.exists() and mine.is_dir()
    assert mine.name.startswith(scratch_prefix()) and stat.S_IMODE(mine.stat().st_mode) == 0o700


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[-1].split()[0]


def test_a_killed_run_not_yet_reaped_counts_as_gone(tmp_path):
    proc, folder = _run_with_scratch(tmp_path)
    proc.send_signal(signal.SIGKILL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _state(proc.pid) != "Z":
            time.sleep(0.05)  # a zombie: dead, its parent (this test) has not waited for it
        assert remove_dead_scratch(tmp_path) == [folder]
    finally:
        proc.wait()


def test_a_live_runs_scratch_and_folders_not_named_by_a_run_are_kept(tmp_path):
    proc, live = _run_with_scratch(tmp_path)
    try:
        dead = _dead_pid()
        (tmp_path / ".run-abc123").mkdir()  # no process in its name: not ours to judge
        (tmp_path / f".run-other-machine-{dead}-x1").mkdir()  # that pid is gone here, not there
        (tmp_path / f"{scratch_prefix(dead)}file").write_text("a file, not a scratch folder")
        (tmp_path / f"{scratch_prefix(dead)[1:]}x").mkdir()
        assert remove_dead_scratch(tmp_path) == []
        assert live.is_dir() and (live / "adapter_model.safetensors").is_file()
    finally:
        proc.kill()
        proc.wait()


def test_files_others_wrote_into_scratch_become_owner_only(tmp_path):
    folder = scratch_dir(tmp_path)
    (folder / "weights").mkdir(mode=0o755)
    (folder / "weights" / "adapter_model.safetensors").write_bytes(b"w")
    (folder / "state.pt").write_bytes(b"s")
    os.chmod(folder / "state.pt", 0o644)
    make_private(folder)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*")}
    assert modes == {"weights": 0o700, "adapter_model.safetensors": 0o600, "state.pt": 0o600}


@pytest.mark.faults_slow
def test_resume_after_a_killed_run_removes_its_scratch_and_writes_owner_only(make_state, run_check, monkeypatch):
    from pytest_ftready.trainers import worker

    state = make_state()
    proc, stale = _run_with_scratch(state.artifacts)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    seen = {}
    real_resume = worker.run

    def look_at_the_checkpoint(trainer, request, *args):
        folder = Path(request.folder)
        seen.update({str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*")})
        return real_resume(trainer, request, *args)

    monkeypatch.setattr(worker, "run", look_at_the_checkpoint)
    run_check(state, "lifecycle.resume")
    assert not stale.exists()  # the killed run's checkpoint and weights are gone
    assert seen and all(mode in (0o600, 0o700) for mode in seen.values()), seen
