"""Work that must run in a fresh process: ``python -m pytest_ftready.engine.worker resume RECIPE
CHECKPOINT STEPS TOTAL DEVICE THREADS`` prints one JSON line with the resumed losses."""

from __future__ import annotations

import json
import sys


def command(*args: str) -> list[str]:
    """The argv that runs this module in a fresh interpreter."""
    return [sys.executable, "-m", "pytest_ftready.engine.worker", *args]


def main(argv: list[str]) -> int:
    what, recipe_path, folder, steps, total, device, threads = argv
    if what != "resume":
        print(json.dumps({"error": f"unknown command {what}"}))
        return 2
    import torch

    from .loading import load_model, load_tokenizer
    from ..recipe.schema import load_recipe
    from .checkpoint import MissingState, resume_and_train

    torch.set_num_threads(int(threads))
    recipe = load_recipe(recipe_path)
    tokenizer = load_tokenizer(recipe)
    try:
        losses = resume_and_train(recipe, load_model(recipe, device), folder, int(steps), device,
                                  tokenizer.pad_token_id, int(total))
    except MissingState as exc:
        print(json.dumps({"missing": str(exc)}))
        return 0
    print(json.dumps({"losses": losses}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
