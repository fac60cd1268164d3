"""Private files: every artifact is written atomically (temp file + rename) with owner-only
permissions, so nothing is ever half-written or readable by others. Used by every layer
that writes (data manifests, engine checkpoints, outputs)."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) with owner-only permissions on the folders we create."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
    return path


def write_private(path: Path, data: str | bytes) -> Path:
    """Write atomically (temp file + rename) with mode 0600: never half-written, never public."""
    path = Path(path)
    ensure_private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, payload: Any) -> Path:
    return write_private(path, json.dumps(json_safe(payload), indent=2, sort_keys=True) + "\n")




# errno -> what to do about it, for a folder the plugin writes into
OS_ERROR_ADVICE = {
    errno.ENOSPC: "make room on that disk or point --ftready-artifacts at a disk with space",
    errno.EDQUOT: "your disk quota is used up: free some of it or point --ftready-artifacts at another disk",
    errno.EFBIG: "the file is larger than this process may write (ulimit -f) or the file system holds: "
                 "raise the limit or point --ftready-artifacts at another disk",
    errno.EACCES: "this user may not write there: fix the folder's permissions or point --ftready-artifacts "
                  "at a folder you own",
    errno.EPERM: "the folder refuses writes (immutable, or owned by another user): point --ftready-artifacts "
                 "at a folder you own",
    errno.EROFS: "the file system is mounted read-only: point --ftready-artifacts at a writable disk",
    errno.ENAMETOOLONG: "the name is longer than the file system allows: shorten the recipe's name or the "
                        "--ftready-artifacts path",
    errno.ENOTDIR: "a file stands where a folder is needed: move it, or point --ftready-artifacts elsewhere",
    errno.EEXIST: "a file stands where a folder is needed: move it, or point --ftready-artifacts elsewhere",
    errno.EISDIR: "a folder stands where the file goes: move it, or point --ftready-artifacts elsewhere",
    errno.ELOOP: "a symbolic link on the way points back to itself: fix the link",
}


def os_error_advice(exc: OSError, option: str = "--ftready-artifacts") -> str:
    """What to do about an OSError met while writing: advice that fits its errno; ``option`` is
    what the user points elsewhere (an option like ``-o``, or a recipe key)."""
    advice = OS_ERROR_ADVICE.get(exc.errno or 0, "check that folder, or point --ftready-artifacts at a writable folder")
    return advice.replace("--ftready-artifacts", option)


# Pseudo file systems: a path into them is a process's memory, a device or a kernel table, never a
# user's file; reading one may block, never end, or fail file by file.
PSEUDO_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))


def pseudo_file_system(path: Path | str) -> bool:
    """Whether ``path`` (resolved) lies under /proc, /sys or /dev (``/dev/shm``, a tmpfs, excepted)."""
    try:
        resolved = Path(path).resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    if resolved == Path("/dev/shm") or Path("/dev/shm") in resolved.parents:
        return False
    return any(resolved == root or root in resolved.parents for root in PSEUDO_ROOTS)


class PathProblem(Exception):
    """A user's path the plugin cannot read or write; ``str()`` is one line saying what to do."""


def path_problem(exc: OSError, path: Path | str, doing: str, option: str) -> PathProblem:
    """The one line for ``exc``, met while ``doing`` (\"write\", \"read\") ``path``, named by ``option``."""
    reason = exc.strerror or str(exc)
    return PathProblem(f"cannot {doing} {path} ({option}): {reason}; {os_error_advice(exc, option)}")


def write_user_file(path: Path | str, data: str | bytes, option: str) -> Path:
    """``write_private`` for a path the user named (by ``option``): an OS error becomes a
    PathProblem with advice, and nothing is left half-written (a folder where the file goes,
    a read-only or full disk, a file where a folder is needed)."""
    try:
        return write_private(Path(path), data)
    except OSError as exc:
        raise path_problem(exc, path, "write", option) from None


def read_user_text(path: Path | str, option: str, most_bytes: int = 1 << 26) -> str:
    """The UTF-8 text of a file the user named (by ``option``): a missing file, a folder, a
    pseudo file (/proc, /sys, /dev), one larger than ``most_bytes`` or one that is not text is a
    PathProblem saying what to write instead."""
    path = Path(path)
    if pseudo_file_system(path):
        raise PathProblem(f"cannot read {path} ({option}): it lies in a pseudo file system (/proc, /sys, /dev), "
                          "not a file of yours; point it at a regular file")
    try:
        if path.is_dir():
            raise PathProblem(f"cannot read {path} ({option}): it is a folder; point it at a file")
        size = path.stat().st_size
        if size > most_bytes:
            raise PathProblem(f"cannot read {path} ({option}): it holds {size:,} bytes, more than the {most_bytes:,} "
                              "expected; point it at the right file")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PathProblem(f"cannot read {path} ({option}): no such file; write it, or fix the path") from None
    except OSError as exc:
        raise PathProblem(f"cannot read {path} ({option}): {exc.strerror or exc}; make it readable by this user, "
                          "or point it at a file that is") from None
    except UnicodeDecodeError as exc:
        raise PathProblem(f"cannot read {path} ({option}): not UTF-8 text ({exc.reason} at byte {exc.start}); "
                          "save it as UTF-8") from None


def make_private(folder: Path) -> None:
    """Owner-only permissions on everything under ``folder`` that others wrote with their own
    modes (torch.save, save_pretrained): folders 0700, files 0600."""
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o700)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, 0o600)


_SCRATCH = re.compile(r"\.run-(?P<host>[A-Za-z0-9._]+)-(?P<pid>\d+)-[a-z0-9_]+$")


def scratch_prefix(pid: int | None = None) -> str:
    """``.run-<host>-<pid>-``: a scratch folder's name says which process on which machine
    made it (an artifacts folder on a shared disk may hold runs of several machines)."""
    host = re.sub(r"[^A-Za-z0-9.]", "_", os.uname().nodename) or "host"
    return f".run-{host}-{os.getpid() if pid is None else pid}-"


def scratch_dir(parent: Path) -> Path:
    """A new owner-only working folder ``.run-<host>-<pid>-<random>`` in ``parent``, first
    removing those of runs whose process is gone (killed before they could clean up)."""
    parent = ensure_private_dir(parent)
    remove_dead_scratch(parent)
    return Path(tempfile.mkdtemp(prefix=scratch_prefix(), dir=parent))


def remove_dead_scratch(parent: Path) -> list[Path]:
    """Remove the scratch folders in ``parent`` made on this machine whose run's process no
    longer exists (only those: a live run's folder, another machine's, or one whose name says
    no process, is left alone)."""
    removed: list[Path] = []
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return removed
    for entry in entries:
        found = _SCRATCH.match(entry.name)
        try:
            is_folder = stat.S_ISDIR(entry.lstat().st_mode)
        except OSError:
            continue
        if (found and is_folder and entry.name.startswith(scratch_prefix(int(found["pid"])))
                and not _process_alive(int(found["pid"]))):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process: alive; a bogus number: not ours to judge
        return True
    try:  # a zombie (killed, not yet reaped by its parent) has finished
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True
