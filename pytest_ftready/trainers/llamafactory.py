"""LLaMA-Factory: the training examples exactly as LLaMA-Factory builds them from the team's
config (``LlamaFactoryPipeline``), and LLaMA-Factory's own run (``LlamaFactoryTrainer``): its
step, overfit and save-and-resume through the ``CustomSeq2SeqTrainer`` its ``run_sft`` builds.

The config is read by LLaMA-Factory's own argument parsing (``hparams.get_train_args``) with
the keys the checks set themselves replaced: the model at the recipe's path, a bounded run
(``max_steps``, no reporting, no hub), and every path LLaMA-Factory writes (``output_dir``,
``cache_dir``; ``tokenized_path`` dropped) under the run's scratch folder, never the team's.
The rows the checks read are handed to LLaMA-Factory as one dataset: a ``dataset_info.json``
written under scratch describes them with the formatting, columns and tags of the config's
own ``dataset`` entries (in its ``dataset_dir``), so LLaMA-Factory's loader and converter read
them as they read the team's files.

The pipeline: LLaMA-Factory's template (``get_template_and_fix_tokenizer``: the config's
``template``, its stop words and EOS), its loading and converter, and its supervised dataset
processor (``cutoff_len``, ``train_on_prompt``, ``mask_history``, efficient EOS), row by row so
that each example maps back to its row (unpacked: packing does not change labels). Rows it
drops are reported on the row. The labels get the plugin's independent verification
(``data.verify.judge_labels``).

The run: LLaMA-Factory's tokenizer, template, ``get_dataset``, ``load_model`` (its adapter,
gradient checkpointing, upcasting), its ``SFTDataCollatorWith4DAttentionMask`` and its
optimizer and scheduler, as ``run_sft`` builds them; peak memory measured as the engine's
(``hf.measure_step``), losses logged with ``hf.step_logger``, a resume with
``resume_from_checkpoint`` in a fresh process judged by ``hf.resume_difference``.

LLaMA-Factory pins its own transformers and TRL, so it lives in its own environment with the
plugin (see README, "The trainer's own run")."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

from ..data.encoding import Encoded
from ..data.layouts import read_sample
from ..data.verify import IGNORE_INDEX, judge_labels
from ..outcomes import Fail, Skip
from .base import Pipeline, ResumeRun, Trainer, pipeline_stops
from .builtin import resume_steps
from . import hf

DATASET = "ftready_rows"  # the one dataset of the dataset_info.json written under scratch
ENTRY_KEYS = ("formatting", "columns", "tags", "ranking")  # what of a dataset entry shapes the examples
UNCUT = 1 << 30  # a cutoff_len that cuts nothing: the length of a row before truncation
# Config keys the checks set themselves: the data they read, a bounded run, its logs, paths under scratch.
RUN_KEYS = frozenset(("model_name_or_path", "dataset", "dataset_dir", "eval_dataset", "val_size", "tokenized_path",
                      "cache_dir", "media_dir", "max_samples", "streaming", "overwrite_cache",
                      "preprocessing_num_workers", "dataloader_num_workers", "output_dir", "overwrite_output_dir",
                      "max_steps", "num_train_epochs", "save_strategy", "save_steps", "save_total_limit",
                      "save_only_model", "logging_steps", "logging_strategy", "logging_first_step", "report_to",
                      "run_name", "push_to_hub", "hub_model_id", "hub_strategy", "resume_from_checkpoint", "do_eval",
                      "do_predict", "eval_strategy", "eval_steps", "load_best_model_at_end", "plot_loss",
                      "disable_tqdm", "use_cpu", "include_num_input_tokens_seen", "predict_with_generate"))
# Config keys whose run is sharded over processes a launcher starts: not a run one test process can make.
SHARDING_KEYS = ("deepspeed", "fsdp")
# LLaMA-Factory logs every argument and example at INFO (and turns transformers' INFO on); the checks want its warnings.
QUIET_ENV = {"LLAMAFACTORY_VERBOSITY": "WARN"}


def _import(what: str):
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    try:
        import llamafactory  # noqa: F401  (its import fails where torchaudio/torchvision do not match torch)
        return __import__(what, fromlist=["_"])
    except ImportError as exc:
        raise Skip(f"the recipe asks for LLaMA-Factory's own run but llamafactory does not import here "
                   f"({type(exc).__name__}: {exc}); {LlamaFactoryTrainer.install}") from None


def config_of(recipe) -> tuple[Path, dict]:
    """The team's LLaMA-Factory config (its path and YAML mapping)."""
    from ..recipe.importers.base import read_yaml

    origin = recipe.origin
    if origin is None or origin.format != "llamafactory":
        raise Fail("[data] pipeline = \"llamafactory\" needs a LLaMA-Factory config: run "
                   "pytest --ftready=<your llamafactory.yaml>")
    source = Path(origin.source)
    raw = read_yaml(source)
    if (raw.get("stage") or "sft") != "sft":
        raise Fail(f"{source}: stage {raw.get('stage')!r}; the checks run LLaMA-Factory's supervised fine-tune "
                   "(stage: sft) only")
    return source, raw


