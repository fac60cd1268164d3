"""A trainer's resume in a fresh process: ``python -m pytest_ftready.trainers.worker TRAINER
RECIPE FOLDER CHECKPOINT STEPS DEVICE THREADS`` prints one JSON line with the logs of the
steps the trainer trained after resuming (``[step, loss, learning_rate, tokens]`` each)."""

from __future__ import annotations

import json
import sys


def command(trainer: str, recipe: str, folder: str, checkpoint: str, steps: str, device: str) -> list[str]:
    """The argv that runs this module in a fresh interpreter, with this process's thread count."""
    import torch

    return [sys.executable, "-m", "pytest_ftready.trainers.worker", trainer, recipe, folder, checkpoint, steps, device,
            str(torch.get_num_threads())]


def main(argv: list[str]) -> int:
    from pathlib import Path

    import torch

    from ..recipe.schema import load_recipe
    from . import trainer_named

    name, recipe_path, folder, checkpoint, steps, device, threads = argv
    torch.set_num_threads(int(threads))
    logs = trainer_named(name).resume_here(load_recipe(recipe_path), Path(folder), Path(checkpoint), int(steps), device)
    print(json.dumps({"logs": logs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
