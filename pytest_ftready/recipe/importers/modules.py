""""Every linear layer" (Axolotl's ``lora_target_linear``, TRL's ``all-linear``,
LLaMA-Factory's ``lora_target: all``) as the trainer selects it on the model's own
architecture: the model is built from its ``config.json`` on the meta device (no weights, no
memory) and its modules are picked by the trainer's own rule. Where the config is not
readable (a hub model, remote code), the note names the architecture and what to set.

torch and transformers are imported here only, and only when a config asks for every linear
layer and the model's folder is on this machine."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

# Llama-style names: the fallback when the architecture cannot be read.
LLAMA_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Each trainer's rule, with where it is written.
RULES = {
    # peft's all-linear (tuners_utils._maybe_include_all_linear_layers): nn.Linear and Conv1D, not the output embedding
    "peft": "peft's all-linear",
    # axolotl/loaders/adapter.py find_all_linear_names: nn.Linear or a class named *Linear*, not lm_head
    "axolotl": "Axolotl's find_all_linear_names",
    # llamafactory/model/model_utils/misc.py find_all_linear_modules: a class named *Linear* (not *Embedding*),
    # outside lm_head (chatglm: output_layer, internlm2: output)
    "llamafactory": "LLaMA-Factory's find_all_linear_modules",
}
LLAMAFACTORY_OUTPUTS = {"chatglm": "output_layer", "internlm2": "output"}


@dataclass(frozen=True)
class EveryLinear:
    """A config's request for every linear layer, resolved in ``Builder.finish``."""

    key: str  # the config key that asked
    rule: str  # peft | axolotl | llamafactory
    extra: tuple[str, ...] = ()  # modules named beside it (Axolotl trains the union)
    architecture: str = ""  # what the config says the architecture is, where it says (Axolotl's model_type)

    def resolve(self, b) -> None:
        """Resolved on the importer's ``Builder`` ``b`` once its model is known (``resolve_every_linear``)."""
        resolve_every_linear(b, self)


def resolve_every_linear(b, want: EveryLinear) -> None:
    """[adapter] target_modules of the importer's Builder ``b`` from the model's own architecture
    (plus ``want.extra``), or Llama-style names with a note naming the architecture where its
    config cannot be read here."""
    model = b.tables.get("model", {})
    folder = b.local_path(str(model["path"])) if model.get("path") else None
    names, architecture, why = linear_names(folder, want.rule, bool(model.get("trust_remote_code")))
    union = " and the named modules" if want.extra else ""
    if names is None:
        names = list(LLAMA_LINEAR)
        named = want.architecture or architecture or (f"the model {model.get('id')!r}" if model.get("id") else "")
        b.caveat(want.key, f"every linear layer{union} ({RULES[want.rule]}) of {named or 'this model'}: {why}, so "
                 f"the architecture's module names are not known here and the checks use Llama-style names "
                 f"{LLAMA_LINEAR}; set [model] path in ftready.toml to a local copy (its config.json gives the "
                 "names), or [adapter] target_modules")
    else:
        b.mapped.append((f"{want.key} ({RULES[want.rule]} on {architecture})", "[adapter] target_modules"))
    targets = sorted(set(names) | set(want.extra))
    b.tables.setdefault("adapter", {})["target_modules"] = targets
    b.tables["adapter"].pop("target_regex", None)


def linear_names(folder, rule: str, trust_remote_code: bool) -> tuple[Optional[list[str]], str, str]:
    """(module names, architecture, why not): the leaf names of the layers ``rule`` selects on the
    model built from ``folder``'s config.json on the meta device; None with the reason when the
    config cannot be read or built here."""
    if folder is None:
        return None, "", "the model is a hub id (its config.json is not on this machine)"
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, "", f"{folder}/config.json is not readable"
    architecture = str(config.get("model_type") or (config.get("architectures") or ["?"])[0])
    if config.get("auto_map") and not trust_remote_code:
        return None, architecture, f"the {architecture} architecture is the repository's own code (auto_map) and " \
                                   "trust_remote_code is off"
    try:
        model = _meta_model(folder, trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for an architecture it cannot build
        return None, architecture, f"transformers cannot build the {architecture} architecture here " \
                                   f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    return sorted(_pick(model, rule, architecture)), architecture, ""


def _meta_model(folder, trust_remote_code: bool) -> Any:
    import warnings

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def _pick(model: Any, rule: str, architecture: str) -> set[str]:
    import torch
    from transformers.pytorch_utils import Conv1D

    output = model.get_output_embeddings()
    names: set[str] = set()
    for full, module in model.named_modules():
        kind = type(module).__name__
        if rule == "peft":
            chosen = isinstance(module, (torch.nn.Linear, Conv1D)) and module is not output
        elif rule == "axolotl":
            chosen = (isinstance(module, torch.nn.Linear) or "Linear" in kind) \
                and kind != "LlamaLinearScalingRotaryEmbedding"
        else:
            forbidden = ("lm_head", LLAMAFACTORY_OUTPUTS.get(architecture, "lm_head"))
            chosen = "Linear" in kind and "Embedding" not in kind and not any(f in full for f in forbidden)
        if chosen:
            names.add(full.split(".")[-1])
    if rule == "axolotl":
        names.discard("lm_head")  # get_linear_embedding_layers(model_type)[1]: lm_head for every architecture
    return names