def dataset_entry(source: Path, raw: dict) -> dict:
    """What of the config's ``dataset`` entries (``dataset_info.json`` in its ``dataset_dir``,
    read from the config's folder as the importer reads it) shapes the examples."""
    from ..recipe.importers.llamafactory import DATASET_DIR

    names = raw.get("dataset")
    names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names or ())
    info_path = source.parent / (raw.get("dataset_dir") or DATASET_DIR) / "dataset_info.json"
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Skip(f"LLaMA-Factory's own pipeline reads the config's datasets as {info_path} describes them, and it "
                   f"cannot be read ({type(exc).__name__}); set dataset_dir in {source.name} to the folder holding "
                   "dataset_info.json") from None
    shapes = {json.dumps({k: info.get(n, {}).get(k) for k in ENTRY_KEYS if k in info.get(n, {})}, sort_keys=True)
              for n in names}
    if len(shapes) != 1:
        raise Fail(f"{source}: datasets {', '.join(names)} are described with {len(shapes)} different formattings, "
                   f"columns or tags in {info_path}; the checks hand every training file to LLaMA-Factory as one "
                   "dataset: keep one description per config")
    return json.loads(shapes.pop())


def write_rows(folder: Path, rows: Sequence[dict], entry: dict) -> Path:
    """``rows`` as LLaMA-Factory's dataset ``DATASET`` in ``folder`` (rows.jsonl + dataset_info.json)."""
    from ..files import write_private

    hf.write_rows(folder, rows)
    write_private(folder / "dataset_info.json", json.dumps({DATASET: {**entry, "file_name": hf.ROWS_FILE}}))
    return folder


def train_args(recipe, data_folder: Path, output_dir: Path, torch_device: str, **bounded) -> tuple:
    """LLaMA-Factory's own parsing (``get_train_args``) of the team's config, the keys of
    ``RUN_KEYS`` set by the checks, ``bounded`` over them: (model, data, training, finetuning,
    generating) arguments."""
    parser = _import("llamafactory.hparams")
    import transformers

    _, raw = config_of(recipe)
    # sharding keys are left out: the preprocessing does not depend on them, the own run skips on them (sft_trainer)
    args: dict[str, Any] = {k: v for k, v in raw.items() if k not in RUN_KEYS and k not in SHARDING_KEYS}
    model = str(Path(recipe.model.path).resolve()) if recipe.model.path else raw.get("model_name_or_path")
    args.update(model_name_or_path=model, dataset=DATASET, dataset_dir=str(data_folder), do_train=True,
                cache_dir=str(output_dir / "cache"), overwrite_cache=True, preprocessing_num_workers=None,
                dataloader_num_workers=0, output_dir=str(output_dir), overwrite_output_dir=True, report_to="none",
                logging_steps=1, disable_tqdm=True, save_strategy="no", plot_loss=False,
                use_cpu=not torch_device.startswith(("cuda", "mps")), include_num_input_tokens_seen=True)
    args.update(bounded)
    verbosity = transformers.utils.logging.get_verbosity()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return parser.get_train_args(args)
    except (ValueError, TypeError) as exc:
        raise Fail(f"LLaMA-Factory refuses this config ({recipe.origin.source}): {' '.join(str(exc).split())}") from None
    finally:  # get_train_args turns transformers' INFO logging on for the whole process
        transformers.utils.logging.set_verbosity(verbosity)


