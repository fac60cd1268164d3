"""engine.trainable: the recipe's loss (full or chunked) and optimizer (after the backward or
inside it) on the real tiny model: the variants train exactly as the plain step does, and the
keys they need are checked where the recipe is read."""

from __future__ import annotations

import pytest


def _train(recipe, steps: int = 3):
    """Losses of ``steps`` optimizer steps on one fixed batch, the optimizer's state_dict after them."""
    import torch

    from pytest_ftready.engine.loading import load_model
    from pytest_ftready.engine.trainable import make_optimizer, make_scheduler, make_trainable, train_step

    ids = torch.randint(3, 500, (2, 32), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    batch["labels"][:, :7] = -100  # a prompt that carries no loss
    torch.manual_seed(0)
    model = make_trainable(load_model(recipe, "cpu"), recipe)
    optimizer = make_optimizer(model, recipe)
    scheduler = make_scheduler(optimizer, recipe, total_steps=10)
    losses = [train_step(model, optimizer, scheduler, [batch], "cpu") for _ in range(steps)]
    return losses, optimizer, model


@pytest.fixture
def full_recipe(make_state):
    from pytest_ftready.recipe.schema import with_changes

    return with_changes(make_state().recipe, {"adapter.method": "none", "training.gradient_accumulation_steps": 1})


@pytest.mark.parametrize("changes", [{"training.loss": "chunked", "training.loss_chunks": 3},
                                     {"training.optimizer_in_backward": True},
                                     {"training.optimizer_in_backward": True, "training.loss": "chunked"},
                                     {"training.loss_dtype": "compute"},
                                     {"training.loss_dtype": "compute", "training.loss": "chunked"}],
                         ids=["chunked", "in_backward", "both", "compute_dtype", "chunked_compute_dtype"])
def test_variants_train_as_the_plain_step_does(full_recipe, changes):
    import torch

    from pytest_ftready.recipe.schema import with_changes

    plain, plain_optimizer, plain_model = _train(full_recipe)
    losses, optimizer, model = _train(with_changes(full_recipe, changes))
    assert plain[-1] < plain[0] - 1.0  # a full fine-tune learns the batch: the comparison means something
    assert losses == pytest.approx(plain, rel=1e-5)
    for (name, a), b in zip(plain_model.named_parameters(), model.parameters()):
        assert torch.allclose(a, b, atol=1e-5), name
    assert len(optimizer.state_dict()["state"]) == len(plain_optimizer.state_dict()["state"])


def test_optimizer_in_the_backward_holds_no_gradients_and_resumes_from_its_state(full_recipe):
    from pytest_ftready.recipe.schema import with_changes

    recipe = with_changes(full_recipe, {"training.optimizer_in_backward": True})
    losses, optimizer, model = _train(recipe, steps=2)
    assert all(p.grad is None for p in model.parameters())  # each gradient freed by its hook
    saved = optimizer.state_dict()
    assert saved["state"] and all(int(s["step"]) == 2 for s in saved["state"].values())
    again = _train(recipe, steps=0)[1]
    again.load_state_dict(saved)
    first = next(iter(again.per_parameter.values()))
    assert first.state is again.state and int(next(iter(again.state.values()))["step"]) == 2


def test_the_loss_in_the_compute_dtype_keeps_bfloat16_logits(full_recipe):
    import torch

    from pytest_ftready.engine.trainable import step_loss
    from pytest_ftready.recipe.schema import with_changes

    recipe = with_changes(full_recipe, {"model.dtype": "bfloat16", "training.loss_dtype": "compute"})
    seen = []
    _, _, model = _train(recipe, steps=0)
    model.get_output_embeddings().register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    ids = torch.randint(3, 500, (1, 16), generator=torch.Generator().manual_seed(0))
    loss = step_loss(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    assert seen == [torch.bfloat16] and loss.dtype == torch.bfloat16 and torch.isfinite(loss)


def test_the_loss_dtype_applies_to_the_full_and_chunked_losses_only(make_state):
    from pytest_ftready.recipe.schema import RecipeError, with_changes

    with pytest.raises(RecipeError, match=r'\[training\] loss_dtype: applies to loss = "full" or "chunked"; '
                                          r'fused_linear runs its kernel'):
        with_changes(make_state().recipe, {"training.loss": "fused_linear", "training.loss_dtype": "compute"})


def test_optimizer_in_the_backward_refuses_gradient_accumulation(make_state):
    from pytest_ftready.recipe.schema import RecipeError, with_changes

    with pytest.raises(RecipeError, match=r"\[training\] optimizer_in_backward: .* gradient_accumulation_steps = 1"):
        with_changes(make_state().recipe, {"training.optimizer_in_backward": True,
                                           "training.gradient_accumulation_steps": 4})


@pytest.mark.parametrize("loss", ["fused_linear", "cut_cross_entropy"])
def test_gpu_loss_kernels_say_what_to_use_on_a_cpu(make_state, loss):
    from pytest_ftready.outcomes import Fail
    from pytest_ftready.recipe.schema import with_changes

    recipe = with_changes(make_state().recipe, {"training.loss": loss})
    with pytest.raises(Fail, match=f'loss = "{loss}" runs a Triton kernel on an NVIDIA GPU; on cpu use loss = "chunked"'):
        _train(recipe, steps=1)


def test_kbit_preparation_follows_the_recipe(make_state):
    from pytest_ftready.engine.trainable import kbit_preparation
    from pytest_ftready.recipe.schema import with_changes

    recipe = make_state().recipe
    assert not kbit_preparation(recipe)  # nothing quantized, nothing to prepare
    qlora = with_changes(recipe, {"model.quantization": "4bit"})
    assert kbit_preparation(qlora)  # auto: as the built-in engine (and TRL, the HF Trainer) do
    assert not kbit_preparation(with_changes(qlora, {"model.kbit_preparation": "off"}))


def test_chunked_loss_refuses_a_head_that_scales_its_logits():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from pytest_ftready.engine.trainable import LOSS_ATTRIBUTE, LossPlan, step_loss
    from pytest_ftready.outcomes import Fail

    config = AutoConfig.for_model("gemma2", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=100)
    model = AutoModelForCausalLM.from_config(config)
    setattr(model, LOSS_ATTRIBUTE, LossPlan("chunked", 2))
    ids = torch.zeros((1, 8), dtype=torch.long)
    with pytest.raises(Fail, match=r"gemma2 scales them \({'final_logit_softcapping': 30.0}\): use loss = \"full\""):
        step_loss(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
