"""Fault: out of memory in the training step, on a (fake) small device and as a real
torch.OutOfMemoryError raised by an allocation during the step."""

from __future__ import annotations

import pytest

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests import fakes
from tests.faults.conftest import dependents_of

MiB = 1024 ** 2


class AllocationBudget(TorchDispatchMode):
    """Every op's output tensors are allocations; past ``budget`` bytes the allocator 'fails'
    the way CUDA's does: torch.OutOfMemoryError."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget, self.allocated = budget, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(t, torch.Tensor):
                self.allocated += t.numel() * t.element_size()
        if self.allocated > self.budget:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {self.allocated - self.budget} bytes "
                                         f"(budget {self.budget} bytes)")
        return out


def _no_lora_left(state) -> bool:
    return not any("lora" in name for name, _ in state.model.named_modules())


def test_small_device_fails_step_memory_with_numbers_and_levers_and_stops_its_dependents(make_state, fails):
    state = make_state(machine=fakes.cpu_only(memory=4 * MiB))  # a fake machine whose device holds 4 MiB
    message = fails(state, "model.step_memory")
    assert "the worst-case step needs" in message and "offers 3.60 MiB (4.00 MiB less the 10% memory_headroom)" in message
    assert "Levers for this recipe" in message and "gradient_checkpointing = true" in message
    assert _no_lora_left(state)
    state.outcomes["model.step_memory"] = "failed"  # what the plugin records for the failed check
    dependents = dependents_of("model.step_memory")
    assert {"model.overfit", "lifecycle.resume", "lifecycle.generate", "data.loader"} <= set(dependents)
    from pytest_ftready.checks.registry import REGISTRY

    for check_id in sorted(dependents, key=lambda c: REGISTRY[c].stage):  # in run order, as collect.py does
        blocked_by = state.failed_prerequisite(REGISTRY[check_id].requires)
        assert blocked_by == "model.step_memory", check_id  # each skips naming the step
        state.blocked[check_id] = blocked_by


@pytest.mark.faults_slow  # a real allocation until it fails: CI's second line (pytest tests -m "slow or faults_slow")
def test_real_out_of_memory_error_from_an_allocation_is_a_clear_failure(make_state, fails, run_check, monkeypatch):
    from pytest_ftready.engine import step

    budget = AllocationBudget(budget=2 * MiB)
    real_step = step.train_step

    def step_on_a_small_device(*args, **kwargs):  # every allocation of the step counts against the budget
        with budget:
            return real_step(*args, **kwargs)

    state = make_state()
    monkeypatch.setattr(step, "train_step", step_on_a_small_device)
    message = fails(state, "model.step_memory")
    monkeypatch.undo()
    assert budget.allocated > 2 * MiB  # the step really ran into the budget
    assert message.startswith("out of memory on ") and "micro_batch_size 4 x max_length 128" in message
    assert "CUDA out of memory. Tried to allocate" in message and "Levers for this recipe" in message
    assert "\n" not in message.split("Levers")[0].strip()  # the reason is one line; the levers follow
    assert _no_lora_left(state)  # the trainable wrapper was undone: later checks get a clean model
    assert state.step.out_of_memory  # remembered: every check asking for the step hears of it once
    run_check(state, "model.overfit")  # the shared base model is clean: the same state still trains


OOM_WHILE_ADDING_THE_ADAPTER = """
import torch
from pytest_ftready.engine import trainable

def no_memory_for_the_adapter(base, recipe):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")

trainable.make_trainable = no_memory_for_the_adapter
"""


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_out_of_memory_outside_the_measured_step_is_one_line_and_stops_dependents(pytester, tiny_example):
    import xml.etree.ElementTree as ET

    (tiny_example / "conftest.py").write_text(OOM_WHILE_ADDING_THE_ADAPTER)
    result = pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "-k",
                                           "model.step_memory or model.overfit or lifecycle.resume",
                                           "--junitxml=out.xml", f"--ftready-artifacts={pytester.path / 'arts'}")
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "out.xml").iter("testcase")}
    failure = cases["model.step_memory"].find("failure").get("message")
    assert failure.startswith("Failed: out of memory in model.step_memory on ") and "Tried to allocate 20.00 MiB" in failure
    for name in ("model.overfit", "lifecycle.resume"):
        assert "model.step_memory failed" in cases[name].find("skipped").get("message")
    assert "Traceback" not in result.stdout.str() and "\n" not in failure
