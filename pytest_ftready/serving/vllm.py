"""vLLM's LoRA rules (``vllm_lora.toml``: read from vLLM's source, each value with its file) held
against a saved adapter's ``adapter_config.json``, without vLLM installed; where vLLM is
importable its own values (``LoRAConfig``'s default rank, ``PEFTHelper``'s refusals) are used."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RULES_FILE = Path(__file__).with_name("vllm_lora.toml")


@dataclass(frozen=True)
class Rules:
    default_rank: int
    allowed_ranks: tuple[int, ...]
    refused: dict  # adapter_config key -> vLLM's refusal message
    embedding_modules: tuple[str, ...]
    targets: tuple[str, ...]
    architectures: tuple[str, ...]  # LoRA-capable
    sources: dict = field(default_factory=dict)  # rule -> the vLLM file it was read from
    origin: str = "vllm_lora.toml"  # or "vllm <version> (installed)"
    without_lora: tuple[str, ...] = ()  # served by vLLM, without LoRA
    # the installed vLLM's own answer for one architecture: True / False (LoRA-capable or not), None (not registered)
    probe: Callable[[str], bool | None] | None = None

    def lora_support(self, architecture: str) -> bool | None:
        """True: vLLM serves ``architecture`` with LoRA; False: it serves it without LoRA; None: not in its list."""
        if self.probe is not None:
            return self.probe(architecture)
        if architecture in self.architectures:
            return True
        return False if architecture in self.without_lora else None


def load_rules() -> Rules:
    """The sourced rules, with the installed vLLM's own values where it is importable."""
    data = tomllib.loads(RULES_FILE.read_text())
    rules = Rules(default_rank=data["rank"]["default"], allowed_ranks=tuple(data["rank"]["allowed"]),
                  refused={k: v for k, v in data["refused"].items() if k != "source"},
                  embedding_modules=tuple(data["embeddings"]["modules"]), targets=tuple(data["targets"]["modules"]),
                  architectures=tuple(data["architectures"]["names"]),
                  without_lora=tuple(data["architectures"]["without_lora"]),
                  sources={name: table["source"] for name, table in data.items() if "source" in table})
    return installed_rules(rules) if importlib.util.find_spec("vllm") is not None else rules


def installed_rules(rules: Rules) -> Rules:
    """The installed vLLM's default rank, allowed ranks and, per architecture, its model class's own LoRA
    support (``supports_lora``: the class implements SupportsLoRA; imported only here)."""
    import dataclasses
    import typing

    import vllm
    from vllm.config import LoRAConfig

    allowed = rules.allowed_ranks
    hints = typing.get_type_hints(LoRAConfig)
    if "max_lora_rank" in hints and typing.get_args(hints["max_lora_rank"]):
        allowed = tuple(typing.get_args(hints["max_lora_rank"]))
    default = LoRAConfig.__dataclass_fields__["max_lora_rank"].default
    return dataclasses.replace(rules, default_rank=default, allowed_ranks=allowed, probe=_installed_probe(rules),
                               origin=f"vllm {vllm.__version__} (installed)")


def _installed_probe(rules: Rules) -> Callable[[str], bool | None]:
    """The installed vLLM's answer for one architecture; the sourced lists where its registry API differs."""
    import dataclasses

    sourced = dataclasses.replace(rules, probe=None)

    def probe(architecture: str) -> bool | None:
        try:
            from vllm.model_executor.models import ModelRegistry
            from vllm.model_executor.models.interfaces import supports_lora

            if architecture not in ModelRegistry.get_supported_archs():
                return None
            model_cls = ModelRegistry._try_load_model_cls(architecture)
            return None if model_cls is None else bool(supports_lora(model_cls))
        except Exception:  # noqa: BLE001 - a registry API of another release: the sourced lists answer
            return sourced.lora_support(architecture)

    return probe


@dataclass(frozen=True)
class Finding:
    cause: str
    fix: str

    def __str__(self) -> str:
        return f"{self.cause}; {self.fix}"


