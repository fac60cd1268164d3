"""lifecycle.interrupted_save: a save killed before each of its files (the run's folder as the
kill leaves it, rebuilt from the resume check's real checkpoint), then the trainer's own pick and
resume. The engine refuses every partial checkpoint naming a missing file; a resume that takes
one as complete fails naming it; transformers' get_last_checkpoint picks the partial newest one,
and TRL's own resume (transformers 5) stops on it for want of trainer_state.json."""

from __future__ import annotations

import pytest

from pytest_ftready.outcomes import Fail


def test_the_engine_refuses_every_partial_checkpoint_naming_a_missing_file(make_state, run_check):
    from pytest_ftready.engine.checkpoint import EXAMPLES_FILE, STATE_FILE

    state = make_state()
    ctx = run_check(state, "lifecycle.interrupted_save")
    results = state.interrupted_saves
    got = {m.name: m.value for m in ctx.measured}
    missing = [r.missing for r in results]
    # the save order of save_checkpoint: the adapter (as peft writes it), the training state, the examples
    assert set(missing[:-2]) == {"weights/adapter_config.json", "weights/adapter_model.safetensors"}
    assert missing[-2:] == [STATE_FILE, EXAMPLES_FILE]
    assert got["killed_saves"] == got["partial_refused"] == got["checkpoint_files"] == len(results) == 4
    assert got["resumed_from_complete"] == 0  # the engine resumes the folder it is handed: it must refuse it
    for r in results:
        assert r.picked == r.partial == state.saved_run.checkpoint.name and not r.taken_as_complete
        assert r.refusal.startswith("the checkpoint lacks "), r
        assert any(name.split("/")[-1] in r.refusal for name in missing[r.written:]), r  # a file not yet written
    assert not (state.scratch / "interrupted-saves").exists()  # the killed folders are removed once judged


def test_a_resume_that_takes_a_partial_checkpoint_fails_naming_the_missing_file(make_state, run_check, monkeypatch):
    from pytest_ftready.trainers import worker
    from pytest_ftready.trainers.builtin import EngineTrainer

    state = make_state(save_total_limit="1")
    told = []

    def trains_from_whatever_it_is_handed(trainer, requests, timeout_s=None):
        told.extend(requests)
        return {"each": [{"logs": [[3, 1.0, None, None], [4, 0.9, None, None]]} for _ in requests]}

    # a trainer with no check before its resume, whose resume starts from any folder it is handed
    monkeypatch.setattr(EngineTrainer, "check_saved", lambda self, saved: None)
    monkeypatch.setattr(worker, "run", trains_from_whatever_it_is_handed)
    with pytest.raises(Fail) as info:
        run_check(state, "lifecycle.interrupted_save")
    message = str(info.value)
    first = state.interrupted_saves[0]
    assert message.startswith(f"pytest-ftready engine: a save killed before {first.missing} was written leaves "
                              f"{first.partial} with 0 of the 4 files a resume needs, and the resume takes it as "
                              f"complete: it starts from {first.picked} without {first.missing} and says nothing")
    later = [r.missing for r in state.interrupted_saves[1:]]
    assert later[-2:] == ["training_state.pt", "examples.json"] and f"(likewise without {', '.join(later)})" in message
    assert "(the recipe's is 1)" in message and "verify that trainer_state.json and the optimizer file" in message
    assert len(told) == 4 and all(r.folder == r.checkpoint for r in told)  # one fresh process, every partial folder


def test_get_last_checkpoint_picks_the_newest_folder_complete_or_not(tmp_path):
    pytest.importorskip("transformers")
    from pytest_ftready.trainers.trl import TrlTrainer

    for name in ("checkpoint-2", "checkpoint-10", "checkpoint-9"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text("{}")
    # numbered, not sorted by name; and a folder with nothing in it is as good as a complete one
    assert TrlTrainer().resume_pick(tmp_path, tmp_path / "checkpoint-9") == tmp_path / "checkpoint-10"


def test_killed_saves_keep_the_files_written_before_the_kill_beside_the_complete_checkpoint(tmp_path):
    from pytest_ftready.engine.interrupted import killed_saves

    run = tmp_path / "run"
    complete = run / "checkpoint-2"
    complete.mkdir(parents=True)
    (run / "rows.jsonl").write_text("{}\n")
    files = ["adapter_model.safetensors", "optimizer.pt", "trainer_state.json"]
    for name in files + ["README.md"]:
        (complete / name).write_text(name)
    (run / "checkpoint-4").mkdir()  # the run's own later save: not in the rebuilt folders
    into = tmp_path / "killed"
    with killed_saves(run, complete, files, 4, into) as killed:
        assert [k.missing for k in killed] == files
        for k in killed:
            assert k.partial == k.folder / "checkpoint-4"
            assert sorted(p.name for p in k.partial.iterdir()) == sorted(["README.md", *k.written])
            assert sorted(p.name for p in (k.folder / "checkpoint-2").iterdir()) == sorted(files + ["README.md"])
            assert (k.folder / "rows.jsonl").read_text() == "{}\n"
    assert not into.exists()


@pytest.mark.slow  # TRL's own run and its six resumes in a fresh process (~25 s): CI's second line
def test_trls_resume_picks_the_partial_checkpoint_and_stops_on_it(tmp_path, tiny_model_dir, real_machine, run_check):
    pytest.importorskip("trl")
    from tests.trainers.test_trl import state_for, trl_folder

    state = state_for(trl_folder(tmp_path / "tiny", tiny_model_dir), tmp_path / "arts", real_machine)
    got = {m.name: m.value for m in run_check(state, "lifecycle.interrupted_save").measured}
    results = state.interrupted_saves
    assert [r.missing for r in results] == ["adapter_model.safetensors", "adapter_config.json", "optimizer.pt",
                                            "scheduler.pt", "rng_state.pth", "trainer_state.json"]
    newest = f"checkpoint-{state.saved_run.steps}"
    assert all(r.partial == r.picked == newest for r in results)  # never the complete checkpoint beside it
    assert got["resumed_from_complete"] == 0 and got["partial_refused"] == got["killed_saves"] == 6
    assert "Can't find a valid checkpoint" in results[0].refusal
    assert all("trainer_state.json" in r.refusal for r in results[1:])  # transformers 5 reads it unguarded
