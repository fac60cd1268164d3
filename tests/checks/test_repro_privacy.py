"""Reproducibility and privacy checks, in-process on the tiny recipe, and one plugin run whose
every output channel is searched for planted secrets."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail, Skip
from tests.helpers import fails
from tests import planted



# ---- pins -------------------------------------------------------------------------------------
def test_pins_match_mismatch_and_branch_revision(make_state, run_check, tiny_example):
    import importlib.metadata as md

    torch_version = md.version("torch")
    lock = tiny_example / "requirements.lock"
    lock.write_text(f"torch=={torch_version}\npyrsistent=={md.version('pyrsistent')}\n# comment\nrequests>=2\n")
    recipe = tiny_example / "recipe.toml"
    recipe.write_text(recipe.read_text() + '\n[pins]\nlockfile = "requirements.lock"\n')
    state = make_state()
    measured = {m.name: m.value for m in run_check(state, "repro.pins").measured}
    assert measured["pinned_packages"] == 2 and len(measured["model_folder_sha256"]) == 64
    lock.write_text("torch==1.0.0\npeft==0.0.1\n")
    fails(run_check, state, "repro.pins", "2 installed package(s) differ", f"torch: pinned 1.0.0, installed {torch_version}",
          "peft: pinned 0.0.1")


def test_uv_lock_and_recipe_pins(tmp_path):
    from pytest_ftready.machine.pins import read_lockfile

    (tmp_path / "uv.lock").write_text('version = 1\n[[package]]\nname = "Torch"\nversion = "2.5.1"\n'
                                      '[[package]]\nname = "my_pkg"\nversion = "1.0"\n')
    assert read_lockfile(tmp_path / "uv.lock") == {"torch": "2.5.1", "my-pkg": "1.0"}


def test_a_hub_revision_that_is_a_branch_fails(tmp_path, run_check):
    from pytest_ftready.checks.registry import all_checks
    from pytest_ftready.recipe.schema import parse_recipe
    from pytest_ftready.session.state import RunState
    from tests import fakes

    all_checks()
    (tmp_path / "t.jsonl").write_text("{}\n")
    recipe = parse_recipe('[model]\nid = "org/model"\nrevision = "main"\n[data]\ntrain = ["t.jsonl"]\n'
                          '[pins]\npackages = { pyrsistent = "0.20.0" }\n', tmp_path / "r.toml")
    state = RunState(artifacts_root=tmp_path, machine_factory=fakes.cpu_only).recipe_state(recipe)
    fails(run_check, state, "repro.pins", "revision 'main' is a branch or tag, not a commit",
          "HfApi().model_info('org/model', revision='main').sha")


# ---- config and manifest --------------------------------------------------------------------
def test_config_is_written_and_seeds_apply(make_state, run_check):
    state = make_state()
    run_check(state, "repro.config")
    written = json.loads((state.artifacts / "config.json").read_text())
    assert written["seeds"]["torch"] == 42 and written["recipe"]["data"]["max_length"] == 128
    assert oct((state.artifacts / "config.json").stat().st_mode & 0o777) == "0o600"


def test_manifest_match_change_missing_and_written_then_verified(make_state, run_check, tiny_example):
    from pytest_ftready.data.manifest import main

    state = make_state()
    run_check(state, "repro.manifest")  # the committed example manifest matches the generated data
    data = tiny_example / "data" / "train.jsonl"
    data.write_text(data.read_text().replace("likes", "loves", 1))
    fails(run_check, state, "repro.manifest", "train.jsonl: sha256")
    assert main(["write", str(tiny_example / "recipe.toml")]) == 0
    run_check(state, "repro.manifest")
    data.unlink()
    fails(run_check, state, "repro.manifest", "train.jsonl: missing on disk")
    (tiny_example / "data" / "MANIFEST.json").unlink()
    fails(run_check, state, "repro.manifest", "does not exist: write it with `ftready-manifest write")


# ---- permissions, license, retention ------------------------------------------------------------
def test_world_readable_data_fails_with_its_fix(make_state, run_check):
    import shutil
    import tempfile

    state = make_state()
    run_check(state, "privacy.permissions")  # everything below a 0700 pytest temp folder: private
    shared = Path(tempfile.mkdtemp(prefix="ftready-shared-"))  # /tmp is traversable by everyone
    try:
        shared.chmod(0o755)
        data = shared / "train.jsonl"
        data.write_text((state.recipe.folder / "data" / "train.jsonl").read_text())
        data.chmod(0o644)
        state = make_state(train=f'["{data}"]')
        fails(run_check, state, "privacy.permissions", f"{data} (mode 0644) is reachable by group and others",
              f"chmod go-rwx {data}")
        shared.chmod(0o700)  # the same 0644 file inside a private folder is private
        run_check(make_state(), "privacy.permissions")
    finally:
        shutil.rmtree(shared)


def test_license_allowed_not_allowed_and_unknown(make_state, run_check, tiny_example):
    run_check(make_state(), "privacy.license")
    state = make_state(license='"llama3.1"')
    fails(run_check, state, "privacy.license", "licensed 'llama3.1' (the recipe's [model] license), not one of")
    (tiny_example / "model").unlink()
    (tiny_example / "model").mkdir()
    (tiny_example / "model" / "config.json").write_text("{}")
    (tiny_example / "model" / "README.md").write_text("---\nlicense: other\nlicense_name: gemma\n---\n# card\n")
    state = make_state(license='""')
    fails(run_check, state, "privacy.license", "licensed 'gemma' (README.md front matter)")
    (tiny_example / "model" / "README.md").write_text("# a card without front matter\n")
    fails(run_check, make_state(), "privacy.license", "the model's license is unknown")


def test_retention_and_backups(make_state, run_check, tiny_example):
    state = make_state()
    with pytest.raises(Skip, match=r"the backups folder .*backups \(\[privacy\] backups path = \"backups\"\) does not "
                                   r"exist, so no backup was checked"):
        run_check(state, "privacy.retention")  # a declared folder that is not there: nothing looked at, no pass
    backups = tiny_example / "backups"
    backups.mkdir()
    measured = {m.name: m.value for m in run_check(state, "privacy.retention").measured}
    assert measured["backup_files_checked"] == 0 and "artifact_files_checked" in measured
    (backups / "train.jsonl.bak").write_text('{"messages": []}\n' * 100)
    (backups / "train.jsonl.age").write_bytes(b"age-encryption.org/v1\n" + os.urandom(2048))
    old = state.artifacts / "old.log"
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_text("x")
    os.utime(old, (time.time() - 100 * 86400,) * 2)
    message = fails(run_check, state, "privacy.retention", "1 backup file(s)", "train.jsonl.bak",
                    "1 artifact(s) are older than retention_days = 90", "old.log")
    assert "train.jsonl.age" not in message


# ---- secrets and personal data, end to end ------------------------------------------------------
@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_planted_data_is_found_and_never_printed_anywhere(pytester, tiny_example):
    data = tiny_example / "data" / "train.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    for i, row in enumerate(planted.rows()):
        rows[i]["messages"][-1]["content"] = row["messages"][0]["content"]  # secrets in trained text too
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    arts = pytester.path / "arts"
    result = pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "--junitxml=out.xml",
                                           "--benchmark-json=bench.json", f"--ftready-artifacts={arts}", "-rA", "-v")
    outputs = {"terminal": result.stdout.str() + result.stderr.str()}
    for path in [pytester.path / "out.xml", pytester.path / "bench.json", *arts.rglob("*")]:
        if path.is_file() and path.suffix in (".xml", ".json", ".html", ".txt", ".md", ""):
            outputs[str(path)] = path.read_text(errors="replace")
    assert "privacy.secrets FAILED" in outputs["terminal"] and "privacy.pii FAILED" in outputs["terminal"]
    assert "15 secret finding(s)" in outputs["terminal"]
    assert (arts / "tiny" / "masking.html").is_file()
    for value in planted.planted_values():
        for channel, text in outputs.items():
            assert value not in text, f"planted value leaked into {channel}"


def test_allowlist_accepts_known_findings_by_fingerprint(make_state, run_check, tiny_example):
    from pytest_ftready.privacy.audit import scan_file

    data = tiny_example / "data" / "train.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows[0]["messages"][1]["content"] = f"Mail {planted.PII['email']} or call {planted.PII['phone']}"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    state = make_state()
    with pytest.raises(Fail, match="2 personal data finding"):
        run_check(state, "privacy.pii")
    email = next(f for f in scan_file(data, frozenset({"pii"})) if f.finding.kind == "email")
    (tiny_example / "accepted.txt").write_text(f"# our support address, public\n{email.finding.fingerprint}\n")
    recipe = tiny_example / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("retention_days = 90", 'retention_days = 90\nallowlist = "accepted.txt"'))
    state = make_state()
    with pytest.raises(Fail, match="1 personal data finding.*phone"):
        run_check(state, "privacy.pii")
    measured = {m.name: m.value for m in state.run.measurements if m.check == "privacy.pii"}
    assert measured["pii_allowlisted"] == 1


# ---- what the scans and walks did not look at ----------------------------------------------------
def test_a_key_in_a_file_with_a_nul_byte_is_found_and_the_file_counted_as_binary(make_state, run_check, tiny_example):
    logs = tiny_example / "logs"
    logs.mkdir()
    (logs / "crash.log").write_bytes(b"core\0dump\n" + f"export KEY={planted.SECRETS['aws_access_key_id']}\n".encode())
    recipe = tiny_example / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("retention_days = 90", 'retention_days = 90\nscan_paths = ["logs"]'))
    state = make_state()
    fails(run_check, state, "privacy.secrets", "1 secret finding(s) (aws_access_key_id)", "crash.log:2")
    measured = {m.name: m.value for m in state.run.measurements if m.check == "privacy.secrets"}
    assert measured["binary_files_scanned"] == 1 and measured["files_scanned"] == 2


def test_a_scan_path_that_does_not_exist_fails_naming_it(make_state, run_check, tiny_example):
    recipe = tiny_example / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("retention_days = 90", 'retention_days = 90\nscan_paths = ["logz"]'))
    state = make_state()
    fails(run_check, state, "privacy.pii", "1 training data or [privacy] scan_paths entr(ies) could not be scanned",
          f"{tiny_example / 'logz'}: does not exist", "remove it from scan_paths")


def test_a_fifo_as_training_data_is_not_a_passed_scan(make_state, run_check, tiny_example):
    # The recipe refuses a FIFO (tests/faults): here the file becomes one after the recipe was read.
    fifo = tiny_example / "data" / "pipe.jsonl"
    fifo.write_text((tiny_example / "data" / "train.jsonl").read_text())
    state = make_state(train=f'["{fifo}"]')
    fifo.unlink()
    os.mkfifo(fifo)
    with pytest.raises(Skip, match=r"nothing was scanned for secrets: no file .*\n  .*pipe.jsonl: not a regular file"):
        run_check(state, "privacy.secrets")


def test_walks_cover_every_root_and_name_what_they_could_not_list(tmp_path):
    from pytest_ftready.privacy.audit import walk

    first, second = tmp_path / "a", tmp_path / "b"
    (first / "locked").mkdir(parents=True)
    second.mkdir()
    (second / "last.txt").write_text("x")
    (first / "locked").chmod(0)
    try:
        paths = walk([first, tmp_path / "missing", second])
        seen = list(paths)
    finally:
        (first / "locked").chmod(0o700)
    assert second / "last.txt" in seen  # every root is walked, whatever came before it
    assert paths.missing == [tmp_path / "missing"]
    if os.geteuid() != 0:  # root lists any folder
        assert paths.unreadable and "locked" in paths.unreadable[0]
