"""Axolotl: the training examples as Axolotl's own prompt strategy tokenizes and labels each
row (``axolotl.prompt_strategies.load(type, tokenizer, cfg, dataset)`` then
``tokenize_prompt(row)``, the function Axolotl's preprocess maps over the dataset), read from
the team's config by Axolotl's own ``load_cfg``. The labels get the plugin's independent
verification.

Axolotl's own run (``AxolotlTrainer``): the step, overfit and save-and-resume through the
Trainer Axolotl builds from the team's config (``load_cfg``, ``load_datasets``,
``setup_model_and_trainer``): its model loading and adapter, its dataset preparation, its
collator (sample_packing, pad_to_sequence_len), optimizer, scheduler, gradient checkpointing
and kernels. Bounded: ``max_steps``, the rows the check chose (written to a file under the
run's scratch folder), output_dir and ``dataset_prepared_path`` under that folder (never the
team's), no tracking, no hub. A resume is ``trainer.train(resume_from_checkpoint=...)`` in a
fresh process. What Axolotl cannot run on this machine (a CUDA kernel, an 8-bit optimizer) is
a skip naming what it needs.

Axolotl pins its own transformers and TRL, so it lives in its own environment with the plugin
(see docs/trainers.md, "The trainer's own run"); importing it costs 15 to 60 s."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Iterator, Sequence

from ..outcomes import Fail, Skip
from .base import Bounds, FunctionPipeline, Pipeline, PipelineInputs, RunInputs, RunRows
from . import hf

# Axolotl reports usage unless told not to; the checks never send anything anywhere.
QUIET_ENV = {"AXOLOTL_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1", "WANDB_DISABLED": "true"}


def config_path(recipe) -> Path:
    """The team's Axolotl config; a Skip where axolotl does not import, a Fail where the recipe
    is no Axolotl config."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    try:
        import axolotl.cli.config  # noqa: F401
    except ImportError as exc:
        raise Skip(f"the recipe asks for Axolotl's pipeline but axolotl does not import here ({exc}); "
                   f"{AxolotlTrainer.install}") from None
    origin = recipe.origin
    if origin is None or origin.format != "axolotl":
        raise Fail("[data] pipeline = \"axolotl\" needs an Axolotl config: run pytest --ftready=<your axolotl.yml>")
    return Path(origin.source)


def axolotl_cfg(recipe, **overrides):
    """The team's config as Axolotl reads it (``load_cfg``), the model at the recipe's path,
    ``overrides`` over its keys (as ``axolotl train --key=value`` would)."""
    source = config_path(recipe)
    from axolotl.cli.config import load_cfg

    if recipe.model.path:
        overrides = {"base_model": str(Path(recipe.model.path).resolve()), **overrides}
    with contextlib.redirect_stdout(io.StringIO()):  # load_cfg prints the whole resolved config
        try:
            return load_cfg(str(source), **overrides)
        except ValueError as exc:  # pydantic's ValidationError is one: Axolotl refuses the config
            said = " ".join(str(exc).split())
            raise Fail(f"{source}: Axolotl refuses this config ({type(exc).__name__}: {said[:600]}); "
                       "fix the key it names (axolotl preprocess would stop the same way)") from None


class AxolotlPipeline(FunctionPipeline):
    """Each row through Axolotl's prompt strategy for the config's dataset entry."""

    def __init__(self, inputs: PipelineInputs) -> None:
        from axolotl.loaders import load_tokenizer
        from axolotl.prompt_strategies import load as load_strategy

        recipe = inputs.recipe
        cfg = axolotl_cfg(recipe)
        kinds = {str(entry.get("type")) for entry in cfg.datasets or ()}
        if len(kinds) != 1:
            raise Fail(f"{recipe.origin.source}: datasets of {len(kinds)} types ({', '.join(sorted(kinds))}); the "
                       "checks read every training file with one Axolotl prompt strategy: keep one type per config")
        entry = cfg.datasets[0]
        tokenizer = load_tokenizer(cfg)
        strategy = load_strategy(entry["type"], tokenizer, cfg, entry)
        if strategy is None or not hasattr(strategy, "tokenize_prompt"):
            raise Skip(f"Axolotl's dataset type {entry['type']!r} has no per-row prompt strategy the checks can run")
        super().__init__(strategy.tokenize_prompt, recipe, inputs.tokenizer, inputs.stop_ids, name="axolotl")
        self.method = f"Axolotl {entry['type']}"


# ---- Axolotl's own run ------------------------------------------------------------------------
# Keys the checks set on every run of theirs: nothing leaves the machine, nothing resumes by itself.
UNTRACKED = {"use_wandb": False, "wandb_project": None, "use_mlflow": False, "mlflow_tracking_uri": None,
             "use_comet": False, "use_tensorboard": False, "use_trackio": False, "use_otel_metrics": False,
             "hub_model_id": None, "push_dataset_to_hub": None, "resume_from_checkpoint": None,
             "auto_resume_from_checkpoints": False, "val_set_size": 0, "test_datasets": None,
             "load_best_model_at_end": False, "save_first_step": False, "logging_steps": 1}
# What an error Axolotl raises on this machine says it needs, and how the skip names it.
NEEDS = (("bitsandbytes", "bitsandbytes with a CUDA GPU (an 8-bit or paged optimizer, 4/8-bit loading)"),
         ("flash_attn", "flash-attn on a CUDA GPU"), ("flashattention", "flash-attn on a CUDA GPU"),
         ("triton", "triton on a GPU"), ("cuda", "a CUDA GPU"), ("nccl", "a CUDA GPU"),
         ("liger", "a GPU (Liger kernels)"),
         ("cut_cross_entropy", "a GPU (Cut Cross-Entropy)"))


