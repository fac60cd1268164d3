"""The trained model as a serving engine takes it: the adapter merged the way [serving] merge_into
declares (``serving.merge``; by default into a fresh load of the original base), or the full fine-tune's
saved model, with the training tokenizer (its chat template included) saved beside it, as a folder a
converter reads."""

from __future__ import annotations

import shutil
from pathlib import Path


def merged_folder(state, folder: Path) -> Path:
    """``folder`` holding the merged trained model and the training tokenizer (made once per run)."""
    if (folder / "config.json").is_file():
        return folder
    from ..engine.generate import adapter_on_original_base, merge_and_save
    from ..outcomes import Fail
    from .merge import declared_way

    recipe, result = state.recipe, state.overfit
    if recipe.adapter.method == "lora":
        way = declared_way(recipe)
        if way == "quantized" and recipe.model.quantization != "none":
            raise Fail(f"[serving] merge_into = \"quantized\" merges into the {recipe.model.quantization} "
                       "bitsandbytes base and saves bitsandbytes weights, but llama.cpp's converter reads 16-bit "
                       "weights: set [serving] merge_into = \"dequantized\" (the quantized base dequantize()d, "
                       "then merged: Unsloth save_method=\"merged_16bit\") or \"original\"")
        loaded = adapter_on_original_base(recipe, result.adapter_dir, [*result.prompt_ids, *result.greedy_ids], "cpu",
                                          way)
        merge_and_save(loaded, folder)
    else:
        shutil.copytree(result.adapter_dir, folder)
    state.tokenizer.save_pretrained(str(folder))
    return folder
