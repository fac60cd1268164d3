"""Settings resolve command line > environment > ini > default and remember where they came from."""

import pytest

from pytest_ftready.options import parse_seconds, resolve


def test_resolve_order_and_source(monkeypatch):
    monkeypatch.setenv("FTREADY_X", "env-value")
    kw = dict(flag="--x", ini_name="x")
    assert str(resolve("cli", "FTREADY_X", "ini", "d", **kw)) == "cli (from --x)"
    assert resolve(None, "FTREADY_X", "ini", "d", **kw).source == "env FTREADY_X"
    monkeypatch.delenv("FTREADY_X")
    assert resolve([], "FTREADY_X", "ini", "d", **kw).source == "ini x"
    assert resolve("", None, "", "d", **kw).value == "d"
    assert resolve("3", None, None, 0, parse=int, **kw).value == 3


def test_parse_seconds_explains_bad_values():
    assert parse_seconds("2.5") == 2.5
    with pytest.raises(ValueError, match="expected a positive number of seconds, got '0'"):
        parse_seconds("0")
    with pytest.raises(ValueError, match="expected a number of seconds, got 'soon'"):
        parse_seconds("soon")
