"""Where a step's peak goes: the storages alive at the peak of the recipe's trainer's step and of
the engine's, summed by the source lines that created them (the innermost frames outside torch).
For a gap between a trainer's step and the engine's (model.step_memory's ``peak_vs_engine``):

    python -m tests.benchmarks.peak_sources CONFIG [--top N]

It runs the same measurement the checks run (``engine.memory``'s live tensor bytes, so a CPU
step), in this process, with this interpreter's trainer. Run from the repository root with
``PYTHONPATH=$PWD`` and the offline variables of the README."""

from __future__ import annotations

import argparse
import traceback
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence

SKIPPED = ("/torch/", "/engine/memory.py", "/peak_sources.py")  # frames that say nothing about who asked
DEPTH = 3  # frames per source: the line, its caller, theirs


def source_line() -> str:
    frames = [f for f in traceback.extract_stack() if not any(part in f.filename for part in SKIPPED)]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames[-DEPTH:]))


@contextmanager
def attributed() -> Iterator[list]:
    """Every ``TensorBytes`` made in the block remembers the source line of each storage it counts."""
    from pytest_ftready.engine.memory import TensorBytes

    made: list = []
    init, track = TensorBytes.__init__, TensorBytes.track

    def counting_init(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self.sources = []
        made.append(self)

    def counting_track(self, storage, key: int) -> None:
        track(self, storage, key)
        self.sources.append(source_line())

    TensorBytes.__init__, TensorBytes.track = counting_init, counting_track
    try:
        yield made
    finally:
        TensorBytes.__init__, TensorBytes.track = init, track


def at_peak(tracker, top: int) -> list[tuple[int, str]]:
    """(bytes, source) of the storages alive at the tracker's peak, largest first."""
    by_source: Counter = Counter()
    for serial in tracker.live_at(tracker.peak_event):
        by_source[tracker.sources[serial]] += tracker.nbytes[serial]
    return [(nbytes, where) for where, nbytes in by_source.most_common(top)]


def measured(state, fact: str, top: int) -> tuple[object, Optional[list[tuple[int, str]]]]:
    """The step fact (``step`` or ``engine_step``) and its sources at the peak (None where no
    tensor count ran: an accelerator's allocator, or the fact was computed before)."""
    with attributed() as trackers:
        step = getattr(state, fact)
    counted = [t for t in trackers if t.peak]
    return step, (at_peak(max(counted, key=lambda t: t.peak), top) if counted else None)


def report(state, top: int = 12) -> str:
    facts = ["step", "engine_step"] if state.trainer.name != "builtin" else ["engine_step"]
    lines = []
    for fact in facts:
        step, sources = measured(state, fact, top)
        who = state.trainer.step_trainer if fact == "step" else "pytest-ftready engine"
        b = step.breakdown
        created = step.peak_bytes - b.weights_bytes
        lines.append(f"{who}: peak {step.peak_bytes / 1e6:.2f} MB ({step.tokens_per_step} tokens): weights "
                     f"{b.weights_bytes / 1e6:.2f} MB, created in the step {created / 1e6:.2f} MB")
        for nbytes, where in sources or ():
            lines.append(f"  {nbytes / 1e6:10.2f} MB  {where}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.peak_sources",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--artifacts", type=Path, default=Path(".ftready") / "peak-sources")
    args = parser.parse_args(argv)
    import torch

    from pytest_ftready.checks.registry import all_checks
    from pytest_ftready.machine.probes import read_machine
    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.session.state import RunState

    torch.set_num_threads(1)
    all_checks()
    state = RunState(artifacts_root=args.artifacts, machine_factory=read_machine).recipe_state(load_recipe(args.config))
    print(report(state, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
