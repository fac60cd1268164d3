"""Greedy generation from a trained, saved or merged model."""

from __future__ import annotations

from typing import Sequence


def greedy(model, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids, pad_id: int, device: str) -> list[int]:
    import torch

    model.eval()
    with torch.no_grad():
        ids = torch.tensor([list(prompt_ids)], device=device)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=sorted(stop_ids), pad_token_id=pad_id, use_cache=True)
    return out[0, ids.shape[1]:].tolist()


# What a team does to serve an adapter trained with added tokens (peft #2415, #1932, LLaMA-Factory #3154).
RESIZED_REMEDY = ("keep embed_tokens and lm_head in the adapter's modules_to_save (or save_embedding_layers=True) so "
                  "the new rows travel with it, ship the tokenizer beside it, and serve it on the base resized first "
                  "(model.resize_token_embeddings({rows}) before PeftModel.from_pretrained)")


def merge_base(recipe, way: str, torch_device: str):
    """The base a merge ``way`` folds the adapter into: "quantized", the base as trained (bitsandbytes
    4-bit/8-bit where the recipe quantizes it); "dequantized", that base's quantized weights turned
    back into [model] dtype (transformers' ``dequantize()``); "original", the checkpoint loaded
    unquantized in [model] dtype."""
    from .loading import load_model

    if way == "original" and recipe.model.quantization != "none":
        return load_model(recipe, torch_device, quantization_config=None)
    base = load_model(recipe, torch_device)
    if way == "dequantized" and recipe.model.quantization != "none":
        base = base.dequantize()
    return base


def adapter_on_original_base(recipe, adapter_dir, used_ids, torch_device: str, way: str = "quantized"):
    """The saved adapter loaded onto a fresh load of the original base from disk (never the in-memory
    model a trainer may have resized), as a team serving it loads it; ``way`` names which base
    (``merge_base``: by default the base as trained). Fail, with the remedy, when the
    adapter was trained on a resized vocabulary: its embedding rows do not fit the base (a size
    mismatch), or the token ids the trained model used (``used_ids``) have no row in the base."""
    from pathlib import Path

    from peft import PeftModel

    from ..outcomes import Fail
    from .token_rows import vocabulary_rows
    from .trainable import peft_quiet

    base = merge_base(recipe, way, torch_device)
    rows = base.get_input_embeddings().weight.shape[0]
    saved = Path(adapter_dir) / "adapter_model.safetensors"
    adapter_rows = max(vocabulary_rows(saved).values(), default=rows) if saved.is_file() else rows
    where = recipe.model.path or recipe.model.id
    if adapter_rows != rows:
        raise Fail(f"the saved adapter does not load onto the original base {where}: its embedding rows number "
                   f"{adapter_rows} ({saved.name}) but the base has {rows} (training resized the vocabulary for added "
                   f"tokens; PeftModel.from_pretrained stops with 'size mismatch'): "
                   + RESIZED_REMEDY.format(rows=adapter_rows))
    beyond = sorted(i for i in set(used_ids) if i >= rows)
    if beyond:
        raise Fail(f"the trained model used token id(s) {beyond[:5]} but the original base {where} has {rows} "
                   f"embedding rows and the saved adapter carries none: the vocabulary was resized during training "
                   "and the added tokens' rows were not saved; " + RESIZED_REMEDY.format(rows=max(beyond) + 1))
    try:
        with peft_quiet():
            return PeftModel.from_pretrained(base, str(adapter_dir))
    except RuntimeError as exc:
        if "size mismatch" not in str(exc):
            raise
        mismatch = next(line.strip() for line in str(exc).splitlines() if "size mismatch" in line)
        raise Fail(f"the saved adapter does not load onto the original base {where}: {mismatch}; it was saved "
                   "from a model of another shape: train and serve the adapter on the same base") from None


def merged(peft_model):
    """The adapter folded into its base's weights (peft's ``merge_and_unload``). On a bitsandbytes base
    peft warns that re-quantizing rounds the delta: ``serving.merge`` measures that instead."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Merge lora module to (4|8)-bit linear.*", category=UserWarning)
        return peft_model.merge_and_unload()


def merge_and_save(peft_model, folder) -> None:
    """The merged artifact: adapter folded into the base weights."""
    from ..files import ensure_private_dir, make_private

    merged(peft_model).save_pretrained(ensure_private_dir(folder))
    make_private(folder)


def reloaded_outputs(recipe, adapter_dir, prompt_ids, stop_ids, pad_id: int, torch_device: str, merged_dir,
                     merge=None, trained_ids=()) -> dict[str, list[int]]:
    """Greedy outputs of the saved artifact loaded afresh: the adapter on a fresh load of the original
    base (``adapter_on_original_base``: ``trained_ids``, what the trained model generated, must have
    rows there too) and the merged model (LoRA), or the saved full model. On a quantized base the merge
    goes into the dequantized base, the merged artifact that is the trained model (lifecycle.merged_model
    judges the other ways)."""
    from transformers import AutoModelForCausalLM

    from ..outcomes import Fail
    from .loading import torch_dtype
    from .memory import free_device_memory

    merge = merge or merge_and_save
    n = recipe.checks.max_new_tokens
    outputs = {}
    if recipe.adapter.method == "lora":
        loaded = adapter_on_original_base(recipe, adapter_dir, [*prompt_ids, *trained_ids], torch_device)
        outputs["adapter"] = greedy(loaded, prompt_ids, n, stop_ids, pad_id, torch_device)
        if recipe.model.quantization != "none":
            del loaded
            free_device_memory(torch_device)
            loaded = adapter_on_original_base(recipe, adapter_dir, [*prompt_ids, *trained_ids], torch_device,
                                              "dequantized")
        try:
            merge(loaded, merged_dir)
        except (ValueError, RuntimeError, OSError) as exc:
            raise Fail(f"the adapter reloads and generates, but the merged model cannot be saved: "
                       f"{str(exc).splitlines()[0]}" + (" (transformers does not save models loaded from GGUF: "
                       "merge onto a safetensors checkpoint of the same model, or ship the adapter)"
                       if recipe.model.gguf_file else "")) from None
        del loaded
        free_device_memory(torch_device)
    else:
        merged_dir = adapter_dir
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch_dtype(recipe.model.dtype),
                                                  attn_implementation=recipe.model.attn_implementation).to(torch_device)
    outputs["merged"] = greedy(merged, prompt_ids, n, stop_ids, pad_id, torch_device)
    del merged
    free_device_memory(torch_device)
    return outputs
