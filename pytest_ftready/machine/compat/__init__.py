"""Compatibility facts shipped as data (TOML), each row naming its source."""

from __future__ import annotations

import functools
import sys
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@functools.lru_cache(maxsize=None)
def load(name: str) -> dict[str, Any]:
    """The facts table ``name`` (cuda, compute, rocm, mlx)."""
    return tomllib.loads(resources.files(__name__).joinpath(f"{name}.toml").read_text(encoding="utf-8"))


def source(table: dict[str, Any], row: dict[str, Any]) -> str:
    return table["sources"][row["source"]]


def version_tuple(text: str) -> tuple[int, ...]:
    """'550.54.15' -> (550, 54, 15); '2.6.0+cu124' -> (2, 6, 0); '12.4' -> (12, 4)."""
    out = []
    for part in text.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def cc_text(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"
