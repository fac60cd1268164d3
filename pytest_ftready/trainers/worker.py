"""The fresh process of a resume, for every trainer (the built-in engine's included):
``python -m pytest_ftready.trainers.worker TRAINER REQUEST THREADS`` (REQUEST: a
``base.ResumeRequest`` as JSON) prints one JSON line: ``{"logs": [[step, loss, learning_rate,
tokens], ...]}`` for the steps trained after the resume, ``{"missing": what}`` when the
checkpoint lacks a piece the resume needs, ``{"skip": why}`` when the run cannot be made here."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Optional

from .base import ResumeRequest, ResumeRun, RunInputs, SavedRun, StepLog, Trainer


def resume(trainer: Trainer, inputs: RunInputs, saved: SavedRun, timeout_s: Optional[float] = None) -> ResumeRun:
    """``saved``'s checkpoint resumed by ``trainer`` in a fresh process (nothing shared with this
    one), beside the uninterrupted run's losses; the difference as the trainer tells it."""
    from ..outcomes import Fail, Skip

    trainer.check_saved(saved)  # before a fresh process is started for nothing
    inputs.progress(f"lifecycle.resume: resuming {trainer.label}'s checkpoint at step {saved.steps // 2} in a "
                    "fresh process", True)
    request = ResumeRequest(str(inputs.recipe.source), str(saved.folder), str(saved.checkpoint), saved.steps,
                            asdict(inputs.device), tuple(trainer.hook_files))
    payload = run(trainer.name, request, timeout_s)
    if "missing" in payload:
        raise Fail(f"the checkpoint lacks {payload['missing']}: a resume cannot continue the run")
    if "skip" in payload:
        raise Skip(payload["skip"])
    resumed = [StepLog(*log) for log in payload["logs"]]
    return ResumeRun(saved.straight_losses, [log.loss for log in resumed], saved.steps, saved.checkpoint_bytes,
                     trainer.difference(saved, resumed), trainer.step_trainer)


def command(trainer: str, request: ResumeRequest) -> list[str]:
    """The argv that runs this module in a fresh interpreter, with this process's thread count."""
    import torch

    return [sys.executable, "-m", "pytest_ftready.trainers.worker", trainer, json.dumps(asdict(request)),
            str(torch.get_num_threads())]


def run(trainer: str, request: ResumeRequest, timeout_s: Optional[float] = None) -> dict:
    """The JSON object the fresh process printed last. A worker that fails, or outlives
    ``timeout_s``, is a Fail naming its last error line."""
    import os
    import subprocess

    from ..outcomes import Fail

    # run() kills the worker on any exception while waiting: the check's time limit, Ctrl-C
    try:
        proc = subprocess.run(command(trainer, request), capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired:  # subprocess.run kills the worker before raising
        raise Fail(f"the resume worker did not finish within {timeout_s:.0f} s and was stopped") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise Fail(f"the resume in a fresh process failed (exit {proc.returncode}): "
                   f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(lines[-1])


def main(argv: list[str]) -> int:
    import torch

    from ..engine.checkpoint import MissingState
    from ..outcomes import Skip
    from ..recipe import load_recipe
    from . import trainer_named
    from .conftest import CONFTEST, fresh_process_trainer

    name, request_json, threads = argv
    torch.set_num_threads(int(threads))
    request = ResumeRequest(**json.loads(request_json))
    try:
        trainer = fresh_process_trainer(request) if name == CONFTEST else trainer_named(name)
        logs = trainer.resume_here(request, load_recipe(request.recipe))
    except MissingState as exc:
        print(json.dumps({"missing": str(exc)}))
        return 0
    except Skip as exc:
        print(json.dumps({"skip": str(exc)}))
        return 0
    print(json.dumps({"logs": [log.to_list() for log in logs]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
