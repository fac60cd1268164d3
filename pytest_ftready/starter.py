"""A commented starting recipe for a team's own model and data (``ftready-init``).

Every key of the schema (``schema.SCHEMA``) is written with its meaning: the values read from
the model folder (``config.json``, the model card) and the data file (the first row's layout)
as keys, with where they came from; the defaults as comments; and each value that could not be
read, and matters, marked ``FILL IN``. From a trainer's config (TRL, Axolotl, LLaMA-Factory)
it writes the side file ``<config stem>.ftready.toml`` instead: what that config cannot say.
Reads local files only (no hub request); imports no torch."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from .recipe.schema import REQUIRED, SCHEMA, RecipeError


FILL_IN = "FILL IN"
TRAIN_ON = {"prompt_completion": "completion", "text": "all"}  # layout -> the train_on its rows need


def toml_value(value: Any) -> str:
    """A TOML literal for the plain values a recipe holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return ("{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }"
                if value else "{}")
    raise TypeError(f"no TOML literal for {type(value).__name__}")


def _first_row(path: Path) -> Optional[dict]:
    from .data.rows import Row, chunks

    for chunk in chunks([path]):
        for item in chunk.items():
            return item.data if isinstance(item, Row) and isinstance(item.data, dict) else None
    return None


def model_facts(folder: Path) -> dict[str, tuple[Any, str]]:
    """What a local model folder says: key -> (value, where it was read)."""
    facts: dict[str, tuple[Any, str]] = {}
    config_path = folder / "config.json"
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"ftready-init: {config_path} cannot be read as JSON ({exc}): fix or restore the model's "
                             "config.json (save_pretrained writes it)") from None
        if not isinstance(config, dict):
            raise ValueError(f"ftready-init: {config_path} holds a JSON {type(config).__name__}, not the model's "
                             "config object: fix or restore it")
        dtype = config.get("dtype") or config.get("torch_dtype")
        if dtype in SCHEMA["model"]["dtype"].choices:
            facts["dtype"] = (dtype, "config.json dtype")
        positions = config.get("max_position_embeddings")
        if isinstance(positions, int) and positions > 0:
            facts["max_length"] = (min(2048, positions), f"config.json max_position_embeddings {positions}, "
                                   f"at most 2048"
                                                         ": write the length your trainer cuts at")
        if config.get("license"):
            facts["license"] = (str(config["license"]).lower(), "config.json license")
    readme = folder / "README.md"
    if readme.is_file() and "license" not in facts:
        from .privacy.audit import card_license

        found = card_license(readme.read_text(encoding="utf-8", errors="replace"))
        if found:
            facts["license"] = (found, "the model card (README.md)")
    return facts


def data_facts(files: Sequence[Path]) -> dict[str, tuple[Any, str]]:
    """The layout of the first file's first row, and the train_on it needs."""
    from .data.layouts import layout_of

    row = _first_row(files[0]) if files else None
    layout = layout_of(row) if row is not None else None
    if layout is None:
        return {}
    fmt = layout
    where = f"the first row of {files[0].name}"
    return {"format": (fmt, where), "train_on": (TRAIN_ON.get(fmt, "assistant"), f"the {fmt} layout")}


