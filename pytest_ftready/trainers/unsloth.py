"""Unsloth's own run (``[data] pipeline = "unsloth"``), as its notebooks write it: the model
loaded by ``FastLanguageModel.from_pretrained`` (the recipe's dtype, 4-bit, ``max_length`` as
``max_seq_length``), the adapter by ``FastLanguageModel.get_peft_model`` (its
``use_gradient_checkpointing = "unsloth"`` where the recipe checkpoints), the chat template by
``unsloth.chat_templates.get_chat_template`` where ``[unsloth] chat_template`` names one, every
row rendered to a ``text`` column, an ``SFTTrainer`` over it, and the labels made by
``unsloth.chat_templates.train_on_responses_only`` with the recipe's instruction and response
parts. Step, overfit, save-and-resume are that Trainer's (``hf.HFTrainer``); what the overfit
saved is reloaded for ``lifecycle.generate`` as a server loads it (the base class's
``reloaded_outputs``) and as Unsloth does: the adapter by ``FastLanguageModel.from_pretrained``,
and the merged 16-bit model Unsloth's ``save_pretrained_merged`` writes, reloaded by it too.

The pipeline (``data.masking``) is the same text through TRL's own tokenization (Unsloth trains
with TRL's SFTTrainer) and Unsloth's own masking function, each row's labels then verified
independently (``data.verify.judge_labels``).

``unsloth`` is optional (its own environment: CPU torch, torchvision removed,
``UNSLOTH_FORCE_CPU=1`` on a machine without a GPU); imported only when its work runs."""

from __future__ import annotations

import contextlib
import copy
import difflib
from pathlib import Path
from typing import Iterator, Sequence

from ..data.encoding import Encoded
from ..data.layouts import Chat, read_sample
from ..data.rows import Row
from ..data.verify import IGNORE_INDEX, judge_labels
from ..outcomes import Fail, Skip
from . import hf
from .base import Bounds, Pipeline, PipelineInputs, Reloaded, RunInputs, RunRows

INSTALL = ("pip install unsloth in an environment of its own (CPU: torch==2.13.0, then pip uninstall -y "
           "torchvision; UNSLOTH_FORCE_CPU=1 without a GPU)")
TEXT = "text"  # the column Unsloth's notebooks render each conversation into (dataset_text_field)


def unsloth_api():
    """(FastLanguageModel, get_chat_template, train_on_responses_only), or a Skip naming Unsloth."""
    import warnings

    try:
        with warnings.catch_warnings():
            # the checks import it after transformers (the session's): its import-order advice is for scripts
            warnings.filterwarnings("ignore", message=".*Unsloth should be imported before")
            from unsloth import FastLanguageModel
            from unsloth.chat_templates import get_chat_template, train_on_responses_only
    except (ImportError, NotImplementedError, RuntimeError) as exc:  # Unsloth's own import checks raise these
        said = " ".join(str(exc).split())[:300]
        raise Skip(f"the recipe trains with Unsloth ([data] pipeline = \"unsloth\") but unsloth does not import "
                   f"here ({type(exc).__name__}: {said}); {INSTALL}") from None
    return FastLanguageModel, get_chat_template, train_on_responses_only


def unsloth_tokenizer(recipe, tokenizer):
    """``tokenizer`` as the team's script has it after ``get_chat_template`` with ``[unsloth]
    chat_template`` (a copy; the tokenizer itself where none is named)."""
    name = recipe.unsloth.chat_template
    if not name:
        return tokenizer
    _, get_chat_template, _ = unsloth_api()
    from unsloth.chat_templates import CHAT_TEMPLATES

    if name not in CHAT_TEMPLATES:
        close = difflib.get_close_matches(name, list(CHAT_TEMPLATES), n=3)
        raise Fail(f"{recipe.source} [unsloth] chat_template: Unsloth's get_chat_template knows no template "
                   f"{name!r}" + (f"; did you mean {', '.join(map(repr, close))}?" if close else "")
                   + f" (its names: {', '.join(sorted(CHAT_TEMPLATES))})")
    return get_chat_template(copy.deepcopy(tokenizer), chat_template=name)


