"""Checkpoint and headroom checks with a fake hub (realistic file lists) and a fake small disk."""

from __future__ import annotations

import pytest

from pytest_ftready.outcomes import Fail, Skip
from pytest_ftready.machine.hub import HubUnavailable, ModelFiles, needed_files
from pytest_ftready.recipe.schema import parse_recipe
from pytest_ftready.session.state import RunState
from tests import fakes

GB = 10 ** 9
SHA = "0e9e39f249a16976918f6564b8830bc894c89659"
# The file list of an 8B instruct model that ships safetensors, .bin copies and original/ weights.
LLAMA_FILES = (
    (".gitattributes", 1519), ("LICENSE", 7627), ("README.md", 44000), ("USE_POLICY.md", 4691),
    ("config.json", 855), ("generation_config.json", 184),
    ("model-00001-of-00004.safetensors", 4_976_698_672), ("model-00002-of-00004.safetensors", 4_999_802_720),
    ("model-00003-of-00004.safetensors", 4_915_916_176), ("model-00004-of-00004.safetensors", 1_168_138_808),
    ("model.safetensors.index.json", 23950),
    ("pytorch_model-00001-of-00004.bin", 4_976_718_466), ("pytorch_model-00002-of-00004.bin", 4_999_826_656),
    ("pytorch_model-00003-of-00004.bin", 4_915_939_254), ("pytorch_model-00004-of-00004.bin", 1_168_140_873),
    ("pytorch_model.bin.index.json", 23950),
    ("original/consolidated.00.pth", 16_060_617_592), ("original/params.json", 199), ("original/tokenizer.model", 2_183_982),
    ("special_tokens_map.json", 296), ("tokenizer.json", 9_085_657), ("tokenizer_config.json", 55351),
)
NEEDED = ["config.json", "generation_config.json", "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
          "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors", "model.safetensors.index.json",
          "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]


class FakeHub:
    def __init__(self, fail: bool = False):
        self.fail = fail
        self.calls = []

    def model_files(self, repo_id, revision, timeout_s):
        self.calls.append((repo_id, revision, timeout_s))
        if self.fail:
            raise HubUnavailable(f"offline and {repo_id}@{revision} is not in the cache")
        return ModelFiles(sha=SHA, files=LLAMA_FILES, source="hub")


@pytest.fixture
def hub_state(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from pytest_ftready.checks.registry import all_checks

    all_checks()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    (tmp_path / "t.jsonl").write_text("{}\n")

    def make(revision=SHA, free=500 * GB, hub=None):
        recipe = parse_recipe(f'[model]\nid = "meta-llama/Llama-3.1-8B-Instruct"\nrevision = "{revision}"\n'
                              '[data]\ntrain = ["t.jsonl"]\n', tmp_path / "r.toml")
        run = RunState(artifacts_root=tmp_path / "arts", machine_factory=fakes.cpu_only,
                       hub_factory=lambda: hub or FakeHub(), free_bytes=lambda path: free)
        return run.recipe_state(recipe)
    return make


def test_allow_patterns_skip_bin_and_original_copies():
    assert needed_files(dict(LLAMA_FILES)) == NEEDED


def test_files_and_bytes_from_hub_metadata(hub_state, run_check):
    state = hub_state()
    run_check(state, "checkpoint.revision")
    with pytest.raises(Skip, match=r"not downloaded yet; .*snapshot_download\('meta-llama/Llama-3.1-8B-Instruct', "
                                   rf"revision='{SHA}', allow_patterns=\['config.json'"):
        run_check(state, "checkpoint.files")
    measured = {m.name: m.value for m in run_check(state, "checkpoint.disk").measured}
    expected = sum(size for name, size in LLAMA_FILES if name in NEEDED)
    assert measured["model_bytes"] == measured["bytes_to_download"] == expected
    assert state.run.hub.calls == [("meta-llama/Llama-3.1-8B-Instruct", SHA, 10.0)]  # asked once, with a timeout


def test_a_small_disk_fails_checkpoint_disk_with_both_figures(hub_state, run_check):
    state = hub_state(free=20 * GB)
    with pytest.raises(Fail, match=r"downloading 14\.97 GiB of meta-llama/Llama-3\.1-8B-Instruct needs more than the "
                                   r"14\.90 GiB usable .* \(18\.63 GiB free less the 20% disk_headroom\)"):
        run_check(state, "checkpoint.disk")


def test_a_branch_is_reported_with_todays_commit(hub_state, run_check):
    with pytest.raises(Fail, match=f"revision 'main' is a branch or tag; today it points to {SHA}"):
        run_check(hub_state(revision="main"), "checkpoint.revision")


def test_offline_without_cache_skips_and_never_hangs(hub_state, run_check):
    state = hub_state(hub=FakeHub(fail=True))
    for check_id in ("checkpoint.revision", "checkpoint.files", "checkpoint.disk"):
        with pytest.raises(Skip, match="not in the cache"):
            run_check(state, check_id)


def test_cached_snapshot_missing_a_shard_fails(hub_state, run_check, tmp_path):
    from pytest_ftready.machine.hub import repo_cache_dir

    snapshot = repo_cache_dir("meta-llama/Llama-3.1-8B-Instruct") / "snapshots" / SHA
    snapshot.mkdir(parents=True)
    for name in NEEDED[:-1]:
        (snapshot / name).write_text("x")
    with pytest.raises(Fail, match="lacks tokenizer_config.json"):
        run_check(hub_state(), "checkpoint.files")
    (snapshot / "tokenizer_config.json").write_text("{}")
    run_check(hub_state(), "checkpoint.files")
    measured = {m.name: m.value for m in run_check(hub_state(), "checkpoint.disk").measured}
    assert measured["bytes_to_download"] == 0


def test_headroom_on_a_small_disk_and_a_short_budget(make_state, run_check):
    import dataclasses

    state = make_state()  # headroom.disk and headroom.time measure the checkpoint and the step they need
    measured = {m.name: m.value for m in run_check(state, "headroom.disk").measured}
    assert measured["checkpoint_bytes"] > 0 and measured["run_disk_bytes"] > 2 * measured["checkpoint_bytes"]
    state.run.free_bytes = lambda path: 50 * 1024 ** 2
    with pytest.raises(Fail, match=r"the run writes 95\.\d\d MiB \(2 checkpoints of .* but .* has 40\.00 MiB usable "
                                   r"\(50\.00 MiB free less the 20% disk_headroom\)"):
        run_check(state, "headroom.disk")
    eta = {m.name: m.value for m in run_check(state, "headroom.time").measured}
    assert eta["eta_with_margins"] > eta["eta_training"] > 0 and eta["tokens_to_train"] > 0
    state.step = dataclasses.replace(state.step, step_seconds=1e4)
    with pytest.raises(Fail, match=r"the run needs ~\d+\.\d h .* but max_hours is 1\.0"):
        run_check(state, "headroom.time")


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_tiny_headroom_passes_with_measured_figures_in_junit(pytester, tiny_example):
    import xml.etree.ElementTree as ET

    pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "-k", "headroom", "--junitxml=out.xml")
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "out.xml").getroot().iter("testcase")}
    for name in ("headroom.disk", "headroom.time"):
        assert not [c for c in cases[name] if c.tag in ("failure", "error", "skipped")], f"{name} did not pass"
    disk = {p.get("name"): float(p.get("value")) for p in cases["headroom.disk"].iter("property")}
    eta = {p.get("name"): p.get("value") for p in cases["headroom.time"].iter("property")}
    assert disk["checkpoint_bytes[bytes]"] > 10_000 and disk["disk_free[bytes]"] > disk["run_disk_bytes[bytes]"]
    assert float(eta["throughput_used[tokens/s]"]) > 0 and 0 < float(eta["eta_with_margins[h]"]) < 1


