"""What the hub (or its local cache) says about a model: the commit a revision points to and
the files with their sizes. One small interface, so tests substitute a fake hub."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
                   "vocab.txt", "spiece.model")
CONFIG_FILES = ("config.json", "generation_config.json")
# copies of the weights a torch + safetensors recipe never loads
DUPLICATE_PATTERNS = ("*.bin", "*.pth", "*.pt", "*.gguf", "*.msgpack", "*.h5", "*.ckpt", "*.onnx", "*.mlmodel",
                      "original/*", "consolidated*")


class HubUnavailable(Exception):
    """The hub cannot answer (offline, timeout, gated): the message says why."""


@dataclass(frozen=True)
class ModelFiles:
    sha: str  # the commit
    files: tuple[tuple[str, Optional[int]], ...]  # (path in the repo, bytes or None)
    source: str  # "hub" | "cache" | "folder"

    @property
    def sizes(self) -> dict[str, Optional[int]]:
        return dict(self.files)


class Hub(Protocol):
    def model_files(self, repo_id: str, revision: str, timeout_s: float) -> ModelFiles: ...


def needed_files(files: dict[str, Optional[int]], gguf_file: str = "") -> list[str]:
    """Config, tokenizer and one copy of the weights (the recipe's GGUF file if it names one,
    else safetensors when the repo has them, else pytorch_model*.bin)."""
    top = [f for f in files if "/" not in f]
    keep = [f for f in top if f in CONFIG_FILES or f in TOKENIZER_FILES]
    if gguf_file:
        return sorted(set(keep + [gguf_file]))
    safetensors = [f for f in top if f.endswith(".safetensors") and not f.startswith("consolidated")]
    if safetensors:
        keep += safetensors + [f for f in top if f == "model.safetensors.index.json"]
    else:
        keep += [f for f in top if fnmatch.fnmatch(f, "pytorch_model*.bin") or f == "pytorch_model.bin.index.json"]
    return sorted(set(keep))


def duplicates(files: dict[str, Optional[int]], needed: list[str]) -> list[str]:
    return sorted(f for f in files if f not in needed and any(fnmatch.fnmatch(f, p) for p in DUPLICATE_PATTERNS))


def repo_cache_dir(repo_id: str, cache: Optional[Path] = None) -> Path:
    from huggingface_hub import constants

    return Path(cache or constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))


class RealHub:
    """huggingface_hub online (with a timeout), the local cache when offline."""

    def model_files(self, repo_id: str, revision: str, timeout_s: float) -> ModelFiles:
        from huggingface_hub import HfApi, constants

        if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True"):
            return self.cached(repo_id, revision)
        try:
            info = HfApi().model_info(repo_id, revision=revision, files_metadata=True, timeout=timeout_s)
        except Exception as exc:  # network, auth, timeouts: fall back to the cache, else say why
            try:
                return self.cached(repo_id, revision)
            except HubUnavailable:
                raise HubUnavailable(f"the hub did not answer for {repo_id}@{revision} "
                                     f"({type(exc).__name__}: "
                                     f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
        return ModelFiles(sha=info.sha, files=tuple((s.rfilename, s.size) for s in info.siblings or ()), source="hub")

    def cached(self, repo_id: str, revision: str) -> ModelFiles:
        folder = repo_cache_dir(repo_id)
        ref = folder / "refs" / revision
        sha = ref.read_text().strip() if ref.is_file() else revision
        snapshot = folder / "snapshots" / sha
        if not snapshot.is_dir():
            raise HubUnavailable(f"offline and {repo_id}@{revision} is not in the cache ({folder})")
        return ModelFiles(sha=sha, files=files_on_disk(snapshot), source="cache")


SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def index_shards(index: Path) -> list[str]:
    """The shard files a ``*.index.json`` maps the weights to (none when it cannot be read)."""
    import json

    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
    except (OSError, ValueError, AttributeError):
        return []
    return sorted({str(name) for name in weight_map.values()})


def files_on_disk(folder: Path) -> tuple[tuple[str, Optional[int]], ...]:
    """The files under ``folder`` with their sizes, plus every shard its weight indexes name
    (size None when absent): a folder holds what was downloaded, not what the model needs."""
    on_disk = {str(p.relative_to(folder)): p.stat().st_size for p in Path(folder).rglob("*") if p.is_file()}
    named = {shard: None for index in SHARD_INDEXES if index in on_disk for shard in index_shards(Path(folder) / index)}
    return tuple((named | on_disk).items())


def folder_files(folder: Path) -> ModelFiles:
    return ModelFiles(sha="", files=files_on_disk(folder), source="folder")


def free_bytes(path: Path) -> int:
    """Free bytes on the disk that holds ``path`` (the nearest existing parent)."""
    import shutil

    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free
