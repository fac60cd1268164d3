"""Loading what a recipe names: tokenizer, model, trainable model. Imports transformers
and peft lazily: nothing here runs at plugin import."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..recipe.schema import Recipe


def model_source(recipe: Recipe) -> tuple[str, dict[str, Any]]:
    m = recipe.model
    extra = {"gguf_file": m.gguf_file} if m.gguf_file else {}
    if m.path:
        return str(m.path), extra
    return m.id, {"revision": m.revision, **extra}


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def refuse_remote_code(recipe: Recipe) -> None:
    """A local model whose config maps classes to its own Python files (``auto_map``) would run
    that code when loaded: refused, before transformers sees it, unless the recipe opts in."""
    if recipe.model.trust_remote_code or not recipe.model.path:
        return  # hub models: transformers itself refuses remote code without trust_remote_code
    import json

    for name in ("config.json", "tokenizer_config.json"):
        path = Path(recipe.model.path) / name
        try:
            auto_map = json.loads(path.read_text(encoding="utf-8")).get("auto_map")
        except (OSError, ValueError, AttributeError):
            continue
        if auto_map:
            raise ValueError(f"{path} maps classes to the model's own Python code (auto_map), which loading would "
                             "run; read that code, then set [model] trust_remote_code = true in the recipe")


def load_tokenizer(recipe: Recipe):
    from transformers import AutoTokenizer

    refuse_remote_code(recipe)
    source, kwargs = model_source(recipe)
    tok = AutoTokenizer.from_pretrained(source, trust_remote_code=recipe.model.trust_remote_code, **kwargs)
    if recipe.data.chat_template:
        tok.chat_template = Path(recipe.data.chat_template).read_text(encoding="utf-8")
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token  # padding is masked out of loss and attention
    return tok


def quantization_config(recipe: Recipe):
    q = recipe.model.quantization
    if q == "none":
        return None
    from transformers import BitsAndBytesConfig

    if q == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=torch_dtype(recipe.model.dtype))
    return BitsAndBytesConfig(load_in_8bit=True)


def load_model(recipe: Recipe, torch_device: str, **overrides: Any):
    """The base causal LM in the recipe's dtype and attention kernel, on ``torch_device``."""
    from transformers import AutoModelForCausalLM

    refuse_remote_code(recipe)
    source, kwargs = model_source(recipe)
    qconfig = quantization_config(recipe)
    options = dict(dtype=torch_dtype(recipe.model.dtype), attn_implementation=recipe.model.attn_implementation,
                   trust_remote_code=recipe.model.trust_remote_code, **kwargs)
    if qconfig is not None:
        options.update(quantization_config=qconfig, device_map={"": torch_device})
    options.update(overrides)
    model = AutoModelForCausalLM.from_pretrained(source, **options)
    if qconfig is None:
        model.to(torch_device)
    model.config.use_cache = False
    return model


def model_config(recipe: Recipe) -> dict[str, Any]:
    """config.json as a dict (local folder, GGUF metadata, or the hub / its cache)."""
    import json

    config = Path(recipe.model.path) / "config.json" if recipe.model.path else None
    if config is not None and config.is_file():
        return json.loads(config.read_text(encoding="utf-8"))
    from transformers import AutoConfig

    source, kwargs = model_source(recipe)
    return AutoConfig.from_pretrained(source, trust_remote_code=recipe.model.trust_remote_code, **kwargs).to_dict()


def generation_eos_ids(recipe: Recipe) -> list[int]:
    """The eos ids of the model's generation config (Gemma and Llama-3 end turns with a token
    that is not the tokenizer's EOS); [] when there is none."""
    from transformers import GenerationConfig

    source, kwargs = model_source(recipe)
    kwargs.pop("gguf_file", None)
    try:
        eos = GenerationConfig.from_pretrained(source, **kwargs).eos_token_id
    except (OSError, ValueError):  # no generation_config.json (or offline without it)
        return []
    return [int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None]