def parse_setting(text: str) -> tuple[tuple[str, str], Any]:
    """``table.key=VALUE`` (VALUE a TOML literal, or a bare word taken as a string) as
    ((table, key), value); a ValueError names what is wrong and the valid keys."""
    import difflib
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib

    name, sep, literal = text.partition("=")
    table, _, key = name.strip().partition(".")
    if not sep or table not in SCHEMA or key not in SCHEMA[table]:
        known = [f"{t}.{k}" for t, keys in SCHEMA.items() for k in keys]
        close = difflib.get_close_matches(name.strip(), known, n=1)
        raise ValueError(f"--set {text!r}: expected table.key=VALUE with a recipe key"
                         + (f"; did you mean {close[0]}?" if close else " (see pytest-ftready's docs/recipe.md)"))
    try:
        value = tomllib.loads(f"v = {literal.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = literal.strip()  # a bare word: a string
    if SCHEMA[table][key].kind not in ("path", "paths"):  # paths are checked where the recipe is written
        from .recipe.schema import validate_value

        try:
            validate_value(table, key, value, "recipe.toml")
        except RecipeError as exc:
            raise ValueError(f"--set {text!r}: {exc.message}; the plugin would refuse the recipe "
                             f"the same way") from None
    return (table, key), value


def starter_recipe(recipe_path: Path, model: str, data: Sequence[Path], revision: str = "", license: str = "",
                   rights: str = "", settings: Sequence[str] = ()) -> str:
    """The text of a commented starting recipe to be written at ``recipe_path``; ``settings``:
    ``table.key=VALUE`` values the team already knows (``--set``)."""
    base = recipe_path.parent
    values: dict[tuple[str, str], tuple[Any, str]] = {}
    marked: dict[tuple[str, str], str] = {}
    folder = Path(model)
    if folder.is_dir():
        values["model", "path"] = (_relative(folder, base), "the model folder given")
        facts = model_facts(folder)
    else:
        values["model", "id"] = (model, "the hub id given")
        facts = {}
        if revision:
            values["model", "revision"] = (revision, "--revision")
        else:
            marked["model", "revision"] = ("the 40-hex commit of the model on the hub (its 'Files' tab, or "
                                           "huggingface_hub.model_info(id).sha)")
    for key, table in (("dtype", "model"), ("license", "model"), ("max_length", "data")):
        if key in facts:
            values[table, key] = facts[key]
    if license:
        values["model", "license"] = (license, "--license")
    if ("model", "license") not in values:
        marked["model", "license"] = "the model's license, after reading its terms (privacy.license)"
    values["data", "train"] = ([_relative(Path(p), base) for p in data], "the data files given")
    for key, fact in data_facts([Path(p) for p in data]).items():
        values["data", key] = fact
    if rights:
        values["data", "rights"] = (rights, "--rights")
    else:
        marked["data", "rights"] = "why you may train on this data (privacy.license)"
    chosen = values.get(("model", "license"))
    if chosen:
        values["privacy", "licenses"] = ([chosen[0]], "the model's license: the licenses you accept")
    else:
        marked["privacy", "licenses"] = "the model licenses you accept, e.g. [\"apache-2.0\"]"
    marked["privacy", "backups"] = "where backups go and whether encrypted: { path = \"backups/\", encrypted = true }"
    marked["privacy", "retention_days"] = "how many days artifacts are kept (privacy.retention)"
    for text in settings:
        where, value = parse_setting(text)
        values[where] = (value, "--set")
        marked.pop(where, None)
    return _render(recipe_path.stem, values, marked)


def _relative(path: Path, base: Path) -> str:
    """``path`` relative to the recipe's folder, as given (a link stays a link)."""
    return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(base))).as_posix()


def _render(name: str, values: dict, marked: dict) -> str:
    lines = ["# A starting recipe written by ftready-init: check every value, then run",
             f"#   pytest --ftready={name}.toml",
             f"# Values read from your files say where from; '{FILL_IN}' marks what could not be read;",
             "# commented keys show their defaults. Keys and meanings: pytest-ftready's docs/recipe.md.",
             f"name = {toml_value(name)}"]
    for table, keys in SCHEMA.items():
        if table == "distributed":
            continue  # multi-GPU recipes only: see docs/multi-gpu.md
        lines += ["", f"[{table}]"]
        for key, spec in keys.items():
            lines.append(_line(key, spec, values.get((table, key)), marked.get((table, key))))
    return "\n".join(lines) + "\n"


def _line(key: str, spec, value: Optional[tuple], mark: Optional[str]) -> str:
    if value is not None:
        return f"{key} = {toml_value(value[0])}   # from {value[1]}"
    if mark is not None:
        empty = spec.default if spec.default is not REQUIRED else ""
        return f"{key} = {toml_value(empty)}   # {FILL_IN}: {mark}"
    if spec.default is REQUIRED:
        return f"# {key} =   # required: {spec.doc}"
    return f"# {key} = {toml_value(spec.default)}   # {spec.doc}"


# What stands in for a key the side file must give while the config is read to find every such
# key (never written): a commit-shaped revision, the config's own folder as the model, its own
# file as the rows.
STANDING_IN = {("model", "revision"): "0" * 40, ("model", "path"): ".", ("data", "train"): None}
NEEDED = {("model", "revision"): ('revision = ""', "the hub commit (40 hex digits) of the model; or a local copy: "
                                  'path = "path/to/model" (it replaces the hub id)'),
          ("model", "path"): ('path = "path/to/your/copy"', "the config names a model folder that is not on this "
                              "machine"),
          ("data", "train"): ('train = ["path/to/train.jsonl"]', "a local copy of the rows (the config's data is "
                              "not a local file)")}


def read_for_side_file(config: Path, revision: str = "") -> tuple[Any, dict]:
    """The config read as pytest --ftready would, with what its side file must give standing in:
    (the recipe, {(table, key): the error that asked for it}). A config wrong in any other way
    raises its RecipeError."""
    from .recipe import load_recipe
    from .recipe.importers import SideFileNeeded

    standing_in: dict = {"model": {"revision": revision}} if revision else {}
    needed: dict = {}
    while True:
        try:
            return load_recipe(config, standing_in), needed
        except SideFileNeeded as exc:
            if exc.fixes in needed or (exc.fixes == ("model", "revision") and revision):
                raise
            needed[exc.fixes] = exc
            table, key = exc.fixes
            standing_in.setdefault(table, {})[key] = STANDING_IN[exc.fixes] or [str(config)]