def judge_adapter(adapter_dir: Path, rules: Rules, max_lora_rank: int = 0, architecture: str = "") -> list[Finding]:
    """What vLLM refuses or ignores in the adapter saved at ``adapter_dir`` when served with
    ``--max-lora-rank max_lora_rank`` (0: not passed, vLLM's default)."""
    path = Path(adapter_dir) / "adapter_config.json"
    config = json.loads(path.read_text())
    found = []
    limit = max_lora_rank or rules.default_rank
    ranks = [config.get("r") or 0, *(config.get("rank_pattern") or {}).values()]
    rank = max(int(r) for r in ranks)
    if rank > limit:
        raise_to = min((r for r in rules.allowed_ranks if r >= rank), default=None)
        how = (f"start vLLM with --max-lora-rank {raise_to} (it takes {', '.join(map(str, rules.allowed_ranks))})"
               if raise_to else f"train at a rank vLLM takes (at most {max(rules.allowed_ranks)})")
        found.append(Finding(f"{path}: the adapter's LoRA rank is {rank}, above vLLM's max_lora_rank {limit}"
                             + (" (its default; --max-lora-rank not passed)" if not max_lora_rank else "")
                             + f": vLLM refuses it ('LoRA rank {rank} is greater than max_lora_rank {limit}', "
                             f"{rules.sources.get('rank', 'vllm/lora/peft_helper.py')})",
                             how + (" and write [serving] max_lora_rank to match" if raise_to else "")))
    elif max_lora_rank and max_lora_rank not in rules.allowed_ranks:
        found.append(Finding(f"[serving] max_lora_rank = {max_lora_rank} is not a value vLLM's --max-lora-rank takes",
                             f"use one of {', '.join(map(str, rules.allowed_ranks))}"))
    if config.get("modules_to_save"):
        found.append(Finding(f"{path}: modules_to_save = {config['modules_to_save']}: vLLM refuses the adapter "
                             f"('{rules.refused['modules_to_save']}', {rules.sources.get('refused')})",
                             "serve the merged model instead (merge_and_unload, then save_pretrained), or train "
                             "without modules_to_save (LoRA on those modules, or leave them frozen)"))
    if config.get("use_dora"):
        found.append(Finding(f"{path}: use_dora = true: vLLM refuses the adapter ('{rules.refused['use_dora']}')",
                             "serve the merged model, or train plain LoRA"))
    if config.get("bias", "none") != "none":
        found.append(Finding(f"{path}: bias = {config['bias']!r}: vLLM loads adapter biases only with bias support "
                             "enabled ('Adapter bias cannot be used without bias_enabled')",
                             "train with bias = \"none\", or serve the merged model"))
    targets = config.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    if isinstance(config.get("target_modules"), str):
        names = []  # a regex: judged by its literal module names only
    else:
        names = [t.rsplit(".", 1)[-1] for t in targets]
    embeds = [n for n in names if n in rules.embedding_modules]
    if embeds:
        found.append(Finding(f"{path}: LoRA on {', '.join(embeds)}: vLLM loads embedding / LM-head adapters only for "
                             "models that list them (embedding_modules) and no longer takes new vocabulary rows "
                             f"({rules.sources.get('embeddings')})", "serve the merged model, or adapt only the "
                             "attention and MLP projections"))
    unknown = [n for n in names if n not in rules.targets and n not in rules.embedding_modules]
    if unknown:
        found.append(Finding(f"{path}: target module(s) {', '.join(unknown)} are not among the layers vLLM's LoRA "
                             f"wraps ({rules.sources.get('targets')}): vLLM refuses the adapter ('While loading "
                             "<adapter>, expected target modules in [...] but received [...]')",
                             "target the attention and MLP projections, or serve the merged model"))
    support = rules.lora_support(architecture) if architecture else True
    if support is False:
        found.append(Finding(f"the model's architecture {architecture} is served by vLLM without LoRA "
                             f"({rules.origin}; {rules.sources.get('architectures')}): it refuses --enable-lora "
                             "for it", "serve the merged model (merge_and_unload, then save_pretrained)"))
    elif support is None:
        found.append(Finding(f"the model's architecture {architecture} is not in vLLM's list of LoRA-capable models "
                             f"({rules.origin}; {rules.sources.get('architectures')})",
                             "serve the merged model, or install the vLLM you serve with beside the plugin so its "
                             "own registry is asked (a newer vLLM may serve it)"))
    return found
