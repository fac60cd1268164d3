"""The check registry and the outcomes a check body raises.

A check is a function ``body(ctx)`` registered with ``@check(...)``. It raises ``Fail`` or
``Skip`` (plain exceptions, so check logic is testable without pytest) and records values
through ``ctx.measure``. The collector turns each registered check into a pytest item.

The check modules are listed here by name (``CHECK_MODULES``, as pytest lists its built-in
plugins) and imported by name on the first ``all_checks()``: they import the registry, the
registry never imports them back.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional, Union

# Cheap before expensive (DESIGN.md "Order and dependencies").
STAGES = {
    "repro.environment": 0, "stack": 10, "checkpoint": 20, "data": 30, "model.forecast": 35, "model.step": 40,
    "data.loader": 45, "model.overfit": 50, "lifecycle": 60, "distributed": 65, "levers": 70, "sustained": 75,
    "headroom": 80, "repro": 90, "privacy": 95,
}


@dataclass(frozen=True)
class CheckSpec:
    id: str
    body: Callable[..., None]
    stage: int
    doc: str
    accelerator: Union[bool, Callable[..., bool]] = False  # or recipe -> bool (distributed: nccl recipes)
    nightly: bool = False
    requires: tuple[str, ...] = ()
    # recipe -> reason the check does not apply to it (the item is then skipped with it)
    applies: Optional[Callable[..., Optional[str]]] = None
    # recipe -> [(param id, value)]: one item per value, named id[param id] (ctx.param)
    params: Optional[Callable[..., list]] = None

    def needs_accelerator(self, recipe) -> bool:
        return bool(self.accelerator(recipe) if callable(self.accelerator) else self.accelerator)

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]


REGISTRY: dict[str, CheckSpec] = {}


def check(id: str, *, stage: int, accelerator: Union[bool, Callable] = False, nightly: bool = False,
          requires: tuple[str, ...] = (), applies: Callable | None = None, params: Callable | None = None) -> Callable:
    """Register ``body(ctx)`` as the check ``id`` ("area.name")."""

    def register(body: Callable[..., None]) -> Callable[..., None]:
        if id in REGISTRY:
            raise ValueError(f"check {id} registered twice")
        # the docstring's first paragraph (wrapped at 120 characters), in one line
        doc = " ".join(body.__doc__.strip().split("\n\n")[0].split()) if body.__doc__ else id
        REGISTRY[id] = CheckSpec(id=id, body=body, stage=stage, doc=doc, accelerator=accelerator,
                                 nightly=nightly, requires=tuple(requires), applies=applies, params=params)
        return body

    return register


CHECK_MODULES = ("checkpoint", "data", "distributed", "forecast", "headroom", "levers", "lifecycle", "model", "privacy",
                 "repro", "serving", "stack", "sustained")


def all_checks() -> list[CheckSpec]:
    """Every check, in run order (stage, then id). Imports the check modules once."""
    for name in CHECK_MODULES:
        importlib.import_module(f"{__package__}.{name}")
    return sorted(REGISTRY.values(), key=lambda spec: (spec.stage, spec.id))


# The areas the check modules register (the pytest face names them as markers at startup without
# importing the check modules; tests/plugin/test_lazy_startup.py keeps this equal to areas()).
AREAS = ("checkpoint", "data", "distributed", "headroom", "levers", "lifecycle", "model", "privacy", "repro", "stack",
         "sustained")


def areas() -> list[str]:
    return sorted({spec.area for spec in all_checks()})
