"""The fresh process of a resume, for every trainer (the built-in engine's included):
``python -m pytest_ftready.trainers.worker TRAINER REQUEST THREADS`` (REQUEST: a
``base.ResumeRequest`` as JSON) prints one JSON line: ``{"logs": [[step, loss, learning_rate,
tokens], ...]}`` for the steps trained after the resume, ``{"missing": what}`` when the
checkpoint lacks a piece the resume needs, ``{"skip": why}`` when the run cannot be made here.
REQUEST may be a list (``lifecycle.interrupted_save``): each resumed in turn in the same process,
``{"each": [one object per request]}``, an error that resume's ``{"error": what}``."""

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
                            asdict(inputs.device), tuple(trainer.hook_files))
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
    picks the partial one, whether its own resume refuses it: its check before a resume, then its
    resume, every one in the same fresh process (one start, however many files)."""
    from dataclasses import replace

    from ..engine.interrupted import killed_saves
    from ..outcomes import Fail, Skip

    files = trainer.resume_files(saved.checkpoint)
    inputs.progress(f"lifecycle.interrupted_save: a save of {trainer.label} killed before each of its "
                    f"{len(files)} files, then its resume", True)
    with killed_saves(saved.folder, saved.checkpoint, files, saved.steps,
                      inputs.scratch / "interrupted-saves") as killed:
        picks = [Path(trainer.resume_pick(k.folder, k.partial)) for k in killed]
        refusals, requests = {}, {}
        for i, (k, picked) in enumerate(zip(killed, picks)):
            if picked.resolve() != k.partial.resolve():
                continue  # it resumes from the complete checkpoint
            try:
                trainer.check_saved(replace(saved, folder=k.folder, checkpoint=picked))
            except Fail as exc:
                refusals[i] = str(exc)
            else:
                requests[i] = ResumeRequest(str(inputs.recipe.source), str(k.folder), str(picked), saved.steps,
                                            asdict(inputs.device), tuple(trainer.hook_files))
        payloads = run(trainer.name, list(requests.values()), timeout_s)["each"] if requests else []
        for i, payload in zip(requests, payloads):
            if "skip" in payload:
                raise Skip(payload["skip"])
            refusals[i] = (f"the checkpoint lacks {payload['missing']}" if "missing" in payload
                           else f"its resume stopped: {payload['error']}" if "error" in payload else "")
        return [InterruptedResume(k.missing, len(k.written), len(files), k.partial.name, picked.name,
                                  refusals.get(i, "")) for i, (k, picked) in enumerate(zip(killed, picks))]


def command(trainer: str, request) -> list[str]:
    """The argv that runs this module in a fresh interpreter, with this process's thread count."""
    import torch

    told = [asdict(r) for r in request] if isinstance(request, list) else asdict(request)
    return [sys.executable, "-m", "pytest_ftready.trainers.worker", trainer, json.dumps(told),
            str(torch.get_num_threads())]


def run(trainer: str, request, timeout_s: Optional[float] = None) -> dict:
    """The JSON object the fresh process printed last (``request``: one ResumeRequest, or a list
    of them, each resumed in turn: ``{"each": [one object per request]}``). A worker that fails,
    or outlives ``timeout_s``, is a Fail naming its last error line."""
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

    from ..recipe import load_recipe
    from . import trainer_named
    from .base import rehearsal_recipe
    from .conftest import CONFTEST, fresh_process_trainer

    name, request_json, threads = argv
    torch.set_num_threads(int(threads))
    told = json.loads(request_json)
    requests = [ResumeRequest(**r) for r in (told if isinstance(told, list) else [told])]
    # the team's own Trainer (conftest) is rebuilt from the files that implement its hook
    trainer = fresh_process_trainer(requests[0]) if name == CONFTEST and requests else trainer_named(name)
    if isinstance(told, list):  # every resume of lifecycle.interrupted_save; an error is that resume's answer
        print(json.dumps({"each": [_resumed(trainer, r, rehearsal_recipe(load_recipe(r.recipe)), errors=True)
                                   for r in requests]}))
    else:
        print(json.dumps(_resumed(trainer, requests[0], rehearsal_recipe(load_recipe(requests[0].recipe)))))
    return 0


def _resumed(trainer: Trainer, request: ResumeRequest, recipe, errors: bool = False) -> dict:
    from ..engine.checkpoint import MissingState
    from ..outcomes import Skip

    try:
        logs = trainer.resume_here(request, recipe)
    except MissingState as exc:
        return {"missing": str(exc)}
    except Skip as exc:
        return {"skip": str(exc)}
    except Exception as exc:  # noqa: BLE001 - told back as this resume's answer when asked for
        if not errors:
            raise
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    return {"logs": [log.to_list() for log in logs]}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
