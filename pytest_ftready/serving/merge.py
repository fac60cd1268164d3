"""Merging a LoRA adapter trained on a quantized base (issue 41; peft#2321): the trained model is the
adapter on the bitsandbytes base as trained. A merge folds the adapter into one of three bases
(``recipe.schema.MERGE_WAYS``), each held against that adapter model here:

* "original": the checkpoint loaded unquantized (Axolotl's merge_lora, LLaMA-Factory's export): the
  adapter learned around the quantized weights, not these;
* "dequantized": the quantized base ``dequantize()``d, then merged (Unsloth's merged_16bit): the
  trained weights, in 16 bits;
* "quantized": peft's merge_and_unload on the 4-bit/8-bit base (Unsloth's merged_4bit_forced): it
  dequantizes, adds the delta and re-quantizes, and the small delta is rounded away.

Nothing here imports torch at import time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..recipe.schema import MERGE_WAYS

# What each way is, as a team does it, and why it is not the trained model where it is not.
HOW = {
    "original": "merge into the original base loaded unquantized (AutoModelForCausalLM.from_pretrained without "
                "quantization_config, then PeftModel.from_pretrained and merge_and_unload; Axolotl merge_lora, "
                "LLaMA-Factory export)",
    "dequantized": "merge into the dequantized base (base.dequantize() before PeftModel.from_pretrained, or Unsloth "
                   "save_method=\"merged_16bit\")",
    "quantized": "merge into the quantized base (peft merge_and_unload on the bitsandbytes base, or Unsloth "
                 "save_method=\"merged_4bit_forced\")",
}
CAUSE = {
    "original": "the adapter was trained on the quantized base's rounded weights, and the original weights differ "
                "from them by the quantization error",
    "dequantized": "the dequantized weights plus the delta do not reproduce the quantized matmul",
    "quantized": "merge_and_unload on a bitsandbytes base dequantizes, adds the LoRA delta and re-quantizes: the "
                 "small delta is rounded away (peft#2321)",
}


@dataclass(frozen=True)
class Merge:
    """One way's merged model against the adapter model (the quantized base as trained + adapter)."""

    way: str
    greedy_ids: tuple[int, ...]
    greedy_match: int  # leading tokens equal to the adapter model's greedy output
    argmax_agreement: float  # share of prompt+answer positions whose teacher-forced argmax agrees
    max_logit_difference: float

    def agrees(self, adapter_ids: Sequence[int]) -> bool:
        return list(self.greedy_ids) == list(adapter_ids)


@dataclass(frozen=True)
class Merges:
    adapter_ids: tuple[int, ...]  # the adapter model's greedy output
    ways: dict[str, Merge]

    def agreeing(self) -> list[str]:
        return [way for way, merge in self.ways.items() if merge.agrees(self.adapter_ids)]


def declared_way(recipe) -> str:
    """[serving] merge_into, "" read as "original" (what engines needing merged weights are handed)."""
    return recipe.serving.merge_into or "original"


def _logits(model, ids: Sequence[int], torch_device: str):
    import torch

    model.eval()
    with torch.no_grad():
        batch = torch.tensor([list(ids)], device=torch_device)
        return model(input_ids=batch, attention_mask=torch.ones_like(batch)).logits[0].float().cpu()


def measure(recipe, adapter_dir, prompt_ids: Sequence[int], trained_ids: Sequence[int], stop_ids, pad_id: int,
            torch_device: str, ways: Sequence[str] = MERGE_WAYS) -> Merges:
    """Each merge ``way`` of the saved adapter held against the adapter model: greedy generation from
    ``prompt_ids`` and teacher-forced logits over the prompt and ``trained_ids`` (the trained model's
    greedy answer). Each model is loaded once and freed before the next."""
    from ..engine.generate import adapter_on_original_base, greedy, merged
    from ..engine.memory import free_device_memory
    from .gguf import matching_prefix

    n = recipe.checks.max_new_tokens
    sequence = [*prompt_ids, *trained_ids]
    model = adapter_on_original_base(recipe, adapter_dir, sequence, torch_device)
    adapter_ids = greedy(model, prompt_ids, n, stop_ids, pad_id, torch_device)
    reference = _logits(model, sequence, torch_device)

    def judged(way: str, peft_model) -> Merge:
        model = merged(peft_model)
        ids = greedy(model, prompt_ids, n, stop_ids, pad_id, torch_device)
        logits = _logits(model, sequence, torch_device)
        agreement = float((logits.argmax(-1) == reference.argmax(-1)).float().mean())
        return Merge(way, tuple(ids), matching_prefix(ids, adapter_ids), agreement,
                     float((logits - reference).abs().max()))

    results = {}
    if "quantized" in ways:  # the adapter model's own base: merged in place, no second load
        results["quantized"] = judged("quantized", model)
    del model
    free_device_memory(torch_device)
    for way in ways:
        if way != "quantized":
            results[way] = judged(way, adapter_on_original_base(recipe, adapter_dir, sequence, torch_device, way))
            free_device_memory(torch_device)
    return Merges(tuple(adapter_ids), {way: results[way] for way in ways})
