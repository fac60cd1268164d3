"""The embedding rows (and an untied LM head's rows) of chosen tokens, read from the safetensors
files alone (``safetensors.safe_open``, in chunks of rows: no model is built), judged against the
whole vocabulary: a zero row, or a row whose norm is far from the vocabulary's median, is a token
the base model never trained (a chat token of a base model: unsloth #658, #1056, axolotl #1666)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

# A row is untrained when its L2 norm is below LOW x the vocabulary's median row norm (zero rows
# included) or above HIGH x it: trained rows of one matrix sit within a small factor of each other,
# while untrained chat tokens of base models are zero or near it (Llama-3 base's <|eot_id|>).
LOW, HIGH = 0.1, 10.0
CHUNK_ROWS = 8192  # rows read at a time: memory stays CHUNK_ROWS x hidden, whatever the vocabulary
EMBEDDING_NAMES = ("embed_tokens", "wte", "word_embeddings")
HEAD_NAMES = ("lm_head",)


class NoWeights(Exception):
    """The folder holds no safetensors embedding to read (the reason says why)."""


@dataclass(frozen=True)
class BadRow:
    token: str
    token_id: int
    matrix: str  # tensor name
    norm: float
    why: str  # "a zero row", "below 0.1 x the median", ...


@dataclass
class TokenRows:
    matrices: dict = field(default_factory=dict)  # tensor name -> (file, vocabulary rows, median row norm)
    checked: int = 0  # token ids judged
    bad: list = field(default_factory=list)  # BadRow


def tensor_files(folder: Path) -> dict[str, str]:
    """Tensor name -> safetensors file, from the weight index's map or each file's header."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return dict(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            out.update({name: path.name for name in handle.keys()})
    if not out:
        raise NoWeights(f"no *.safetensors in {folder} (pytorch_model*.bin cannot be read without unpickling: "
                        "convert the weights to safetensors)")
    return out


def vocabulary_rows(path: Path) -> dict[str, int]:
    """Rows of each embedding or LM-head tensor in one safetensors file (a saved adapter's, say)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return {name: handle.get_slice(name).get_shape()[0] for name in handle.keys()
                if any(k in name for k in EMBEDDING_NAMES + HEAD_NAMES)
                and len(handle.get_slice(name).get_shape()) == 2}


def _shape(folder: Path, file: str, name: str) -> list[int]:
    from safetensors import safe_open

    with safe_open(str(folder / file), framework="pt") as handle:
        return list(handle.get_slice(name).get_shape())


def find_matrices(folder: Path, files: dict[str, str], vocab_size: Optional[int],
                  tied: Optional[bool]) -> dict[str, str]:
    """The input embedding's tensor name (and the LM head's, when it is stored and not tied) -> file."""
    def matrix(names: tuple[str, ...]) -> Optional[str]:
        found = [n for n in files if n.endswith(".weight") and any(k in n for k in names) and "per_layer" not in n]
        shaped = [(n, _shape(folder, files[n], n)) for n in found]
        shaped = [(n, s) for n, s in shaped if len(s) == 2]
        exact = [n for n, s in shaped if s[0] == vocab_size]
        return next(iter(exact or [n for n, s in sorted(shaped, key=lambda x: -x[1][0])]), None)

    embedding = matrix(EMBEDDING_NAMES)
    if embedding is None:
        raise NoWeights(f"no embedding matrix (a 2-D *{'/'.join(EMBEDDING_NAMES)}*.weight tensor) among the "
                        f"{len(files)} tensors of {folder}")
    out = {embedding: files[embedding]}
    head = matrix(HEAD_NAMES)
    if head is not None and tied is not True:
        out[head] = files[head]
    return out


def row_norms(path: Path, name: str):
    """The L2 norm of every row of tensor ``name`` (float32), read CHUNK_ROWS rows at a time."""
    import torch
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        tensor = handle.get_slice(name)
        rows = tensor.get_shape()[0]
        return torch.cat([tensor[start:start + CHUNK_ROWS].float().norm(dim=1)
                          for start in range(0, rows, CHUNK_ROWS)])


def judge(folder: Path, tokens: dict[int, str], vocab_size: Optional[int] = None,
          tied: Optional[bool] = None) -> TokenRows:
    """The rows of ``tokens`` (id -> text) in the embedding (and untied head) under ``folder``, each
    judged against its matrix's median row norm."""
    import torch

    files = tensor_files(folder)
    result = TokenRows(checked=len(tokens))
    for name, file in find_matrices(folder, files, vocab_size, tied).items():
        norms = row_norms(folder / file, name)
        median = float(norms.median())
        result.matrices[name] = (file, len(norms), median)
        for token_id, text in sorted(tokens.items()):
            if token_id >= len(norms):
                result.bad.append(BadRow(text, token_id, name, float("nan"), f"beyond its {len(norms)} rows"))
                continue
            norm = float(norms[token_id])
            if not torch.isfinite(norms[token_id]):
                why = "not finite"
            elif norm == 0.0:
                why = "a zero row"
            elif norm < LOW * median:
                why = f"below {LOW:g} x the median"
            elif norm > HIGH * median:
                why = f"above {HIGH:g} x the median"
            else:
                continue
            result.bad.append(BadRow(text, token_id, name, norm, why))
    return result
