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
(see README, "The trainer's own run"); importing it costs 15 to 60 s."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Sequence

from ..outcomes import Fail, Skip
from .base import FunctionPipeline, Pipeline, ResumeRun, Trainer, pipeline_stops
from .builtin import resume_steps
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

    def __init__(self, state) -> None:
        from axolotl.loaders import load_tokenizer
        from axolotl.prompt_strategies import load as load_strategy

        recipe = state.recipe
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
        super().__init__(strategy.tokenize_prompt, recipe, state.tokenizer, pipeline_stops(state), name="axolotl")
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
         ("triton", "triton on a GPU"), ("cuda", "a CUDA GPU"), ("nccl", "a CUDA GPU"), ("liger", "a GPU (Liger kernels)"),
         ("cut_cross_entropy", "a GPU (Cut Cross-Entropy)"))


def needs_accelerator(state, exc: BaseException) -> None:
    """Raise a Skip naming what Axolotl needs when ``exc`` says it cannot run here without an
    accelerator; return when the error is something else (it then fails as itself)."""
    if state.device.is_accelerator:
        return
    said = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    needed = next((what for word, what in NEEDS if word in said.lower()), None)
    if needed is not None:
        raise Skip(f"Axolotl cannot run this config's step on {state.device.name} ({said[:300]}): it needs {needed}; "
                   "its preprocessing is checked here, run the model checks on the GPU machine") from None


def run_cfg(recipe, folder: Path, **bounded):
    """The team's config for a bounded run of the rows in ``folder/rows.jsonl``: the config's
    dataset entry (its type, fields, roles) over that file; its output (checkpoints) in ``folder``
    and its prepared dataset under it; ``bounded`` (steps, saving) over the rest."""
    from ..recipe.importers.base import read_yaml

    entries = read_yaml(config_path(recipe)).get("datasets") or [{}]
    entry = {key: value for key, value in entries[0].items() if key not in ("data_files", "name", "split", "revision")}
    entry.update(path=str(folder / hf.ROWS_FILE), ds_type="json")
    save_strategy = bounded.pop("save_strategy")  # load_cfg reads the string "no" as YAML's false
    cfg = axolotl_cfg(recipe, datasets=[entry], output_dir=str(folder),
                      dataset_prepared_path=str(folder / "prepared"), **UNTRACKED, **bounded)
    cfg.save_strategy = save_strategy
    # datasets >= 4 maps through a process pool even at num_proc = 1; None tokenizes in this process
    cfg.dataset_num_proc = None
    return cfg


def axolotl_trainer(state, cfg, callbacks: Sequence = ()):
    """The Trainer Axolotl builds for ``cfg`` (its dataset preparation, model, adapter,
    collator, optimizer), quiet, with ``callbacks``."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), hf.trainer_warnings():
            from axolotl.common.datasets import load_datasets
            from axolotl.train import setup_model_and_trainer

            trainer = setup_model_and_trainer(cfg, load_datasets(cfg=cfg))[0]
    except (ImportError, RuntimeError, AssertionError, ValueError, OSError) as exc:
        if state is not None:
            needs_accelerator(state, exc)
        raise Fail(f"Axolotl could not build its trainer for {cfg.axolotl_config_path}: {type(exc).__name__}: "
                   f"{' '.join(str(exc).split())[:600]}") from None
    hf.quiet(trainer)
    for callback in callbacks:
        trainer.add_callback(callback)
    return trainer


def train(state, trainer, **kwargs) -> None:
    """``hf.train``, quiet; an error saying Axolotl needs an accelerator skips (``needs_accelerator``)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            hf.train(trainer, **kwargs)
    except (ImportError, RuntimeError, AssertionError) as exc:
        if state is not None:
            needs_accelerator(state, exc)
        raise


