"""Parametrized markers on a team's own tests: accelerator requirements decided by the probes
and compatibility facts (fake machines here), recipe variants with their own facts, and the
recipes a test runs for."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.helpers import outcomes

ROOT = Path(__file__).resolve().parents[2]
FAKE_MACHINES = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import pytest
from tests import fakes

@pytest.hookimpl(tryfirst=True)
def pytest_ftready_machine(config):
    return {{
        "h100": fakes.nvidia(memory=80 * fakes.GiB),
        "small": fakes.nvidia(name="NVIDIA RTX A4000", cc=(8, 6), memory=16 * fakes.GiB),
        "t4": fakes.nvidia(name="Tesla T4", cc=(7, 5), memory=16 * fakes.GiB),
    }}[config.getoption("machine")]

def pytest_addoption(parser):
    parser.addoption("--machine")
"""

GPU_TESTS = """
import pytest

@pytest.mark.accelerator(min_memory="24GiB")
def test_needs_24(ftready_recipe):
    pass

@pytest.mark.accelerator(dtype="bfloat16")
def test_needs_bf16(ftready_recipe):
    pass

@pytest.mark.accelerator(kind="rocm")
def test_needs_rocm(ftready_recipe):
    pass

@pytest.mark.accelerator(capability=">=9.0", kernels=["flash_attention_2"])
def test_needs_hopper_and_flash(ftready_recipe):
    pass
"""


def run_machine(pytester, tiny_example, machine):
    pytester.makeconftest(FAKE_MACHINES)
    pytester.makepyfile(test_gpu=GPU_TESTS)
    pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "test_gpu.py", f"--machine={machine}",
                                  "-m", "not ftready", "--junitxml=out.xml")
    return outcomes(pytester.path / "out.xml")


def test_accelerator_requirements_skip_with_the_figure_or_run(pytester, tiny_example):
    small = run_machine(pytester, tiny_example, "small")
    assert small["test_needs_24"][0] == "skipped"
    assert "needs min_memory 24.00 GiB; NVIDIA RTX A4000 has 16.00 GiB" in small["test_needs_24"][1]
    assert small["test_needs_bf16"][0] == "passed"  # Ampere: bf16 is native
    assert "needs kind='rocm'; this machine's accelerator is cuda" in small["test_needs_rocm"][1]
    big = run_machine(pytester, tiny_example, "h100")
    assert big["test_needs_24"][0] == "passed"
    assert "flash-attn is not installed" in big["test_needs_hopper_and_flash"][1] or \
        "flash_attn is not installed" in big["test_needs_hopper_and_flash"][1]
    t4 = run_machine(pytester, tiny_example, "t4")
    assert t4["test_needs_bf16"][0] == "skipped"
    assert "no native bfloat16" in t4["test_needs_bf16"][1] and "Tesla T4" in t4["test_needs_bf16"][1]
    assert "needs compute capability >=9.0; Tesla T4" in t4["test_needs_hopper_and_flash"][1]


def test_a_malformed_accelerator_argument_is_a_collection_error_naming_the_test(pytester, tiny_example):
    pytester.makepyfile(test_bad="""
        import pytest

        @pytest.mark.accelerator(min_memory="lots")
        def test_wants_memory():
            pass
    """)
    result = pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "test_bad.py")
    assert result.ret == 2  # interrupted: errors during collection
    result.stdout.fnmatch_lines(["*test_bad.py::test_wants_memory: @pytest.mark.accelerator: min_memory: expected a "
                                 "size like '24GiB' or '80GB', got 'lots'*"])
    assert "Traceback" not in result.stdout.str()


