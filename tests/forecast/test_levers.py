"""forecast.levers: the one lever model. Which levers apply to a recipe; each saving traced by
the forecast where it runs, estimated from a breakdown where it cannot; one recipe and one lever
give one figure in ftready-forecast, the check model.memory_forecast and levers.advice."""

from __future__ import annotations

import re

import pytest

from pytest_ftready.engine.breakdown import Breakdown
from pytest_ftready.forecast.levers import (ESTIMATE, TRACED, ModelShape, candidates, estimated_levers,
                                            recipe_changes, with_changes)
from pytest_ftready.outputs.forecast_text import levers_text, saving_text
from pytest_ftready.recipe.schema import parse_recipe
from pytest_ftready.units import human_bytes

MiB = 1024 ** 2
BREAKDOWN = Breakdown(weights_bytes=1000 * MiB, frozen_numel=500 * MiB, trainable_bytes=10 * MiB,
                      gradient_bytes=10 * MiB, optimizer_state_bytes=20 * MiB, peak_bytes=2000 * MiB)


def recipe(tmp_path, **training):
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "train.jsonl").write_text("{}\n")
    lines = "\n".join(f"{k} = {v}" for k, v in training.items())
    text = f'[model]\npath = "model"\n[data]\ntrain = ["train.jsonl"]\nmax_length = 2048\n[training]\n{lines}\n'
    return parse_recipe(text, tmp_path / "recipe.toml")


def test_estimates_for_a_lora_recipe_without_checkpointing(tmp_path):
    levers = estimated_levers(recipe(tmp_path, micro_batch_size=4, gradient_checkpointing="false"), BREAKDOWN,
                              ModelShape(num_layers=8), p95_length=300)
    names = [lv.name for lv in levers]
    assert names[:3] == ["activation checkpointing", "4-bit base (QLoRA)", "shorter max_length"]
    assert {"smaller micro-batch, more accumulation", "8-bit optimizer", "paged optimizer",
            "optimizer in the backward"} <= set(names)
    assert "chunked loss" not in names  # no vocabulary size known: no estimate, not a guess
    saves = {lv.name: lv.saves_bytes for lv in levers}
    assert saves["4-bit base (QLoRA)"] == 990 * MiB - 250 * MiB
    assert saves["activation checkpointing"] == int(970 * MiB * 7 / 8)
    assert saves["shorter max_length"] == int(970 * MiB * (1 - 512 / 2048))
    assert saves["optimizer in the backward"] == 10 * MiB and saves["paged optimizer"] == 20 * MiB
    assert [lv.saves_bytes for lv in levers] == sorted(saves.values(), reverse=True)
    assert {lv.how for lv in levers} == {ESTIMATE}
    text = levers_text(levers)
    assert "[data] max_length = 512 (p95 of lengths is 300)" in text and "(estimate)" in text


def test_chunked_loss_estimate_counts_the_logits_it_no_longer_holds(tmp_path):
    levers = estimated_levers(recipe(tmp_path, micro_batch_size=2), BREAKDOWN, ModelShape(8, vocab_size=1000))
    chunked = next(lv for lv in levers if lv.name == "chunked loss")
    # bf16 logits + their float32 copy + its gradient, for 2 x 2048 tokens, less the one piece in 8 still held
    assert chunked.saves_bytes == int(2 * 2048 * 1000 * (2 + 8) * 7 / 8)


def test_no_lever_left_says_so(tmp_path):
    none = Breakdown(100, 0, 100, 100, 0, 200)
    levers = estimated_levers(recipe(tmp_path, micro_batch_size=1, gradient_checkpointing="true", optimizer='"sgd"',
                                     loss='"chunked"', optimizer_in_backward="true"), none, ModelShape(2))
    assert [lv.name for lv in levers] == ["4-bit base (QLoRA)"]  # everything else pulled, no state
    assert levers_text([]).startswith("no lever left")


def test_accumulation_and_the_optimizer_in_the_backward_exclude_each_other(tmp_path):
    names = [c.name for c in candidates(recipe(tmp_path, micro_batch_size=4, gradient_accumulation_steps=4))]
    assert "optimizer in the backward" not in names and "smaller micro-batch, more accumulation" in names
    names = [c.name for c in candidates(recipe(tmp_path, micro_batch_size=4, optimizer_in_backward="true"))]
    assert "smaller micro-batch, more accumulation" not in names and "chunked loss" in names


def test_lever_changes_are_recipe_keys(make_state):
    base = make_state().recipe
    full = with_changes(base, [("adapter", "method", "none"), ("training", "gradient_accumulation_steps", 1)])
    qlora = with_changes(base, [("model", "quantization", "4bit"), ("training", "optimizer", "adamw_8bit")])
    seen = set()
    for source in (base, full, qlora):
        for lever in candidates(source, p95_length=40):
            changes = recipe_changes(lever.change)
            if lever.name.startswith("optimizer state offload"):
                assert changes is None  # no recipe key: the estimate stands
                continue
            assert changes, lever
            with_changes(source, changes)  # every key exists, and the lever is a valid recipe
            seen.update(key for _, key, _ in changes)
    assert {"gradient_checkpointing", "micro_batch_size", "gradient_accumulation_steps", "max_length", "method",
            "quantization", "optimizer", "loss", "optimizer_in_backward", "kbit_preparation"} <= seen
    assert recipe_changes("[data] max_length = 64 (p95 of lengths is 40)") == [("data", "max_length", 64)]


