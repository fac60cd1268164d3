"""Saves killed at each file boundary, rebuilt from a complete checkpoint: the run's folder as a
process killed (SIGKILL, out of memory, a preempted node) while writing its next checkpoint
leaves it, one folder per boundary of the save order. Nothing is copied that a link can share:
the files are hard links where the filesystem allows, and the folders are removed once judged.

A save killed before its first file, after its k-th, or before its last leaves a checkpoint
folder with the files written so far and nothing else to tell it from a complete one
(transformers writes no completion marker: #35525)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from ..files import ensure_private_dir


@dataclass(frozen=True)
class KilledSave:
    """The run's folder as a save killed while writing ``missing`` left it."""

    folder: Path  # the run's folder (the trainer's output_dir; the checkpoint itself where the run's folder is one)
    partial: Path  # the checkpoint the killed save was writing
    written: tuple  # the files a resume needs that were complete when it died, in save order
    missing: str  # the file it was writing: absent, as are all after it


@contextlib.contextmanager
def killed_saves(run_folder: Path, checkpoint: Path, files: Sequence[str], step: int,
                 into: Path) -> Iterator[list[KilledSave]]:
    """One ``KilledSave`` per boundary of ``files`` (the resume files of the complete ``checkpoint``
    in save order): the save of the checkpoint at ``step`` killed before each. Where the checkpoint
    is a folder of the run (``checkpoint-N``) the complete one stays beside the partial one, as a
    team's output_dir holds it; where it is the run's folder itself, the partial one is all there
    is. Files a resume does not need (README.md, the tokenizer's) are in every partial folder.
    The folders are removed on leaving the context."""
    run_folder, checkpoint, into = Path(run_folder), Path(checkpoint), Path(into)
    inside = checkpoint.parent == run_folder
    partial_name = re.sub(r"\d+$", str(step), checkpoint.name) if inside else checkpoint.name
    needed = set(files)
    try:
        killed = []
        for k, missing in enumerate(files):
            folder = ensure_private_dir(into / f"killed-before-{k}")
            if inside:
                for entry in run_folder.iterdir():
                    if entry.is_file():
                        _link(entry, folder / entry.name)
                _link_tree(checkpoint, folder / checkpoint.name, lambda name: True)
            partial = folder / partial_name  # named as the checkpoint it would have been
            kept = set(files[:k])
            _link_tree(checkpoint, partial, lambda name: name not in needed or name in kept)
            killed.append(KilledSave(folder if inside else partial, partial, tuple(files[:k]), missing))
        yield killed
    finally:
        shutil.rmtree(into, ignore_errors=True)


def _link_tree(source: Path, target: Path, keep) -> None:
    """``source``'s files whose path relative to it ``keep`` accepts, linked under ``target``."""
    ensure_private_dir(target)
    for path in sorted(source.rglob("*")):
        name = path.relative_to(source).as_posix()
        if path.is_file() and keep(name):
            ensure_private_dir((target / name).parent)
            _link(path, target / name)


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or links not allowed: a private copy
        shutil.copy2(source, target)
        os.chmod(target, 0o600)
