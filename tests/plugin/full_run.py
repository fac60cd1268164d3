"""What the shared whole run of the tiny example (``tiny_full_run`` in conftest.py) puts
beside the recipe: a team's conftest and test file using every documented fixture, and the
README's own example; and how the plugin tests run pytest as a user does."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


# A team's conftest: which markers each collected item carries (the contract test reads it).
MARKER_DUMP = '''
import json


def pytest_collection_finish(session):
    items = {item.nodeid: sorted({m.name for m in item.iter_markers()}) for item in session.items}
    with open("markers.json", "w") as handle:
        json.dump(items, handle)
'''

# A team's own readiness tests, one per documented fixture, used as the README shows.
TEAM_TESTS = '''
import datasets


def test_uses_ftready_recipe(ftready_recipe):
    assert ftready_recipe.name == "tiny" and ftready_recipe.data.max_length == 128


def test_uses_ftready_device(ftready_device):
    assert ftready_device.kind == "cpu" and ftready_device.name
    assert ftready_device.memory_total_bytes > 0
    assert ftready_device.capability is None or ftready_device.capability
    assert hasattr(ftready_device, "driver")


def test_uses_ftready_tokenizer(ftready_tokenizer):
    assert "<|im_start|>" in ftready_tokenizer.chat_template
    assert ftready_tokenizer("Hello")["input_ids"]


def test_uses_ftready_model(ftready_model, ftready_tokenizer):
    import torch

    ids = torch.tensor([ftready_tokenizer("Hello")["input_ids"]])
    with torch.no_grad():
        logits = ftready_model(input_ids=ids).logits
    assert logits.shape[-1] == len(ftready_tokenizer)


def test_uses_ftready_dataset(ftready_dataset, ftready_recipe, ftready_measure):
    assert isinstance(ftready_dataset, datasets.Dataset)
    assert ftready_dataset.cache_files, "the dataset is not backed by an Arrow file on disk"
    assert ftready_dataset.column_names == ["input_ids", "attention_mask", "labels", "where"]
    rows = 0
    for example in ftready_dataset:
        ids, labels = example["input_ids"], example["labels"]
        assert 0 < len(ids) <= ftready_recipe.data.max_length
        assert example["attention_mask"] == [1] * len(ids) and len(labels) == len(ids)
        assert all(label == -100 or label == token for token, label in zip(ids, labels))
        assert any(label != -100 for label in labels)
        assert example["where"].startswith(ftready_recipe.data.train[0].name + ":")
        rows += 1
    ftready_measure("dataset_rows", rows, "rows")


def test_uses_ftready_step(ftready_step):
    assert ftready_step.peak_bytes > 0 and ftready_step.capacity_bytes > ftready_step.peak_bytes
    assert ftready_step.host_peak_bytes > 0 and ftready_step.step_seconds > 0 and ftready_step.tokens_per_s > 0
    assert ftready_step.breakdown and ftready_step.fits(0.10) and not ftready_step.out_of_memory


def test_uses_ftready_measure(ftready_measure):
    ftready_measure("team_figure", 7, "widgets")
'''


@dataclass(frozen=True)
class FullRun:
    folder: Path  # the example's copy, where the run ran
    result: subprocess.CompletedProcess
    artifacts: Path  # arts/tiny

    @property
    def junit(self) -> Path:
        return self.folder / "out.xml"


def run_pytest(folder: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m pytest --ftready=recipe.toml`` in ``folder`` (artifacts in ``arts``), as a user runs it."""
    clean = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "FTREADY_BASELINE")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--ftready=recipe.toml",
                           "--ftready-artifacts=arts", *args], cwd=folder, env={**clean, **(env or {})},
                          capture_output=True, text=True)


def readme_python_example() -> str:
    """The README's "Writing your own checks" code block, verbatim."""
    from tests.plugin.readme import code_blocks, section

    return code_blocks(section("Writing your own checks"), "python")[0]