@contextlib.contextmanager
def rows_unlogged():
    """LLaMA-Factory's converter and processor log a row they reject in full, and its loader prints
    the first example: user data, which the checks report through their own redacting outputs only."""
    import logging

    root = logging.getLogger("llamafactory")
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def tokenizer_and_template(model_args, data_args) -> tuple[dict, Any]:
    """LLaMA-Factory's tokenizer (``load_tokenizer``) and the config's template, which sets the
    tokenizer's EOS and stop words (``get_template_and_fix_tokenizer``)."""
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.model import load_tokenizer

    module = load_tokenizer(model_args)
    return module, get_template_and_fix_tokenizer(module["tokenizer"], data_args)


class LlamaFactoryPipeline(Pipeline):
    """Each row through LLaMA-Factory's loader, converter and supervised processor."""

    name = "llamafactory"

    def __init__(self, state) -> None:
        self.recipe, self.tok, self.stop_ids, self.scratch = state.recipe, state.tokenizer, pipeline_stops(state), state.scratch
        source, raw = config_of(self.recipe)
        self.entry = dataset_entry(source, raw)
        self.folder = Path(tempfile.mkdtemp(prefix="llamafactory-data-", dir=self.scratch))
        self.args = train_args(self.recipe, self.folder, self.folder / "out", state.torch_device)
        self.tokenizer_module, self.template = tokenizer_and_template(self.args[0], self.args[1])
        self.method = f"LLaMA-Factory template {self.args[1].template}"

    def _prepared(self, folder: Path, cutoff_len: int) -> dict[int, tuple[list, list]]:
        from llamafactory.data.loader import _get_dataset_processor, _get_merged_dataset

        model_args, data_args, training_args = self.args[:3]
        data_args = copy.copy(data_args)
        data_args.dataset_dir, data_args.cutoff_len = str(folder), cutoff_len
        # unpacked, so that each example is one row: packing joins the rows its processor encoded one by one, with
        # the cutoff_len its arguments set for packing (one token less), without changing their labels
        data_args.packing = data_args.neat_packing = False
        tokenizer = self.tokenizer_module["tokenizer"]
        processor = _get_dataset_processor(data_args, "sft", self.template, tokenizer, self.tokenizer_module["processor"])
        out = {}
        with rows_unlogged():
            rows = _get_merged_dataset(data_args.dataset, model_args, data_args, training_args, stage="sft")
            for i, example in enumerate(rows):  # the batch LLaMA-Factory maps, one row at a time: a dropped row shows
                made = processor.preprocess_dataset({key: [value] for key, value in example.items()})
                if made["input_ids"]:
                    out[i] = (list(made["input_ids"][0]), list(made["labels"][0]))
        return out

    def encode(self, rows: Sequence) -> list[Encoded]:
        if not rows:
            return []
        data = self.recipe.data
        with tempfile.TemporaryDirectory(prefix="rows-", dir=self.folder) as folder:
            write_rows(Path(folder), [row.data for row in rows], self.entry)
            kept = self._prepared(Path(folder), self.args[1].cutoff_len)
            full = self._prepared(Path(folder), UNCUT)
        out = []
        for i, row in enumerate(rows):
            if i not in kept:
                detail = ("LLaMA-Factory drops this row (\"Dropped invalid example\"): after its converter the turns "
                          "must alternate user and assistant and end with an assistant turn")
                out.append(Encoded(row, (), (), self.method, 0, 0, (("no_supervised", detail),)))
                continue
            ids, labels = kept[i]
            whole_ids, whole_labels = full[i]
            trained_full = sum(1 for label in whole_labels if label != IGNORE_INDEX)
            problems = judge_labels(self.tok, read_sample(row, data.format, data.train_on, data.roles)[0], data.train_on,
                                    ids, labels, self.stop_ids, full_length=len(whole_ids))
            out.append(Encoded(row, tuple(ids), tuple(labels), self.method, len(whole_ids), trained_full,
                               tuple(problems)))
        return out


