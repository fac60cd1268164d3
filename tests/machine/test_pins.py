"""Pins against what is installed."""

from pytest_ftready.machine.pins import mismatches, normalize
from pytest_ftready.machine.probes import installed


def test_normalize_names_the_pep503_way():
    assert normalize("Flash_Attn") == normalize("flash.attn") == "flash-attn"


def test_mismatches_name_each_differing_or_missing_pin():
    torch_version = installed("torch")
    pins = {"torch": torch_version.split("+")[0], "pytest": "0.0.1", "not-a-real-package-xyz": "1.0"}
    found = mismatches(pins, matter=["not-a-real-package-xyz"])
    assert found == ["not-a-real-package-xyz: pinned 1.0, not installed",
                     f"pytest: pinned 0.0.1, installed {installed('pytest')}"]
    assert mismatches({"not-a-real-package-xyz": "1.0"}, matter=[]) == []  # absent and irrelevant
    assert mismatches({"torch": torch_version + "+other"}, matter=[]) != []  # a local build tag must match exactly
