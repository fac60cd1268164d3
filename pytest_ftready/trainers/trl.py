"""TRL: the training examples exactly as TRL's ``SFTTrainer`` prepares them (``TrlPipeline``),
and TRL's own run (``TrlTrainer``): its step, overfit and save-and-resume through an
``SFTTrainer`` with the config's SFTConfig settings (optimizer, scheduler, collator,
gradient checkpointing), bounded by ``max_steps``.

The pipeline: chat template or TRL's substituted training template, ``assistant_only_loss``,
``completion_only_loss``, EOS handling, truncation, produced by TRL's own code: an
``SFTTrainer`` is built over the rows and its prepared ``train_dataset`` and ``data_collator``
are read. Nothing is re-implemented here. Data preparation reads the tokenizer, not the
weights, so that trainer is built over a two-layer stand-in model with the tokenizer's
vocabulary (loading an 8B model to tokenize would cost minutes). Rows are prepared unpacked
and unshuffled so each example maps back to its row; packing does not change labels, TRL's
collator is used for batches.

The run: the recipe's model with the recipe's adapter (the engine's ``trainable``) handed to
an ``SFTTrainer`` over the raw rows, so TRL tokenizes, collates, steps and checkpoints them
itself; a resume is ``trainer.train(resume_from_checkpoint=...)`` in a fresh process.

``trl`` is optional (``pip install 'pytest-ftready[trl]'``); without it the checks that need it skip."""

from __future__ import annotations

import contextlib
import copy
import math
import tempfile
import warnings
from pathlib import Path
from typing import Iterator, Optional, Sequence

from ..data.encoding import Encoded
from ..data.layouts import layout_of, read_sample
from ..data.verify import IGNORE_INDEX, judge_labels
from ..outcomes import Fail, Skip
from .base import Bounds, Pipeline, PipelineInputs, RunInputs, RunRows
from . import hf

ROW_KEY = "ftready_row"
FIXES = ("Fix it one of these ways: (1) give TRL a training template whose assistant turns sit inside "
         "{% generation %} ... {% endgeneration %} (chat_template_path: a .jinja file, or [data] chat_template in "
         "ftready.toml); (2) use prompt-completion rows with completion_only_loss: true; (3) build labels with "
         "pytest-ftready's prefix-diff encoder (pytest_ftready.data.encoding.Encoder) and pass them in a 'labels' "
         "column with dataset_kwargs: {skip_prepare_dataset: true} and a custom collator")


CONVERSATIONS = ("messages", "sharegpt")  # layouts TRL trains as conversations
PROMPT_COMPLETION = ("prompt_completion",)  # strings or message lists


class TrainerRefused(ValueError):
    """TRL would not start on this recipe: the message says what TRL said and how to fix it."""


def sft_settings(recipe, layout: Optional[str] = None) -> dict:
    """The SFTConfig data settings of the recipe for rows of ``layout`` (the recipe's format, or
    the layout the rows show under format = "auto"); a TRL config's own data keys win."""
    data = recipe.data
    layout = layout or data.format
    settings = {"max_length": data.max_length, "packing": bool(data.packing),
                "assistant_only_loss": layout in CONVERSATIONS and data.train_on in ("assistant", "last_assistant"),
                "completion_only_loss": layout in PROMPT_COMPLETION and data.train_on == "completion"}
    origin = recipe.origin
    if origin is not None and origin.format == "trl":  # the config's own keys that shape the examples
        settings.update(origin.handed_to_preprocessing())
    return settings


MIN_TRL = "1.9"  # the oldest TRL these checks were run with (1.9 beside Axolotl 0.19, 1.16); 0.24 lacks shuffle_dataset


def trl_classes():
    """TRL's SFTConfig and SFTTrainer, or a Skip that says what to install."""
    try:
        import trl
        from trl import SFTConfig, SFTTrainer
    except ImportError as exc:
        raise Skip(f"the recipe trains with TRL but trl is not installed ({exc}); "
                   "pip install 'pytest-ftready[trl]'") from None
    from packaging.version import Version

    if Version(trl.__version__) < Version(MIN_TRL):
        raise Skip(f"the recipe trains with TRL but TRL {trl.__version__} is older than the {MIN_TRL} these checks "
                   f"need; pip install 'trl>={MIN_TRL}' (where another trainer pins it lower, check the TRL run in an "
                   "environment of its own)")
    return SFTConfig, SFTTrainer


