"""The recipe: what one fine-tuning run is (model, data, adapter, training, hardware, budget,
checks, pins, privacy), read from a file into a frozen, validated ``Recipe``.

Owns the schema and its error messages (``schema``), the trainers' configs read as recipes
(``importers``), and ``loading``, the one loader above both. Imports neither pytest nor torch,
and nothing else of the package: every other layer reads the recipe, the recipe reads no one."""

from .loading import load_recipe
from .schema import Recipe, RecipeError, is_commit_hash, parse_recipe

__all__ = ["Recipe", "RecipeError", "is_commit_hash", "load_recipe", "parse_recipe"]