def test_offline_snapshot_lacking_a_shard_its_index_names_fails(hub_state, run_check, monkeypatch):
    """Offline, the file list comes from the cache: the shard the index names but the disk lacks
    is still needed (it was never drawn from what happens to be there)."""
    import json

    from huggingface_hub import constants

    from pytest_ftready.machine.hub import RealHub, repo_cache_dir

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    snapshot = repo_cache_dir("meta-llama/Llama-3.1-8B-Instruct") / "snapshots" / SHA
    snapshot.mkdir(parents=True)
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", shards[0]):
        (snapshot / name).write_text("{}")
    (snapshot / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shards[0], "b": shards[1]}}))
    state = hub_state(hub=RealHub())
    with pytest.raises(Fail, match=f"lacks {shards[1]}"):
        run_check(state, "checkpoint.files")
    measured = {m.name: m.value for m in state.run.measurements if m.check == "checkpoint.files"}
    assert measured["file_list_source"] == "cache" and measured["files_listed"] == 6
    with pytest.raises(Skip, match=f"no size known for {shards[1]} \\(the file list came from the cache, where"):
        run_check(state, "checkpoint.disk")
    (snapshot / shards[1]).write_text("{}")
    run_check(hub_state(hub=RealHub()), "checkpoint.files")


def test_a_local_model_folder_lacking_a_shard_fails(make_state, run_check, tiny_example):
    import json

    from tests.helpers import private_model

    model = private_model(tiny_example)  # with an index naming a shard it lacks
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-00002-of-00002.safetensors"}}))
    state = make_state()
    with pytest.raises(Fail, match="lacks model-00002-of-00002.safetensors, named by its weight index"):
        run_check(state, "checkpoint.files")
