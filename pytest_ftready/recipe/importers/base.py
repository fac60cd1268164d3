"""What every importer shares: the translation record, a builder that fills the TOML-shaped
tables while remembering which source key became which recipe key, the side ``ftready.toml``
of overrides, and validation through the recipe schema (so errors read the same as for a
recipe.toml, plus the source key they came from). Reads files only; imports no trainer."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from pyrsistent import freeze, pmap, thaw

from ..schema import MAX_RECIPE_BYTES, SCHEMA, TOP_KEYS, Recipe, RecipeError, _shown, did_you_mean, validate_recipe

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

SIDE_TOML = "ftready.toml"
INTEGER_TEXT = re.compile(r"^[+-]?\d+(\.0*)?([eE]\+?\d+)?$")  # a count as YAML may leave it: "10", "1e3", "8.0"
MAX_CONFIG_INT = 1 << 53  # counts past this are no run's (and floats stop being exact)
# A model named by a path rather than a hub id ("org/name"): absolute, home- or dot-relative,
# a Windows drive, a trailing slash, or more than one folder deep.
LOCAL_LOOKING = re.compile(r"^(/|~|\.{1,2}[/\\]|[A-Za-z]:[/\\])|[/\\]$|\\|^[^/]+/[^/]+/")


@dataclass(frozen=True)
class Translation:
    """How a trainer's config became a recipe; kept on ``Recipe.origin`` and shown to the user."""

    format: str  # "trl" | "axolotl" | "llamafactory"
    title: str  # "TRL (trl sft --config)"
    source: str  # the config file
    mapped: tuple[tuple[str, str], ...]  # (source key, "[table] key")
    not_checked: tuple[tuple[str, str], ...]  # (source key, why)
    caveats: tuple[str, ...]  # values that change what the checks mean, each with what is and is not checked
    overrides: str = ""  # the side TOML applied on top, if any
    classes: tuple[tuple[str, str], ...] = ()  # (config key, translated | noted) for every top-level key
    unknown: tuple[str, ...] = ()  # config keys no row of the trainer's table names
    overridden: tuple[str, ...] = ()  # "[table] key: translated value -> side file's value"
    trainer_version: str = ""  # the trainer version whose keys and defaults were applied
    memory_notes: tuple[str, ...] = ()  # the caveats on memory the checks cannot model (a subset of caveats)
    config: Mapping = field(default_factory=pmap)  # the config as parsed, frozen: read once, here
    runs: tuple[tuple[str, str], ...] = ()  # (config key, what the trainer's own run gets: table.RUN_CLASSES)
    preprocessing: tuple[str, ...] = ()  # the keys handed to the trainer's data preparation too
    run_what: str = ""  # the trainer's own run, as messages name it
    inputs: Mapping = field(default_factory=pmap)  # what else of the config's side files the trainer's run needs

    def value(self, key: str, default: Any = None) -> Any:
        """The config's own value of ``key`` (plain, a copy), or ``default``."""
        return thaw(self.config[key]) if key in self.config else default

    def handed(self) -> dict[str, Any]:
        """The config's keys the trainer's own run is handed, as the config wrote them."""
        return {key: self.value(key) for key, cls in self.runs if cls == "handed"}

    def handed_to_preprocessing(self) -> dict[str, Any]:
        """The config's keys (set, not null) the trainer's data preparation is handed."""
        return {key: self.value(key) for key in self.preprocessing if self.config.get(key) is not None}

    def sharding(self) -> list[str]:
        """The config's keys, set, that shard the run over processes a launcher starts."""
        return [key for key, cls in self.runs if cls == "sharding" and self.config.get(key)]

    def input(self, name: str, default: Any = None) -> Any:
        return thaw(self.inputs[name]) if name in self.inputs else default

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "title": self.title, "source": self.source, "overrides": self.overrides,
                "mapped": [list(pair) for pair in self.mapped],
                "not_checked": [list(pair) for pair in self.not_checked], "caveats": list(self.caveats),
                "classes": dict(self.classes), "unknown": list(self.unknown), "overridden": list(self.overridden),
                "trainer_version": self.trainer_version, "memory_notes": list(self.memory_notes)}

    def unchecked_lines(self) -> list[str]:
        """The lines of ``header_lines`` saying what the checks do not reflect (its not-checked
        keys and its notes): what a quiet run still prints."""
        name = Path(self.source).name
        lines = [f"ftready: {name} not checked ({len(self.not_checked)}): "
                 + ", ".join(f"{key} ({why})" for key, why in self.not_checked)] if self.not_checked else []
        return lines + [f"ftready: {name} note: {text}" for text in self.caveats]

    def header_lines(self) -> list[str]:
        """Terminal lines for pytest_report_header: what was translated, what was not."""
        name = Path(self.source).name
        side = Path(self.overrides).name if self.overrides else None
        own = [(src, dst) for src, dst in self.mapped if not (side and src.startswith(side + " "))]
        own.sort(key=lambda pair: " (default " in pair[0])  # the config's own keys first, trainer defaults after
        lines = [f"ftready: {name} read as {self.title}: " + ", ".join(f"{src} -> {dst}" for src, dst in own)]
        if side:
            lines.append(f"ftready: {name} overrides from {side}: "
                         + ", ".join(dst for src, dst in self.mapped if src.startswith(side + " ")))
            if self.overridden:
                lines.append(f"ftready: {name} overridden by {side}: " + "; ".join(self.overridden))
        return lines + self.unchecked_lines()

    def suite_properties(self) -> list[tuple[str, str]]:
        """JUnit suite properties: one per unchecked key and per caveat."""
        stem = Path(self.source).name
        side = Path(self.overrides).name + " " if self.overrides else None
        own = sum(1 for src, _ in self.mapped if not (side and src.startswith(side)))
        out = [(f"ftready_translated:{stem}", f"{self.title}: {own} keys translated"
                + (f", overrides from {side.strip()}" if side else ""))]
        out += [(f"ftready_not_checked:{stem}:{key}", why) for key, why in self.not_checked]
        out += [(f"ftready_caveat:{stem}:{i}", text) for i, text in enumerate(self.caveats, start=1)]
        return out


