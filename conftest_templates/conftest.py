"""A team's own readiness check, written with pytest-ftready's fixtures.

Copy this file next to your tests (or into a conftest.py), then run it beside the built-in
checks:

    pytest --ftready=recipe.toml tests/

The fixtures are session-scoped and shared with the built-in checks: the model and the data
are loaded once.
"""

import pytest


def test_no_row_is_longer_than_our_serving_context(ftready_recipe, ftready_dataset, ftready_measure):
    """Our server answers with at most 4096 tokens of context: training rows must fit it."""
    serving_context = 4096
    longest = max(len(ids) for ids in ftready_dataset["input_ids"])
    ftready_measure("longest_row", longest, "tokens")
    assert longest <= min(serving_context, ftready_recipe.data.max_length)


def test_system_prompt_is_never_trained(ftready_tokenizer, ftready_dataset):
    """Our system prompt starts with 'You answer'; it must never carry loss."""
    marker = ftready_tokenizer.encode("You answer", add_special_tokens=False)
    for ids, labels in zip(ftready_dataset["input_ids"], ftready_dataset["labels"]):
        trained = [t for t, label in zip(ids, labels) if label != -100]
        text = ftready_tokenizer.decode(trained)
        assert "You answer" not in text, f"system prompt trained in row {ids[:8]}... ({len(marker)} marker tokens)"


@pytest.mark.accelerator
def test_first_token_latency_after_warmup(ftready_model, ftready_tokenizer, ftready_device, ftready_measure, benchmark):
    """Greedy generation of 16 tokens, timed by pytest-benchmark (runs on the GPU box)."""
    import torch

    prompt = ftready_tokenizer("Hello", return_tensors="pt").to(ftready_device.torch_device)
    with torch.no_grad():
        out = benchmark(lambda: ftready_model.generate(**prompt, max_new_tokens=16, do_sample=False))
    ftready_measure("generated_tokens", int(out.shape[1] - prompt["input_ids"].shape[1]), "tokens")


@pytest.mark.ftready_variants(micro_batch_size=[1, 2, 4], gradient_checkpointing=[False, True])
def test_our_step_fits_a_24gb_card(ftready_step, ftready_measure):
    """Our step must fit a 24 GB card at micro-batch 1, 2 and 4, with and without checkpointing:
    six items, each measuring the recipe's real worst-case step for its variant."""
    ftready_measure("peak_bytes", ftready_step.peak_bytes, "bytes")
    assert ftready_step.peak_bytes <= 0.9 * 24 * 1024 ** 3


@pytest.mark.accelerator(min_memory="24GiB", dtype="bfloat16")
def test_bf16_step_runs_where_we_train(ftready_step, ftready_measure):
    """Only on a GPU with 24 GiB or more and native bf16 (skipped elsewhere, with the reason)."""
    ftready_measure("tokens_per_s", ftready_step.tokens_per_s, "tokens/s")
    assert ftready_step.fits(0.10), ftready_step.out_of_memory or "the step does not leave 10% headroom"
