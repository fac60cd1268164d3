"""What the tests share: reading a JUnit file into outcomes, and expecting a check to fail."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail


def outcomes(junit_path) -> dict[str, tuple[str, str]]:
    """check name -> (passed | failed | skipped, the failure or skip message)."""
    out = {}
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        kids = {child.tag: child for child in case}
        state = "failed" if "failure" in kids else "skipped" if "skipped" in kids else "passed"
        detail = kids.get("failure") if "failure" in kids else kids.get("skipped")
        out[case.get("name")] = (state, (detail.get("message", "") + (detail.text or "")) if detail is not None else "")
    return out


def properties(junit_path, name: str) -> dict[str, str]:
    """The JUnit properties of test case ``name``."""
    case = next(c for c in ET.parse(junit_path).getroot().iter("testcase") if c.get("name") == name)
    return {p.get("name"): p.get("value") for p in case.iter("property")}


def fails(runner, subject, check_id: str, *expected: str, **options) -> str:
    """``runner(subject, check_id, **options)`` raises Fail whose message holds every ``expected`` text."""
    with pytest.raises(Fail) as info:
        runner(subject, check_id, **options)
    for text in expected:
        assert text in str(info.value), str(info.value)
    return str(info.value)


def private_model(example):
    """The example's model folder (a link to the session's shared build) as a private copy, to edit."""
    import shutil

    model = example / "model"
    built = model.resolve()
    model.unlink()
    shutil.copytree(built, model)
    return model


def job_result(mode: str, phases: dict, failure=None, ranks=(0, 1)):
    """A torchrun job as its ranks report it (``phases``: {phase: figures}, the same on every rank),
    for judging the distributed checks' verdicts without launching one."""
    from pytest_ftready.engine.distributed.launcher import JobResult, RankOutcome

    finished = "finished" if failure is None else failure.phase
    outcomes_ = {r: RankOutcome(r, {"phase": finished, "phases": phases}) for r in ranks}
    return JobResult(mode, ["torchrun"], len(ranks), 0 if failure is None else 1, False, 1.0, outcomes_, failure, 0,
                     Path("."))


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def bundled_examples(folder: Path, model_dir: Path) -> Path:
    """examples/ copied into ``folder`` as a user's checkout holds it after the README's first line
    (``python -m pytest_ftready.tiny examples/tiny``): every config and data file, the tiny model
    at examples/tiny/model (a link to the session's build). Returns ``folder``."""
    import shutil

    shutil.copytree(EXAMPLES, folder, ignore=shutil.ignore_patterns("model", "runs", ".ftready", "backups"))
    (folder / "tiny" / "model").symlink_to(model_dir)
    return folder


def run_as_written(folder: Path, command: str, env: dict | None = None):
    """A README command (``pytest --ftready=trl-sft.yaml``) run from ``folder`` with this interpreter,
    its JUnit XML written beside: (the finished process, each check's outcome by name)."""
    import os
    import shlex
    import subprocess
    import sys

    words = shlex.split(command)
    assert words[0] == "pytest", command
    clean = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "FTREADY_BASELINE")}
    done = subprocess.run([sys.executable, "-m", *words, "--junitxml=out.xml", "-p", "no:cacheprovider"], cwd=folder,
                          env={**clean, **(env or {})}, capture_output=True, text=True)
    return done, outcomes(folder / "out.xml") if (folder / "out.xml").exists() else {}


def assert_green(done, found: dict) -> None:
    """Exit 0, and every check passed or skipped (a skip names what it needs)."""
    failed = {name: message[:300] for name, (state, message) in found.items() if state == "failed"}
    assert done.returncode == 0 and found and not failed, (failed, done.stdout[-3000:], done.stderr[-2000:])
