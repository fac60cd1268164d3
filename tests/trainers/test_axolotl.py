"""Axolotl's own preprocessing: an Axolotl config's rows are tokenized and labelled by Axolotl's
prompt strategy, and data.masking judges those labels. Runs where axolotl is installed (its own
environment: .ci/run builds one); skipped elsewhere, saying so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail
from pytest_ftready.recipe.schema import load_recipe
from pytest_ftready.session.state import RunState

from ..conftest import copy_example

pytest.importorskip("axolotl", reason="Axolotl's own pipeline needs axolotl, installed in an environment of its own "
                                      "(.ci/run builds one)")

ROOT = Path(__file__).resolve().parents[2]


def axolotl_state(folder: Path, model_dir: Path, machine, **edits: str):
    from pytest_ftready.checks.registry import all_checks

    all_checks()
    copy_example(folder, model_dir)
    for name in ("axolotl.yml", "ftready.toml"):
        shutil.copy(ROOT / "examples" / "tiny" / name, folder / name)
    config = folder / "axolotl.yml"
    text = config.read_text()
    for key, value in edits.items():
        text = text.replace(f"{key}: ", f"{key}: {value}  # was: ", 1)
    config.write_text(text)
    run = RunState(artifacts_root=folder / "arts", machine_factory=lambda: machine)
    return run.recipe_state(load_recipe(config))


def test_an_axolotl_config_checks_the_labels_axolotl_makes(tmp_path, tiny_model_dir, real_machine, run_check):
    state = axolotl_state(tmp_path / "tiny", tiny_model_dir, real_machine)
    got = {m.name: m.value for m in run_check(state, "data.masking").measured}
    assert (got["pipeline"], got["step_trainer"]) == ("axolotl", "pytest-ftready engine")
    assert got["trained_span_method"] == "Axolotl chat_template"
    assert 0 < got["trained_token_share"] < 0.5
    assert not (tmp_path / "tiny" / "last_run_prepared").exists()  # nothing written beside the team's config


def test_a_config_whose_masks_axolotl_builds_wrong_fails_masking_naming_axolotl(tmp_path, tiny_model_dir, real_machine,
                                                                               run_check):
    state = axolotl_state(tmp_path / "tiny", tiny_model_dir, real_machine, train_on_eos="none")
    with pytest.raises(Fail) as info:
        run_check(state, "data.masking")
    message = str(info.value)
    assert message.startswith("labels made by Axolotl chat_template:") and "stop_untrained" in message
