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