class TrlPipeline(Pipeline):
    name = "trl"

    def __init__(self, recipe, tokenizer, stop_ids: frozenset[int]) -> None:
        self.recipe, self.tok, self.stop_ids = recipe, tokenizer, stop_ids
        self.settings = sft_settings(recipe)
        self.method = "TRL SFTTrainer"
        self.substituted_template: Optional[str] = None
        self._collator = None

    def _trainer(self, rows: Sequence, max_length):
        import datasets
        import pyarrow
        from transformers import LlamaConfig, LlamaForCausalLM

        SFTConfig, SFTTrainer = trl_classes()
        try:
            table = datasets.Dataset.from_list([{**row.data, ROW_KEY: i} for i, row in enumerate(rows)])
        except (TypeError, ValueError, pyarrow.ArrowException) as exc:
            raise ValueError(f"the rows do not form one datasets.Dataset, as TRL needs them ({type(exc).__name__}: "
                             f"{exc}); TRL's load_dataset would fail the same way: give every row the same fields "
                             "and types") from None
        if self.recipe.data.format == "auto" and rows:  # TRL decides from the rows' fields too
            self.settings = sft_settings(self.recipe, layout_of(rows[0].data))
        tok = copy.deepcopy(self.tok)  # TRL sets eos/pad tokens on the tokenizer it gets
        stand_in = LlamaForCausalLM(LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                                num_attention_heads=1, num_key_value_heads=1, vocab_size=len(tok),
                                                max_position_embeddings=max(16, max_length or 0)))
        settings = {**self.settings, "max_length": max_length, "packing": False, "padding_free": False}
        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bar()
        try:
            with tempfile.TemporaryDirectory(prefix="ftready-trl-") as out, warnings.catch_warnings():
                # TRL's own defaults trip transformers' deprecations (gradient_checkpointing): not the user's
                warnings.simplefilter("ignore", FutureWarning)
                args = SFTConfig(output_dir=out, use_cpu=True, report_to="none", shuffle_dataset=False,
                                 dataset_num_proc=None, **settings)
                return SFTTrainer(model=stand_in, args=args, train_dataset=table, processing_class=tok)
        except (ValueError, RuntimeError) as exc:
            import trl

            said = " ".join(str(exc).split())
            raise TrainerRefused(f"TRL {trl.__version__} refuses to start on this recipe (SFTTrainer raised "
                                 f"{type(exc).__name__}: {said}). {FIXES}") from None
        finally:
            if bars:
                datasets.enable_progress_bar()

    def _prepared(self, rows: Sequence, max_length) -> dict[int, tuple[list[int], list[int]]]:
        trainer = self._trainer(rows, max_length)
        if max_length is not None:
            self.substituted_template = trainer.chat_template
            self._collator = trainer.data_collator
            if trainer.chat_template:
                self.method = "TRL SFTTrainer with TRL's substituted training template"
        prepared = trainer.train_dataset
        return {int(i): (list(ids), list(labels)) for i, ids, labels in
                zip(prepared[ROW_KEY], prepared["input_ids"], prepared["labels"])}

    def encode(self, rows: Sequence) -> list[Encoded]:
        if not rows:
            return []
        kept = self._prepared(rows, self.recipe.data.max_length)
        full = self._prepared(rows, None)
        data = self.recipe.data
        out = []
        for i, row in enumerate(rows):
            whole_ids, whole_labels = full.get(i, ((), ()))
            trained_full = sum(1 for label in whole_labels if label != IGNORE_INDEX)
            if i not in kept:  # TRL drops rows left without a trained token
                kind = "truncated_all" if trained_full else "no_supervised"
                detail = (f"TRL drops this row: max_length {data.max_length} leaves none of its {trained_full} trained "
                          f"tokens ({len(whole_ids)} tokens)" if trained_full else "TRL trains no token of this row")
                out.append(Encoded(row, (), (), self.method, len(whole_ids), trained_full, ((kind, detail),)))
                continue
            ids, labels = kept[i]
            problems = judge_labels(self.tok, read_sample(row, data.format, data.train_on, data.roles)[0],
                                    data.train_on, ids, labels, self.stop_ids,
                                    full_length=len(whole_ids) or None)
            out.append(Encoded(row, tuple(ids), tuple(labels), self.method, len(whole_ids) or len(ids),
                               trained_full, tuple(problems)))
        return out

    def collate(self, examples: Sequence[Encoded], pad_id: int) -> dict:
        """A batch made by TRL's own collator (padding-free when the config says so)."""
        if self._collator is None:
            return super().collate(examples, pad_id)
        collator = copy.copy(self._collator)
        collator.padding_free = bool(self.settings.get("padding_free")) or (
            bool(self.settings.get("packing")) and self.settings.get("packing_strategy", "bfd") in ("bfd", "bfd_split"))
        return collator([{"input_ids": list(e.input_ids), "labels": list(e.labels)} for e in examples])


# ---- TRL's own run ---------------------------------------------------------------------------
OPTIM = {"adamw": "adamw_torch", "adamw_8bit": "adamw_bnb_8bit", "paged_adamw": "paged_adamw_32bit",
         "paged_adamw_8bit": "paged_adamw_8bit", "sgd": "sgd", "adafactor": "adafactor"}


