"""A trainer's keys as data: ``keys/<trainer>.toml`` holds one row per key (or group of keys)
with the trainer's default, its aliases and deprecated names, what it does, its class and,
for a translated key, the recipe key it becomes, each row with its source. ``apply`` walks a
config through its table so that every key ends in exactly one class:

- ``translated``: written into the recipe with the trainer's meaning; an absent key takes the
  trainer's default (never the recipe's);
- ``noted``: the checks will not reflect it (the note says why it matters; a row with
  ``effect = "none"`` only logs, reports or publishes);
- ``refused``: the config is not text SFT (or not what the checks can judge): one line naming
  the key, unless its value is one the row allows.

A key no row names is noted as unknown (with a "did you mean" when one is close).

A table's ``[run]`` section says what the trainer's own run (the checks running the trainer's
code over the team's rows) is handed of a config: each key is ``handed`` (as the config wrote
it), ``set`` (the checks set it for their bounded run: output, steps, saving, logs, no hub),
``sharding`` (it shards the run over processes a launcher starts, which one test process cannot
make) or ``neither`` (the run sees it through the recipe, or not at all); ``preprocessing``
lists the keys handed to the trainer's data preparation too. A note on a handed key concerns
the built-in engine's run only, and says so.

``keys/deprecated.toml`` holds the keys a newer trainer renamed or removed, with the versions
that had them and their source: ``rewrite_deprecated`` reads a config's old keys with the
meaning they had (renamed to today's key, or through the importer's handler) before the
trainer's parser or the walk sees it. Reads files only; imports no trainer."""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from ..schema import _clip, _shown
from .base import Builder
from .common import NUMBER

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

KEYS_DIR = Path(__file__).with_name("keys")
CLASSES = ("translated", "noted", "refused")
RUN_CLASSES = ("handed", "set", "sharding", "neither")
NOT_SET = object()  # a row without a default: the trainer's own is "unset"
MISSING = object()  # a value that leaves the recipe as it is


@dataclass(frozen=True)
class Row:
    """One row of a trainer's key table."""

    names: tuple[str, ...]  # the trainer's key name(s) this row describes
    cls: str  # translated | noted | refused
    does: str  # what the key does in the trainer
    source: str  # where the trainer defines it
    aliases: tuple[str, ...] = ()  # other or deprecated names the trainer accepts for names[0]
    prefix: bool = False  # names are prefixes (wandb_ covers wandb_project, ...)
    default: Any = NOT_SET  # the trainer's default, applied when the config is silent
    recipe: str = ""  # "table.key" a translated row writes
    values: dict = field(default_factory=dict)  # trainer value (as text) -> recipe value; "" = leave as is
    how: str = ""  # the importer's handler for a translation a value map cannot say
    note: str = ""  # translated: what the checks still do not reflect when set; noted: why it matters
    effect: str = ""  # "none": logging/reporting only (listed as not checked); "memory": a memory lever
    allow: tuple = ()  # refused: values that are text SFT after all (e.g. stage: sft)
    versions: str = ""  # trainer versions the row holds for, where it differs
    # Against the installed trainer's schema (tests/recipe/test_tables_against_trainers.py): the names that are
    # other programs' keys (a recipe script's, accelerate's, a plugin's) with whose, and the trainer versions
    # that added (since) or last had (until) a name, where the versions the table covers differ.
    outside: tuple = ()
    schema: str = ""
    since: dict = field(default_factory=dict)
    until: dict = field(default_factory=dict)

    def matches(self, key: str) -> bool:
        if self.prefix:
            return any(key.startswith(name) for name in self.names)
        return key in self.names or key in self.aliases


@dataclass(frozen=True)
class RunKeys:
    """What a trainer's own run is handed of a config (a key table's ``[run]`` section)."""

    what: str  # the run, as messages name it: "TRL's own run (SFTTrainer)"
    default: str = "neither"  # the class of a key the section does not list
    listed: tuple[tuple[str, str], ...] = ()  # (key, class)
    neither_from: tuple[str, ...] = ()  # the keys of rows defined in these sources are never handed
    preprocessing: tuple[str, ...] = ()  # keys handed to the trainer's data preparation too

    def of(self, key: str, row: Optional[Row]) -> str:
        listed = dict(self.listed)
        if key in listed:
            return listed[key]
        if row is not None and self.neither_from and row.source.endswith(self.neither_from):
            return "neither"
        return self.default


