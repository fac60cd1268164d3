"""Fault: the artifacts folder cannot be written (read-only, disk full). The check fails
naming the path; no truncated or temporary file is left; an earlier complete file stays."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

DISK_FULL = textwrap.dedent("""
    import resource, signal, sys
    from pathlib import Path

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails with EFBIG instead of killing us
    from pytest_ftready.checks.registry import REGISTRY, all_checks
    from pytest_ftready.machine.probes import read_machine
    from pytest_ftready.outcomes import Fail
    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.session.context import CheckContext
    from pytest_ftready.session.state import RunState

    all_checks()
    state = RunState(artifacts_root=Path(sys.argv[2]), machine_factory=read_machine).recipe_state(load_recipe(sys.argv[1]))
    state.digest, state.encoder  # read the data before the disk is 'full'
    resource.setrlimit(resource.RLIMIT_FSIZE, (512, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        REGISTRY["data.masking"].body(CheckContext(state, REGISTRY["data.masking"]))
        print("PASSED")
    except Fail as exc:
        print("FAILED", exc)
""")


@pytest.mark.faults_slow  # a whole run on a full file system: CI's second line (pytest tests -m "slow or faults_slow")
def test_disk_full_while_writing_fails_naming_the_path_and_leaves_no_partial_file(tiny_example, tmp_path):
    arts = tmp_path / "arts"
    (arts / "tiny").mkdir(parents=True)
    earlier = arts / "tiny" / "masking.html"
    earlier.write_text("<p>the complete report of an earlier run</p>")
    proc = subprocess.run([sys.executable, "-c", DISK_FULL, str(tiny_example / "recipe.toml"), str(arts)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.strip().splitlines()[-1]
    assert out == (f"FAILED cannot write {earlier}: File too large; the file is larger than this process may write "
                   "(ulimit -f) or the file system holds: raise the limit or point --ftready-artifacts at another disk")
    assert earlier.read_text() == "<p>the complete report of an earlier run</p>"  # not truncated, not replaced
    assert sorted(p.name for p in (arts / "tiny").iterdir()) == ["masking.html"]  # no temporary file left


def _read_only(folder) -> bool:
    """Make ``folder`` unwritable even for root (immutable), else by mode; False if it stays writable."""
    subprocess.run(["chattr", "+i", str(folder)], capture_output=True)
    if os.geteuid() != 0:
        folder.chmod(0o500)
    try:
        (folder / ".probe").write_text("x")
    except OSError:
        return True
    (folder / ".probe").unlink()
    return False


def test_read_only_artifacts_folder_fails_naming_the_path(make_state, fails):
    state = make_state()
    folder = state.artifacts
    folder.mkdir(parents=True)
    try:
        if not _read_only(folder):
            pytest.skip("cannot make a folder read-only here (neither chattr +i nor a non-root mode)")
        message = fails(state, "data.masking")
        assert message.startswith(f"cannot write {folder / 'masking.html'}: ")
        assert ("Permission denied" in message or "Operation not permitted" in message) and "\n" not in message
    finally:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
        folder.chmod(0o700)
    assert list(folder.iterdir()) == []
