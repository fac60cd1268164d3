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




def merge_and_save(peft_model, folder) -> None:
    """The merged artifact: adapter folded into the base weights."""
    from ..files import ensure_private_dir, make_private

    peft_model.merge_and_unload().save_pretrained(ensure_private_dir(folder))
    make_private(folder)


def reloaded_outputs(recipe, adapter_dir, prompt_ids, stop_ids, pad_id: int, torch_device: str, merged_dir,
                     merge=None) -> dict[str, list[int]]:
    """Greedy outputs of the saved artifact loaded afresh: the adapter on a fresh base and the
    merged model (LoRA), or the saved full model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ..outcomes import Fail
    from .loading import load_model, torch_dtype
    from .memory import free_device_memory
    from .trainable import peft_quiet

    merge = merge or merge_and_save
    n = recipe.checks.max_new_tokens
    outputs = {}
    if recipe.adapter.method == "lora":
        with peft_quiet():
            loaded = PeftModel.from_pretrained(load_model(recipe, torch_device), str(adapter_dir))
        outputs["adapter"] = greedy(loaded, prompt_ids, n, stop_ids, pad_id, torch_device)
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
