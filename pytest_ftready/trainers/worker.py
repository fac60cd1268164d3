"""The fresh process of a resume, for every trainer (the built-in engine's included):
``python -m pytest_ftready.trainers.worker TRAINER REQUEST THREADS`` (REQUEST: a
``base.ResumeRequest`` as JSON) prints one JSON line: ``{"logs": [[step, loss, learning_rate,
tokens], ...]}`` for the steps trained after the resume, ``{"missing": what}`` when the
checkpoint lacks a piece the resume needs, ``{"skip": why}`` when the run cannot be made here."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
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
                            asdict(inputs.device))
    payload = run(trainer.name, request, timeout_s)
    if "missing" in payload:
        raise Fail(f"the checkpoint lacks {payload['missing']}: a resume cannot continue the run")
    if "skip" in payload:
        raise Skip(payload["skip"])
    resumed = [StepLog(*log) for log in payload["logs"]]
    return ResumeRun(saved.straight_losses, [log.loss for log in resumed], saved.steps, saved.checkpoint_bytes,
                     trainer.difference(saved, resumed), trainer.step_trainer)


@dataclass(frozen=True)
class InterruptedResume:
    """What the trainer's resume did with the run's folder as a save killed before ``missing`` left it."""

    missing: str  # the file the killed save was writing (it and all after it absent)
    written: int  # the resume files complete when it died
    files: int  # the resume files of a complete checkpoint
    partial: str  # the name of the checkpoint the killed save left
    picked: str  # the name of the checkpoint the trainer's resume starts from
    refusal: str  # the trainer's message refusing the partial checkpoint; "" where it resumed from it

    @property
    def taken_as_complete(self) -> bool:
        return self.picked == self.partial and not self.refusal


def interrupted_saves(trainer: Trainer, inputs: RunInputs, saved: SavedRun,
                      timeout_s: Optional[float] = None) -> list[InterruptedResume]:
    """The save of the checkpoint after ``saved``'s killed before each file a resume needs
    (``engine.interrupted``); each time, which checkpoint the trainer's resume picks and, where it
    picks the partial one, whether its own resume refuses it: its check before a resume, then
    its resume in a fresh process. It stops at the first partial checkpoint taken as complete."""
    from dataclasses import replace

    from ..engine.interrupted import killed_saves
    from ..outcomes import Fail, Skip

    files = trainer.resume_files(saved.checkpoint)
    inputs.progress(f"lifecycle.interrupted_save: a save of {trainer.label} killed before each of its "
                    f"{len(files)} files, then its resume", True)
    out: list[InterruptedResume] = []
    for killed in killed_saves(saved.folder, saved.checkpoint, files, saved.steps, inputs.scratch / "interrupted-saves"):
        picked = Path(trainer.resume_pick(killed.folder, killed.partial))
        refusal = ""
        if picked.resolve() == killed.partial.resolve():
            try:
                trainer.check_saved(replace(saved, folder=killed.folder, checkpoint=picked))
                request = ResumeRequest(str(inputs.recipe.source), str(killed.folder), str(picked), saved.steps,
                                        asdict(inputs.device))
                payload = run(trainer.name, request, timeout_s)
            except Fail as exc:  # its check, or its resume stopping with an error
                refusal = str(exc)
            else:
                if "skip" in payload:
                    raise Skip(payload["skip"])
                refusal = f"the checkpoint lacks {payload['missing']}" if "missing" in payload else ""
        out.append(InterruptedResume(killed.missing, len(killed.written), len(files), killed.partial.name,
                                     picked.name, refusal))
        if out[-1].taken_as_complete:  # the verdict is known: no more fresh processes
            break
    return out


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

    name, request_json, threads = argv
    torch.set_num_threads(int(threads))
    request = ResumeRequest(**json.loads(request_json))
    try:
        logs = trainer_named(name).resume_here(request, load_recipe(request.recipe))
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
