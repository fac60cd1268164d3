"""Known bugs of the stack: the installed versions, the recipe's settings and the (described)
GPU held against the table of fine-tuning bugs in ``compat/known_bugs.toml``.

Pure logic: a ``Situation`` (plain data, built by ``situation_of`` from the recipe, the
``Machine`` snapshot and the resolved device, or by a test by hand) is judged row by row.
Versions are compared with ``packaging`` (PEP 440 specifiers, pre-releases included)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .compat import load
from .pins import normalize

TABLE = "known_bugs"
TRAINER_NAMES = {"transformers": "the Hugging Face Trainer", "trl": "TRL", "axolotl": "Axolotl",
                 "llamafactory": "LLaMA-Factory", "unsloth": "Unsloth"}
# condition key -> the Situation field it is judged on: the field's value must be in the row's list
LIST_CONDITIONS = {"trainers": "trainer", "model_types": "model_type", "dtypes": "dtype", "attn": "attn",
                   "quantization": "quantization", "adapters": "adapter", "optimizers": "optimizer",
                   "devices": "device"}
BOOL_CONDITIONS = ("packing", "gradient_checkpointing", "gradient_accumulation")
CONDITIONS = frozenset(LIST_CONDITIONS) | frozenset(BOOL_CONDITIONS) | {"packages", "capability", "unstated"}
ROW_KEYS = {"id", "package", "affected", "what", "fixed", "workaround", "link", "title", "also", "when"}


@dataclass(frozen=True)
class Bug:
    """One row of the table."""

    id: str
    package: str
    affected: SpecifierSet
    what: str
    fixed: str
    workaround: str
    link: str
    title: str
    when: Mapping[str, Any]
    also: tuple[tuple[str, str], ...] = ()

    def fix(self) -> str:
        """'upgrade to transformers>=4.46.0, or <workaround>'."""
        upgrade = f"upgrade to {self.package}>={self.fixed}" if self.fixed else ""
        return ", or ".join(part for part in (upgrade, self.workaround) if part)


@dataclass(frozen=True)
class Situation:
    """What the table is judged against. ``packages``: distribution -> installed version (None:
    not installed). ``trainer``/``model_type``/``capability`` are None where unknown; then
    ``gpu_unknown`` says why the GPU's facts are missing (a recipe for a GPU on a machine without one)."""

    packages: Mapping[str, Optional[str]]
    dtype: str = "bfloat16"
    attn: str = "sdpa"
    quantization: str = "none"
    adapter: str = "lora"
    optimizer: str = "adamw"
    packing: bool = False
    gradient_checkpointing: bool = False
    gradient_accumulation_steps: int = 1
    device: str = "cpu"
    trainer: Optional[str] = None
    model_type: Optional[str] = None
    capability: Optional[tuple[int, int]] = None
    gpu_unknown: str = ""

    def installed(self, package: str) -> Optional[str]:
        return {normalize(k): v for k, v in self.packages.items()}.get(normalize(package))


@dataclass(frozen=True)
class Verdict:
    """``state``: applies | may_apply (hinges on a setting no recipe states, e.g. DeepSpeed's ZeRO
    stage) | unknown (a fact needed could not be read) | no. ``notes``: the assumptions, the
    conditions it hinges on, or the missing facts."""

    bug: Bug
    state: str
    installed: Optional[str] = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def line(self, fix: bool = True) -> str:
        """One line: the bug, the version here, what goes wrong, (the fix,) the source."""
        hinge = f" ({'; '.join(self.notes)})" if self.notes else ""
        remedy = f"Fix: {self.bug.fix()}. " if fix else ""
        return (f"{self.bug.id}: {self.bug.package} {self.installed}{hinge}: {self.bug.what}. "
                f"{remedy}Source: {self.bug.title} <{self.bug.link}>")


def _spec(text: str, where: str) -> SpecifierSet:
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise ValueError(f"{where}: {text!r} is not a PEP 440 version specifier (e.g. \">=4.46,<4.48\")") from None


def parse_bugs(table: Mapping[str, Any], source: str = f"compat/{TABLE}.toml") -> tuple[Bug, ...]:
    """The rows of ``table`` as ``Bug``s; a malformed row raises ValueError naming the file, row and key."""
    bugs, seen = [], set()
    for index, row in enumerate(table.get("bug", [])):
        where = f"{source} [[bug]] #{index + 1} ({row.get('id', 'no id')})"
        missing = sorted({"id", "package", "affected", "what", "fixed", "workaround", "link", "title"} - set(row))
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        unknown = sorted(set(row) - ROW_KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(ROW_KEYS))}")
        when = dict(row.get("when", {}))
        bad = sorted(set(when) - CONDITIONS)
        if bad:
            raise ValueError(f"{where} [bug.when]: unknown condition(s) {', '.join(bad)}; "
                             f"expected {', '.join(sorted(CONDITIONS))}")
        for name, spec in when.get("packages", {}).items():
            _spec(spec, f"{where} [bug.when] packages.{name}")
        if "capability" in when:
            _spec(when["capability"], f"{where} [bug.when] capability")
        if row["id"] in seen:
            raise ValueError(f"{where}: id {row['id']!r} is used twice")
        if not str(row["link"]).startswith("https://"):
            raise ValueError(f"{where}: link must be the https:// address of the upstream source, got {row['link']!r}")
        seen.add(row["id"])
        bugs.append(Bug(id=row["id"], package=row["package"], affected=_spec(row["affected"], f"{where} affected"),
                        what=row["what"], fixed=row["fixed"], workaround=row["workaround"], link=row["link"],
                        title=row["title"], when=when, also=tuple(tuple(pair) for pair in row.get("also", ()))))
    return tuple(bugs)


