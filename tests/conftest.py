"""Shared test assets: a real tiny model and data, built offline once per session."""

from __future__ import annotations

import os
import re

# Before anything imports transformers / huggingface_hub (ENVIRONMENT.md).
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS",
              "HF_DATASETS_DISABLE_PROGRESS_BARS"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny"

# Tests that run only when a -m expression names their marker: the default `pytest tests` is the fast
# core; CI runs `pytest tests -m "slow or faults_slow"` too (scale and published are run by hand).
ON_REQUEST = ("slow", "faults_slow", "scale", "published")


def pytest_collection_modifyitems(config, items):
    asked = config.option.markexpr or ""
    held = [name for name in ON_REQUEST if not re.search(rf"\b{name}\b", asked)]
    keep = [item for item in items if not any(item.get_closest_marker(name) for name in held)]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The example's model (ChatML template with generation markers), built once."""
    from pytest_ftready.tiny import build_model, build_tokenizer

    return build_model(build_tokenizer(), tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def tiny_example(tmp_path, tiny_model_dir) -> Path:
    """A private copy of examples/tiny (recipe + data) with the session's model."""
    return copy_example(tmp_path / "tiny", tiny_model_dir)


def copy_example(folder: Path, model_dir: Path) -> Path:
    """examples/tiny (recipe + data) in ``folder``, its model a link to ``model_dir``."""
    from pytest_ftready.tiny import example_rows, write_jsonl

    folder.mkdir()
    shutil.copy(EXAMPLE / "recipe.toml", folder / "recipe.toml")
    write_jsonl(folder / "data" / "train.jsonl", example_rows())
    shutil.copy(EXAMPLE / "data" / "MANIFEST.json", folder / "data" / "MANIFEST.json")
    (folder / "model").symlink_to(model_dir)
    return folder


def state_for(config: Path, artifacts: Path, machine):
    """The RecipeState of a recipe or a trainer's config (its facts computed on demand), checks registered."""
    from pytest_ftready.checks.registry import all_checks
    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.session.state import RunState

    all_checks()
    return RunState(artifacts_root=artifacts, machine_factory=lambda: machine).recipe_state(load_recipe(config))


def values(ctx) -> dict:
    """A check's measurements by name (its context from ``run_check``)."""
    return {m.name: m.value for m in ctx.measured}


def resume_failure_without(state, run_check, part: str) -> str:
    """lifecycle.resume's failure message once ``part`` is deleted from the trainer's own checkpoint."""
    from pytest_ftready.outcomes import Fail

    (state.saved_run.checkpoint / part).unlink()
    with pytest.raises(Fail) as info:
        run_check(state, "lifecycle.resume")
    return str(info.value)


def assert_own_overfit(state, run_check, step_trainer: str) -> None:
    """A trainer's own overfit reaches the threshold, the engine's run of the same examples beside
    it, and the trainer's adapter (saved apart from the engine's) reloads and generates the same."""
    got = values(run_check(state, "model.overfit"))
    assert got["step_trainer"] == step_trainer
    assert got["overfit_final_loss"] <= 0.1 < got["overfit_first_loss"]
    assert got["engine_overfit_final_loss"] <= 0.1  # the engine's run of the same examples, side by side
    run_check(state, "lifecycle.generate")


def assert_own_resume_exact(state, run_check) -> None:
    """A trainer's own resume in a fresh process gives the straight run's losses, from the
    trainer's own checkpoint (its scheduler.pt)."""
    got = values(run_check(state, "lifecycle.resume"))
    run = state.resume_run
    assert run.difference == "" and got["resume_max_loss_difference"] == 0.0
    assert run.resumed_losses == run.straight_losses[run.steps // 2:]
    assert (state.saved_run.checkpoint / "scheduler.pt").exists()


@pytest.fixture
def edit_recipe():
    """``edit_recipe(path, key='value', ...)``: replace whole ``key = ...`` lines of a recipe."""
    return _edit_recipe


def _edit_recipe(path: Path, **replacements: str) -> Path:
    """Replace whole lines ``key = ...`` in a recipe (first match of each key)."""
    lines = path.read_text().splitlines()
    for key, value in replacements.items():
        for i, line in enumerate(lines):
            if line.split("=")[0].strip() == key:
                lines[i] = f"{key} = {value}"
                break
        else:
            raise KeyError(key)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def real_machine():
    from pytest_ftready.machine.probes import read_machine

    return read_machine()


@pytest.fixture
def make_state(tiny_example, tmp_path, real_machine, edit_recipe):
    """``make_state(machine=None, **recipe_edits)``: the tiny recipe's RecipeState, in-process."""
    from pytest_ftready.checks.registry import all_checks
    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.session.state import RunState

    all_checks()

    def make(machine=None, **edits):
        path = tiny_example / "recipe.toml"
        if edits:
            _edit_recipe(path, **edits)
        run = RunState(artifacts_root=tmp_path / "arts", machine_factory=lambda: machine or real_machine)
        return run.recipe_state(load_recipe(path))
    return make


@pytest.fixture
def run_check():
    """``run_check(state, check_id)``: run one check's body; returns its context (measurements)."""
    from pytest_ftready.checks.registry import REGISTRY
    from pytest_ftready.session.context import CheckContext

    def run(state, check_id):
        ctx = CheckContext(state, REGISTRY[check_id])
        with ctx.running():
            REGISTRY[check_id].body(ctx)
        return ctx
    return run
