"""The bundled examples as a user runs them: each one's README command, from its folder, green with
every check that runs on this CPU (TRL's config in TRL's environment: this one; Axolotl's and
LLaMA-Factory's in theirs, tests/trainers/); the real-model recipe is valid and its forecast fits
the card it names; the conftest template runs beside the checks."""

from __future__ import annotations

import pytest

import shutil
from pathlib import Path

from pytest_ftready.recipe import load_recipe
from tests.helpers import assert_green, bundled_examples, outcomes, run_as_written

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_conftest_template_runs_with_the_fixtures(pytester, tiny_example):
    shutil.copy(ROOT / "conftest_templates" / "conftest.py", pytester.path / "test_team_checks.py")
    pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "test_team_checks.py", "-k",
                                  "team_checks or data.format", "--junitxml=out.xml")
    result = outcomes(pytester.path / "out.xml")
    assert result["test_no_row_is_longer_than_our_serving_context"][0] == "passed"
    assert result["test_system_prompt_is_never_trained"][0] == "passed"
    state, reason = result["test_first_token_latency_after_warmup"]
    assert state == "skipped" and "needs a CUDA/ROCm GPU" in reason
    assert result["data.format"][0] == "passed"


def test_real_model_recipe_is_valid(tmp_path):
    shutil.copy(ROOT / "examples" / "llama-3.1-8b-qlora-24gb.toml", tmp_path / "r.toml")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    (tmp_path / "requirements.lock").write_text("torch==2.5.1\n")
    recipe = load_recipe(tmp_path / "r.toml")
    assert recipe.model.quantization == "4bit" and recipe.training.optimizer == "adamw_8bit"
    assert len(recipe.model.revision) == 40


# (folder under examples/, the README's command there, the trainer package it needs)
EXAMPLE_RUNS = (("tiny", "pytest --ftready=trl-sft.yaml", "trl"),
                ("tiny-multi", "pytest --ftready=recipe.toml", None))
# examples/tiny/recipe.toml: tests/plugin/test_readme_contract.py's whole run (nightly checks too)


@pytest.mark.slow  # whole pytest runs (TRL's own step, overfit and resume; two torchrun ranks): CI's second line
@pytest.mark.parametrize("folder, command, needs", EXAMPLE_RUNS, ids=[f"{f}: {c}" for f, c, _ in EXAMPLE_RUNS])
def test_a_bundled_example_is_green_with_every_check_that_runs_here(tmp_path, tiny_model_dir, folder, command, needs):
    if needs:
        pytest.importorskip(needs, reason=f"{command} runs {needs}'s own step: pip install 'pytest-ftready[{needs}]'")
    examples = bundled_examples(tmp_path / "examples", tiny_model_dir)
    done, found = run_as_written(examples / folder, command)
    assert_green(done, found)
    assert found["model.forecast_error"][0] == "passed" and found["model.step_memory"][0] == "passed"


@pytest.mark.slow  # an 8B-shaped step traced on fake tensors (~10-30 s on two cores)
def test_the_real_model_example_fits_the_card_it_names_by_the_forecast(tmp_path):
    """The 8B QLoRA example applies on its 24 GB GPU; on a CPU its forecast does: the README's
    ftready-forecast line, from a Llama-3.1-8B config.json written here (the hub is offline)."""
    import subprocess
    import sys

    from transformers import AutoConfig

    config = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0,
                  tie_word_embeddings=False, rms_norm_eps=1e-5)
    AutoConfig.for_model("llama", **config).save_pretrained(tmp_path / "llama-3.1-8b")
    text = (ROOT / "examples" / "llama-3.1-8b-qlora-24gb.toml").read_text()
    model = text[text.index("[model]"):text.index("[data]")]
    local = "\n".join(line for line in model.splitlines() if not line.startswith(("id =", "revision =")))
    (tmp_path / "r.toml").write_text(text.replace(model, local.replace("[model]", '[model]\npath = "llama-3.1-8b"') + "\n"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    (tmp_path / "requirements.lock").write_text("torch==2.5.1\n")
    for card in ("RTX 4090", "24GiB"):
        done = subprocess.run([sys.executable, "-m", "pytest_ftready.forecast_command", "r.toml", "--target", card],
                              cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr  # 0: it fits
        assert "verdict: FITS" in done.stdout and "step: pytest-ftready engine on cuda" in done.stdout
