"""Private files: every artifact is written atomically (temp file + rename) with owner-only
permissions, so nothing is ever half-written or readable by others. Used by every layer
that writes (data manifests, engine checkpoints, outputs)."""

from __future__ import annotations

import json
import math
import os
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