def side_file(config: Path, license: str = "", rights: str = "", revision: str = "") -> tuple[Path, str]:
    """(path, text) of ``<config stem>.ftready.toml`` for a trainer's config: what the config
    cannot say (license, data rights, accepted licenses; a hub model's commit, local rows or a
    model folder where the config names what is not on this machine), marked where not given."""
    if config.suffix.lower() not in (".yaml", ".yml"):
        raise RecipeError(config, "", "--from takes a TRL, Axolotl or LLaMA-Factory YAML config")
    recipe, needed = read_for_side_file(config, revision)
    local_model = recipe.model.path and ("model", "path") not in needed
    facts = model_facts(Path(recipe.model.path)) if local_model else {}
    chosen = license or (facts.get("license") or ("", ""))[0]

    def asked(table: str) -> list[str]:
        return [f"# {NEEDED[fix][0]}   # {FILL_IN}: {NEEDED[fix][1]}" for fix in needed if fix[0] == table]

    lines = [f"# What {config.name} cannot say, read by pytest --ftready={config.name} (written by ftready-init).",
             "# The tables and keys of recipe.toml; these win over the translation key by key.", "", "[model]",
             f"license = {toml_value(chosen)}" + ("" if chosen else f"   # {FILL_IN}: the model's license, after "
                                                  f"reading its terms"),
             *([f"revision = {toml_value(revision)}"] if revision else []), *asked("model"),
             "", "[data]", f"rights = {toml_value(rights)}" + ("" if rights
                                                               else f"   # {FILL_IN}: why you may train on this data"),
             *asked("data"),
             "", "[privacy]", f"licenses = {toml_value([chosen] if chosen else [])}"
             + ("" if chosen else f"   # {FILL_IN}: the model licenses you accept"), "", "[checks]"]
    lines += [f"# {key} = {toml_value(spec.default)}   # {spec.doc}" for key, spec in SCHEMA["checks"].items()]
    return config.with_name(f"{config.stem}.ftready.toml"), "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="ftready-init", description="write a commented starting recipe for your "
                                     "model and data, or the side file of a trainer's config")
    parser.add_argument("--model", help="a local model folder or a hub id")
    parser.add_argument("--data", action="append", default=[], metavar="FILE", help="a training file (repeatable)")
    parser.add_argument("--from", dest="config", metavar="CONFIG",
                        help="a TRL / Axolotl / LLaMA-Factory config: write <stem>.ftready.toml beside it")
    parser.add_argument("--revision", default="", help="the hub commit (with a hub id; with --from, written to "
                        "the side file)")
    parser.add_argument("--license", default="", help="the model's license, once you have read its terms")
    parser.add_argument("--rights", default="", help="why you may train on this data")
    parser.add_argument("--set", action="append", default=[], metavar="TABLE.KEY=VALUE",
                        help="a value you already know, e.g. training.learning_rate=1e-4 (repeatable)")
    parser.add_argument("-o", "--output", default="recipe.toml", help="where to write the recipe (default recipe.toml)")
    parser.add_argument("--force", action="store_true", help="replace an existing file")
    args = parser.parse_args(argv)
    try:
        if args.config:
            path, text = side_file(Path(args.config), args.license, args.rights, args.revision)
        elif args.model and args.data:
            missing = [d for d in args.data if not Path(d).is_file()]
            if missing:
                parser.error(f"--data {missing[0]}: no such file")
            path = Path(args.output)
            text = starter_recipe(path, args.model, [Path(d) for d in args.data], args.revision, args.license,
                                  args.rights, args.set)
        else:
            parser.error("give --model and --data (a recipe for your model and data) or --from CONFIG")
    except (RecipeError, ValueError) as exc:
        print(exc)
        return 2
    from .files import PathProblem, write_user_file

    option = "--from's side file" if args.config else "-o"
    if path.is_dir():
        print(f"ftready-init: {path} is a folder; pass the recipe file's path, e.g. -o {path / 'recipe.toml'}")
        return 2
    if path.exists() and not args.force:
        print(f"ftready-init: {path} exists; pass --force to replace it")
        return 1
    try:
        write_user_file(path, text, option)  # atomic: an existing recipe is replaced whole or left as it was
    except PathProblem as exc:
        print(f"ftready-init: {exc}")
        return 2
    filled = text.count(f"# {FILL_IN}")
    print(f"wrote {path}" + (f": {filled} value(s) marked {FILL_IN}" if filled else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
