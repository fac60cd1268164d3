"""Facts of a recipe, computed on demand and once, the way pytest computes a session-scoped
fixture: the first check that asks computes the fact, later ones reuse it, and a failure to
compute it is remembered. The check that was computing it fails with the root cause; a
check that asks later is skipped naming that check and the cause, so one broken model or
tokenizer gives one failure, not twenty. Then any single check selected with ``-k`` still
does its job: it computes what it needs itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, TypeVar, Union

from ..outcomes import Fail, Skip

T = TypeVar("T")


@dataclass(frozen=True)
class Failed:
    """A fact that could not be computed: the outcome it raised and the check that asked first."""

    fact: str
    error: Union[Fail, Skip]
    first_asked_by: Optional[str]

    def raise_for(self, asker: Optional[str]) -> None:
        if isinstance(self.error, Skip) or asker == self.first_asked_by or self.first_asked_by is None:
            raise self.error.with_traceback(None)
        raise Skip(f"{self.first_asked_by} failed: {self.error}")


class fact(Generic[T]):
    """Decorates ``compute(state) -> T`` on a class with a ``facts`` dict and an ``asking``
    attribute (the id of the check whose body runs now). ``state.NAME`` computes once;
    ``Fail``/``Skip`` raised while computing are remembered and re-raised to every asker.
    Other exceptions are bugs of the plugin: they propagate with their traceback."""

    def __init__(self, compute: Callable[[Any], T]) -> None:
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, state, owner=None) -> T:
        if state is None:
            return self  # type: ignore[return-value]
        facts = state.facts
        if self.name not in facts:
            try:
                facts[self.name] = self.compute(state)
            except (Fail, Skip) as exc:
                facts[self.name] = Failed(self.name, exc, state.asking)
        value = facts[self.name]
        if isinstance(value, Failed):
            value.raise_for(state.asking)
        return value

    def __set__(self, state, value: T) -> None:
        """Tests and callers may provide a fact (e.g. a sabotaged dataset) instead of computing it."""
        state.facts[self.name] = value


def computed(state, name: str) -> Any:
    """The fact ``name`` if some check has already computed it, else None (no computing)."""
    value = state.facts.get(name)
    return None if isinstance(value, Failed) else value
