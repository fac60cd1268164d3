"""Fault: a model folder that cannot load (corrupt safetensors, a missing shard, a broken
tokenizer, code it would have to run). One clear failure, remembered; nothing retried."""

from __future__ import annotations

import json
import shutil

import pytest

from pytest_ftready.outcomes import Fail


@pytest.fixture
def own_model(tiny_example, tiny_model_dir):
    """A private copy of the tiny model (the session's one stays intact)."""
    (tiny_example / "model").unlink()
    return shutil.copytree(tiny_model_dir, tiny_example / "model")


def _load_fails_once(state, what: str, monkeypatch) -> str:
    from pytest_ftready.engine import loading

    calls = []
    real = getattr(loading, f"load_{what}")
    monkeypatch.setattr(loading, f"load_{what}", lambda *a, **k: calls.append(1) or real(*a, **k))
    with pytest.raises(Fail) as first:
        getattr(state, what)
    with pytest.raises(Fail) as second:
        getattr(state, what)
    assert second.value is first.value and len(calls) == 1  # remembered, not retried
    message = str(first.value)
    assert message.startswith(f"cannot load the {what} from {state.recipe.model.path}: ") and "\n" not in message
    return message


def test_corrupt_safetensors(make_state, own_model, monkeypatch):
    weights = own_model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:64] + b"\0garbage" * 100)
    message = _load_fails_once(make_state(), "model", monkeypatch)
    assert "SafetensorError: Error while deserializing header" in message


def test_missing_shard(make_state, own_model, monkeypatch):
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(own_model).save_pretrained(own_model, max_shard_size="200KB")
    (own_model / "model.safetensors").unlink(missing_ok=True)
    index = json.loads((own_model / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2
    (own_model / shards[-1]).unlink()
    message = _load_fails_once(make_state(), "model", monkeypatch)
    assert shards[-1] in message


def test_tokenizer_that_fails_to_load(make_state, own_model, monkeypatch):
    (own_model / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    message = _load_fails_once(make_state(), "tokenizer", monkeypatch)
    assert ": KeyError: " in message


def test_remote_code_is_refused_without_opt_in_and_never_runs(make_state, own_model, tmp_path, monkeypatch):
    ran = tmp_path / "remote-code-ran"
    (own_model / "modeling_evil.py").write_text(f"open({str(ran)!r}, 'w').write('x')\n"
                                               "from transformers import LlamaForCausalLM as EvilModel\n")
    config = json.loads((own_model / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (own_model / "config.json").write_text(json.dumps(config))
    state = make_state()
    for what in ("model", "tokenizer"):
        message = _load_fails_once(state, what, monkeypatch)
        assert "maps classes to the model's own Python code (auto_map)" in message
        assert "set [model] trust_remote_code = true in the recipe" in message
    assert not ran.exists()


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_through_pytest_one_failure_and_every_dependent_skips_naming_it(pytester, tiny_example, own_model):
    import xml.etree.ElementTree as ET

    (own_model / "tokenizer.json").write_text("{}")
    result = pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "-m", "not nightly",
                                           "-k", "data or model or lifecycle", "--junitxml=out.xml",
                                           f"--ftready-artifacts={pytester.path / 'arts'}")
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "out.xml").iter("testcase")}
    failed = {name: c.find("failure").get("message") for name, c in cases.items() if c.find("failure") is not None}
    skipped = {name: c.find("skipped").get("message") for name, c in cases.items() if c.find("skipped") is not None}
    assert list(failed) == ["data.template"] and "cannot load the tokenizer from" in failed["data.template"]
    # data.masking and data.lengths asked for the same tokenizer: the remembered failure, named, not repeated
    for name in ("data.masking", "data.lengths"):
        assert skipped[name].startswith("data.template failed: cannot load the tokenizer"), name
    for name in ("model.step_memory", "model.overfit", "lifecycle.resume", "lifecycle.generate", "data.loader"):
        assert "data.template failed" in skipped[name], name
    assert "data.format" in cases and "Traceback" not in result.stdout.str()
