"""Levers: which apply to a recipe, what each would save (estimates from the measured breakdown)."""

from pytest_ftready.engine.breakdown import Breakdown, advice_text, levers_for
from pytest_ftready.recipe.schema import parse_recipe

MiB = 1024 ** 2


def recipe(tmp_path, **training):
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "train.jsonl").write_text("{}\n")
    lines = "\n".join(f"{k} = {v}" for k, v in training.items())
    text = f'[model]\npath = "model"\n[data]\ntrain = ["train.jsonl"]\nmax_length = 2048\n[training]\n{lines}\n'
    return parse_recipe(text, tmp_path / "recipe.toml")


BREAKDOWN = Breakdown(weights_bytes=1000 * MiB, frozen_numel=500 * MiB, trainable_bytes=10 * MiB,
                      gradient_bytes=10 * MiB, optimizer_state_bytes=20 * MiB, peak_bytes=2000 * MiB)


def test_activation_bytes_are_what_the_peak_holds_besides_the_rest():
    assert BREAKDOWN.activation_bytes == 970 * MiB


def test_levers_for_a_lora_recipe_without_checkpointing(tmp_path):
    levers = levers_for(recipe(tmp_path, micro_batch_size=4, gradient_checkpointing="false"), BREAKDOWN,
                        num_layers=8, p95_length=300)
    names = [lv.name for lv in levers]
    assert names[:3] == ["activation checkpointing", "4-bit base (QLoRA)", "shorter max_length"]
    assert {"smaller micro-batch, more accumulation", "4-bit base (QLoRA)", "8-bit optimizer"} <= set(names)
    saves = {lv.name: lv.saves_bytes for lv in levers}
    assert saves["4-bit base (QLoRA)"] == 990 * MiB - 250 * MiB
    assert saves["activation checkpointing"] == int(970 * MiB * 7 / 8)
    assert saves["shorter max_length"] == int(970 * MiB * (1 - 512 / 2048))
    assert [lv.saves_bytes for lv in levers] == sorted(saves.values(), reverse=True)
    text = advice_text(levers)
    assert "[data] max_length = 512 (p95 of lengths is 300)" in text and "(estimate)" in text


def test_no_lever_left_says_so(tmp_path):
    none = Breakdown(100, 0, 100, 100, 0, 200)
    levers = levers_for(recipe(tmp_path, micro_batch_size=1, gradient_checkpointing="true", optimizer='"sgd"'),
                        none, num_layers=2)
    assert [lv.name for lv in levers] == ["4-bit base (QLoRA)"]  # checkpointing on, micro-batch 1, no state
    assert advice_text([]).startswith("no lever left")
