"""The conftest template runs beside the checks; the documented real-model recipe is valid."""

from __future__ import annotations

import pytest

import shutil
from pathlib import Path

from pytest_ftready.recipe import load_recipe
from tests.helpers import outcomes

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
