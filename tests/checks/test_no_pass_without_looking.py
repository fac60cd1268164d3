"""A check with nothing to judge skips with its reason; a verdict judges all it says it does
(issue 32). Each test plants one case that used to pass."""

from __future__ import annotations

import pytest

from pytest_ftready.outcomes import Fail, Skip
from tests.helpers import job_result, private_model


def test_a_forecast_without_a_target_skips_and_still_records_the_forecast(make_state, run_check):
    state = make_state()
    with pytest.raises(Skip, match=r"no target device to judge the forecast against .*set \[hardware\] target"):
        run_check(state, "model.memory_forecast")
    measured = {m.name: m.value for m in state.run.measurements if m.check == "model.memory_forecast"}
    assert measured["forecast_peak"] > 0 and "forecast_target" not in measured


# ---- resumes compare every step, not the shorter of two lists -------------------------------------
def test_a_resumed_run_with_fewer_losses_differs():
    from pytest_ftready.engine.checkpoint import compare_losses

    assert compare_losses([2.0, 1.5], [2.0, 1.5], exact=True) == ""
    assert "returned 1 loss(es) for the 2 step(s) after the checkpoint" in compare_losses([2.0, 1.5], [2.0], exact=True)


def distributed_jobs(straight: list, resumed: list):
    """A two-rank job's straight run and resumed run as the ranks report them (the figures under test)."""
    from types import SimpleNamespace

    return SimpleNamespace(run=lambda: job_result("train", {"train": {"losses": straight}}),
                           resume=lambda: job_result("resume", {"resume": {"losses": resumed}}), steps=len(straight),
                           plan=SimpleNamespace(device_kind="cpu", backend="gloo", world_size=2, reshard_world_size=1))


def test_distributed_resume_that_returns_fewer_losses_fails(make_state, run_check):
    state = make_state()
    state.distributed_jobs = distributed_jobs([3.0, 2.5, 2.0, 1.5], [2.0])
    with pytest.raises(Fail, match=r"rank 0 returned 1 loss\(es\) after the resume for the 2 step\(s\) the straight run "
                                   r"made after step 2"):
        run_check(state, "distributed.resume")


def test_data_lengths_skips_when_the_model_config_cannot_be_read(make_state, run_check, tiny_example):
    import json

    config = private_model(tiny_example) / "config.json"
    fields = json.loads(config.read_text())
    del fields["max_position_embeddings"]
    config.write_text(json.dumps(fields))
    with pytest.raises(Skip, match=r"max_length 128 not compared with the model's positions: its config has none of "
                                   r"max_position_embeddings"):
        run_check(make_state(), "data.lengths")
    config.unlink()  # the tokenizer loads without it
    state = make_state()
    with pytest.raises(Skip, match=r"its config could not be read \(ValueError: Unrecognized model"):
        run_check(state, "data.lengths")
    measured = {m.name: m.value for m in state.run.measurements if m.check == "data.lengths"}
    assert measured["length_max"] > 0  # what it could look at is recorded


def test_a_seeding_that_gives_numpy_another_seed_fails_repro_config(make_state, run_check, monkeypatch):
    import random

    import numpy as np
    import torch

    from pytest_ftready.engine import batches

    monkeypatch.setattr(batches, "seed_everything", lambda seed: (random.seed(seed), np.random.seed(seed + 1),
                                                                  torch.manual_seed(seed)))
    state = make_state()
    with pytest.raises(Fail, match=r"\[training\] seed = 42 did not reach numpy: write a seed between 0 and 4294967295"):
        run_check(state, "repro.config")


def test_a_step_whose_host_peak_exceeds_the_ram_fails_step_memory(make_state, run_check):
    import dataclasses

    state = make_state()
    real = state.step
    total = state.machine.host.memory_total_bytes
    assert real.peak_bytes < 0.9 * total  # the device side fits
    state.step = dataclasses.replace(real, host_peak_bytes=total)  # a step that would take all the RAM
    with pytest.raises(Fail, match=r"the worst-case step's own host peak is .* but this machine offers .* of RAM"):
        run_check(state, "model.step_memory")


def test_one_adapter_left_out_of_the_optimizer_fails_the_overfit(make_state, run_check, monkeypatch):
    from pytest_ftready.engine import overfit

    real = overfit.make_optimizer
    left_out = []

    def forgetful(model, recipe):  # the bug: one LoRA matrix of many never reaches the optimizer
        optimizer = real(model, recipe)
        name, param = next((n, p) for n, p in model.named_parameters() if p.requires_grad)
        left_out.append(name)
        for group in optimizer.param_groups:
            group["params"] = [p for p in group["params"] if p is not param]
        return optimizer

    monkeypatch.setattr(overfit, "make_optimizer", forgetful)
    state = make_state()
    with pytest.raises(Fail, match=r"1 of \d+ trainable parameters never changed in \d+ steps, e.g. .*not in the optimizer") \
            as info:
        run_check(state, "model.overfit")
    assert left_out[0] in str(info.value)


def test_a_sweep_variant_that_runs_out_of_memory_fails(make_state, monkeypatch):
    import dataclasses

    from pytest_ftready.checks.registry import REGISTRY
    from pytest_ftready.engine import step
    from pytest_ftready.session.context import CheckContext

    real = step.measure_step
    monkeypatch.setattr(step, "measure_step", lambda *args, **kwargs: dataclasses.replace(  # the GPU's allocator answer
        real(*args, **kwargs), out_of_memory="CUDA out of memory. Tried to allocate 2.00 GiB"))
    state = make_state()
    ctx = CheckContext(state, REGISTRY["levers.sweep"], param={"training.micro_batch_size": 8})
    with pytest.raises(Fail, match=r"training.micro_batch_size = 8 runs out of memory on .*: CUDA out of memory. Tried"):
        with ctx.running():
            REGISTRY["levers.sweep"].body(ctx)
    assert {m.name: m.value for m in ctx.measured}["out_of_memory"] is True


@pytest.mark.parametrize("flags, outcome", [(("fpu", "avx2", "avx512f"), Fail), (("avx2", "avx512_bf16"), None),
                                            (("fp", "asimd", "bf16"), None), ((), Skip)],
                         ids=["x86-without-bf16", "avx512-bf16", "arm-bf16", "flags-unknown"])
def test_bfloat16_on_a_cpu_is_native_or_named(make_state, run_check, real_machine, flags, outcome):
    import dataclasses

    machine = dataclasses.replace(real_machine, host=dataclasses.replace(real_machine.host, cpu_flags=flags))
    state = make_state(machine=machine, dtype='"bfloat16"')
    if outcome is None:
        run_check(state, "stack.precision")
        return
    match = {Fail: r"has no native bfloat16 \(none of avx512_bf16, amx_bf16, bf16 among its flags\): torch emulates it",
             Skip: r"feature flags could not be read"}[outcome]
    with pytest.raises(outcome, match=match):
        run_check(state, "stack.precision")


def test_a_machine_the_hook_describes_counts_as_fake_even_unmarked(make_state, run_check, real_machine):
    import dataclasses
    from types import SimpleNamespace

    from pytest_ftready.plugin import _machine

    described = dataclasses.replace(real_machine, fake=False)  # a hook that forgot fake=True
    config = SimpleNamespace(hook=SimpleNamespace(pytest_ftready_machine=lambda config: described))
    machine = _machine(config)
    assert machine.fake and dataclasses.replace(machine, fake=False) == described
    with pytest.raises(Skip, match=r"the machine is described \(pytest_ftready_machine\), not probed"):
        run_check(make_state(machine=machine), "stack.smoke")