# ---- LLaMA-Factory's own run ---------------------------------------------------------------------
def sft_trainer(recipe, rows: Sequence[dict], folder: Path, torch_device: str, callbacks: Sequence = (), **bounded):
    """The ``CustomSeq2SeqTrainer`` LLaMA-Factory's ``run_sft`` builds for the config over ``rows``
    (its dataset, model and adapter, collator; output under ``folder``), and its model."""
    import datasets

    _import("llamafactory.train.sft.trainer")
    from llamafactory.data import SFTDataCollatorWith4DAttentionMask, get_dataset
    from llamafactory.extras.constants import IGNORE_INDEX as LF_IGNORE
    from llamafactory.model import load_model
    from llamafactory.train.sft.trainer import CustomSeq2SeqTrainer

    source, raw = config_of(recipe)
    sharded = [key for key in SHARDING_KEYS if raw.get(key)]
    if sharded:
        raise Skip(f"{source.name} shards the run ({', '.join(sharded)}): LLaMA-Factory's own step then runs in the "
                   "processes its launcher starts (llamafactory-cli train on the GPU machine), not in one test "
                   "process; the data checks still judge its preprocessing and the [distributed] checks its sharding")
    data_folder = write_rows(folder / "data", rows, dataset_entry(source, raw))
    model_args, data_args, training_args, finetuning_args, _ = train_args(recipe, data_folder, folder, torch_device,
                                                                          **bounded)
    tokenizer_module, template = tokenizer_and_template(model_args, data_args)
    tokenizer = tokenizer_module["tokenizer"]
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bar()
    try:
        with rows_unlogged():
            dataset_module = get_dataset(template, model_args, data_args, training_args, stage="sft",
                                         **tokenizer_module)
    finally:
        if bars:
            datasets.enable_progress_bar()
    model = load_model(tokenizer, model_args, finetuning_args, is_trainable=True)
    collator = SFTDataCollatorWith4DAttentionMask(  # as run_sft builds it for training
        template=template, model=model, pad_to_multiple_of=8,
        label_pad_token_id=LF_IGNORE if data_args.ignore_pad_token_for_loss else tokenizer.pad_token_id,
        block_diag_attn=model_args.block_diag_attn, neat_packing=data_args.neat_packing,
        attn_implementation=getattr(model.config, "_attn_implementation", None),
        compute_dtype=model_args.compute_dtype, **tokenizer_module)
    trainer = CustomSeq2SeqTrainer(model=model, args=training_args, finetuning_args=finetuning_args,
                                   data_collator=collator, callbacks=list(callbacks), gen_kwargs={},
                                   **dataset_module, **tokenizer_module)
    hf.quiet(trainer)
    return trainer, model


