"""Reproducibility checks: environment record, pins, resolved config and seeds, manifest."""

from __future__ import annotations

from ..machine.environment import environment_record, suite_properties
from ..outcomes import Fail, Skip
from ..recipe.schema import SEED_MAX
from .registry import STAGES, check


@check("repro.environment", stage=STAGES["repro.environment"])
def environment(ctx) -> None:
    """Record hardware, driver, CUDA/ROCm, OS, Python and package versions."""
    machine = ctx.machine
    record = environment_record(machine)
    path = ctx.state.run.gate.write_json(ctx.state.artifacts / "environment.json", record)
    for name, value in suite_properties(machine).items():
        ctx.suite_property(name, value)
    ctx.measure("packages_recorded", len(record["packages"]), "packages")
    ctx.measure("cpu_cores", machine.host.cores_logical, "cores")
    ctx.measure("host_memory_total", machine.host.memory_total_bytes, "bytes")
    for gpu in machine.gpus:
        if gpu.memory_total_bytes:
            ctx.measure(f"gpu{gpu.index}_memory_total", gpu.memory_total_bytes, "bytes")
    ctx.user_properties.append(("environment_json", str(path)))
    if machine.torch.version is None:
        raise Fail("torch is not installed: pip install torch (the CPU, CUDA or ROCm build for this machine)")


@check("repro.pins", stage=STAGES["repro"])
def pins(ctx) -> None:
    """Installed versions equal the pins; the model revision is a commit (or the local folder is hashed)."""
    from ..machine.pins import folder_hash, mismatches, normalize, read_lockfile
    from ..machine.probes import PACKAGES
    from ..recipe.schema import is_commit_hash

    recipe = ctx.recipe
    problems = []
    if recipe.model.id:
        ctx.measure("model_revision", recipe.model.revision, "")
        if not is_commit_hash(recipe.model.revision):
            problems.append(f"[model] revision {recipe.model.revision!r} is a branch or tag, not a commit: "
                            f"it can move. "
                            f"Pin the commit it points to: python -c \"from huggingface_hub import HfApi; "
                            f"print(HfApi().model_info('{recipe.model.id}', revision='{recipe.model.revision}').sha)\"")
    else:
        ctx.measure("model_folder_sha256", folder_hash(recipe.model.path), "")
    declared = {normalize(k): v for k, v in recipe.pins.packages.items()}
    if recipe.pins.lockfile:
        from ..files import PathProblem

        try:
            declared = read_lockfile(recipe.pins.lockfile) | declared
        except PathProblem as exc:
            raise Fail(str(exc)) from None
    ctx.measure("pinned_packages", len(declared), "packages")
    if declared:
        mismatch = mismatches(declared, PACKAGES)
        ctx.measure("pin_mismatches", len(mismatch), "packages")
        if mismatch:
            problems.append(f"{len(mismatch)} installed package(s) differ from the pins:\n  " + "\n  ".join(mismatch))
    if problems:
        raise Fail("\n".join(problems))
    if not declared:
        raise Skip("no package pins declared: add [pins] lockfile = \"requirements.lock\" (pip freeze > "
                   "requirements.lock) or packages = { torch = \"...\" }")




def seeds_applied(seed: int) -> list[str]:
    """Seed torch, python and numpy as training does, and verify each generator took it: the
    names of those that did not, each with why."""
    import random

    import numpy as np
    import torch

    from ..engine.batches import seed_everything

    try:
        seed_everything(seed)
    except (ValueError, OverflowError, RuntimeError) as exc:  # training would stop at its first line
        return [f"training's seeding ({type(exc).__name__}: {exc})"]
    drawn = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    expected = (random.Random(seed).random(), float(np.random.RandomState(seed).rand()),
                float(torch.rand(1, generator=torch.Generator().manual_seed(seed))))
    return [name for name, a, b in zip(("python", "numpy", "torch"), drawn, expected) if a != b]


@check("repro.config", stage=STAGES["repro"] + 1)
def config(ctx) -> None:
    """The resolved recipe, the plugin version and every seed are written; the seeds really apply."""
    from .. import __version__

    recipe = ctx.recipe
    seed = recipe.training.seed
    payload = {"plugin": "pytest-ftready", "version": __version__, "recipe": recipe.to_dict(),
               "seeds": {"torch": seed, "python": seed, "numpy": seed, "data_order": seed}}
    path = ctx.state.run.gate.write_json(ctx.state.artifacts / "config.json", payload)
    ctx.user_properties.append(("config_json", str(path)))
    ctx.measure("seed", seed, "")
    failed = seeds_applied(seed)
    ctx.measure("generators_checked", 3, "generators")  # torch, python, numpy
    if failed:
        raise Fail(f"[training] seed = {seed} did not reach {', '.join(failed)}: write a seed between 0 and "
                   f"{SEED_MAX} (numpy's range), which torch, python and numpy all take")


@check("repro.manifest", stage=STAGES["repro"] + 2)
def manifest(ctx) -> None:
    """The data on disk matches the data manifest (file, size, sha256, rows)."""
    from ..data.manifest import differences

    recipe = ctx.recipe
    if not recipe.data.manifest:
        raise Skip("no [data] manifest declared; add manifest = \"data/MANIFEST.json\" and write it with "
                   f"`ftready-manifest write {recipe.source}`")
    if not recipe.data.manifest.exists():
        raise Fail(f"the manifest {recipe.data.manifest} does not exist: write it with "
                   f"`ftready-manifest write {recipe.source}` and commit it")
    problems = differences(recipe.data.train, recipe.data.manifest)
    ctx.measure("manifest_files", len(recipe.data.train), "files")
    if problems:
        raise Fail(f"the data differs from {recipe.data.manifest.name} in {len(problems)} place(s):\n  "
                   + "\n  ".join(problems) + f"\nIf the change is intended, rewrite it: ftready-manifest write "
                   f"{recipe.source}")