class SideFileNeeded(RecipeError):
    """A config that names what is not on this machine (a hub model without a commit, hub data, a
    model folder of its author's): the side file's ``fixes`` key ((table, key)) is the way out."""

    def __init__(self, path: Path | str, where: str, message: str, fixes: tuple[str, str]) -> None:
        super().__init__(path, where, message)
        self.fixes = fixes


class Builder:
    """Fills recipe tables from one config (``table.apply`` walks it): every top-level source key
    ends up translated, noted (a caveat, or listed as not checked) or refused: none is dropped
    silently."""

    def __init__(self, path: Path, raw: dict, fmt: str, title: str) -> None:
        self.path = path
        self.folder = path.parent
        self.raw = raw
        self.format, self.title = fmt, title
        self.tables: dict[str, Any] = {}  # table -> its keys; "name" -> the recipe's name
        self.mapped: list[tuple[str, str]] = []
        self.caveats: list[str] = []
        self.unchecked: dict[str, str] = {}
        self.classes: dict[str, str] = {}  # top-level config key -> class (table.apply fills it)
        self.unknown: list[str] = []
        self.memory_notes: list[str] = []
        self.version = ""
        self.runs: dict[str, str] = {}  # config key -> table.RUN_CLASSES (table.apply fills it)
        self.run_keys: Any = None  # the table's table.RunKeys (table.apply sets it)
        self.inputs: dict[str, Any] = {}  # what the trainer's run needs of the side files (dataset_info.json ...)
        self.absent_model: Optional[tuple[str, str]] = None  # (key, path): a local model folder not on this machine
        # "every linear layer" (modules.EveryLinear), resolved on the model's own architecture once the
        # side file has said where the model is
        self.every_linear: Any = None

    def note_unexpanded(self) -> None:
        """A caveat for each top-level key whose value holds an environment reference (``${HOME}``,
        ``$DATA_DIR``): YAML does not expand them and neither do the checks."""
        for key, value in self.raw.items():
            found = unexpanded(value)
            if found:
                self.caveat(str(key), f"holds {', '.join(found[:3])}, left unexpanded: the checks read the text as "
                            "written (YAML expands no environment variables); write the value itself, or set it in "
                            f"{SIDE_TOML}")

    def put(self, source: str, table: str, key: str, value: Any) -> None:
        self.tables.setdefault(table, {})[key] = value
        self.mapped.append((source, f"[{table}] {key}"))

    def caveat(self, source: str, text: str, memory: bool = False, handed: bool = False) -> None:
        """A value that changes what the checks mean; ``memory``: a lever the memory checks cannot
        model, with the bound of their error (shown by model.step_memory and model.memory_forecast);
        ``handed``: the trainer's own run is handed the key, so the note concerns the built-in
        engine's run only, and says so."""
        if handed:
            text += f" (the built-in engine's run; {self.run_keys.what} is handed {source} as written)"
        self.caveats.append(f"{source}: {text}")
        if memory:
            self.memory_notes.append(f"{source}: {text}")

    def not_checked(self, source: str, why: str) -> None:
        self.unchecked[source] = why

    def fail(self, source: str, message: str) -> RecipeError:
        return RecipeError(self.path, source, message)

    def integer(self, source: str, value: Any, expected: str, low: int = 0, high: int = MAX_CONFIG_INT) -> int:
        """``value`` as the trainer reads a count (an int, a whole float, or either written as
        text), within ``low``..``high``; anything else is a RecipeError naming ``source`` and
        what ``expected`` says it should be."""
        number = value
        if isinstance(value, str) and INTEGER_TEXT.match(value.strip()):
            number = float(value.strip())
        if isinstance(number, float) and number.is_integer():
            number = int(number)
        if isinstance(number, bool) or not isinstance(number, int):
            raise self.fail(source, f"expected {expected}, got {_shown(value)}: write a whole number")
        if not low <= number <= high:
            raise self.fail(source, f"expected {expected} between {low:,} and {high:,}, got {_shown(number)}: "
                            "write a number in that range")
        return number

    def local_path(self, raw: str) -> Path:
        """A path as the trainer would read it when launched from the config's folder."""
        return (self.folder / Path(raw).expanduser()).resolve()

    def local_files(self, source: str, raw: str) -> list[Path]:
        """The data files a local path names (a file, or a folder's data files); a hub name is
        named as not read."""
        local = self.local_path(raw)
        if local.is_file():
            return [local]
        if local.is_dir():
            return data_files_in(local)
        self.caveat(source, f"{raw!r} is not a local file or folder (a hub dataset?): the checks read local "
                    "files only; set [data] train in ftready.toml to a local copy")
        return []

    def model(self, source: str, name: Any, revision: Optional[str]) -> None:
        """A local folder becomes [model] path; anything else a hub id with its revision. A path
        that is not on this machine (the author's own folder) is kept as the path, and ``finish``
        names it unless the side file points [model] path at a local copy."""
        if not isinstance(name, str) or not name:
            raise self.fail(source, f"expected a model id or folder, got {name!r}")
        found = unexpanded(name)
        if found and not self.local_path(name).is_dir():
            raise self.fail(source.split(" ")[0], f"{name!r} holds {', '.join(found)}, left unexpanded "
                            f"(YAML expands no "
                            "environment variables, nor do the checks): write the model's folder or hub id itself, or "
                            f"[model] path = \"path/to/model\" in {self.path.stem}.{SIDE_TOML} or {SIDE_TOML}")
        if self.local_path(name).is_dir():
            self.put(source, "model", "path", name)
        elif LOCAL_LOOKING.search(name):
            self.put(source, "model", "path", name)
            self.absent_model = (source.split(" ")[0], name)
        else:
            self.put(source, "model", "id", name)
            if revision:
                self.tables["model"]["revision"] = revision

    def translation(self, overrides: str, overridden: tuple[str, ...] = ()) -> Translation:
        run = self.run_keys
        return Translation(self.format, self.title, str(self.path), tuple(self.mapped),
                           tuple(sorted(self.unchecked.items())), tuple(self.caveats), overrides,
                           tuple(self.classes.items()), tuple(self.unknown), tuple(overridden), self.version,
                           tuple(self.memory_notes), freeze(self.raw), tuple(self.runs.items()),
                           run.preprocessing if run else (), run.what if run else "", freeze(self.inputs))

    def finish(self, standing_in: Optional[dict] = None) -> Recipe:
        """Apply the side TOML, validate through the recipe schema, attach the translation.
        ``standing_in`` ({table: {key: value}}) stands in for side-file keys not yet written
        (ftready-init --from, finding every key a side file must give)."""
        for table, values in (standing_in or {}).items():
            self.tables.setdefault(table, {}).update(values)
            if table == "model" and "path" in values:
                self.tables["model"].pop("id", None)
        side = side_toml(self.path)
        overridden: list[str] = []
        if side is not None:
            for table, values in read_side_toml(side).items():
                if isinstance(values, dict) and table in SCHEMA:
                    overridden += self._override(side, table, values)
                else:
                    self.tables[table] = values
                    self.mapped.append((f"{side.name} {table}", table))
        self.tables.setdefault("name", _name(self.path.stem))
        self._model_here()
        if self.every_linear is not None and not (side and "target_modules" in read_side_toml(side).get("adapter", {})):
            self.every_linear.resolve(self)
        if not self.tables.get("data", {}).get("train"):
            notes = "; ".join(c for c in self.caveats if "local" in c or "left out" in c or "not found" in c)
            raise SideFileNeeded(self.path, "[data] train", "no local training file in this config"
                                 + (f" ({notes})" if notes else "") + f"; the checks read local rows: write [data] "
                                 f"train = [\"path/to/train.jsonl\"] in {self.path.stem}.{SIDE_TOML} or {SIDE_TOML} "
                                 "beside it", ("data", "train"))
        origin = self.translation(str(side) if side else "", tuple(overridden))
        try:
            return validate_recipe(self.tables, self.path, origin=origin)
        except RecipeError as exc:
            message = exc.message
            needed = exc.where == "[model] revision"  # a hub id: a local copy is the other way out
            if needed:
                message += (f"; or check a local copy: [model] path = \"path/to/model\" in {SIDE_TOML} replaces "
                            "the hub id")
            source = next((src for src, dst in reversed(self.mapped) if exc.where.startswith(dst)), None)
            where = exc.where if source is None or source == exc.where else f"{exc.where} (from {source})"
            if needed:
                raise SideFileNeeded(self.path, where, message, ("model", "revision")) from None
            raise RecipeError(self.path, where, message) from None

    def _model_here(self) -> None:
        """A model folder the config names by a path that is not on this machine, still the
        recipe's after the side file: one line naming the key and what fixes it."""
        if self.absent_model is None:
            return
        key, name = self.absent_model
        if self.tables.get("model", {}).get("path") == name and not self.local_path(name).is_dir():
            raise SideFileNeeded(self.path, key, f"{name!r} is a local model folder that is not on this machine "
                                 f"(looked for {self.local_path(name)}); the side file's [model] path fixes it: write "
                                 f"[model] path = \"path/to/your/copy\" in {self.path.stem}.{SIDE_TOML} or {SIDE_TOML} "
                                 f"beside the config (it replaces {key})", ("model", "path"))

    def _override(self, side: Path, table: str, values: dict) -> list[str]:
        """The side file's keys of ``table`` win over the translation; each one that replaced a
        translated value is named. ``[model] path`` (or ``id``) replaces the other one: a config
        that names a hub id can be pointed at a local copy of the model."""
        current = self.tables.setdefault(table, {})
        overridden = []
        if table == "model":
            for mine, other in (("path", "id"), ("id", "path")):
                if mine in values and current.get(other):
                    overridden.append(f"[model] {other} {current.pop(other)!r} replaced by [model] {mine}")
                    if other == "id":
                        current.pop("revision", None)
        for key, value in values.items():
            if key in current and current[key] != value:
                overridden.append(f"[{table}] {key} {current[key]!r} -> {value!r}")
            current[key] = value
            self.mapped.append((f"{side.name} [{table}] {key}", f"[{table}] {key}"))
        return overridden