@dataclass(frozen=True)
class KeyTable:
    trainer: str
    version: str
    source: str
    rows: tuple[Row, ...]
    run: RunKeys = RunKeys("")
    covers: str = ""  # the oldest trainer version the rows are held for against its schema (default: version)

    def row(self, key: str) -> Optional[Row]:
        exact = [r for r in self.rows if not r.prefix and r.matches(key)]
        return exact[0] if exact else next((r for r in self.rows if r.prefix and r.matches(key)), None)

    def names(self) -> list[str]:
        return [name for r in self.rows if not r.prefix for name in (*r.names, *r.aliases)]


@lru_cache(maxsize=None)
def table_section(trainer: str, section: str) -> dict:
    """A section of keys/<trainer>.toml beside its rows (llamafactory's [multimodal_templates])."""
    return tomllib.loads((KEYS_DIR / f"{trainer}.toml").read_text(encoding="utf-8")).get(section, {})


@lru_cache(maxsize=None)
def load_table(trainer: str) -> KeyTable:
    """The key table of ``trainer`` (axolotl | llamafactory | trl), validated."""
    path = KEYS_DIR / f"{trainer}.toml"
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    rows = []
    for i, item in enumerate(raw["key"]):
        names = item.pop("names", None) or [item.pop("name")]
        item.pop("name", None)
        row = Row(names=tuple(names), cls=item.pop("class"), aliases=tuple(item.pop("aliases", ())),
                  allow=tuple(item.pop("allow", ())), outside=tuple(item.pop("outside", ())), **item)
        if row.outside and not row.schema or not set(row.outside) <= set(row.names):
            raise ValueError(f"{path} key[{i}] {names}: outside names some of names, and schema says whose they are")
        if row.cls not in CLASSES or not row.source or not row.does:
            raise ValueError(f"{path} key[{i}] {names}: class must be one of {CLASSES}, with does and source")
        if row.cls == "translated" and not (row.recipe or row.how):
            raise ValueError(f"{path} key[{i}] {names}: a translated row names its recipe key or handler")
        rows.append(row)
    meta = raw["trainer"]
    rows = [row if row.source.startswith("http") else replace(row, source=meta["source"] + row.source) for row in rows]
    if meta.get("include"):  # a shared table (transformers' TrainingArguments); own rows win by name
        own = {name for row in rows for name in row.names}
        rows += [row for row in load_table(meta["include"]).rows if not own & set(row.names)]
    return KeyTable(meta["name"], meta["version"], meta["source"], tuple(rows), _run_keys(path, raw.get("run")),
                    meta.get("covers", meta["version"]))


def _run_keys(path: Path, raw: Optional[dict]) -> RunKeys:
    """A table's ``[run]`` section (none: the trainer's own run is handed nothing)."""
    if raw is None:
        return RunKeys("")
    listed = tuple((key, cls) for cls in RUN_CLASSES for key in raw.get(cls, ()))
    default = raw.get("default", "neither")
    if default not in RUN_CLASSES or any(key not in RUN_CLASSES + ("what", "default", "neither_from", "preprocessing")
                                         for key in raw):
        raise ValueError(f"{path} [run]: default must be one of {RUN_CLASSES}; keys: what, default, neither_from, "
                         f"preprocessing and the classes")
    return RunKeys(raw["what"], default, listed, tuple(raw.get("neither_from", ())),
                   tuple(raw.get("preprocessing", ())))


Handler = Callable[[Builder, Any, str, Any, bool], None]  # the row: a Row or a Deprecated key


@dataclass(frozen=True)
class Deprecated:
    """A key a newer trainer renamed or removed (a row of ``keys/deprecated.toml``)."""

    trainer: str
    name: str  # a top-level key, or "table.key" inside a mapping (dataset_kwargs.add_special_tokens)
    versions: str  # where it existed and what became of it
    source: str
    becomes: str = ""  # renamed: today's key
    values: dict = field(default_factory=dict)  # old value (as text) -> the new key's value; "" drops the key
    how: str = ""  # else the importer's handler
    note: str = ""  # what the installed trainer does with the old key

    @property
    def does(self) -> str:  # as a Row's, for the handlers that read it
        return self.versions


@lru_cache(maxsize=None)
def load_deprecated(trainer: str) -> tuple[Deprecated, ...]:
    """The deprecated keys of ``trainer``, validated."""
    path = KEYS_DIR / "deprecated.toml"
    rows = tuple(Deprecated(**item) for item in tomllib.loads(path.read_text(encoding="utf-8"))["key"])
    for row in rows:
        if bool(row.becomes) == bool(row.how) or not row.source.startswith("https://") or not row.versions:
            raise ValueError(f"{path} {row.name}: one of becomes or how, with versions and an https source")
    return tuple(row for row in rows if row.trainer == trainer)