def rendered(tokenizer, sample) -> str:
    """A row as Unsloth's notebooks render it into the text column: the conversation through the
    chat template (``apply_chat_template(tokenize=False)``), a text row as it is."""
    if isinstance(sample, Chat):
        return tokenizer.apply_chat_template([dict(m) for m in sample.messages], tokenize=False,
                                             add_generation_prompt=False)
    return sample.prompt + sample.completion


def masking_function(recipe, tokenizer):
    """Unsloth's ``train_on_responses_only`` labelling function for the recipe's parts (None under
    train_on = "all": the whole text is trained)."""
    u = recipe.unsloth
    if not u.response_part:
        return None
    _, _, train_on_responses_only = unsloth_api()
    try:
        return train_on_responses_only(None, instruction_part=u.instruction_part, response_part=u.response_part,
                                       tokenizer=tokenizer, return_function=True)
    except ValueError as exc:
        raise Fail(f"Unsloth's train_on_responses_only refuses [unsloth] instruction_part = {u.instruction_part!r}, "
                   f"response_part = {u.response_part!r}: {' '.join(str(exc).split())}") from None


def part_problems(recipe, text: str) -> list[tuple[str, str]]:
    """What the recipe's parts do to a rendered row when they do not occur in it (the cause, said
    before the label verification finds the effect)."""
    u = recipe.unsloth
    if not u.response_part:
        return []
    if u.response_part not in text:
        return [("no_supervised", f"Unsloth's train_on_responses_only: [unsloth] response_part {u.response_part!r} "
                 "does not occur in the rendered row, so every label is -100; write the text the chat template opens "
                 "assistant turns with (see the rendered row in masking.html)")]
    if u.instruction_part not in text:
        return [("wrong_role_trained", f"Unsloth's train_on_responses_only: [unsloth] instruction_part "
                 f"{u.instruction_part!r} does not occur in the rendered row, so nothing after the first response "
                 "is masked (user turns train); write the text the chat template opens user turns with")]
    return []


def template_problem(recipe, own, templated, sample) -> list[tuple[str, str]]:
    """A ``get_chat_template`` name whose rendering differs from the model's own chat template: the
    model is trained in one format and served (vLLM, Ollama, llama.cpp read the model's template) in another."""
    name = recipe.unsloth.chat_template
    if not name or not isinstance(sample, Chat) or not getattr(own, "chat_template", None):
        return []
    try:
        theirs = rendered(own, sample)
    except Exception:  # noqa: BLE001 - the model's own template failing is data.template's finding, not this one
        return []
    if theirs == rendered(templated, sample):
        return []
    return [("prompt_not_prefix", f"Unsloth's get_chat_template({name!r}) renders this row differently from the "
             f"model's own chat template (its tokenizer's): trained in {name}'s format, the model is prompted in its "
             "own by every server that reads its template; name the model's own template in [unsloth] "
             "chat_template, or leave it unset")]


