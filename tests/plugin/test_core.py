"""The plugin as a user meets it: pytest --ftready=recipe.toml, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

RECIPE = """
name = "{name}"
[model]
path = "model"
[data]
train = ["train.jsonl"]
"""


@pytest.fixture
def project(pytester):
    (pytester.path / "model").mkdir()
    (pytester.path / "train.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    pytester.makefile(".toml", recipe=RECIPE.format(name="demo"))
    return pytester


def test_import_does_not_import_torch():
    code = ("import sys, pytest_ftready, pytest_ftready.plugin, pytest_ftready.recipe.schema, pytest_ftready.collect;"
            "heavy = [m for m in ('torch', 'transformers', 'peft', 'datasets') if m in sys.modules];"
            "print(heavy); sys.exit(1 if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_help_and_version_work_with_a_broken_recipe(project):
    (project.path / "broken.toml").write_text("[model\n")
    result = project.runpytest_subprocess("--ftready=broken.toml", "--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*--ftready=RECIPE*", "*--ftready-artifacts=DIR*"])
    assert project.runpytest_subprocess("--ftready=broken.toml", "--version").ret == 0


def test_broken_recipe_is_a_one_line_collection_error(project):
    (project.path / "broken.toml").write_text(RECIPE.format(name="b") + "[training]\nmicro_batch = 2\n")
    result = project.runpytest_subprocess("--ftready=broken.toml")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*Invalid recipe *broken.toml [[]training] micro_batch: unknown key; "
                                 "did you mean micro_batch_size?"])
    assert "Traceback" not in result.stdout.str() and "raise " not in result.stdout.str()


def test_missing_recipe_is_a_usage_error(project):
    result = project.runpytest_subprocess("--ftready=absent.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ftready: recipe *absent.toml not found (from --ftready)*"])


def test_markers_are_registered(project):
    result = project.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.ftready:*", "@pytest.mark.accelerator(kind=*):*", "@pytest.mark.nightly:*",
                                 "@pytest.mark.ftready_data:*"])


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_node_ids_selection_and_skips_from_the_recipe(project):
    result = project.runpytest_subprocess("--ftready=recipe.toml", "--collect-only", "-q", "-m", "ftready_repro")
    assert "recipe.toml::repro.environment" in result.stdout.str()
    assert "data." not in result.stdout.str()
    result = project.runpytest_subprocess("--ftready=recipe.toml", "--collect-only", "-q", "-k", "environment")
    assert [line for line in result.stdout.lines if "::" in line] == ["recipe.toml::repro.environment"]
    (project.path / "skip.toml").write_text(RECIPE.format(name="s") + '[checks]\nskip = { "repro.environment" = "we record it elsewhere" }\n')
    result = project.runpytest_subprocess("--ftready=skip.toml", "-k", "environment", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*we record it elsewhere*"])
    (project.path / "skip2.toml").write_text(RECIPE.format(name="s2") + '[checks]\nskip = ["repro.enviroment"]\n')
    result = project.runpytest_subprocess("--ftready=skip2.toml")
    result.stdout.fnmatch_lines(["*skip 'repro.enviroment'*unknown check; did you mean repro.environment?"])


def test_junit_properties_and_artifacts_without_warnings(project):
    result = project.runpytest_subprocess("--ftready=recipe.toml", "-k", "environment", "--junitxml=out.xml",
                                          "-W", "error", "--ftready-artifacts=arts")
    result.assert_outcomes(passed=1, warnings=0)
    root = ET.parse(project.path / "out.xml").getroot()
    suite_props = {p.get("name"): p.get("value") for p in root.iter("testsuite") for p in p.find("properties")}
    assert suite_props["ftready.python"] == ".".join(map(str, sys.version_info[:3]))
    assert suite_props["ftready.pkg.torch"]
    case = next(root.iter("testcase"))
    assert case.get("name") == "repro.environment"
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert int(props["cpu_cores[cores]"]) >= 1
    env = project.path / "arts" / "demo" / "environment.json"
    assert json.loads(env.read_text())["python"] == suite_props["ftready.python"]
    assert oct(env.stat().st_mode & 0o777) == "0o600"
    assert oct(env.parent.stat().st_mode & 0o777) == "0o700"
    measurements = json.loads((env.parent / "measurements-partial.json").read_text())
    assert {m["name"] for m in measurements} >= {"cpu_cores", "host_memory_total"}
    result.stdout.fnmatch_lines(["*ftready measurements*", "demo :: repro.environment", "*cpu_cores = * cores"])


def test_user_tests_run_beside_checks_and_use_the_fixtures(project):
    project.makepyfile(test_mine="""
        def test_my_rule(ftready_recipe, ftready_device, ftready_measure):
            assert ftready_recipe.name == "demo"
            assert ftready_device.kind == "cpu"
            ftready_measure("my_number", 7, "widgets")
    """)
    result = project.runpytest_subprocess("--ftready=recipe.toml", "test_mine.py", "-k", "environment or my_rule",
                                          "--junitxml=out.xml")
    result.assert_outcomes(passed=2)
    cases = {c.get("name"): c for c in ET.parse(project.path / "out.xml").getroot().iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["test_my_rule"].iter("property")}
    assert props == {"my_number[widgets]": "7"}


def test_ini_key_opts_a_repo_in(project):
    project.makeini("[pytest]\nftready = recipe.toml\n")
    result = project.runpytest_subprocess("--collect-only", "-q")
    assert "recipe.toml::repro.environment" in result.stdout.str()
    result = project.runpytest_subprocess("-k", "environment")
    result.stdout.fnmatch_lines(["ftready: recipes *recipe.toml (from ini ftready)*"])


def test_several_recipes_prefix_ids_with_their_names(project):
    project.makefile(".toml", other=RECIPE.format(name="other"))
    result = project.runpytest_subprocess("--ftready=recipe.toml", "--ftready=other.toml", "--collect-only", "-q")
    out = result.stdout.str()
    assert "recipe.toml::demo/repro.environment" in out and "other.toml::other/repro.environment" in out


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_measurements_reach_benchmark_json(pytester, tiny_example):
    pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "-k", "step_memory or data.lengths",
                                  "--benchmark-json=bench.json")
    bench = json.loads((pytester.path / "bench.json").read_text())
    step = next(b for b in bench["benchmarks"] if b["name"] == "model.step_memory")
    assert step["extra_info"]["peak_tensor_bytes[bytes]"] > 0 and step["extra_info"]["step_tokens_per_s[tokens/s]"] > 0
    names = {(m["check"], m["name"]) for m in bench["ftready"]}
    assert ("data.lengths", "length_p95") in names and ("model.step_memory", "peak_host_step") in names


def test_two_recipes_with_one_name_are_refused(project):
    (project.path / "sub").mkdir()
    (project.path / "sub" / "model").mkdir()
    (project.path / "sub" / "train.jsonl").write_text("{}\n")
    (project.path / "sub" / "recipe.toml").write_text(RECIPE.format(name="demo"))
    result = project.runpytest_subprocess("--ftready=recipe.toml", "--ftready=sub/recipe.toml", "--collect-only")
    result.stdout.fnmatch_lines(["*Invalid recipe *sub/recipe.toml name: 'demo' is also the name of *recipe.toml*"])


@pytest.mark.faults_slow  # a pytest run on a broken model: CI's second line (pytest tests -m "slow or faults_slow")
def test_a_model_that_cannot_load_fails_each_check_once_and_clearly(project):
    (project.path / "model" / "config.json").write_text("{not json")
    result = project.runpytest_subprocess("--ftready=recipe.toml", "-k", "data.template or data.masking", "-rf")
    result.stdout.fnmatch_lines(["*cannot load the tokenizer from *model: *"])
    assert "Traceback" not in result.stdout.str()
