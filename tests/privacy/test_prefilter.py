"""The raw-bytes prefilter of the file scan: whatever engine finds the candidate lines, the
findings are those of scanning every line (same kinds, lines, fields, fingerprints), and
secrets behind JSON escapes are found."""

from __future__ import annotations

import json

import pytest

from pytest_ftready.privacy import audit, prefilter
from tests import planted

ALL = frozenset({"secrets", "pii"})
ENGINES = {"re2": prefilter._re2, "hyperscan": prefilter._hyperscan, "re": prefilter._python}


def _every_line(path):
    """The reference: every line (text mode, universal newlines) through the same line scan."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            yield from audit._scan_line(str(path), path.suffix, number, line, ALL, None)


def _key(found):
    return [(f.line, f.field, f.finding.kind, f.finding.fingerprint) for f in found]


@pytest.fixture(scope="module")
def tricky(tmp_path_factory):
    """Planted rows and decoys, a PEM block behind \\n escapes, an e-mail behind \\u0040, a
    card in full-width digits, a password behind a non-breaking space, CRLF and bare-CR lines,
    a last line without a newline, plain filler between them."""
    lines = [json.dumps(row) for row in planted.rows()]
    lines += [json.dumps({"text": "key:\n" + planted.PEM_BLOCK}),
              '{"text": "mail jane.roe.77\\u0040gmail.com now"}',
              json.dumps({"text": "card " + planted.PII["payment_card"].translate(str.maketrans("0123456789", "０１２３４５６７８９"))}, ensure_ascii=False),
              json.dumps({"text": "password\u00a0= Tr0ub4dor&3xK9!zQ"}, ensure_ascii=False),
              json.dumps({"text": "id 529.982.247-25"}) + "\r",
              "not json: ghp_" + "a1B2" * 9 + "\r" + "plain 81.2.69.160 after a bare CR",
              ]
    filler = json.dumps({"messages": [{"role": "user", "content": "hello there, version 2.13.0"}]})
    body = "\n".join(x for line in lines for x in (filler, line)) + "\n" + json.dumps({"text": "x " + planted.PII["iban"]})
    path = tmp_path_factory.mktemp("prefilter") / "tricky.jsonl"
    path.write_bytes(body.encode("utf-8"))
    return path


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_engine_finds_what_scanning_every_line_finds(tricky, name, monkeypatch):
    try:
        find = ENGINES[name]()
    except ImportError:
        pytest.skip(f"the {name} engine is not installed (pip install pytest-ftready[scan])")
    monkeypatch.setattr(prefilter, "engine", lambda: (name, find))
    fast = _key(audit.scan_file(tricky, ALL))
    assert fast == _key(_every_line(tricky))
    kinds = {kind for _, _, kind, _ in fast}
    assert kinds >= set(planted.SECRETS) | set(planted.PII)


def test_secrets_behind_json_escapes_are_found(tricky):
    found = list(audit.scan_file(tricky, ALL))
    with open(tricky, encoding="utf-8") as handle:  # numbered as text mode reads it (bare CRs end lines)
        raw = [line.encode("utf-8") for line in handle]
    lines = {f.finding.kind: [] for f in found}
    for f in found:
        lines[f.finding.kind].append(raw[f.line - 1])
    assert any(b"\\u0040gmail" in line for line in lines["email"])
    assert any(b"\\n" in line and b"BEGIN RSA" in line for line in lines["private_key"])
    with open(tricky, "rb") as handle:  # Python's \d takes full-width digits: such a line is looked at
        assert any("\uff14" in line for _, line in prefilter.candidate_lines(handle))


def test_decoys_stay_silent_and_numbering_follows_text_mode(tmp_path):
    path = tmp_path / "decoys.jsonl"
    path.write_text("\n".join(json.dumps({"text": d}) for d in planted.DECOYS) + "\r\n" + json.dumps({"text": planted.PII["email"]}) + "\n")
    found = list(audit.scan_file(path, ALL))
    assert [(f.line, f.finding.kind) for f in found] == [(len(planted.DECOYS) + 1, "email")]


def test_chunks_cut_at_line_ends(tricky, monkeypatch):
    monkeypatch.setattr(prefilter, "CHUNK", 97)  # lines straddle many reads
    assert _key(audit.scan_file(tricky, ALL)) == _key(_every_line(tricky))