class UnslothPipeline(Pipeline):
    """The rows as Unsloth's run makes its examples: rendered text, TRL's tokenization, Unsloth's masks."""

    name = "unsloth"

    def __init__(self, recipe, tokenizer, stop_ids: frozenset[int]) -> None:
        self.recipe, self.own, self.stop_ids = recipe, tokenizer, stop_ids
        self.tok = unsloth_tokenizer(recipe, tokenizer)
        self.mask = masking_function(recipe, self.tok)
        self.method = "Unsloth train_on_responses_only" if self.mask else "Unsloth SFTTrainer"

    def _tokenized(self, texts: Sequence[str], max_length) -> dict[int, list[int]]:
        """TRL's own tokenization of the text column (its EOS added, its truncation), by row."""
        from .trl import ROW_KEY, TrlPipeline

        data = self.recipe.data.set("format", "text").set("train_on", "all")
        trl = TrlPipeline(self.recipe.set("data", data), self.tok, self.stop_ids)
        prepared = trl._trainer([Row("unsloth", i + 1, {TEXT: text}) for i, text in enumerate(texts)],
                                max_length).train_dataset
        return {int(i): list(ids) for i, ids in zip(prepared[ROW_KEY], prepared["input_ids"])}

    def encode(self, rows: Sequence) -> list[Encoded]:
        data = self.recipe.data
        samples, texts, failed = [], [], {}
        for i, row in enumerate(rows):
            sample, errors = read_sample(row, data.format, data.train_on, data.roles)
            try:
                text = rendered(self.tok, sample) if sample is not None and not errors else ""
            except Exception as exc:  # noqa: BLE001 - the template's error, reported on the row
                failed[i] = f"template failed: {type(exc).__name__}: {exc}"
                text = ""
            if sample is None or errors:
                failed[i] = "; ".join(errors) or "unreadable row"
            samples.append(sample)
            texts.append(text)
        kept = self._tokenized(texts, data.max_length) if rows else {}
        full = self._tokenized(texts, None) if rows else {}
        out = []
        for i, row in enumerate(rows):
            if i in failed:
                out.append(Encoded(row, (), (), self.method, 0, 0, (("render_error", failed[i]),)))
                continue
            ids, whole = kept.get(i, []), full.get(i, [])
            labels = self.mask({"input_ids": [ids]})["labels"][0] if self.mask else list(ids)
            whole_labels = self.mask({"input_ids": [whole]})["labels"][0] if self.mask else list(whole)
            problems = (part_problems(self.recipe, texts[i])
                        + template_problem(self.recipe, self.own, self.tok, samples[i]))
            problems += judge_labels(self.tok, samples[i], data.train_on, ids, labels, self.stop_ids,
                                     full_length=len(whole) or None)
            trained_full = sum(1 for label in whole_labels if label != IGNORE_INDEX)
            out.append(Encoded(row, tuple(ids), tuple(int(x) for x in labels), self.method, len(whole) or len(ids),
                               trained_full, tuple(problems)))
        return out


def gradient_checkpointing(recipe):
    """What the team's script hands Unsloth: "unsloth" where the recipe checkpoints, else False."""
    return "unsloth" if recipe.training.gradient_checkpointing else False


def load(recipe, model_name: str = ""):
    """``FastLanguageModel.from_pretrained`` as the team's script calls it: (model, tokenizer)."""
    from ..engine.loading import torch_dtype

    FastLanguageModel, _, _ = unsloth_api()
    m = recipe.model
    with hf.trainer_warnings():
        return FastLanguageModel.from_pretrained(
            model_name=model_name or str(m.path or m.id), revision=m.revision or None,
            max_seq_length=recipe.data.max_length, dtype=torch_dtype(m.dtype),
            load_in_4bit=m.quantization == "4bit", load_in_8bit=m.quantization == "8bit",
            full_finetuning=recipe.adapter.method == "none", attn_implementation=m.attn_implementation,
            trust_remote_code=m.trust_remote_code, use_gradient_checkpointing=gradient_checkpointing(recipe))


def with_adapter(recipe, model):
    """``FastLanguageModel.get_peft_model`` with the recipe's adapter (the model itself for a full fine-tune)."""
    FastLanguageModel, _, _ = unsloth_api()
    a = recipe.adapter
    if a.method != "lora":
        return model
    return FastLanguageModel.get_peft_model(model, r=a.r, lora_alpha=a.alpha, lora_dropout=a.dropout,
                                            target_modules=list(a.target_modules),
                                            use_gradient_checkpointing=gradient_checkpointing(recipe),
                                            random_state=recipe.training.seed)


