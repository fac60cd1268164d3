"""Pins: versions from a lock file (pip freeze / requirements '==', uv.lock, poetry.lock)
or the recipe's [pins] packages, compared with what is installed."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path
from typing import Iterable

from .probes import installed

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*===?\s*([^\s;#]+)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lockfile(path: Path) -> dict[str, str]:
    """package -> pinned version. Unpinned requirement lines are ignored. A file that cannot be
    read, or a TOML lock that is not TOML, is a ``files.PathProblem`` saying what to do."""
    from ..files import PathProblem, read_user_text

    path = Path(path)
    text = read_user_text(path, "[pins] lockfile")
    if "[[package]]" in text:  # uv.lock and poetry.lock are TOML with [[package]] tables
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PathProblem(f"cannot read {path} ([pins] lockfile): a uv.lock / poetry.lock that is not valid TOML "
                              f"({exc}); regenerate it (uv lock, poetry lock)") from None
        return {normalize(p["name"]): str(p["version"]) for p in data.get("package", [])
                if isinstance(p, dict) and "name" in p and "version" in p}
    pins = {}
    for line in text.splitlines():
        m = REQ.match(line)
        if m:
            pins[normalize(m.group(1))] = m.group(2)
    return pins


def public(version: str) -> str:
    return version.split("+", 1)[0]


def mismatches(pins: dict[str, str], matter: Iterable[str]) -> list[str]:
    """Each pinned package whose installed version differs; missing ones only if they matter."""
    matter = {normalize(m) for m in matter}
    out = []
    for name, pinned in sorted(pins.items()):
        have = installed(name)
        if have is None:
            if name in matter:
                out.append(f"{name}: pinned {pinned}, not installed")
            continue
        same = have == pinned if "+" in pinned else public(have) == public(pinned)
        if not same:
            out.append(f"{name}: pinned {pinned}, installed {have}")
    return out


def folder_hash(folder: Path) -> str:
    """sha256 over every file's relative path and content (streamed), in sorted order."""
    digest = hashlib.sha256()
    folder = Path(folder)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()
