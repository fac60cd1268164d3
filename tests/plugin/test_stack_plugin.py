"""Stack checks through the plugin: on this machine, and on a machine described by a conftest."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import outcomes

ROOT = Path(__file__).resolve().parents[2]


def test_flash_attention_here_fails_stack_kernels_and_skips_the_step(pytester, tiny_example, edit_recipe):
    recipe = edit_recipe(tiny_example / "recipe.toml", attn_implementation='"flash_attention_2"')
    pytester.runpytest_subprocess(f"--ftready={recipe}", "-k", "stack or step_memory", "--junitxml=out.xml", "-rs")
    result = outcomes(pytester.path / "out.xml")
    assert result["stack.kernels"][0] == "failed"
    assert 'needs flash attention 2 on an NVIDIA GPU' in result["stack.kernels"][1]
    assert result["stack.driver"][0] == "skipped" and "needs a CUDA/ROCm GPU" in result["stack.driver"][1]
    assert result["stack.precision"][0] == "passed" and result["stack.smoke"][0] == "passed"
    assert result["stack.known_bugs"][0] == "passed"  # this machine's real versions hit no known bug
    assert result["model.step_memory"][0] == "skipped" and "stack.kernels failed" in result["model.step_memory"][1]


def test_a_described_turing_machine_runs_the_accelerator_checks(pytester, tiny_example, edit_recipe):
    pytester.makeconftest(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests import fakes

        def pytest_ftready_machine(config):
            return fakes.nvidia(name="Tesla T4", cc=(7, 5), memory=16 * fakes.GiB)
    """)
    recipe = edit_recipe(tiny_example / "recipe.toml", dtype='"bfloat16"')
    result_run = pytester.runpytest_subprocess(f"--ftready={recipe}", "-m", "ftready_stack", "--junitxml=out.xml", "-rs")
    result = outcomes(pytester.path / "out.xml")
    assert result["stack.driver"][0] == "passed" and result["stack.arch"][0] == "passed"
    assert result["stack.precision"][0] == "failed" and "Tesla T4" in result["stack.precision"][1]
    assert "skipped" == result["stack.smoke"][0]
    assert result["stack.known_bugs"][0] == "passed"  # judged on the described machine's versions
    result_run.stdout.fnmatch_lines(["SKIPPED *recipe.toml: stack.precision failed; fix correctness*"])