class UnslothTrainer(hf.HFTrainer):
    """Unsloth's own run (see the module docstring)."""

    name = "unsloth"
    step_trainer = "unsloth SFTTrainer"
    label = "Unsloth"
    module = "unsloth"
    install = INSTALL
    native = False  # chosen by [data] pipeline = "unsloth"

    def pipeline(self, inputs: PipelineInputs) -> Pipeline:
        return UnslothPipeline(inputs.recipe, inputs.tokenizer, inputs.stop_ids)

    @contextlib.contextmanager
    def built(self, inputs: RunInputs, run: RunRows, bounds: Bounds, callbacks: Sequence = ()) -> Iterator[hf.Built]:
        import datasets

        from .trl import bounded_args, run_args, sft_trainer

        recipe = inputs.recipe
        _, get_chat_template, train_on_responses_only = unsloth_api()
        model, tokenizer = load(recipe)
        if recipe.unsloth.chat_template:
            tokenizer = get_chat_template(tokenizer, chat_template=recipe.unsloth.chat_template)
        model = with_adapter(recipe, model)
        data = recipe.data
        texts = []
        for i, values in enumerate(run.rows):
            sample, errors = read_sample(Row(str(run.rows_file), i + 1, values), data.format, data.train_on, data.roles)
            if sample is None or errors:
                raise Fail(f"{run.rows_file}:{i + 1}: Unsloth's run cannot render this row: {'; '.join(errors)}")
            texts.append({TEXT: rendered(tokenizer, sample)})
        text_recipe = recipe.set("data", data.set("format", "text").set("train_on", "all"))
        device = inputs.torch_device
        args = run_args(text_recipe, run.folder, device, dataset_text_field=TEXT,
                        **bounded_args(text_recipe, run.folder, device, bounds))
        trainer = sft_trainer(model, tokenizer, texts, args, callbacks)
        if recipe.unsloth.response_part:
            bars = datasets.is_progress_bar_enabled()
            datasets.disable_progress_bar()
            try:
                with hf.trainer_warnings(), contextlib.redirect_stdout(None):
                    trainer = train_on_responses_only(trainer, instruction_part=recipe.unsloth.instruction_part,
                                                      response_part=recipe.unsloth.response_part, num_proc=1)
            finally:
                if bars:
                    datasets.enable_progress_bar()
        yield hf.Built(hf.quiet(trainer, callbacks), model)

    def reloaded_outputs(self, inputs: RunInputs, result) -> list[Reloaded]:
        """``lifecycle.generate``: the engine's reload (the adapter on a fresh original base, as a
        server loads it, and merged), then Unsloth's own save of what it trained (``unsloth_reloaded``)."""
        outputs = super().reloaded_outputs(inputs, result)
        if inputs.recipe.adapter.method != "lora":
            return outputs
        return [*outputs, *unsloth_reloaded(inputs, result)]


def unsloth_reloaded(inputs: RunInputs, result) -> list[Reloaded]:
    """What Unsloth's own saves of the overfit generate for its prompt: the adapter reloaded by
    ``FastLanguageModel.from_pretrained``, and the merged_16bit model ``save_pretrained_merged``
    writes, reloaded by it too (its ``why``: the dtype it wrote, where that is not the run's)."""
    import json

    from ..engine.generate import greedy
    from ..files import ensure_private_dir

    recipe, n = inputs.recipe, inputs.recipe.checks.max_new_tokens
    FastLanguageModel, _, _ = unsloth_api()
    adapter, tokenizer = load(recipe, str(result.adapter_dir))
    FastLanguageModel.for_inference(adapter)
    outputs = [Reloaded("adapter reloaded by FastLanguageModel.from_pretrained", tuple(greedy(
        adapter, result.prompt_ids, n, inputs.stop_ids, inputs.pad_id, inputs.torch_device)))]
    merged_dir = ensure_private_dir(Path(inputs.scratch) / "unsloth-merged-16bit")
    with hf.trainer_warnings(), contextlib.redirect_stdout(None):
        adapter.save_pretrained_merged(str(merged_dir), tokenizer, save_method="merged_16bit")
    del adapter
    config = json.loads((merged_dir / "config.json").read_text(encoding="utf-8"))
    saved_dtype = str(config.get("dtype") or config.get("torch_dtype") or recipe.model.dtype)
    merged, _ = load(recipe, str(merged_dir))
    why = (f"save_pretrained_merged wrote {saved_dtype} weights; the run trained in {recipe.model.dtype}: ship the "
           "adapter, or train in the dtype you merge to" if saved_dtype != recipe.model.dtype else "")
    outputs.append(Reloaded("merged_16bit model (save_pretrained_merged)", tuple(greedy(
        merged, result.prompt_ids, n, inputs.stop_ids, inputs.pad_id, inputs.torch_device)), why))
    return outputs
