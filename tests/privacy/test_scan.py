"""The scanner on the planted corpus: exactly the expected findings, no decoy, no value shown."""

from __future__ import annotations

import json

import pytest

from pytest_ftready.privacy.audit import scan_file
from pytest_ftready.privacy.scan import iban_ok, luhn_ok, national_id_ok, redact, scan_text
from tests import planted


@pytest.mark.parametrize("kind, value", list(planted.SECRETS.items()) + list(planted.PII.items()))
def test_each_planted_kind_is_found_once(kind, value):
    found = list(scan_text(f"Here it is: {value} thanks"))
    assert [f.kind for f in found] == [kind]
    assert value not in found[0].preview and found[0].fingerprint


@pytest.mark.parametrize("value", planted.MORE_IDS)
def test_national_ids_ibans_and_ipv6(value):
    assert [f.kind for f in scan_text(f"id {value}")] in (["national_id"], ["iban"], ["ip_address"])


@pytest.mark.parametrize("decoy", planted.DECOYS)
def test_decoys_are_not_reported(decoy):
    assert list(scan_text(decoy)) == []


def test_checksums():
    assert luhn_ok(planted.CARD) and not luhn_ok("4111111111111112")
    assert iban_ok("GB82 WEST 1234 5698 7654 32") and not iban_ok("GB82 WEST 1234 5698 7654 33")
    assert national_id_ok("12345678Z") and not national_id_ok("12345678A")
    assert national_id_ok("11010519491231002X") and not national_id_ok("110105194912310021")


def test_scan_file_names_file_line_and_field(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in planted.rows()) + "not json " + planted.PII["email"] + "\n")
    found = list(scan_file(path, frozenset({"secrets", "pii"})))
    kinds = sorted(f.finding.kind for f in found)
    expected = sorted(list(planted.SECRETS) + list(planted.PII) + ["national_id"] * 5 + ["iban", "ip_address", "email"])
    assert kinds == expected
    first = found[0]
    assert (first.line, first.field) == (1, "messages[0].content")
    assert found[-1].field == "text" and found[-1].line == len(planted.rows()) + 1
    described = "\n".join(f.describe() for f in found)
    for value in planted.planted_values():
        assert value not in described


def test_redact_removes_every_value():
    text = " ".join(r["messages"][0]["content"] for r in planted.rows())
    clean = redact(text)
    for value in planted.planted_values():
        assert value not in clean
    for decoy in planted.DECOYS:
        assert decoy in clean