def test_command_prints_the_table_and_exits_by_the_verdict(tiny_example, capsys):
    from pytest_ftready.forecast_command import main

    recipe_path = str(tiny_example / "recipe.toml")
    assert main([recipe_path, "--target", "RTX 4090"]) == 0
    out = capsys.readouterr().out
    assert "at the peak" in out and "activations" in out and "verdict: FITS" in out
    assert main([recipe_path, "--target", "1MiB", "--no-levers"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert main([recipe_path, "--target", "nonsense"]) == 2
    assert "--target: 'nonsense' is neither a size" in capsys.readouterr().err


def _forecast_check_measurements(state):
    """model.memory_forecast's measurements, kept when it fails (the target is too small)."""
    from pytest_ftready.checks.registry import REGISTRY
    from pytest_ftready.outcomes import Fail
    from pytest_ftready.session.context import CheckContext

    ctx = CheckContext(state, REGISTRY["model.memory_forecast"])
    with pytest.raises(Fail) as info:
        with ctx.running():
            REGISTRY["model.memory_forecast"].body(ctx)
    return {m.name: m.value for m in ctx.measured}, str(info.value)


def test_one_lever_one_saving_in_the_command_the_forecast_check_and_the_advice(make_state, tiny_example, run_check,
                                                                               capsys):
    from pytest_ftready.forecast_command import main

    state = make_state(memory_headroom='0.10\ntarget = "8MiB"')
    checked, message = _forecast_check_measurements(state)
    advice = {m.name: m.value for m in run_check(state, "levers.advice").measured}
    assert main([str(tiny_example / "recipe.toml")]) == 1
    printed = capsys.readouterr().out
    levers = state.levers
    assert len(levers) >= 5 and {lv.how for lv in levers} == {TRACED, ESTIMATE}
    for lever in levers:
        assert checked[f"forecast_saves[{lever.name}]"] == advice[f"saves[{lever.name}]"] == lever.saves_bytes
        assert advice[f"saves_how[{lever.name}]"] == lever.how
        line = f"- {lever.name}: {lever.change}; "
        for text in (printed, message):
            found = next(row for row in text.splitlines() if line in row)
            assert saving_text(lever) in found, (lever, found)
            assert lever.saves_bytes <= 0 or f"saves {human_bytes(lever.saves_bytes)} ({lever.how})" in found
    # the tiny model's tensors are all below bitsandbytes' 4096-element threshold: 8-bit saves nothing
    eight_bit = next(lv for lv in levers if lv.name == "8-bit optimizer")
    assert eight_bit.how == TRACED and eight_bit.saves_bytes == 0 and saving_text(eight_bit) in printed
    assert "saves nothing here (traced)" in printed
    assert re.search(r"activation checkpointing: \[training\] gradient_checkpointing = true; peak .* \(traced\)",
                     message)
    assert "verdict: DOES NOT FIT" in message and "target 8MiB" in message
    assert "micro_batch_size = 2, gradient_accumulation_steps = 4; peak" in message
    assert "runtime context" in message and "PR #86509" in message


def test_advice_estimates_where_no_forecast_runs(make_state, run_check):
    from pytest_ftready.outcomes import Skip
    from pytest_ftready.session.facts import Failed

    state = make_state()
    state.facts["memory_forecast"] = Failed("memory_forecast", Skip("the model's config is not available here"), None)
    advice = {m.name: m.value for m in run_check(state, "levers.advice").measured}
    levers = state.levers
    assert levers and {lv.how for lv in levers} == {ESTIMATE}
    assert any(lv.name == "chunked loss" and lv.saves_bytes > 0 for lv in levers)  # the step knows the vocabulary
    for lever in levers:
        assert advice[f"saves[{lever.name}]"] == lever.saves_bytes and advice[f"saves_how[{lever.name}]"] == ESTIMATE


def test_the_sweep_measures_the_lever_models_training_and_data_levers(make_state):
    from pytest_ftready.checks.levers import sweep_variants

    recipe = make_state().recipe
    variants = dict(sweep_variants(recipe))
    for lever in candidates(recipe):
        changes = recipe_changes(lever.change) or []
        wanted = {f"{table}.{key}": value for table, key, value in changes}
        if changes and all(table in ("training", "data") for table, _, _ in changes):
            assert wanted in variants.values(), lever
        elif changes:  # another base model (4-bit, no preparation): traced by the forecast, not swept
            assert wanted not in variants.values(), lever
    # ids stay what earlier nights recorded, so benchmark comparisons keep working
    assert {"recipe", "checkpointing=on", "micro_batch=2", "loss=chunked", "optimizer=adamw_8bit"} <= set(variants)
