"""Whole-text redaction and the output gate: a secret cut into pieces, or cut short, is
never shown; a value learned once is refused in every later output and every form."""

from __future__ import annotations

import json

from pytest_ftready.privacy.redaction import redact_pieces, row_values
from pytest_ftready.outputs.gate import Gate
from tests import planted

AWS, AWS_KEY = planted.SPLIT["aws_secret_access_key"]


def _fragments_left(text: str, secret: str, width: int = 8) -> list[str]:
    return [secret[i:i + width] for i in range(len(secret) - width + 1) if secret[i:i + width] in text]


def test_a_secret_split_over_pieces_is_replaced_once_where_it_starts():
    text = f"user: keys?\nassistant: {AWS} ok"
    cuts = [0, 15, 40, 52, 70, len(text)]  # token runs cut through the value
    pieces = [(text[a:b], i % 2 == 0) for i, (a, b) in enumerate(zip(cuts, cuts[1:]))]
    out = redact_pieces(pieces)
    shown = "".join(t for t, _ in out)
    assert not _fragments_left(shown, AWS_KEY)
    assert shown.count("<aws_secret_access_key redacted>") == 1
    assert [tag for _, tag in out] == [tag for _, tag in pieces] and shown.endswith(" ok")


def test_a_value_cut_short_at_either_edge_is_redacted():
    values = row_values({"messages": [{"role": "assistant", "content": f"token {planted.SECRETS['jwt']}"}]})
    jwt = planted.SECRETS["jwt"]
    window_end = f"<s>assistant: token {jwt[:50]}"  # truncated at max_length: matches no pattern alone
    window_start = f"{jwt[-30:]} and then"
    for window in (window_end, window_start):
        shown = "".join(t for t, _ in redact_pieces([(window, True)], values))
        assert not _fragments_left(shown, jwt) and "<jwt redacted>" in shown


def test_pem_block_is_found_whole_and_each_line_is_refused_later():
    gate = Gate()
    first = gate.text(f"key:\n{planted.PEM_BLOCK}\nend")
    assert "<private_key redacted>" in first and not _fragments_left(first, planted.PEM_BLOCK.splitlines()[1])
    body_line = planted.PEM_BLOCK.splitlines()[2]
    assert body_line not in gate.text(f"line 3 was {body_line}.")  # no pattern matches a bare body line


def test_gate_refuses_learned_values_in_every_form_and_writer(tmp_path):
    gate = Gate()
    gate.learn({AWS: "aws_secret_access_key"})
    bare = f"the key alone: {AWS_KEY}"
    assert AWS_KEY not in gate.text(bare)  # learned as the assignment: a bare key matches no pattern
    gate.learn_one(AWS_KEY, "aws_secret_access_key")
    assert AWS_KEY not in gate.text(bare)
    path = gate.write_json(tmp_path / "m.json", {"note": [bare, {"k": planted.PEM_BLOCK}]})
    written = path.read_text()
    assert AWS_KEY not in written and planted.PEM_BLOCK.splitlines()[1] not in written
    assert json.loads(written)["note"][0].startswith("the key alone: <")
    html = gate.write(tmp_path / "r.html", f"<p>{planted.PII['email']}</p>".encode())
    assert planted.PII["email"] not in html.read_text() and oct(html.stat().st_mode & 0o777) == "0o600"
    assert gate.value((1, 2.5, None)) == (1, 2.5, None)


def test_numbers_in_a_json_artifact_are_not_read_as_findings(tmp_path):
    """A float's decimals can match a pattern (11 digits: a national id); gating the encoded
    JSON as text wrote a marker into the number and left series.json unreadable."""
    from pytest_ftready.privacy.redaction import finding_values

    series = {"sustained.throughput": [10363.920376114858, 10216.36509855024, 19610.31280239611]}
    assert finding_values(json.dumps(series, indent=2))  # the digits alone look like a finding
    gate = Gate()
    written = gate.write_json(tmp_path / "series.json", {**series, "note": f"key {AWS}"})
    payload = json.loads(written.read_text())
    assert payload["sustained.throughput"] == series["sustained.throughput"]
    assert AWS_KEY not in written.read_text()  # strings are still gated


def test_masking_example_of_a_truncated_row_shows_no_fragment(make_state, tiny_example):
    from pytest_ftready.data.encoding import render_example
    from pytest_ftready.tiny import write_jsonl

    rows = planted.plant_in_assistant_turns([{}] * 5)
    write_jsonl(tiny_example / "data" / "train.jsonl", rows)
    state = make_state(max_length="60")
    for enc in state.digest.head:
        shown = render_example(state.tokenizer, enc)
        secret = next(s for _, (v, s) in planted.SPLIT.items() if v in enc.row.data["messages"][1]["content"])
        assert enc.length == 60 and not _fragments_left(shown, secret.replace("\n", "")), shown
