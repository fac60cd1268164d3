"""Recipe variants for ``@pytest.mark.ftready_variants(key=[values], ...)``: every combination,
each validated like the recipe file itself, with an id that reads like pytest's own
(``micro_batch_size=2-gradient_checkpointing=True``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .schema import Recipe, RecipeError, with_changes


@dataclass(frozen=True)
class Variant:
    recipe_path: Path
    changes: tuple[tuple[str, Any], ...] = ()  # (key as written, value), in the marker's order
    id: str = ""
    recipe: Optional[Recipe] = field(default=None, compare=False, hash=False)  # the validated variant


def value_id(value: Any) -> str:
    return str(value) if not isinstance(value, (list, tuple)) else ",".join(map(str, value))


def expand(recipe: Recipe, lists: dict[str, Any], where: str = "ftready_variants") -> list[Variant]:
    """One ``Variant`` per combination of ``lists`` ({key: [values]}), each validated."""
    for key, values in lists.items():
        if not isinstance(values, (list, tuple)) or not values:
            raise RecipeError(recipe.source, f"{where} {key}", f"expected a non-empty list of values, got {values!r}")
    keys = list(lists)
    out = []
    for combo in itertools.product(*(lists[k] for k in keys)):
        changes = tuple(zip(keys, combo))
        variant = with_changes(recipe, dict(changes), where)
        out.append(Variant(Path(recipe.source), changes, "-".join(f"{k}={value_id(v)}" for k, v in changes), variant))
    return out


def matches(recipe: Recipe, wanted: str, invocation: Path) -> bool:
    """``ftready_recipes("name-or-path")``: the recipe's name, its file name or stem, or its path."""
    source = Path(recipe.source)
    if wanted in (recipe.name, source.name, source.stem):
        return True
    return (invocation / wanted).resolve() == source.resolve()
