"""Data manifests: per file its path (relative to the manifest), size, sha256 and rows.

``ftready-manifest write recipe.toml`` writes the manifest the recipe names ([data]
manifest); ``ftready-manifest check recipe.toml`` compares the data on disk with it.
Files are hashed by streaming, never read whole into memory."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

CHUNK = 1 << 20
VERSION = 1


@dataclass(frozen=True)
class Entry:
    path: str
    size: int
    sha256: str
    rows: Optional[int]


def file_entry(path: Path, base: Path) -> Entry:
    digest = hashlib.sha256()
    newlines = 0
    size = 0
    last = b"\n"
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            newlines += chunk.count(b"\n")
            size += len(chunk)
            last = chunk[-1:]
    return Entry(path=os.path.relpath(path, base), size=size, sha256=digest.hexdigest(),
                 rows=count_rows(path, newlines + (0 if last == b"\n" else 1)))


def count_rows(path: Path, lines: int) -> Optional[int]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        with open(path, "rb") as handle:
            return sum(1 for line in handle if line.strip())
    if suffix == ".csv":
        return max(0, lines - 1)
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows
        except Exception:  # pyarrow absent or unreadable file: rows unknown
            return None
    return None


def build(files: Iterable[Path], manifest_path: Path) -> dict:
    base = Path(manifest_path).parent
    return {"version": VERSION, "files": [e.__dict__ for e in (file_entry(Path(f), base) for f in files)]}


def write(files: Iterable[Path], manifest_path: Path) -> Path:
    from ..files import write_user_file

    payload = build(files, manifest_path)
    return write_user_file(manifest_path, json.dumps(payload, indent=2, sort_keys=True) + "\n", "[data] manifest")


def differences(files: Iterable[Path], manifest_path: Path) -> list[str]:
    """Each file that differs from the manifest, in words ([] when the data matches)."""
    manifest_path = Path(manifest_path)
    try:
        recorded = json.loads(manifest_path.read_text(encoding="utf-8"))
        entries = {e["path"]: e for e in recorded["files"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{manifest_path} is not a readable manifest ({type(exc).__name__}: {exc})"]
    base = manifest_path.parent
    problems = []
    seen = set()
    for path in files:
        path = Path(path)
        rel = os.path.relpath(path, base)
        seen.add(rel)
        if rel not in entries:
            problems.append(f"{rel}: not in the manifest")
            continue
        if not path.exists():
            problems.append(f"{rel}: missing on disk")
            continue
        actual, want = file_entry(path, base), entries[rel]
        for field in ("size", "rows", "sha256"):
            if want.get(field) is not None and getattr(actual, field) != want[field]:
                problems.append(f"{rel}: {field} {getattr(actual, field)} on disk, {want[field]} in the manifest")
                break
    for rel in sorted(set(entries) - seen):
        if not (base / rel).exists():
            problems.append(f"{rel}: in the manifest, missing on disk")
        else:
            problems.append(f"{rel}: in the manifest but not in the recipe's [data] train")
    return problems


def main(argv: Optional[list[str]] = None) -> int:
    from ..recipe.schema import RecipeError
    from ..recipe import load_recipe

    parser = argparse.ArgumentParser(prog="ftready-manifest", description="write or check a recipe's data manifest")
    parser.add_argument("action", choices=("write", "check"))
    parser.add_argument("recipe", help="recipe.toml whose [data] train files and manifest are meant")
    args = parser.parse_args(argv)
    try:
        recipe = load_recipe(args.recipe)
    except RecipeError as exc:
        print(exc)
        return 2
    if not recipe.data.manifest:
        print(f"{args.recipe}: [data] manifest is not set; add manifest = \"data/MANIFEST.json\"")
        return 2
    if args.action == "write":
        from ..files import PathProblem

        try:
            print(f"wrote {write(recipe.data.train, Path(recipe.data.manifest))}")
        except PathProblem as exc:
            print(f"ftready-manifest: {exc}")
            return 2
        return 0
    problems = differences(recipe.data.train, Path(recipe.data.manifest))
    for line in problems:
        print(line)
    print("data matches the manifest" if not problems else f"{len(problems)} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