def resume_bounds(recipe, steps: int) -> dict:
    return {"max_steps": steps, "save_strategy": "steps", "save_steps": steps // 2, "save_total_limit": None}


class LlamaFactoryTrainer(Trainer):
    name = "llamafactory"
    step_trainer = "llamafactory CustomSeq2SeqTrainer"
    module = "llamafactory"
    install = ("pip install llamafactory in an environment of its own beside pytest-ftready (it pins transformers and "
               "TRL; see README, \"The trainer's own run\")")

    def pipeline(self, state) -> Pipeline:
        return LlamaFactoryPipeline(state)

    def step(self, state):
        """The worst-case micro-batch (the longest rows) through one step of LLaMA-Factory's trainer
        (``hf.measure_step``): its collator pads, its optimizer steps."""
        with tempfile.TemporaryDirectory(prefix="llamafactory-step-", dir=state.scratch) as out:
            trainer, model = sft_trainer(state.recipe, hf.row_data(hf.worst_case_examples(state)), Path(out),
                                         state.torch_device, max_steps=1, gradient_accumulation_steps=1,
                                         lr_scheduler_type="constant", warmup_steps=0,
                                         disable_shuffling=True)
            return hf.measure_step(state, trainer, model)

    def overfit(self, state):
        """The first ``overfit_examples`` rows, all of them in every optimizer step, through
        LLaMA-Factory's trainer at a constant learning rate until the loss threshold or ``overfit_steps``."""
        recipe, device, checks = state.recipe, state.torch_device, state.recipe.checks
        examples = state.training_examples()[: checks.overfit_examples]
        mb = recipe.training.micro_batch_size
        logger = hf.step_logger(stop_below=checks.overfit_loss)
        state.progress(f"model.overfit: LLaMA-Factory's trainer, up to {checks.overfit_steps} steps", force=True)
        with tempfile.TemporaryDirectory(prefix="llamafactory-overfit-", dir=state.scratch) as out:
            trainer, model = sft_trainer(recipe, hf.row_data(examples), Path(out), device, [logger],
                                         max_steps=checks.overfit_steps, per_device_train_batch_size=mb,
                                         gradient_accumulation_steps=math.ceil(len(examples) / mb),
                                         lr_scheduler_type="constant", warmup_steps=0)
            before = hf.weights_before(model)
            hf.train(trainer)
            return hf.judged_overfit(state, model, examples, logger.logs, before)

    def saved_run(self, state) -> hf.SavedRun:
        """``steps`` uninterrupted steps of LLaMA-Factory's trainer, checkpointed by it at ``steps // 2``."""
        from ..files import ensure_private_dir, write_private

        recipe = state.recipe
        t = recipe.training
        steps = resume_steps(recipe)
        examples = state.training_examples()[: max(2, t.micro_batch_size * t.gradient_accumulation_steps * steps)]
        folder = ensure_private_dir(state.scratch / "llamafactory-resume")
        rows = hf.row_data(examples)
        write_private(folder / "rows.json", json.dumps(rows))
        logger = hf.step_logger()
        state.progress(f"lifecycle.resume: {steps} steps of LLaMA-Factory's trainer, a checkpoint at step {steps // 2}",
                       force=True)
        trainer, _ = sft_trainer(recipe, rows, folder, state.torch_device, [logger], **resume_bounds(recipe, steps))
        hf.train(trainer)
        return hf.saved(folder, steps, logger.logs, not state.device.is_accelerator, "LLaMA-Factory")

    def resume(self, state, saved: hf.SavedRun) -> ResumeRun:
        return hf.resumed_in_fresh_process(state, "llamafactory", saved, "LLaMA-Factory")

    def resume_here(self, recipe, folder: Path, checkpoint: Path, steps: int, torch_device: str) -> list:
        """In the fresh process: the same trainer over the same rows, resumed from ``checkpoint``
        with ``resume_from_checkpoint``; the logs of the steps it trains."""
        rows = json.loads((folder / "rows.json").read_text())
        logger = hf.step_logger()
        trainer, _ = sft_trainer(recipe, rows, folder / "resumed", torch_device, [logger],
                                 **resume_bounds(recipe, steps))
        hf.train(trainer, resume_from_checkpoint=str(checkpoint))
        return [log.to_list() for log in logger.logs]