VARIANT_TESTS = """
import json
from pathlib import Path

import pytest

import pytest

import pytest_ftready.engine.loading as loading

LOADS = []
_load = loading.load_model


def counting(recipe, device, **kw):
    LOADS.append(recipe.model.attn_implementation)
    return _load(recipe, device, **kw)


loading.load_model = counting


@pytest.mark.ftready_variants(micro_batch_size=[1, 2], gradient_checkpointing=[False, True])
def test_peak(ftready_step, ftready_recipe, ftready_measure):
    assert ftready_recipe.training.micro_batch_size in (1, 2)
    ftready_measure("peak", ftready_step.peak_bytes, "bytes")


@pytest.mark.ftready_variants(micro_batch_size=[1, 2], gradient_checkpointing=[False, True])
def test_same_variants_share_the_facts(ftready_step, ftready_model):
    assert ftready_step.peak_bytes > 0


@pytest.mark.ftready_variants(attn_implementation=["eager", "sdpa"])
def test_attention(ftready_model, ftready_recipe):
    assert ftready_model.config._attn_implementation == ftready_recipe.model.attn_implementation


@pytest.mark.ftready_recipes("some-other-recipe")
def test_for_another_recipe(ftready_recipe):
    pass


def test_zz_write_loads():
    Path("loads.json").write_text(json.dumps(LOADS))
"""


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_variants_make_one_item_each_with_their_own_step_and_one_model_load(pytester, tiny_example):
    pytester.makepyfile(test_variants=VARIANT_TESTS)
    result = pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "test_variants.py",
                                           "-m", "not ftready", "--junitxml=out.xml")
    found = outcomes(pytester.path / "out.xml")
    peaks = {}
    for case in ET.parse(pytester.path / "out.xml").getroot().iter("testcase"):
        if case.get("name").startswith("test_peak["):
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            peaks[case.get("name")] = int(props["peak[bytes]"])
    assert set(peaks) == {f"test_peak[micro_batch_size={mb}-gradient_checkpointing={ck}]"
                          for mb in (1, 2) for ck in (False, True)}, found
    for ck in (False, True):  # peak memory rises with the micro-batch
        assert peaks[f"test_peak[micro_batch_size=2-gradient_checkpointing={ck}]"] > \
            peaks[f"test_peak[micro_batch_size=1-gradient_checkpointing={ck}]"]
    for mb in (1, 2):  # and falls with activation checkpointing
        assert peaks[f"test_peak[micro_batch_size={mb}-gradient_checkpointing=True]"] < \
            peaks[f"test_peak[micro_batch_size={mb}-gradient_checkpointing=False]"]
    assert found["test_attention[attn_implementation=eager]"][0] == "passed"
    assert found["test_attention[attn_implementation=sdpa]"][0] == "passed"
    assert found["test_for_another_recipe[no-recipe]"][0] == "skipped"
    assert "names none of this run's recipes (recipe.toml)" in found["test_for_another_recipe[no-recipe]"][1]
    # one load per distinct [model] table: the training variants share the recipe's base model
    assert sorted(json.loads((pytester.path / "loads.json").read_text())) == ["eager", "sdpa"]
    assert result.ret == 0


def test_an_invalid_variant_fails_collection_with_the_recipe_error(pytester, tiny_example):
    pytester.makepyfile(test_typo=textwrap.dedent("""
        import pytest

        @pytest.mark.ftready_variants(micro_batch=[1, 2])
        def test_typo(ftready_recipe):
            pass
    """), test_zero=textwrap.dedent("""
        import pytest

        @pytest.mark.ftready_variants(micro_batch_size=[0])
        def test_zero(ftready_recipe):
            pass
    """))
    result = pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "test_typo.py", "test_zero.py")
    out = result.stdout.str()
    assert result.ret == 2
    assert "test_typo.py::test_typo: Invalid recipe" in out and "unknown recipe key; did you mean micro_batch_size?" in out
    assert "test_zero.py::test_zero: Invalid recipe" in out and "micro_batch_size: expected a positive integer, got 0" in out


def test_markers_are_listed_with_their_signatures(pytester):
    result = pytester.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["*@pytest.mark.accelerator(kind='any', min_memory=None, capability=None, dtype=None,"
                                 " kernels=()):*", "*@pytest.mark.ftready_variants(**lists):*",
                                 "*@pytest.mark.ftready_recipes(*names_or_paths):*"])
