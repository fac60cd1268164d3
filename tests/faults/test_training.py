"""Fault: the loss turns NaN / inf in the middle of the overfit."""

from __future__ import annotations

import math

import pytest


@pytest.mark.parametrize("poison, step", [(math.nan, 5), (math.inf, 1)])
def test_nonfinite_loss_fails_overfit_at_its_step_with_the_likely_cause(make_state, fails, poison, step):
    state = make_state()
    calls = []

    def poison_logits(module, args, output):  # from the step's first micro-batch on, the logits blow up
        calls.append(1)
        return output * poison if len(calls) > 2 * (step - 1) else output

    handle = state.model.lm_head.register_forward_hook(poison_logits)
    try:
        message = fails(state, "model.overfit")
    finally:
        handle.remove()
    assert message.startswith(f"loss is nan at step {step} of the overfit")  # inf logits give a nan loss too
    if step > 1:
        assert f"(step {step - 1}: " in message and "diverged" in message and "learning_rate = 0.01" in message
    else:
        assert "no supervised token" in message
    assert "\n" not in message
    assert not any("lora" in name for name, _ in state.model.named_modules())  # the session's model is clean again