def rewrite_deprecated(b: Builder, trainer: str, handlers: Mapping[str, Handler]) -> set[str]:
    """Read ``b.raw``'s deprecated keys with the meaning they had: a renamed key becomes today's
    (``b.raw`` then holds the config as the installed trainer would have to be given it), a
    removed one goes through its handler. Returns the top-level keys handled here, which the
    walk leaves alone; each one is named in a note with its versions."""
    handled: set[str] = set()
    for row in load_deprecated(trainer):
        outer, _, inner = row.name.partition(".")
        holder = b.raw.get(outer) if inner else b.raw
        key = inner or outer
        if not isinstance(holder, dict) or key not in holder:
            continue
        value = holder[key]
        if row.how:
            handlers[row.how](b, row, row.name, value, False)
            if not inner:
                handled.add(key)
                b.classes[key], b.runs[key] = "translated", "neither"
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        new = row.values.get(text, value) if row.values else value
        del holder[key]
        if row.becomes in holder:
            b.caveat(row.name, f"the name of {row.becomes} in {row.versions}; ignored here: {row.becomes} is set too")
        elif new != "":
            holder[row.becomes] = new
            b.caveat(row.name, f"the name of {row.becomes} in {row.versions}: read as {row.becomes}: {new!r}; "
                     f"{row.note} ({row.source})")
        else:
            b.caveat(row.name, f"the name of {row.becomes} in {row.versions}: {value!r} leaves {row.becomes} at its "
                     f"default; {row.note}")
        if not inner:
            b.classes[key] = "translated"
    return handled


def apply(b: Builder, table: KeyTable, handlers: Mapping[str, Handler], raw: Optional[dict] = None,
          defaults: Optional[dict] = None) -> None:
    """Walk ``raw`` (the config; default ``b.raw``) through ``table``: trainer defaults for the
    translated rows the config is silent about first, then every key in the config's order.
    ``defaults`` (name -> value) replaces the table's defaults where the trainer itself was
    asked (TRL's dataclasses)."""
    raw = b.raw if raw is None else raw
    defaults = defaults or {}
    b.run_keys = table.run
    row: Optional[Row]
    for row in table.rows:
        if row.cls != "translated" or row.prefix or any(n in raw for n in (row.names[0], *row.aliases)):
            continue
        default = defaults.get(row.names[0], row.default)
        if default is not NOT_SET:
            _translate(b, row, f"{row.names[0]} (default {default})", default, handlers, True)
    for key, value in raw.items():
        row = table.row(key)
        b.runs[key] = table.run.of(key, row)
        if row is None:
            _unknown(b, table, key)
            continue
        b.classes[key] = row.cls
        if row.cls == "refused":
            if _refuses(row, value):
                raise b.fail(key, f"{value!r}: {row.does}; the checks judge text supervised fine-tuning, "
                             f"so this config is refused ({table.trainer} {table.version}; see {row.source})")
            b.classes[key] = "translated"  # a value the row allows: text SFT after all
            b.mapped.append((key, "(text SFT)"))
        elif row.cls == "noted":
            if row.effect == "none":
                b.not_checked(key, row.does)
            elif value is not None and value is not False and value != row.default:
                b.caveat(key, row.note or row.does, memory=row.effect == "memory", handed=b.runs[key] == "handed")
            else:
                b.not_checked(key, f"{row.does} (off here)")
        else:
            if value is None:  # written but empty: the trainer's default (a sibling key of the row has none)
                default = defaults.get(row.names[0], row.default) if key in (row.names[0], *row.aliases) else NOT_SET
                if default is NOT_SET:
                    b.not_checked(key, f"{row.does} (unset)")
                    continue
                value = default
            name = key if key in row.names else f"{key} (alias of {row.names[0]})"
            if key in row.aliases and row.versions:
                b.caveat(key, row.versions)
            _translate(b, row, name, value, handlers, False)