def measured(state, trainer):
    """``hf.measure_step`` of Axolotl's Trainer; an error saying it needs an accelerator skips."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return hf.measure_step(state, trainer, trainer.model)
    except (ImportError, RuntimeError, AssertionError) as exc:
        needs_accelerator(state, exc)
        raise


def resume_cfg(recipe, folder: Path, steps: int):
    return run_cfg(recipe, folder, max_steps=steps, save_strategy="steps", save_steps=steps // 2,
                   save_total_limit=None)


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


class AxolotlTrainer(Trainer):
    name = "axolotl"
    step_trainer = "axolotl AxolotlTrainer"  # the class axolotl.core.trainers.base builds for SFT
    module = "axolotl"
    install = ("pip install axolotl in an environment of its own beside pytest-ftready (it pins transformers and "
               "TRL): python -m venv V && V/bin/pip install torch axolotl pytest-ftready")

    def pipeline(self, state) -> Pipeline:
        return AxolotlPipeline(state)

    def step(self, state):
        """The worst-case micro-batch (the longest rows) through one step of Axolotl's Trainer
        (``hf.measure_step``)."""
        import tempfile

        state.progress("model.step_memory: one step of Axolotl's own Trainer", force=True)
        with tempfile.TemporaryDirectory(prefix="axolotl-step-", dir=state.scratch) as out, patches_undone(state.recipe):
            folder = Path(out)
            hf.write_rows(folder, hf.row_data(hf.worst_case_examples(state)))
            cfg = run_cfg(state.recipe, folder, max_steps=1, save_strategy="no", gradient_accumulation_steps=1,
                          shuffle_merged_datasets=False)
            trainer = axolotl_trainer(state, cfg)
            return measured(state, trainer)

    def overfit(self, state):
        """The first ``overfit_examples`` rows, all of them in every optimizer step, through
        Axolotl's Trainer at a constant learning rate until the loss threshold or ``overfit_steps``."""
        import math

        recipe, checks = state.recipe, state.recipe.checks
        examples = state.training_examples()[: checks.overfit_examples]
        if not examples:
            raise Fail("no trainable example to overfit (see data.masking)")
        logger = hf.step_logger(stop_below=checks.overfit_loss)
        state.progress(f"model.overfit: Axolotl's Trainer, up to {checks.overfit_steps} steps", force=True)
        folder = state.scratch / "axolotl-overfit"
        hf.write_rows(folder, hf.row_data(examples))
        cfg = run_cfg(recipe, folder, max_steps=checks.overfit_steps, save_strategy="no",
                      gradient_accumulation_steps=math.ceil(len(examples) / recipe.training.micro_batch_size),
                      lr_scheduler="constant", warmup_steps=0, warmup_ratio=None)
        with patches_undone(recipe):
            trainer = axolotl_trainer(state, cfg, [logger])
            before = hf.weights_before(trainer.model)
            train(state, trainer)
            return hf.judged_overfit(state, trainer.model, examples, logger.logs, before)

    def saved_run(self, state) -> hf.SavedRun:
        """``steps`` uninterrupted steps of Axolotl's Trainer, checkpointed by it at ``steps // 2``."""
        recipe = state.recipe
        t = recipe.training
        steps = resume_steps(recipe)
        examples = state.training_examples()[: max(2, t.micro_batch_size * t.gradient_accumulation_steps * steps)]
        folder = state.scratch / "axolotl-resume"
        hf.write_rows(folder, hf.row_data(examples))
        logger = hf.step_logger()
        state.progress(f"lifecycle.resume: {steps} steps of Axolotl's Trainer, a checkpoint at step {steps // 2}",
                       force=True)
        with patches_undone(recipe):
            train(state, axolotl_trainer(state, resume_cfg(recipe, folder, steps), [logger]))
        return hf.saved(folder, steps, logger.logs, not state.device.is_accelerator, "Axolotl")

    def resume(self, state, saved: hf.SavedRun) -> ResumeRun:
        return hf.resumed_in_fresh_process(state, "axolotl", saved, "Axolotl")

    def resume_here(self, recipe, folder: Path, checkpoint: Path, steps: int, torch_device: str) -> list:
        """In the fresh process: the same config over the same rows (Axolotl finds the dataset it
        prepared), resumed from ``checkpoint`` with ``resume_from_checkpoint``; the logs of the
        steps it trains."""
        logger = hf.step_logger()
        cfg = resume_cfg(recipe, folder, steps)
        cfg.output_dir = str(folder / "resumed")
        train(None, axolotl_trainer(None, cfg, [logger]), resume_from_checkpoint=str(checkpoint))
        return [log.to_list() for log in logger.logs]