@functools.lru_cache(maxsize=None)
def known_bugs() -> tuple[Bug, ...]:
    """Every row of the shipped table."""
    return parse_bugs(load(TABLE))


def _in(spec: SpecifierSet, version: str) -> bool:
    return spec.contains(Version(version), prereleases=True)


def _affected(bug: Bug, situation: Situation) -> tuple[Optional[bool], Optional[str], str]:
    """(in the affected range?, installed version, why it cannot be told)."""
    installed = situation.installed(bug.package)
    if installed is None:
        return False, None, ""
    try:
        return _in(bug.affected, installed), installed, ""
    except InvalidVersion:
        return None, installed, f"installed {bug.package} {installed!r} is not a PEP 440 version"


def _conditions(bug: Bug, s: Situation) -> tuple[bool, list[str], list[str], list[str]]:
    """(no condition is false, facts that could not be read, assumptions made for a trainer the
    recipe does not name, settings the recipe cannot state)."""
    unknown, assumed, hinges = [], [], []
    when = bug.when
    for key, attr in LIST_CONDITIONS.items():
        if key not in when:
            continue
        value = getattr(s, attr)
        if value is None and key == "trainers":
            assumed.append("assuming you train with " + " or ".join(TRAINER_NAMES.get(t, t) for t in when[key])
                           + ": the recipe does not name its trainer")
        elif value is None:
            unknown.append("the model's model_type (its config.json is not readable here)")
        elif value not in when[key]:
            return False, [], [], []
    steps = {"gradient_accumulation": s.gradient_accumulation_steps > 1}
    for key in BOOL_CONDITIONS:
        if key in when and bool(when[key]) != steps.get(key, getattr(s, key, None)):
            return False, [], [], []
    for name, spec in when.get("packages", {}).items():
        other = s.installed(name)
        try:
            if other is None or not _in(SpecifierSet(spec), other):
                return False, [], [], []
        except InvalidVersion:
            unknown.append(f"installed {name} {other!r} is not a PEP 440 version")
    if "capability" in when:
        if s.device != "cuda":
            return False, [], [], []
        if s.capability is None:
            unknown.append(f"the GPU's compute capability ({s.gpu_unknown or 'not reported'})")
        elif not _in(SpecifierSet(when["capability"]), f"{s.capability[0]}.{s.capability[1]}"):
            return False, [], [], []
    if "unstated" in when:
        hinges.append("if " + when["unstated"])
    return True, unknown, assumed, hinges


def judge(bug: Bug, situation: Situation) -> Verdict:
    """Whether ``bug`` applies in ``situation``."""
    affected, installed, why = _affected(bug, situation)
    if affected is False:
        return Verdict(bug, "no", installed)
    holds, unknown, assumed, hinges = _conditions(bug, situation)
    if not holds:
        return Verdict(bug, "no", installed)
    if why or unknown:
        return Verdict(bug, "unknown", installed, tuple(([why] if why else []) + unknown))
    # the trainer is assumed (a recipe that does not name one is most likely trained with one of
    # them); a setting no recipe can state only makes the row "may apply"
    return Verdict(bug, "may_apply" if hinges else "applies", installed, tuple(assumed + hinges))


def judge_all(situation: Situation, bugs: Optional[tuple[Bug, ...]] = None) -> list[Verdict]:
    return [judge(bug, situation) for bug in (known_bugs() if bugs is None else bugs)]


def needs_model_type(situation: Situation, bugs: Optional[tuple[Bug, ...]] = None) -> bool:
    """True when some row affecting an installed version depends on the model's model_type
    (so reading config.json is worth it)."""
    return any("model_types" in bug.when and _affected(bug, situation)[0] is not False
               for bug in (known_bugs() if bugs is None else bugs))


def recipe_trainer(recipe) -> Optional[str]:
    """The trainer the recipe names: its importer (trl, axolotl, llamafactory), else the trainer
    its [data] pipeline names (trl, unsloth, ...), else None (a native recipe on the built-in
    engine, or "auto", does not say what trains it)."""
    if recipe.origin is not None:
        return recipe.origin.format
    return None if recipe.data.pipeline in ("auto", "builtin") else recipe.data.pipeline


def situation_of(recipe, machine, device, model_type: Optional[str] = None) -> Situation:
    """The situation of ``recipe`` on ``machine`` (real or described), training on ``device``."""
    packages = dict(machine.package_versions)
    if not packages.get("torch") and machine.torch.version:
        packages["torch"] = machine.torch.version
    gpu_unknown = ""
    if device.kind == "cuda" and device.capability is None:
        gpu_unknown = device.missing or "the GPU reports none"
        if device.missing:
            gpu_unknown += "; describe the target machine with the pytest_ftready_machine hook"
    return Situation(packages=packages, dtype=recipe.model.dtype, attn=recipe.model.attn_implementation,
                     quantization=recipe.model.quantization, adapter=recipe.adapter.method,
                     optimizer=recipe.training.optimizer, packing=recipe.data.packing,
                     gradient_checkpointing=recipe.training.gradient_checkpointing,
                     gradient_accumulation_steps=recipe.training.gradient_accumulation_steps, device=device.kind,
                     trainer=recipe_trainer(recipe), model_type=model_type, capability=device.capability,
                     gpu_unknown=gpu_unknown)