def read_config(b: Builder, trainer: str, handlers: Mapping[str, Handler], ask: Callable, reader: str,
                command: str) -> None:
    """Read ``b.raw`` as ``trainer`` would: its deprecated keys with the meaning they had, then the
    installed trainer's own reading (``ask``: (values, known keys, version[, warnings]) or None
    without it; ValueError when it refuses the config), then the walk through the key table with
    the trainer's defaults. ``reader`` names its parser in messages, ``command`` its launcher."""
    table = load_table(trainer)
    b.version = table.version
    handled = rewrite_deprecated(b, trainer, handlers)
    try:
        asked = ask(b.raw)
    except ValueError as exc:
        said = str(exc)
        raise b.fail(mentioned_key(said, b.raw), f"{table.trainer}'s {reader} refuses this config: {said[:600]} "
                     f"({command} would stop the same way)") from None
    defaults = None
    if asked is not None:
        defaults, known, version, *said = asked
        b.version = version
        b.title = f"{b.title}, {table.trainer} {version}'s {reader}"
        for line in said[0] if said else ():  # what it warned of: its deprecations
            if "deprecat" in line.lower() or "no longer" in line.lower():
                b.caveat(mentioned_key(line, b.raw) or trainer, f"{table.trainer} {version} says: {line[:300]}")
    apply(b, table, handlers, raw={k: v for k, v in b.raw.items() if k not in handled}, defaults=defaults)
    if asked is not None:
        known_to_trainer(b, known, table.trainer)


def installed(package: str) -> bool:
    """Whether ``package`` can be imported here, found without importing it (a trainer's import
    costs seconds to a minute; a missing one must cost nothing)."""
    import importlib.util

    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def plain(value: Any) -> Any:
    """A value a trainer's parser made (an enum, a tuple) as a config would write it."""
    import enum

    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return value


def known_to_trainer(b: Builder, known: frozenset, trainer: str) -> None:
    """After a walk whose trainer was asked: a key the trainer's own schema knows but no row of
    the table names is the trainer's (no check reads it), not unknown."""
    for key in [k for k in b.unknown if k in known]:
        b.unknown.remove(key)
        b.unchecked[key] = f"a {trainer} {b.version} key no check reads"


def mentioned_key(text: str, keys) -> str:
    """The first of ``keys`` a trainer's message names (``sdp_attention: true``), or ""."""
    import re

    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)
    return next((w for w in words if w in keys), "")


def _refuses(row: Row, value: Any) -> bool:
    if value is None or value is False or value == "" or value == []:
        return False
    return not row.allow or str(value).lower() not in {str(a).lower() for a in row.allow}


def _unknown(b: Builder, table: KeyTable, key: str) -> None:
    close = difflib.get_close_matches(key, table.names(), n=1, cutoff=0.8)
    b.classes[key] = "noted"
    b.unknown.append(key)
    b.not_checked(key, f"not a key of {table.trainer} {table.version} as the plugin knows it"
                  + (f"; did you mean {close[0]}?" if close else ": no check reads it"))


def _translate(b: Builder, row: Row, name: str, value: Any, handlers: Mapping[str, Handler], default: bool) -> None:
    if row.how:
        try:
            handlers[row.how](b, row, name, value, default)
        except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError) as exc:
            # a value of a shape the handler does not expect (a number where a list belongs ...)
            key = name.split(" ")[0]
            raise b.fail(key, f"{_shown(value)} ({type(value).__name__}) cannot be read as this key's value: "
                         f"{row.does} ({type(exc).__name__}: {_clip(str(exc), 80)}); write it as the trainer "
                         f"documents it ({row.source})") from None
    else:
        try:
            converted = convert(row, value)
        except KeyError:
            b.caveat(name.split(" ")[0], f"{value!r} is not a value the plugin translates ({row.does}; known: "
                     f"{', '.join(sorted(row.values))}): [{row.recipe.replace('.', '] ')} keeps the trainer's default")
            return
        if converted is not MISSING:
            table, _, key = row.recipe.partition(".")
            b.put(name, table, key, converted)
    if row.note and not default and value not in (None, False):
        key = name.split(" ")[0]
        b.caveat(key, row.note, memory=row.effect == "memory", handed=b.runs.get(key) == "handed")


def convert(row: Row, value: Any) -> Any:
    """The recipe value of ``value`` by the row's value map (MISSING: leave the recipe as is)."""
    if row.values:
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if text not in row.values:
            raise KeyError(text)
        mapped = row.values[text]
        return MISSING if mapped == "" else mapped
    if isinstance(value, str) and NUMBER.match(value):  # YAML reads 1e-4 as text; the trainers convert it
        return float(value) if any(c in value for c in ".eE") else int(value)
    return value
