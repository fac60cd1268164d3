"""Data manifests: what differs between the files on disk and the manifest."""

import json

from pytest_ftready.data.manifest import differences, file_entry


def test_differences_name_each_changed_missing_or_unlisted_file(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"x": 1}\n{"x": 2}\n')
    b.write_text('{"y": 1}\n')
    manifest = tmp_path / "MANIFEST.json"
    manifest.write_text(json.dumps({"files": [file_entry(a, tmp_path).__dict__, file_entry(b, tmp_path).__dict__]}))
    assert differences([a, b], manifest) == []
    a.write_text('{"x": 1}\n')
    assert differences([a, b], manifest)[0].startswith("a.jsonl: size ")
    assert differences([a], manifest)[-1] == "b.jsonl: in the manifest but not in the recipe's [data] train"
    b.unlink()
    assert "b.jsonl: missing on disk" in differences([a, b], manifest)
    manifest.write_text("not json")
    assert "is not a readable manifest" in differences([a], manifest)[0]