def needs_accelerator(device, exc: BaseException) -> None:
    """Raise a Skip naming what Axolotl needs when ``exc`` says it cannot run here without an
    accelerator; return when the error is something else (it then fails as itself)."""
    if device.is_accelerator:
        return
    said = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    needed = next((what for word, what in NEEDS if word in said.lower()), None)
    if needed is not None:
        raise Skip(f"Axolotl cannot run this config's step on {device.name} ({said[:300]}): it needs {needed}; "
                   "its preprocessing is checked here, run the model checks on the GPU machine") from None


def run_cfg(recipe, run: RunRows, bounds: Bounds):
    """The team's config for a bounded run of ``run``'s rows: the config's dataset entry (its
    type, fields, roles) over the rows file; its output (checkpoints) in ``run.folder`` and its
    prepared dataset beside the rows (so a resumed run finds it); ``bounds`` over the rest."""
    entries = recipe.origin.value("datasets") or [{}]
    entry = {key: value for key, value in entries[0].items() if key not in ("data_files", "name", "split", "revision")}
    entry.update(path=str(run.rows_file), ds_type="json")
    bounded = bounds.keys("micro_batch_size", "lr_scheduler", warmup_ratio=None)
    if not bounds.shuffle:
        bounded["shuffle_merged_datasets"] = False
    cfg = axolotl_cfg(recipe, datasets=[entry], output_dir=str(run.folder),
                      dataset_prepared_path=str(run.rows_file.parent / "prepared"), **UNTRACKED, **bounded)
    cfg.save_strategy = "steps" if bounds.save_steps else "no"  # load_cfg reads the string "no" as YAML's false
    # datasets >= 4 maps through a process pool even at num_proc = 1; None tokenizes in this process
    cfg.dataset_num_proc = None
    return cfg


def axolotl_trainer(device, cfg, callbacks: Sequence = ()):
    """The Trainer Axolotl builds for ``cfg`` (its dataset preparation, model, adapter,
    collator, optimizer), quiet, with ``callbacks``."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), hf.trainer_warnings():
            from axolotl.common.datasets import load_datasets
            from axolotl.train import setup_model_and_trainer

            trainer = setup_model_and_trainer(cfg, load_datasets(cfg=cfg))[0]
    except (ImportError, RuntimeError, AssertionError, ValueError, OSError) as exc:
        needs_accelerator(device, exc)
        raise Fail(f"Axolotl could not build its trainer for {cfg.axolotl_config_path}: {type(exc).__name__}: "
                   f"{' '.join(str(exc).split())[:600]}") from None
    return hf.quiet(trainer, callbacks)


# Where Axolotl patches the libraries in place while it loads a model (its LoRA kernels replace the
# attention class's forward, its loss and attention patches replace module functions).
PATCHED = ("transformers.models.", "transformers.modeling_", "transformers.integrations.", "transformers.loss.",
           "peft.tuners.")


@contextlib.contextmanager
def patches_undone(recipe):
    """Run Axolotl, then put the library classes and module functions it patched back as they
    were: the engine's runs after it, in the same process, must run the libraries' own code, and
    the next Axolotl run patches them again itself (it checks its own marks, which go too). The
    recipe's model class and peft's LoRA layers are imported first, so that they are restored."""
    import sys

    import peft.tuners.lora  # noqa: F401  (imported to be restored)
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig

    from ..engine.loading import model_source

    source, extra = model_source(recipe)
    config = AutoConfig.from_pretrained(source, trust_remote_code=recipe.model.trust_remote_code, **extra)
    MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)  # imports the model's modeling module
    modules = [m for name, m in list(sys.modules.items()) if m is not None and name.startswith(PATCHED)]
    functions = {m: dict(vars(m)) for m in modules}
    classes = {cls: dict(vars(cls)) for m in modules for cls in list(vars(m).values())
               if isinstance(cls, type) and cls.__module__ == m.__name__}
    try:
        yield
    finally:
        for cls, before in classes.items():
            for name in set(vars(cls)) - set(before):
                delattr(cls, name)
            for name, value in before.items():
                if vars(cls).get(name) is not value:
                    with contextlib.suppress(AttributeError, TypeError):  # read-only slots (__dict__)
                        setattr(cls, name, value)
        for module, before in functions.items():
            module.__dict__.update(before)


class AxolotlTrainer(hf.HFTrainer):
    """Axolotl's own run: the Trainer Axolotl builds from the team's config over the checks' rows."""

    name = "axolotl"
    step_trainer = "axolotl AxolotlTrainer"  # the class axolotl.core.trainers.base builds for SFT
    label = "Axolotl"
    module = "axolotl"
    install = ("pip install axolotl in an environment of its own beside pytest-ftready (it pins transformers and "
               "TRL): python -m venv V && V/bin/pip install torch axolotl pytest-ftready")

    def pipeline(self, inputs: PipelineInputs) -> Pipeline:
        return AxolotlPipeline(inputs)

    @contextlib.contextmanager
    def guarded(self, inputs: RunInputs) -> Iterator[None]:
        """Quiet; the libraries Axolotl patches put back after its run; an error saying it needs
        an accelerator a Skip (``needs_accelerator``)."""
        with patches_undone(inputs.recipe):
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    yield
            except (ImportError, RuntimeError, AssertionError) as exc:
                needs_accelerator(inputs.device, exc)
                raise

    @contextlib.contextmanager
    def built(self, inputs: RunInputs, run: RunRows, bounds: Bounds, callbacks: Sequence = ()) -> Iterator[hf.Built]:
        trainer = axolotl_trainer(inputs.device, run_cfg(inputs.recipe, run, bounds), callbacks)
        yield hf.Built(trainer, trainer.model)
