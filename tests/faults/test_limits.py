"""Faults: a step that hangs, a resume worker that never returns, Ctrl-C in the middle of a
run. Each check has its own time limit ([checks] time_limit_s / time_limits, enforced by
pytest-timeout); the worker is killed; the session goes on; nothing is left half-written."""

from __future__ import annotations

import pytest

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

HANG_STEP = """
import time
from pytest_ftready.engine import step

def hung_step(*args, **kwargs):
    time.sleep(3600)

step.train_step = hung_step
"""
HANG_WORKER = """
import sys
from pytest_ftready.trainers import worker

def hung_worker(*args):
    return [sys.executable, "-c", "import os, time; open({pidfile!r}, 'w').write(str(os.getpid())); time.sleep(3600)"]

worker.command = hung_worker
"""


def _limits(recipe, **limits) -> None:
    table = ", ".join(f'"{check}" = {seconds}' for check, seconds in limits.items())
    recipe.write_text(recipe.read_text().replace("[checks]\n", f"[checks]\ntime_limits = {{ {table} }}\n"))


def _cases(path) -> dict[str, tuple[str, str]]:
    out = {}
    for case in ET.parse(path).iter("testcase"):
        for tag in ("failure", "skipped", "error"):
            node = case.find(tag)
            if node is not None:
                out[case.get("name")] = (tag, node.get("message"))
                break
        else:
            out[case.get("name")] = ("passed", "")
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _leftovers(arts) -> list[str]:
    return [str(p) for p in arts.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".run-")]


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_a_hung_step_fails_after_its_limit_and_the_session_goes_on(pytester, tiny_example):
    (tiny_example / "conftest.py").write_text(HANG_STEP)
    _limits(tiny_example / "recipe.toml", **{"model.step_memory": 10})
    arts = pytester.path / "arts"
    # data.masking first: torch and the tokenizer are imported before the limited check starts
    pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "-k",
                                  "data.masking or step_memory or repro.config",
                                  "--junitxml=out.xml", f"--ftready-artifacts={arts}")
    cases = _cases(pytester.path / "out.xml")
    assert cases["model.step_memory"] == ("failure", (
        "Failed: model.step_memory did not finish within its time limit of 10 s ([checks] time_limit_s, or time_limits = "
        '{ "model.step_memory" = SECONDS }); it was stopped and its worker processes killed'))
    assert cases["repro.config"] == cases["data.masking"] == ("passed", "")
    assert _leftovers(arts) == []


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_a_resume_worker_that_never_returns_is_killed_at_the_limit(pytester, tiny_example):
    pidfile = pytester.path / "worker.pid"
    (tiny_example / "conftest.py").write_text(HANG_WORKER.format(pidfile=str(pidfile)))
    _limits(tiny_example / "recipe.toml", **{"lifecycle.resume": 20})
    arts = pytester.path / "arts"
    pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "-k",
                                  "data.masking or lifecycle.resume or repro.config",
                                  "--junitxml=out.xml", f"--ftready-artifacts={arts}")
    cases = _cases(pytester.path / "out.xml")
    assert cases["lifecycle.resume"][0] == "failure"
    assert cases["lifecycle.resume"][1].startswith("Failed: lifecycle.resume did not finish within its time limit of 20 s")
    assert cases["repro.config"] == ("passed", "")
    assert not _alive(int(pidfile.read_text()))  # the worker really started, and is gone
    assert _leftovers(arts) == []


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_ctrl_c_kills_the_worker_leaves_no_partial_artifact_and_says_what_ran(pytester, tiny_example):
    pidfile = pytester.path / "worker.pid"
    (tiny_example / "conftest.py").write_text(HANG_WORKER.format(pidfile=str(pidfile)))
    arts = pytester.path / "arts"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                             f"--ftready={tiny_example / 'recipe.toml'}", f"--ftready-artifacts={arts}",
                             "-k", "data.format or lifecycle.resume or repro.config"],
                            cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while not (pidfile.is_file() and pidfile.read_text()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    worker = int(pidfile.read_text())
    assert _alive(worker)
    os.kill(proc.pid, signal.SIGINT)  # Ctrl-C reaches pytest (the worker is left to us to end)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2, output[-3000:]  # pytest's "interrupted"
    assert "KeyboardInterrupt" in output and "1 passed" in output  # data.format ran and passed
    assert not _alive(worker)
    assert _leftovers(arts) == []
    # an interrupted run is a partial one: its report is written whole, beside no full one
    assert (arts / "tiny" / "report-partial.html").read_text().rstrip().endswith("</html>")
