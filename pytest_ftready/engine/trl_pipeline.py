"""TRL's pipeline: the training examples exactly as TRL's ``SFTTrainer`` prepares them for the
recipe (chat template or TRL's substituted training template, ``assistant_only_loss``,
``completion_only_loss``, EOS handling, truncation), produced by TRL's own code: an
``SFTTrainer`` is built over the rows and its prepared ``train_dataset`` and ``data_collator``
are read. Nothing is re-implemented here.

Data preparation reads the tokenizer, not the weights, so the trainer is built over a
two-layer stand-in model with the tokenizer's vocabulary (loading an 8B model to tokenize
would cost minutes). Rows are prepared unpacked and unshuffled so each example maps back to
its row; packing does not change labels, TRL's collator is used for batches.

``trl`` is optional (``pip install 'pytest-ftready[trl]'``); without it the checks that need it skip."""

from __future__ import annotations

import copy
import tempfile
import warnings
from pathlib import Path
from typing import Optional, Sequence

from ..data.encoding import Encoded
from ..data.layouts import layout_of, read_sample
from ..data.verify import IGNORE_INDEX, judge_labels
from ..outcomes import Skip
from .pipeline import Pipeline

# SFTConfig keys of a TRL config that shape the examples beyond what the recipe says.
TRL_DATA_KEYS = ("truncation_mode", "eos_token", "pad_token", "dataset_text_field", "padding_free",
                 "packing_strategy", "completion_only_loss", "assistant_only_loss")
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
    if origin is not None and origin.format == "trl":
        from ..recipe.importers.base import read_yaml

        raw = read_yaml(Path(origin.source))
        settings.update({key: raw[key] for key in TRL_DATA_KEYS if raw.get(key) is not None})
    return settings


class TrlPipeline(Pipeline):
    name = "trl"

    def __init__(self, recipe, tokenizer, stop_ids: frozenset[int]) -> None:
        self.recipe, self.tok, self.stop_ids = recipe, tokenizer, stop_ids
        self.settings = sft_settings(recipe)
        self.method = "TRL SFTTrainer"
        self.substituted_template: Optional[str] = None
        self._collator = None

    def _trainer(self, rows: Sequence, max_length):
        try:
            import datasets
            import pyarrow
            from transformers import LlamaConfig, LlamaForCausalLM
            from trl import SFTConfig, SFTTrainer
        except ImportError as exc:
            raise Skip(f"the recipe trains with TRL but trl is not installed ({exc}); "
                       "pip install 'pytest-ftready[trl]'") from None
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
            problems = judge_labels(self.tok, read_sample(row, data.format, data.train_on, data.roles)[0], data.train_on, ids, labels, self.stop_ids,
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
