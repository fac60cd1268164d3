"""lifecycle.interrupted_save: a save killed before each of its files (the run's folder as the
kill leaves it, rebuilt from the resume check's real checkpoint), then the trainer's own pick and
resume. The engine refuses every partial checkpoint naming the missing file; a resume that takes
one as complete fails naming it; transformers' get_last_checkpoint picks the partial newest one."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail


def test_the_engine_refuses_every_partial_checkpoint_naming_the_missing_file(make_state, run_check):
    from pytest_ftready.engine.checkpoint import EXAMPLES_FILE, STATE_FILE

    state = make_state()
    ctx = run_check(state, "lifecycle.interrupted_save")
    results = state.interrupted_saves
    got = {m.name: m.value for m in ctx.measured}
    missing = [r.missing for r in results]
    assert missing[-2:] == [STATE_FILE, EXAMPLES_FILE]
    assert {"weights/adapter_config.json", "weights/adapter_model.safetensors"} == set(missing[:-2])
    assert got["killed_saves"] == got["partial_refused"] == got["checkpoint_files"] == len(results) == 4
    for r in results:
        assert r.picked == r.partial and not r.taken_as_complete
        assert r.refusal.startswith("the checkpoint lacks "), r
        assert any(name.split("/")[-1] in r.refusal for name in missing[r.written:]), r  # a file not yet written
    assert not (state.scratch / "interrupted-saves").exists() or not any((state.scratch / "interrupted-saves").iterdir())