def run_args(recipe, output_dir: Path, torch_device: str, **bounded):
    """The SFTConfig of the team's run: the recipe's training settings, a TRL config's own
    SFTConfig keys over them (collator, optimizer, kernels: those its key table hands TRL's
    run), then ``bounded`` (steps, saving)."""
    import dataclasses

    SFTConfig, _ = trl_classes()
    t = recipe.training
    settings = {**sft_settings(recipe), "per_device_train_batch_size": t.micro_batch_size,
                "gradient_accumulation_steps": t.gradient_accumulation_steps, "learning_rate": t.learning_rate,
                "optim": OPTIM[t.optimizer], "lr_scheduler_type": t.lr_scheduler, "warmup_steps": t.warmup_steps,
                "gradient_checkpointing": bool(t.gradient_checkpointing), "seed": t.seed}
    origin = recipe.origin
    if origin is not None and origin.format == "trl":
        fields = {f.name for f in dataclasses.fields(SFTConfig)}  # TRL says which of the handed keys it takes
        settings.update({k: v for k, v in origin.handed().items() if k in fields})
    settings.update(output_dir=str(output_dir), report_to="none", logging_steps=1, disable_tqdm=True,
                    use_cpu=not torch_device.startswith(("cuda", "mps")), dataset_num_proc=None, **bounded)
    with warnings.catch_warnings():  # TRL's own defaults trip transformers' deprecations: not the user's
        warnings.simplefilter("ignore", FutureWarning)
        return SFTConfig(**settings)


def sft_trainer(model, tokenizer, rows: Sequence[dict], args, callbacks: Sequence = ()):
    """An SFTTrainer over the raw rows: TRL tokenizes, masks and collates them itself."""
    import datasets

    _, SFTTrainer = trl_classes()
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            trainer = SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(list(rows)),
                                 processing_class=copy.deepcopy(tokenizer), callbacks=list(callbacks))
    except (ValueError, RuntimeError) as exc:
        import trl

        raise Fail(f"TRL {trl.__version__} refuses to start on this recipe (SFTTrainer raised "
                   f"{type(exc).__name__}: {' '.join(str(exc).split())}). {FIXES}") from None
    finally:
        if bars:
            datasets.enable_progress_bar()
    return hf.quiet(trainer)


def bounded_args(recipe, folder: Path, torch_device: str, bounds: Bounds) -> dict:
    """``bounds`` as SFTConfig keys; for the worst-case step, TRL's collator padding every row to
    the worst-case length (``worst_case_padding``)."""
    bounded = hf.training_arguments(bounds)
    if not bounds.shuffle:
        bounded["shuffle_dataset"] = False
    if bounds.worst_case:
        args = run_args(recipe, folder, torch_device, **bounded)
        bounded["pad_to_multiple_of"] = worst_case_padding(args, recipe.training.micro_batch_size)
    return bounded


def worst_case_padding(args, micro_batch: int) -> Optional[int]:
    """The ``pad_to_multiple_of`` that makes TRL's own collator build the worst-case micro-batch,
    the one the engine measures: every row padded to ``max_length`` rounded up to the config's
    ``pad_to_multiple_of`` (padding-free: the one flattened row padded to ``micro_batch`` such
    rows). Without it TRL pads to the longest row of the data, and its step would be measured on
    fewer tokens than the engine's. None where nothing truncates (``max_length`` unset)."""
    if not args.max_length:
        return args.pad_to_multiple_of
    multiple = args.pad_to_multiple_of or 1
    row = math.ceil(args.max_length / multiple) * multiple
    packed = args.padding_free or (args.packing and getattr(args, "packing_strategy", "bfd") in ("bfd", "bfd_split"))
    return row * micro_batch if packed else row


class TrlTrainer(hf.HFTrainer):
    """TRL's own run: an ``SFTTrainer`` over the raw rows with the recipe's model and adapter
    (the engine's ``trainable``), so TRL tokenizes, collates, steps and checkpoints them itself."""

    name = "trl"
    step_trainer = "trl SFTTrainer"
    label = "TRL"
    module = "trl"
    install = "pip install 'pytest-ftready[trl]'"

    def pipeline(self, inputs: PipelineInputs) -> Pipeline:
        return TrlPipeline(inputs.recipe, inputs.tokenizer, inputs.stop_ids)

    @contextlib.contextmanager
    def built(self, inputs: RunInputs, run: RunRows, bounds: Bounds, callbacks: Sequence = ()) -> Iterator[hf.Built]:
        from ..engine.trainable import trainable

        recipe, device = inputs.recipe, inputs.torch_device
        args = run_args(recipe, run.folder, device, **bounded_args(recipe, run.folder, device, bounds))
        with forwards_kept(inputs.base()), trainable(recipe, device, inputs.base) as model:
            yield hf.Built(sft_trainer(model, inputs.tokenizer, run.rows, args, callbacks), model)


@contextlib.contextmanager
def forwards_kept(model) -> Iterator[None]:
    """The shared base model's ``forward`` methods as they were after TRL's run: TRL's
    ``chunked_nll`` loss (TRL 1.9's default) replaces the forward of the model it is handed, which
    is the base the engine's own runs use next."""
    before = {module: vars(module).get("forward") for module in model.modules()}
    try:
        yield
    finally:
        for module, forward in before.items():
            if vars(module).get("forward") is not forward:
                if forward is None:
                    del module.forward
                else:
                    module.forward = forward
