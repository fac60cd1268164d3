"""machine.targets: sizes, GPU names and Apple chips resolved from the facts table."""

from __future__ import annotations

import pytest

from pytest_ftready.machine import compat
from pytest_ftready.machine.targets import GIB, TargetError, device_target, parse_size, resolve_target


def test_sizes_in_binary_and_decimal_units():
    assert parse_size("24GiB") == 24 * GIB
    assert parse_size("24 GB") == 24 * 10 ** 9
    assert parse_size("512mib") == 512 * 1024 ** 2
    assert parse_size("RTX 4090") is None


def test_bare_size_is_a_cuda_device_and_says_so():
    target = resolve_target("24GiB")
    assert target.capacity_bytes == 24 * GIB and target.kind == "cuda" and "bare size" in target.assumed
    assert target.need_bytes(1000) == int(1000 * (1 + target.allocator_share)) + target.context_bytes
    assert target.usable_bytes(0.10) == int(24 * GIB * 0.9)


@pytest.mark.parametrize("text, name, gib", [("RTX 4090", "RTX 4090", 24), ("geforce rtx 3090", "RTX 3090", 24),
                                             ("NVIDIA H100", "H100", 80), ("a100-40gb", "A100 40GB", 40),
                                             ("A100", "A100 80GB", 80), ("MI300X", "MI300X", 192),
                                             ("l40s", "L40S", 48), ("RTX 5090", "RTX 5090", 32), ("H200", "H200", 141),
                                             ("L4", "L4", 24)])
def test_gpu_names_and_aliases(text, name, gib):
    target = resolve_target(text)
    assert target.name == name and target.capacity_bytes == gib * GIB and target.usable_share == 1.0
    assert target.context_bytes > 0 and len(target.sources) == 3


def test_apple_unified_memory_has_its_usable_share():
    small, large = resolve_target("M2 16GB"), resolve_target("Apple M3 Max 64GB")
    assert small.kind == large.kind == "mps"
    assert small.usable_share == pytest.approx(0.667) and large.usable_share == 0.75
    assert large.usable_bytes(0.0) == int(64 * GIB * 0.75)


def test_unknown_target_lists_what_is_known():
    with pytest.raises(TargetError, match=r"\[hardware\] target: 'GTX 9000'.*RTX 4090.*Apple"):
        resolve_target("GTX 9000", "[hardware] target")


def test_every_row_names_a_known_source():
    facts = compat.load("memory")
    rows = [*facts["gpu"], *facts["unified"], *facts["overhead"].values()]
    for row in rows:
        assert row["source"] in facts["sources"], row
    for row in facts["overhead"].values():
        assert row["allocator_source"] in facts["sources"]


def test_probed_device_keeps_its_capacity():
    target = device_target("cuda", "NVIDIA GeForce RTX 4090", 25_393_692_672)
    assert target.capacity_bytes == 25_393_692_672 and target.kind == "cuda" and target.usable_share == 1.0
    mac = device_target("mps", "Apple M2 Max", 96 * GIB)
    assert mac.usable_share == 0.75 and mac.context_bytes == 0 and "unified memory" in mac.name
