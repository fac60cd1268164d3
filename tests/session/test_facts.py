"""Facts of a recipe: computed once on demand, failures remembered and attributed."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pytest_ftready.outcomes import Fail, Skip
from pytest_ftready.session.facts import computed, fact


@dataclass
class Holder:
    outcome: object = 42
    calls: int = 0
    facts: dict = field(default_factory=dict)
    asking: str | None = None

    @fact
    def answer(self):
        self.calls += 1
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


def test_a_fact_is_computed_once_and_reused():
    holder = Holder()
    assert computed(holder, "answer") is None
    assert holder.answer == 42 and holder.answer == 42
    assert holder.calls == 1 and computed(holder, "answer") == 42


def test_a_failure_is_remembered_the_first_asker_fails_later_ones_skip_naming_it():
    holder = Holder(outcome=Fail("cannot load the model from m: OSError: no config.json"))
    holder.asking = "model.step_memory"
    with pytest.raises(Fail, match="cannot load the model"):
        holder.answer
    holder.asking = "headroom.time"
    with pytest.raises(Skip, match="model.step_memory failed: cannot load"):
        holder.answer
    assert holder.calls == 1 and computed(holder, "answer") is None


def test_a_skip_is_remembered_as_a_skip_for_everyone():
    holder = Holder(outcome=Skip("offline: the hub cannot be reached"))
    for asker in ("checkpoint.revision", "checkpoint.files"):
        holder.asking = asker
        with pytest.raises(Skip, match="offline"):
            holder.answer
    assert holder.calls == 1


def test_a_bug_is_not_hidden_or_cached():
    holder = Holder(outcome=KeyError("oops"))
    for _ in range(2):
        with pytest.raises(KeyError):
            holder.answer
    assert holder.calls == 2


def test_a_fact_can_be_provided_instead_of_computed():
    holder = Holder()
    holder.answer = 7
    assert holder.answer == 7 and holder.calls == 0
