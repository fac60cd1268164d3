"""Fault: no network (HF_HUB_OFFLINE=1). A socket guard refuses every internet connection and
name lookup; every check of the local tiny recipe runs in-process and none tries one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from pytest_ftready.outcomes import Fail, Skip


# The same guard for worker processes (the fresh-process resume): a sitecustomize on their path.
SITECUSTOMIZE = """
import os, socket

def _refuse(what):
    with open(os.environ["FTREADY_SOCKET_LOG"], "a") as log:
        log.write(what + "\\n")
    raise OSError("socket guard: " + what)

_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex
socket.socket.connect = lambda s, a: _refuse(f"connect {a}") if s.family in (socket.AF_INET, socket.AF_INET6) else _connect(s, a)
socket.socket.connect_ex = lambda s, a: _refuse(f"connect_ex {a}") if s.family in (socket.AF_INET, socket.AF_INET6) else _connect_ex(s, a)
socket.getaddrinfo = lambda host, *a, **k: _refuse(f"getaddrinfo {host}")
socket.create_connection = lambda address, *a, **k: _refuse(f"create_connection {address}")
"""


@pytest.fixture
def socket_guard(monkeypatch, tmp_path):
    attempts: list[str] = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "worker-sockets.log"
    log.write_text("")
    monkeypatch.setenv("FTREADY_SOCKET_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", f"{guard}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")

    probe = "import socket\ntry:\n    socket.create_connection(('192.0.2.1', 443), timeout=1)\nexcept OSError: pass"
    subprocess.run([sys.executable, "-c", probe], check=True)
    assert log.read_text() == "create_connection ('192.0.2.1', 443)\n"  # the guard is active in subprocesses
    log.write_text("")

    def refuse(what):
        attempts.append(what)
        raise OSError(f"socket guard: {what} while offline")

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            refuse(f"connect {address}")
        return real_connect(sock, address)

    def connect_ex(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            refuse(f"connect_ex {address}")
        return real_connect_ex(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: refuse(f"getaddrinfo {host}"))
    monkeypatch.setattr(socket, "create_connection", lambda address, *a, **k: refuse(f"create_connection {address}"))
    yield attempts
    attempts.extend(log.read_text().splitlines())


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_every_check_runs_offline_without_opening_a_socket(make_state, socket_guard, monkeypatch):
    from pytest_ftready.checks.registry import all_checks
    from pytest_ftready.collect import _expand
    from pytest_ftready.session.context import CheckContext

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    state = make_state()
    outcomes: dict[str, str] = {}
    for spec, param_id, param in sorted(_expand(all_checks(), state.recipe), key=lambda s: s[0].stage):
        name = spec.id + (f"[{param_id}]" if param_id else "")
        if spec.nightly or (spec.accelerator and not state.device.is_accelerator):
            continue  # deselected / skipped before their body runs, as the plugin does
        reason = (spec.applies(state.recipe) if spec.applies else None) or state.failed_prerequisite(spec.requires)
        if reason:
            outcomes[name] = "skipped"
            continue
        try:
            spec.body(CheckContext(state, spec, param=param))
            outcomes[name] = "passed"
        except Fail:
            outcomes[name] = "failed"
        except Skip:
            outcomes[name] = "skipped"
        state.outcomes[spec.id] = outcomes[name]
    assert socket_guard == []
    assert (state.run.artifacts_root.parent / "worker-sockets.log").read_text() == ""  # the resume worker too
    ran = {name for name, outcome in outcomes.items() if outcome != "skipped"}
    assert {"checkpoint.files", "data.masking", "model.step_memory", "model.overfit", "lifecycle.resume",
            "lifecycle.generate", "privacy.license", "repro.environment"} <= ran
    assert "failed" not in outcomes.values(), outcomes
