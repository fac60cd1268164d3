"""Writes ``recipe/tables.py``: the recipe's tables as classes a type checker reads, generated
from ``schema.SCHEMA`` (the schema stays data; ``recipe.training.micro_batch_size`` is an ``int``
to mypy and to an editor). After a key or table changes in SCHEMA, run

    python -m pytest_ftready.recipe.write_tables

tests/recipe/test_tables.py fails, naming that command, while the file and SCHEMA disagree."""

from __future__ import annotations

import textwrap
from pathlib import Path

from .schema import SCHEMA, Key

COMMAND = "python -m pytest_ftready.recipe.write_tables"
TARGET = Path(__file__).with_name("tables.py")
WIDTH = 120

# what the parser (schema._Parser.value) returns for each kind of key
TYPES = {
    "str": "str", "bool": "bool", "int": "int", "float": "float", "share": "float",
    "path": "Path | str",  # "" where the key is not set
    "paths": "Sequence[Path]", "strs": "Sequence[str]", "table": "Mapping[str, Any]",
    "skip": "Mapping[str, str]", "limits": "Mapping[str, float]", "thresholds": "Mapping[str, float]",
}


def class_name(table: str) -> str:
    return f"{table.capitalize()}Table"


def annotation(key: Key) -> str:
    if key.kind == "choice":
        return f"Literal[{', '.join(repr(c) for c in key.choices)}]"
    return TYPES[key.kind]


def render() -> str:
    """The text of ``tables.py`` for the SCHEMA of this checkout."""
    out = [
        '"""The recipe\'s tables as a type checker sees them. Generated from ``schema.SCHEMA`` by',
        f"``{COMMAND}``: do not edit; regenerate after changing SCHEMA.",
        "",
        "At run time each table is a frozen ``pyrsistent.PRecord`` of a subclass of its class here, built",
        'by ``schema`` with one field per key."""',
        "",
        "from __future__ import annotations",
        "",
        "from pathlib import Path",
        "from typing import Any, Literal, Mapping, Sequence",
        "",
        "from pyrsistent import PRecord",
    ]
    for table, keys in SCHEMA.items():
        out += ["", "", f"class {class_name(table)}(PRecord):", f'    """[{table}]"""', ""]
        for name, key in keys.items():
            line = f"    {name}: {annotation(key)}"
            if len(line) > WIDTH:
                head, _, rest = line.partition("[")
                line = "\n".join(textwrap.wrap(rest, WIDTH - 8, initial_indent=f"{head}[",
                                               subsequent_indent=" " * (len(head) + 1), break_on_hyphens=False))
            out.append(line)
            doc = key.doc.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
            out += textwrap.wrap(doc, WIDTH - 4, initial_indent='    """', subsequent_indent="    ",
                                 break_on_hyphens=False) if doc else []
            if doc:
                out[-1] = (out[-1][:-1] + '\\"' if out[-1].endswith('"') else out[-1]) + '"""'
    out += ["", "", "TABLE_TYPES: dict[str, type[PRecord]] = {"]
    out += [f"    {table!r}: {class_name(table)}," for table in SCHEMA]
    out += ["}", ""]
    return "\n".join(out)


def main() -> None:
    TARGET.write_text(render())
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