ENV_REFERENCE = re.compile(r"\$\{[A-Za-z_][^}]*\}|\$[A-Z_][A-Z0-9_]*\b")


def unexpanded(value: Any) -> list[str]:
    """The environment references (``${NAME}``, ``$NAME``) in the strings of ``value``, in order, each once."""
    found: dict[str, None] = {}
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.update((m, None) for m in ENV_REFERENCE.findall(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return list(found)


def _name(stem: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in stem).lstrip("._-") or "recipe"


def side_toml(path: Path) -> Optional[Path]:
    """``<config stem>.ftready.toml`` beside the config, else ``ftready.toml`` in its folder."""
    for candidate in (path.with_name(f"{path.stem}.{SIDE_TOML}"), path.with_name(SIDE_TOML)):
        if candidate.is_file():
            return candidate
    return None


def read_side_toml(side: Path) -> dict:
    try:
        raw = tomllib.loads(side.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(side, "", f"cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(side, "", f"not valid TOML: {exc}") from None
    for key in raw:
        if key not in SCHEMA and key not in TOP_KEYS:
            raise RecipeError(side, key, "unknown table or key" + did_you_mean(key, [*SCHEMA, *TOP_KEYS]))
        if key in SCHEMA and not isinstance(raw[key], dict):
            raise RecipeError(side, key, f"expected a table ([{key}] with its keys below it), got {_shown(raw[key])}: "
                              f"write [{key}] on a line of its own and its keys under it")
    return raw


MAX_YAML_BYTES = MAX_RECIPE_BYTES  # a config is a page of settings, like a recipe
# What a YAML document may hold once its aliases are expanded (nodes plus the characters of its
# values): a config of a few hundred keys holds a few thousand; a "billion laughs" alias bomb
# holds billions, and walking it (freezing, comparing, handing it on) exhausts memory.
MAX_YAML_EXPANDED = 4 * MAX_YAML_BYTES


def read_yaml_text(path: Path) -> str:
    """The text of the YAML file at ``path``: a regular file of at most MAX_YAML_BYTES, else a
    RecipeError naming it (a FIFO would block the read, a device never ends)."""
    try:
        if path.exists() and not path.is_file():
            what = "a folder" if path.is_dir() else "not a regular file (a FIFO, socket or device)"
            raise RecipeError(path, "", f"is {what}; pass the path of a YAML config file")
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise RecipeError(path, "", f"holds {size:,} bytes, more than the {MAX_YAML_BYTES:,} a config may: "
                              "pass the trainer's config, not a data or model file")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(path, "", "file not found; pass --ftready=PATH to an existing config") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(path, "", f"cannot be read: {exc}") from None


def safe_yaml(text: str, path: Path) -> Any:
    """The one YAML reader of the plugin: ``yaml.safe_load`` of ``text`` (the file at ``path``),
    refusing with a RecipeError naming the file a document larger than MAX_YAML_BYTES, one
    whose aliases expand past MAX_YAML_EXPANDED (an alias bomb), an alias that contains itself,
    or nesting deeper than Python can follow. A syntax error stays a ``yaml.YAMLError`` (each
    caller words it, or falls back)."""
    import yaml

    if len(text) > MAX_YAML_BYTES:
        raise RecipeError(path, "", f"holds {len(text):,} characters, more than the {MAX_YAML_BYTES:,} a config may: "
                          "pass the trainer's config, not a data or model file")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, path)
        return loader.construct_document(node)
    except RecursionError:
        raise RecipeError(path, "", "nests its lists and mappings deeper than the reader can follow: "
                          "a config is a few levels deep; write it flat") from None
    finally:
        loader.dispose()


def _expanded_size(root: Any, path: Path) -> int:
    """Nodes plus value characters of the document under ``root`` with every alias expanded,
    counted without expanding (each node once), up to MAX_YAML_EXPANDED."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, closing = stack.pop()
        key = id(node)
        children = _yaml_children(node)
        if closing:
            open_nodes.discard(key)
            sizes[key] = (1 + (len(node.value) if isinstance(node.value, str) else 0)
                          + sum(sizes[id(c)] for c in children))
            if sizes[key] > MAX_YAML_EXPANDED:
                raise RecipeError(path, "", f"its aliases (*name) expand to more than {MAX_YAML_EXPANDED:,} values "
                                  "and characters (an alias bomb?): a config repeats a few settings at most; "
                                  "write the values out, or use fewer nested aliases")
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise RecipeError(path, "", f"an alias (*name) at line {node.start_mark.line + 1} refers to a list or "
                              "mapping that contains it, which never ends when expanded: remove the alias")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _yaml_children(node: Any) -> list:
    if isinstance(node.value, list):  # a sequence's nodes, a mapping's (key, value) pairs
        return [part for item in node.value for part in (item if isinstance(item, tuple) else (item,))]
    return []


def read_yaml(path: Path) -> dict:
    import yaml

    text = read_yaml_text(path)
    try:
        raw = safe_yaml(text, path)
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()
        raise RecipeError(path, "", f"not valid YAML: {' '.join(first[:3])}") from None
    if not isinstance(raw, dict):
        raise RecipeError(path, "", f"expected a YAML mapping of keys, got {type(raw).__name__}")
    return raw


DATA_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".csv")


def data_files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in DATA_SUFFIXES and p.is_file())


def first_row(files: list[Path]) -> Optional[dict]:
    """The first row of the first JSON/JSONL file (to tell messages / prompt-completion / text)."""
    for file in files:
        if not file.is_file() or file.suffix.lower() not in (".jsonl", ".ndjson", ".json"):
            continue
        try:
            with file.open(encoding="utf-8") as handle:
                head = handle.read(1 << 20).lstrip()
        except (OSError, UnicodeDecodeError):
            continue
        if head.startswith("["):
            try:
                rows = json.loads(file.read_text(encoding="utf-8"))
                return rows[0] if rows and isinstance(rows[0], dict) else None
            except (json.JSONDecodeError, OSError):
                continue
        for line in head.splitlines():
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    break
                return row if isinstance(row, dict) else None
    return None


def row_format(row: Optional[dict], text_field: str = "text") -> Optional[str]:
    if not row:
        return None
    if "messages" in row:
        return "messages"
    if "prompt" in row and "completion" in row:
        return "prompt_completion"
    if text_field in row:
        return "text"
    return None
