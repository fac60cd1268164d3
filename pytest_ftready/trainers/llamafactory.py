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
plugin (see docs/trainers.md, "The trainer's own run")."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..data.encoding import Encoded
from ..data.layouts import read_sample
from ..data.verify import IGNORE_INDEX, judge_labels
from ..outcomes import Fail, Skip
from .base import Bounds, Pipeline, PipelineInputs, RunInputs, RunRows
from . import hf

DATASET = "ftready_rows"  # the one dataset of the dataset_info.json written under scratch
UNCUT = 1 << 30  # a cutoff_len that cuts nothing: the length of a row before truncation
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


def config_of(recipe):
    """The team's LLaMA-Factory config as its translation kept it (recipe.importers)."""
    origin = recipe.origin
    if origin is None or origin.format != "llamafactory":
        raise Fail("[data] pipeline = \"llamafactory\" needs a LLaMA-Factory config: run "
                   "pytest --ftready=<your llamafactory.yaml>")
    return origin


def dataset_entry(origin) -> dict:
    """What of the config's ``dataset`` entries shapes the examples (their formatting, columns and
    tags in ``dataset_info.json``, as the importer read them)."""
    if origin.input("dataset_entry_mixed"):
        raise Fail(origin.input("dataset_entry_mixed"))
    entry = origin.input("dataset_entry")
    if entry is None:
        raise Skip(origin.input("dataset_entry_unreadable", "LLaMA-Factory's own pipeline reads the config's datasets "
                                "as dataset_info.json describes them, and none was read"))
    return entry


def write_rows(run: RunRows, entry: dict) -> Path:
    """``run``'s rows as LLaMA-Factory's dataset ``DATASET``: a ``dataset_info.json`` beside the rows
    file describing it; the folder to hand LLaMA-Factory as ``dataset_dir``."""
    from ..files import write_private

    folder = run.rows_file.parent
    write_private(folder / "dataset_info.json", json.dumps({DATASET: {**entry, "file_name": run.rows_file.name}}))
    return folder


def train_args(recipe, data_folder: Path, output_dir: Path, torch_device: str, **bounded) -> tuple:
    """LLaMA-Factory's own parsing (``get_train_args``) of the team's config, the keys its key
    table marks as set by the checks set here, ``bounded`` over them: (model, data, training,
    finetuning, generating) arguments."""
    parser = _import("llamafactory.hparams")
    import transformers

    origin = config_of(recipe)
    # what the key table hands LLaMA-Factory's run: not the keys set here, nor the sharding keys (the preprocessing
    # does not depend on them, the own run skips on them: sft_trainer)
    args: dict[str, Any] = origin.handed()
    model = str(Path(recipe.model.path).resolve()) if recipe.model.path else origin.value("model_name_or_path")
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
        raise Fail(f"LLaMA-Factory refuses this config ({recipe.origin.source}): "
                   f"{' '.join(str(exc).split())}") from None
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

    def __init__(self, inputs: PipelineInputs) -> None:
        self.recipe, self.tok = inputs.recipe, inputs.tokenizer
        self.stop_ids, self.scratch = inputs.stop_ids, inputs.scratch
        self.entry = dataset_entry(config_of(self.recipe))
        self.folder = Path(tempfile.mkdtemp(prefix="llamafactory-data-", dir=self.scratch))
        self.args = train_args(self.recipe, self.folder, self.folder / "out", inputs.torch_device)
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
        processor = _get_dataset_processor(data_args, "sft", self.template, tokenizer,
                                           self.tokenizer_module["processor"])
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
            data_dir = write_rows(RunRows.write(Path(folder), [row.data for row in rows]), self.entry)
            kept = self._prepared(data_dir, self.args[1].cutoff_len)
            full = self._prepared(data_dir, UNCUT)
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
            problems = judge_labels(self.tok, read_sample(row, data.format, data.train_on, data.roles)[0],
                                    data.train_on,
                                    ids, labels, self.stop_ids, full_length=len(whole_ids))
            out.append(Encoded(row, tuple(ids), tuple(labels), self.method, len(whole_ids), trained_full,
                               tuple(problems)))
        return out


# ---- LLaMA-Factory's own run ---------------------------------------------------------------------
def sft_trainer(recipe, run: RunRows, torch_device: str, callbacks: Sequence = (), **bounded):
    """The ``CustomSeq2SeqTrainer`` LLaMA-Factory's ``run_sft`` builds for the config over ``run``'s
    rows (its dataset, model and adapter, collator; output under ``run.folder``), and its model."""
    import datasets

    _import("llamafactory.train.sft.trainer")
    from llamafactory.data import SFTDataCollatorWith4DAttentionMask, get_dataset
    from llamafactory.extras.constants import IGNORE_INDEX as LF_IGNORE
    from llamafactory.model import load_model
    from llamafactory.train.sft.trainer import CustomSeq2SeqTrainer

    origin = config_of(recipe)
    sharded = origin.sharding()
    if sharded:
        raise Skip(f"{Path(origin.source).name} shards the run ({', '.join(sharded)}): LLaMA-Factory's own step then "
                   "runs in the processes its launcher starts (llamafactory-cli train on the GPU machine), not in one "
                   "test process; the data checks still judge its preprocessing and the [distributed] checks its "
                   "sharding")
    data_folder = write_rows(run, dataset_entry(origin))
    model_args, data_args, training_args, finetuning_args, _ = train_args(recipe, data_folder, run.folder,
                                                                          torch_device, **bounded)
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
    return hf.quiet(trainer), model


class LlamaFactoryTrainer(hf.HFTrainer):
    """LLaMA-Factory's own run: the trainer its ``run_sft`` builds from the team's config over the
    checks' rows."""

    name = "llamafactory"
    step_trainer = "llamafactory CustomSeq2SeqTrainer"
    label = "LLaMA-Factory"
    module = "llamafactory"
    install = ("pip install llamafactory in an environment of its own beside pytest-ftready (it pins transformers and "
               "TRL; see docs/trainers.md, \"The trainer's own run\")")

    def pipeline(self, inputs: PipelineInputs) -> Pipeline:
        return LlamaFactoryPipeline(inputs)

    @contextlib.contextmanager
    def built(self, inputs: RunInputs, run: RunRows, bounds: Bounds, callbacks: Sequence = ()) -> Iterator[hf.Built]:
        bounded = hf.training_arguments(bounds)
        if not bounds.shuffle:
            bounded["disable_shuffling"] = True
        yield hf.Built(*sft_trainer(inputs.recipe, run, inputs.torch_device, callbacks, **bounded))
