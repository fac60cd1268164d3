"""Loading a recipe from its file: the one entry point above the schema (recipe.toml) and the
importers (a trainer's YAML config), so that neither needs the other's loader."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .importers import load_config
from .schema import MAX_RECIPE_BYTES, SHOWN_CHARS, Recipe, RecipeError, _clip, parse_recipe


def load_recipe(path: Path | str, standing_in: Optional[dict] = None) -> Recipe:
    """Read and validate the recipe file at ``path``: a recipe.toml through the schema, a trainer's
    YAML config (TRL, Axolotl, LLaMA-Factory) through ``recipe.importers`` (``standing_in``: its
    side-file keys not yet written, ``importers.load_config``). Whatever the file holds, the only
    error is a one-line RecipeError naming it: a value of a shape no reader expected ends here
    too, never as a traceback (or a pytest INTERNALERROR in the report header)."""
    try:
        return _load(Path(path), standing_in)
    except RecipeError:
        raise
    except Exception as exc:  # noqa: BLE001 - the backstop under every reader's own messages
        raise RecipeError(path, "", f"cannot be read: a value of a shape the reader does not expect "
                          f"({type(exc).__name__}: {_clip(str(exc), SHOWN_CHARS)}); check the file's keys against "
                          "pytest-ftready's docs/recipe.md, and report the file to pytest-ftready so that the key "
                          "gets its own message") from None


def _load(path: Path, standing_in: Optional[dict] = None) -> Recipe:
    if path.suffix.lower() in (".yaml", ".yml"):  # TRL / Axolotl / LLaMA-Factory config
        return load_config(path, standing_in)
    try:
        if path.exists() and not path.is_file():  # a FIFO would block the read forever; a device never ends
            what = "a folder" if path.is_dir() else "not a regular file (a FIFO, socket or device)"
            raise RecipeError(path, "", f"is {what}; pass --ftready=PATH to a recipe.toml file")
        if path.stat().st_size > MAX_RECIPE_BYTES:
            raise RecipeError(path, "", f"holds {path.stat().st_size:,} bytes, more than the {MAX_RECIPE_BYTES:,} "
                              "a recipe may: pass the recipe.toml, not a data or model file")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(path, "", "file not found; pass --ftready=PATH to an existing recipe.toml") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(path, "", f"cannot be read: {exc}") from None
    return parse_recipe(text, path)
