"""Build the runs' folders on the machine that runs them (nothing large travels):

- ``tiny/``: the bundled tiny example (``pytest_ftready.tiny.build_example``: a ~146k-parameter
  Llama, its ChatML tokenizer, 50 chat rows, the manifest, ``recipe.toml``) with
  ``examples/tiny``'s TRL config (``trl-sft.yaml`` and its ``ftready.toml``);
- ``smollm2-135m/``: a Llama of the shape ``--config`` gives (default ``smollm2-135m.json``,
  SmolLM2-135M's), its weights drawn from ``torch.manual_seed(0)`` at the config's
  ``initializer_range`` on the CPU (so the same weights everywhere) and saved in bfloat16, the
  tiny example's tokenizer and rows, ``smollm2-135m.toml`` as ``recipe.toml`` and the TRL config.

Run with the plugin importable: ``python build_models.py WORK [--config smollm2-135m.json]``.
Prints one JSON line: each folder and the model's parameter count.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
TINY = HERE.parent / "tiny"
MEDIUM = "smollm2-135m"


def llama_config(path: Path, tokenizer):
    """The config file's shape (keys starting with ``_`` are notes), with the tokenizer's special ids."""
    from transformers import LlamaConfig

    shape = {k: v for k, v in json.loads(Path(path).read_text()).items() if not k.startswith("_")}
    if shape.get("vocab_size", 0) < len(tokenizer):
        raise SystemExit(f"{path}: vocab_size {shape.get('vocab_size')} is smaller than the tokenizer's "
                         f"{len(tokenizer)} tokens; give at least {len(tokenizer)}")
    return LlamaConfig(**shape, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)


def build_medium(folder: Path, config_path: Path) -> int:
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    from pytest_ftready.data import manifest
    from pytest_ftready.tiny import build_tokenizer, example_rows, write_jsonl

    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(config_path, tokenizer)).to(torch.bfloat16)
    model.save_pretrained(folder / "model")
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    train = write_jsonl(folder / "data" / "train.jsonl", example_rows())
    manifest.write([train], folder / "data" / "MANIFEST.json")
    shutil.copy(HERE / f"{MEDIUM}.toml", folder / "recipe.toml")
    for name in (f"{MEDIUM}-trl.yaml", f"{MEDIUM}-trl.ftready.toml"):
        shutil.copy(HERE / name, folder / name)
    return sum(p.numel() for p in model.parameters())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--config", type=Path, default=HERE / f"{MEDIUM}.json")
    args = parser.parse_args(argv)
    from pytest_ftready.tiny import build_example

    tiny = build_example(args.work / "tiny")
    for name in ("trl-sft.yaml", "ftready.toml"):
        shutil.copy(TINY / name, tiny / name)
    parameters = build_medium(args.work / MEDIUM, args.config)
    print(json.dumps({"tiny": str(tiny), MEDIUM: str(args.work / MEDIUM), "medium_parameters": parameters,
                      "medium_config": str(args.config)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
