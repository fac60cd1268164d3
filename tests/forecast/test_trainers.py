"""forecast.trainers: each trainer's step as the forecast traces it, read from the example
configs as a team writes them: TRL's bf16 autocast default and its fused LM head (its torch
fallback traced on a CPU, its Triton kernels' footprint on CUDA), Axolotl's and LLaMA-Factory's
padding, the trainer the team launches, and what is said where a path is estimated."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_ftready.forecast import trainers
from pytest_ftready.forecast.trace import forecast, forecast_config
from pytest_ftready.forecast.trainers import Step, measured_step, recipe_trainer, resolve
from pytest_ftready.recipe import load_recipe

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny"
TRL_FUSED = trainers.trl_loss_kind() == "fused"


def config_in(folder: Path, name: str, extra: str = "", side: str = ""):
    """The example's trainer config ``name`` (with ``extra`` YAML lines) beside ftready.toml
    (``side`` lines added to its [data] table), read as a recipe."""
    for file in (name, "ftready.toml"):
        shutil.copy(EXAMPLE / file, folder / file)
    shutil.copy(EXAMPLE / "data" / "dataset_info.json", folder / "data" / "dataset_info.json")
    (folder / name).write_text((folder / name).read_text() + extra)
    toml = folder / "ftready.toml"
    toml.write_text(toml.read_text().replace("[data]\n", f"[data]\n{side}", 1))
    return load_recipe(folder / name)


def path_of(recipe, step: Step):
    return resolve(recipe, step, forecast_config(recipe))


def test_trls_step_autocasts_to_bf16_by_default_and_as_its_config_says(tiny_example):
    recipe = config_in(tiny_example, "trl-sft.yaml")
    path = path_of(recipe, Step("trl", "cpu"))
    assert (path.rows, path.row_tokens, path.accumulation, path.autocast) == (4, 128, 2, "bfloat16")
    assert any("bfloat16 autocast over float32 weights" in note for note in path.notes)
    assert path_of(config_in(tiny_example, "trl-sft.yaml", "bf16: false\n"), Step("trl", "cpu")).autocast == ""
    assert path_of(config_in(tiny_example, "trl-sft.yaml", "fp16: true\n"), Step("trl", "cpu")).autocast == "float16"


def test_trls_rows_are_padded_as_its_collator_pads_the_worst_case(tiny_example):
    padded = path_of(config_in(tiny_example, "trl-sft.yaml", "pad_to_multiple_of: 48\n"), Step("trl", "cpu"))
    assert padded.batch_shape == (4, 144)  # 128 rounded up to a multiple of 48
    free = path_of(config_in(tiny_example, "trl-sft.yaml", "padding_free: true\n"), Step("trl", "cpu"))
    assert free.batch_shape == (1, 4 * 128) and any("padding-free" in note for note in free.notes)
    measured = path_of(config_in(tiny_example, "trl-sft.yaml"), measured_step("trl", "cpu", 4 * 96))
    assert (measured.batch_shape, measured.accumulation, measured.step.first_step) == ((4, 96), 1, True)


@pytest.mark.skipif(not TRL_FUSED, reason="needs a TRL with its fused LM head (pip install 'pytest-ftready[trl]')")
def test_trls_fused_head_on_a_cpu_holds_its_tile_and_float32_copies_and_less_on_cuda(tiny_example):
    recipe = config_in(tiny_example, "trl-sft.yaml")
    engine, cpu, cuda = (forecast(recipe, step=Step(name, device))
                         for name, device in (("builtin", "cpu"), ("trl", "cpu"), ("trl", "cuda")))
    assert "TRL's fused LM head, torch fallback (traced)" in cpu.path
    assert "Triton kernels (in place, modelled)" in cuda.path
    assert any("modelled from trl/kernels/chunked_logprob.py" in note for note in cuda.notes)
    tokens, (tile_tokens, tile_columns) = 4 * 127, trainers.TRL_TILE
    tile = min(tokens, tile_tokens) * tile_columns * 2  # bf16 under TRL's autocast, 32,768 columns whatever the vocabulary
    assert cpu.peak_bytes > cuda.peak_bytes > tile > engine.peak_bytes
    # on the CPU TRL's torch fallback adds float32 copies of the tile's used columns (1,000: the tiny vocabulary)
    assert cpu.peak_bytes - cuda.peak_bytes > 4 * tokens * 1000 * 4


@pytest.mark.skipif(not TRL_FUSED, reason="needs a TRL with its fused LM head (pip install 'pytest-ftready[trl]')")
def test_trls_head_on_a_full_fine_tune_keeps_its_patched_forward_under_the_autocast(tiny_example):
    recipe = config_in(tiny_example, "trl-sft.yaml", "use_peft: false\n")
    assert recipe.adapter.method == "none"
    full = forecast(recipe, step=Step("trl", "cpu"))
    assert "TRL's fused LM head" in full.path and full.gradient_bytes >= 4 * full.parameters
    # TRL's head was traced (its 508 x 32,768 bf16 tile: 32 MiB), not the engine's full logits (6 MiB)
    assert full.peak_bytes - forecast(recipe, step=Step("builtin", "cpu")).peak_bytes > 16 * 2**20


def test_axolotls_collator_pads_to_a_multiple_of_64_or_to_sequence_len(tiny_example):
    def row(extra: str, side: str = "") -> int:
        return path_of(config_in(tiny_example, "axolotl.yml", extra, side), Step("axolotl", "cpu")).row_tokens

    assert row("") == 128  # sequence_len 128, already a multiple of 64
    assert row("", side="max_length = 100\n") == 128  # the worst row, 100 tokens, padded to 128
    assert row("pad_to_multiple_of: 48\n", side="max_length = 100\n") == 144
    assert row("pad_to_sequence_len: false\n", side="max_length = 100\n") == 100
    recipe = config_in(tiny_example, "axolotl.yml", "pad_to_sequence_len: true\nsequence_len: 200  # over it\n",
                       side="max_length = 100\n")
    assert path_of(recipe, Step("axolotl", "cpu")).row_tokens == 256  # sequence_len rounded up, whatever the rows
    assert path_of(recipe, Step("axolotl", "cuda")).autocast == ""  # the example says bf16: false


def test_llamafactorys_collator_pads_to_a_multiple_of_8_and_its_flags_autocast(tiny_example):
    recipe = config_in(tiny_example, "llamafactory.yaml", side="max_length = 100\n")
    path = path_of(recipe, Step("llamafactory", "cpu"))
    assert (path.row_tokens, path.autocast, path.loss) == (104, "", "engine")
    measured = path_of(recipe, measured_step("llamafactory", "cpu", 4 * 80))
    assert measured.row_tokens == 80 and measured.step.first_step
    bf16 = path_of(config_in(tiny_example, "llamafactory.yaml", "bf16: true\n"), Step("llamafactory", "cuda"))
    assert bf16.autocast == "bfloat16"


def test_the_trainer_forecast_is_the_one_the_team_launches(tiny_example):
    assert recipe_trainer(load_recipe(tiny_example / "recipe.toml")) == "builtin"
    for name, trainer in (("trl-sft.yaml", "trl"), ("axolotl.yml", "axolotl"), ("llamafactory.yaml", "llamafactory")):
        assert recipe_trainer(config_in(tiny_example, name)) == trainer  # installed here or not
    assert recipe_trainer(config_in(tiny_example, "trl-sft.yaml", side='pipeline = "builtin"\n')) == "builtin"


def test_a_trainer_with_no_model_is_traced_as_the_engine_saying_so(tiny_example):
    recipe = load_recipe(tiny_example / "recipe.toml")
    f = forecast(recipe, step=Step("unsloth", "cuda"))
    assert f.peak_bytes == forecast(recipe, step=Step("builtin", "cuda")).peak_bytes
    assert f.path == "unsloth on cuda: estimated as pytest-ftready's engine step"
    assert any(note.startswith("ESTIMATE: no forecast model of unsloth's step") for note in f.notes)


def test_where_trl_is_not_installed_its_loss_is_estimated_with_its_bound(tiny_example, monkeypatch):
    recipe = config_in(tiny_example, "trl-sft.yaml")
    monkeypatch.setattr(trainers, "trl_loss_kind", lambda: "")
    path = path_of(recipe, Step("trl", "cuda"))
    assert path.loss == "engine" and path.autocast == "bfloat16"
    note = next(n for n in path.notes if n.startswith("ESTIMATE: TRL is not installed here"))
    # TRL's tile (512 x 32,768 bf16 logits, 32 MiB) is larger than the full logits (512 x 1,000 x (4 + 8) bytes)
    assert note.endswith("the larger of the logits term and the tile's, 32.00 MiB")


def test_a_first_step_creates_its_optimizer_state_in_the_step(tiny_example):
    from pytest_ftready.forecast.levers import with_changes

    full = with_changes(load_recipe(tiny_example / "recipe.toml"),
                        [("adapter", "method", "none"), ("training", "gradient_accumulation_steps", 1)])
    steady = forecast(full)
    first = forecast(full, step=Step("builtin", "cpu", first_step=True))
    assert first.peak_bytes < steady.peak_bytes  # no state held through the forward and backward
    assert steady.optimizer_state_bytes >= 2 * 4 * steady.parameters


def test_the_forecast_text_names_the_traced_step(tiny_example):
    from pytest_ftready.forecast.levers import forecast_report
    from pytest_ftready.outputs.forecast_text import render

    text = render(forecast_report(config_in(tiny_example, "trl-sft.yaml"), None))
    assert "  step: trl SFTTrainer on cpu: " in text
