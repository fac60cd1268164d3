"""The documentation is a contract: every fixture, option, ini key, environment variable, marker,
hook, command, artifact, exit code, check id, code block and `## Running` line that README.md or
a page of docs/ documents has a test that uses it as a user would, and every name here is
documented (the lists are read from the pages themselves, tests/plugin/readme.py). Most of them read the outputs of ONE whole run of the tiny example
(``tiny_full_run``, tests/plugin/conftest.py); the rest point at the test that covers them."""

from __future__ import annotations

import ast
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.helpers import outcomes
from tests.plugin import readme
from tests.plugin.full_run import run_pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = "tests/plugin/test_readme_contract.py"

# documented name -> the test that uses it ("path::function"; a bare name is in this module)
CONTRACT: dict[str, dict[str, str]] = {
    "option": {
        "--ftready": "test_a_whole_run_exits_0_with_every_check_and_the_teams_tests",
        "--ftready-artifacts": "test_settings_say_where_they_came_from_cli_over_env_over_ini",
        "--ftready-nightly": "test_nightly_checks_run_when_asked_and_are_named_when_deselected",
        "--ftready-cpu-short": "tests/checks/test_sustained.py::test_cpu_short_mode_runs_sustained_and_the_sweep",
        "--ftready-hub-timeout": "test_bad_option_values_are_usage_errors_naming_the_option",
        "--ftready-workers": "test_bad_option_values_are_usage_errors_naming_the_option",
        "--ftready-baseline": "test_a_k_run_keeps_the_full_figures_as_the_baseline_and_a_doubled_micro_batch_fails",
    },
    "ini": {
        "ftready": "tests/plugin/test_core.py::test_ini_key_opts_a_repo_in",
        "ftready_artifacts": "test_settings_say_where_they_came_from_cli_over_env_over_ini",
    },
    "env": {
        "FTREADY_RECIPE": "test_settings_say_where_they_came_from_cli_over_env_over_ini",
        "FTREADY_LLAMA_CPP_SRC": "tests/serving/test_gguf.py::test_gguf_of_a_model_the_converter_knows_passes_and_records",
        "FTREADY_GGUF_CONVERTER": "tests/serving/test_gguf.py::test_the_converter_is_found_where_the_team_says",
        "FTREADY_ARTIFACTS": "test_settings_say_where_they_came_from_cli_over_env_over_ini",
        "FTREADY_BASELINE": "test_a_k_run_keeps_the_full_figures_as_the_baseline_and_a_doubled_micro_batch_fails",
        "FTREADY_SCALE_ROWS": "tests/benchmarks/test_scale.py::test_data_checks_throughput",
        "FTREADY_SCALE_TEXT": "tests/data/test_skeleton.py::test_a_pass_over_a_generated_corpus_is_the_same_spliced_or_row_by_row",
        "FTREADY_FUZZ_SCALE": "tests/faults/test_fuzz.py::test_fuzzed_recipe_tables_give_a_recipe_or_one_line",
        "GITHUB_STEP_SUMMARY": "tests/outputs/test_summary.py::test_appended_only_where_github_step_summary_is_set",
    },
    "fixture": {name: "test_every_fixture_works_from_a_teams_test_file" for name in (
        "ftready_recipe", "ftready_device", "ftready_tokenizer", "ftready_model", "ftready_dataset", "ftready_step",
        "ftready_measure")},
    "marker": {
        "ftready": "test_every_check_carries_ftready_its_area_and_its_documented_markers",
        **{f"ftready_{area}": "test_every_check_carries_ftready_its_area_and_its_documented_markers" for area in (
            "stack", "data", "model", "lifecycle", "distributed", "levers", "sustained", "headroom", "checkpoint",
            "repro", "privacy")},
        "accelerator": "test_the_readme_example_runs_as_written",
        "nightly": "test_nightly_checks_run_when_asked_and_are_named_when_deselected",
        "ftready_variants": "test_the_readme_example_runs_as_written",
        "ftready_recipes": "test_the_readme_example_runs_as_written",
    },
    "hook": {
        "pytest_ftready_machine": "tests/plugin/test_stack_plugin.py::test_a_described_turing_machine_runs_the_accelerator_checks",
        "pytest_ftready_pipeline": "tests/checks/test_pipelines.py::test_a_conftest_pipeline_hook_is_what_data_masking_checks",
        "pytest_ftready_trainer": "tests/plugin/test_own_trainer.py::test_the_templates_trainer_is_what_step_overfit_resume_and_generate_run",
    },
    "command": {
        "ftready-forecast": "tests/forecast/test_levers.py::test_command_prints_the_table_and_exits_by_the_verdict",
        "ftready-manifest": "tests/checks/test_repro_privacy.py::test_manifest_match_change_missing_and_written_then_verified",
        "ftready-tiny": "test_ftready_tiny_writes_a_runnable_example_anywhere",
        "ftready-init": "tests/test_starter.py::test_a_starting_recipe_for_the_tiny_model_is_valid_and_marks_what_it_could_not_read",
    },
    "exit code": {
        "ftready-forecast: exit 0 fits, 1 does not, 2 cannot tell":
            "tests/forecast/test_levers.py::test_command_prints_the_table_and_exits_by_the_verdict",
    },
    "artifact": {
        **{name: "test_every_artifact_is_written_private" for name in (
            "environment.json", "config.json", "series.json", "masking.html", "report.html", ".run-<host>-<pid>-*")},
        **{name: "test_a_k_run_keeps_the_full_figures_as_the_baseline_and_a_doubled_micro_batch_fails" for name in (
            "measurements-partial.json", "series-partial.json", "report-partial.html")},
    },
    "running": {
        "pytest --ftready=recipe.toml": "test_a_whole_run_exits_0_with_every_check_and_the_teams_tests",
        "pytest --ftready=recipe.toml -k masking":
            "test_a_k_run_keeps_the_full_figures_as_the_baseline_and_a_doubled_micro_batch_fails",
        "pytest --ftready=trl-sft.yaml": "tests/plugin/test_importer_examples.py::test_the_three_examples_run_offline_through_the_plugin",
        'pytest --ftready=recipe.toml -m "ftready and not accelerator"': "test_marker_expressions_select_as_documented",
        "pytest --ftready=recipe.toml -m accelerator --junitxml=gpu.xml --benchmark-json=gpu.json":
            "test_marker_expressions_select_as_documented",
        "pytest --ftready=recipe.toml -m nightly": "test_marker_expressions_select_as_documented",
        "pytest --ftready=a.toml --ftready=b.toml": "tests/plugin/test_core.py::test_several_recipes_prefix_ids_with_their_names",
        "pytest --ftready=recipe.toml tests/": "test_every_fixture_works_from_a_teams_test_file",
        "pytest --ftready=recipe.toml --ftready-baseline=last/measurements.json":
            "test_a_k_run_keeps_the_full_figures_as_the_baseline_and_a_doubled_micro_batch_fails",
    },
    "check": {check_id: "test_every_check_carries_ftready_its_area_and_its_documented_markers"
              for check_id, _ in readme.check_rows()},
    "code block": {
        'pip install torch==2.13.0 -e ".[test]" && python -m pytest_ftready.tiny examples/tiny && '
        "pytest --ftready=examples/tiny/recipe.toml": "test_ci_runs_the_readmes_first_commands",
        'ftready-forecast recipe.toml --target "RTX 4090"':
            "tests/forecast/test_levers.py::test_command_prints_the_table_and_exits_by_the_verdict",
        "pytest --ftready=recipe.toml": "test_every_documented_name_has_a_test_and_every_tested_name_is_documented",
        "[tool.pytest.ini_options]": "test_settings_say_where_they_came_from_cli_over_env_over_ini",
        "import pytest": "test_the_readme_example_runs_as_written",
        "ftready-init --model models/my-model --data data/train.jsonl -o recipe.toml":
            "tests/test_starter.py::test_a_starting_recipe_for_the_tiny_model_is_valid_and_marks_what_it_could_not_read",
        "pytest --ftready=trl-sft.yaml":
            "tests/plugin/test_importer_examples.py::test_the_three_examples_run_offline_through_the_plugin",
        "def pytest_ftready_pipeline(recipe, tokenizer):":
            "tests/checks/test_pipelines.py::test_a_conftest_pipeline_hook_is_what_data_masking_checks",
        "def pytest_ftready_trainer(recipe, rows, output_dir, arguments):":
            "tests/plugin/test_own_trainer.py::test_the_templates_trainer_is_what_step_overfit_resume_and_generate_run",
        "[distributed]": "tests/engine/test_distributed.py::test_defaults_and_declared_table",
        "python -m torch.distributed.run --nnodes=1 --nproc-per-node=2 --standalone --max-restarts=0 \\":
            "tests/checks/test_distributed.py::test_the_four_checks_pass_through_the_plugin",
        "pytest --ftready=recipe.toml --ftready-baseline=last-night/measurements.json":
            "tests/plugin/test_regression_gate.py::test_a_larger_micro_batch_fails_step_memory_against_last_nights_figures",
        "[checks]": "tests/recipe/test_max_regression.py::test_thresholds_per_kind_are_read",
        "FTREADY_SCALE_ROWS=1000000 pytest tests/benchmarks/test_scale.py -m scale --benchmark-json=scale.json":
            "tests/benchmarks/test_scale.py::test_data_checks_throughput",
        # .ci/run's trainer_env builds this environment and runs tests/trainers/ in it
        "python3 -m venv .venv-axolotl": "tests/trainers/test_axolotl.py::test_an_axolotl_config_checks_the_labels_axolotl_makes",
        # docs/unsloth.md: a team's own Trainer, an Unsloth recipe, Unsloth's environment (.ci/run builds it)
        "# conftest.py, beside recipe.toml":
            "tests/plugin/test_own_trainer.py::test_data_masking_judges_the_labels_the_teams_own_trainer_makes",
        "[model]": "tests/trainers/test_unsloth.py::test_masking_judges_the_labels_unsloths_train_on_responses_only_makes",
        "python3 -m venv .venv-unsloth":
            "tests/trainers/test_unsloth.py::test_the_unsloth_notebook_template_is_what_step_overfit_resume_and_generate_run",
        # docs/serving.md: the [serving] table, the llama.cpp extra (CI's serving job installs it)
        "[serving]": "tests/serving/test_serving_rules.py::test_serving_table_is_read_and_defaults_to_no_engine",
        "# recipe.toml: a QLoRA run (4-bit base) served by llama.cpp":
            "tests/serving/test_merge.py::test_merge_into_the_dequantized_base_passes_and_all_three_are_measured",
        'pip install "pytest-ftready[llamacpp]"':
            "tests/serving/test_gguf.py::test_ci_serving_job_has_llama_cpp_and_the_converter",
        # docs/mlx.md: mlx's CPU backend beside the plugin (.ci/run builds that environment)
        'pip install "mlx[cpu]" "mlx-lm[cpu]" pytest-ftready':
            "tests/trainers/test_mlx.py::test_an_mlx_config_selects_mlx_lm_on_mlxs_cpu_backend",
    },
}


# ---- the lists themselves --------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(CONTRACT))
def test_every_documented_name_has_a_test_and_every_tested_name_is_documented(kind):
    documented, tested = readme.documented()[kind], set(CONTRACT[kind])
    assert not documented - tested, f"documented in README.md or docs/ without a contract test: {sorted(documented - tested)}"
    assert not tested - documented, f"in the contract but not in README.md or docs/: {sorted(tested - documented)}"


def test_every_contract_test_exists():
    missing = []
    for kind, entries in CONTRACT.items():
        for name, where in entries.items():
            path, _, function = where.rpartition("::")
            tree = ast.parse((ROOT / (path or HERE)).read_text())
            if function not in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}:
                missing.append(f"{kind} {name}: {where}")
    assert not missing


def test_the_package_has_exactly_the_documented_commands_options_fixtures_and_markers(pytester):
    """The other direction: nothing public goes undocumented."""
    import re
    import tomllib

    from pytest_ftready.checks.registry import AREAS
    from pytest_ftready.plugin import MARKERS

    documented = readme.documented()
    assert set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]) == documented["command"]
    helped = pytester.runpytest_subprocess("--help").stdout.str()
    assert set(re.findall(r"(--ftready[\w-]*)", helped)) == documented["option"]
    assert set(re.findall(r"^  (ftready\w*) \(", helped, re.M)) == documented["ini"]
    listed = pytester.runpytest_subprocess("--fixtures").stdout.str()
    assert set(re.findall(r"^(ftready_\w+)", listed, re.M)) == documented["fixture"]
    registered = {name.split("(")[0] for name in MARKERS} | {f"ftready_{area}" for area in AREAS}
    assert registered == documented["marker"]


# ---- one whole run, read by many -------------------------------------------------------------
def test_a_whole_run_exits_0_with_every_check_and_the_teams_tests(tiny_full_run):
    assert tiny_full_run.result.returncode == 0, tiny_full_run.result.stdout[-3000:]
    states = {state for state, _ in outcomes(tiny_full_run.junit).values()}
    assert states <= {"passed", "skipped"}


def test_every_fixture_works_from_a_teams_test_file(tiny_full_run):
    found = outcomes(tiny_full_run.junit)
    for fixture in CONTRACT["fixture"]:
        state, message = found[f"test_uses_{fixture}"]
        assert state == "passed", f"{fixture}: {message}"
    cases = {c.get("name"): c for c in ET.parse(tiny_full_run.junit).getroot().iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["test_uses_ftready_measure"].iter("property")}
    assert props == {"team_figure[widgets]": "7"}
    rows = {p.get("name"): p.get("value") for p in cases["test_uses_ftready_dataset"].iter("property")}
    assert rows == {"dataset_rows[rows]": "50"}  # every row of the tiny data trains
    bench = json.loads((tiny_full_run.folder / "bench.json").read_text())
    assert {"team_figure", "dataset_rows"} <= {m["name"] for m in bench["ftready"]}


def test_the_readme_example_runs_as_written(tiny_full_run):
    found = outcomes(tiny_full_run.junit)
    fits = {name: state for name, (state, _) in found.items() if name.startswith("test_fits_24gb[")}
    assert fits == {f"test_fits_24gb[micro_batch_size={b}-gradient_checkpointing={c}]": "passed"
                    for b in (1, 2, 4) for c in (False, True)}
    state, reason = found["test_bf16_step"]
    assert state == "skipped" and "GPU" in reason
    state, reason = found["test_only_for_the_support_bot[no-recipe]"]
    assert state == "skipped" and "support-bot-lora" in reason


def test_every_check_carries_ftready_its_area_and_its_documented_markers(tiny_full_run):
    items = json.loads((tiny_full_run.folder / "markers.json").read_text())
    checks = {nodeid.split("::")[-1].split("[")[0]: set(markers) for nodeid, markers in items.items()
              if nodeid.startswith("recipe.toml::")}
    documented = dict(readme.check_rows())
    assert set(checks) == set(documented)
    for check_id, markers in checks.items():
        assert {"ftready", f"ftready_{check_id.split('.')[0]}"} <= markers, check_id
        column = documented[check_id]
        if "(NCCL/GPU recipes)" not in column:  # the tiny recipe trains on the CPU with gloo
            wanted = {m.strip() for m in column.split(",") if m.strip()}
            assert markers & {"accelerator", "nightly"} == wanted, check_id


def test_every_artifact_is_written_private(tiny_full_run):
    arts = tiny_full_run.artifacts
    for name in CONTRACT["artifact"]:
        if name.startswith(".run-"):
            assert not list(arts.glob(".run-*")), "the run's working folder outlived the session"
        elif "partial" not in name:
            assert oct((arts / name).stat().st_mode & 0o777) == "0o600", name
    assert oct(arts.stat().st_mode & 0o777) == "0o700"
    assert json.loads((arts / "series.json").read_text())  # the sustained run's windows, the overfit curve...


def test_nightly_checks_run_when_asked_and_are_named_when_deselected(tiny_full_run):
    found = outcomes(tiny_full_run.junit)
    assert found["sustained.throughput"][0] == "passed"  # --ftready-nightly --ftready-cpu-short
    result = run_pytest(tiny_full_run.folder, "--collect-only")
    assert "ftready: nightly checks deselected (levers.sweep, sustained.thermal, sustained.throughput): " \
           "long-running; run them with -m nightly or --ftready-nightly" in result.stdout


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_marker_expressions_select_as_documented(tiny_full_run):
    def selected(*args):
        out = run_pytest(tiny_full_run.folder, "--collect-only", *args).stdout
        return {line.split("::")[-1] for line in out.splitlines() if line.startswith("recipe.toml::")}

    cheap = selected("-m", "ftready and not accelerator")
    assert "data.masking" in cheap and "stack.driver" not in cheap and "sustained.throughput" not in cheap
    assert selected("-m", "accelerator") == {"stack.driver", "stack.arch"}  # nightly ones need -m nightly
    assert {i.split("[")[0] for i in selected("-m", "nightly")} == {"levers.sweep", "sustained.throughput",
                                                                     "sustained.thermal"}
    result = run_pytest(tiny_full_run.folder, "-m", "accelerator", "--junitxml=gpu.xml", "--benchmark-json=gpu.json")
    assert result.returncode == 0 and {s for s, _ in outcomes(tiny_full_run.folder / "gpu.xml").values()} == {"skipped"}


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_a_k_run_keeps_the_full_figures_as_the_baseline_and_a_doubled_micro_batch_fails(tiny_full_run):
    """The issue's case: after a full run, `pytest -k masking` wrote the figures of one check over
    the full run's, and the README's regression gate then passed a micro-batch 4 -> 8."""
    folder, arts = tiny_full_run.folder, tiny_full_run.artifacts
    full = (arts / "measurements.json").read_bytes()
    run_pytest(folder, "-k", "masking", "-p", "no:benchmark")
    assert (arts / "measurements.json").read_bytes() == full
    assert {m["check"] for m in json.loads((arts / "measurements-partial.json").read_text())} == {"data.masking"}
    assert (arts / "report-partial.html").is_file() and (arts / "report.html").is_file()
    assert set(json.loads((arts / "series-partial.json").read_text())) == {"data.masking"}
    assert {"model.overfit", "sustained.throughput"} <= set(json.loads((arts / "series.json").read_text()))

    doubled = folder / "doubled"
    doubled.mkdir()
    for name in ("data", "model"):
        (doubled / name).symlink_to(folder / name)
    recipe = (folder / "recipe.toml").read_text().replace("micro_batch_size = 4", "micro_batch_size = 8")
    # this shared CPU's step time varies several-fold under load; peak memory does not
    (doubled / "recipe.toml").write_text(recipe.replace("tokens_per_s = 0.5", "tokens_per_s = 0.95"))
    baseline = str(arts / "measurements.json")  # README's Running: --ftready-baseline=last/measurements.json
    result = run_pytest(doubled, "-k", "step_memory", "-p", "no:benchmark", "--junitxml=out.xml",
                        env={"FTREADY_BASELINE": baseline})
    state, message = outcomes(doubled / "out.xml")["model.step_memory"]
    assert state == "failed" and "rose" in message and "max_regression.peak_device_bytes" in message, message
    assert f"ftready baseline {baseline} (tiny: the last full run's figures): " in result.stdout


# ---- settings, commands -------------------------------------------------------------------------
def test_settings_say_where_they_came_from_cli_over_env_over_ini(tiny_example):
    folder = tiny_example
    opt_in = readme.code_blocks(readme.section("Running"), "toml")[0]  # the README's block, verbatim
    (folder / "pyproject.toml").write_text(opt_in + 'ftready_artifacts = "from-ini"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTREADY_")}

    def header(*args, **extra):  # the four collections run side by side
        import subprocess
        import sys

        return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", *args],
                                cwd=folder, env={**env, **extra}, stdout=subprocess.PIPE, text=True)

    runs = [header(), header(FTREADY_RECIPE="recipe.toml"),
            header("--ftready=recipe.toml", FTREADY_ARTIFACTS="from-env"),
            header("--ftready=recipe.toml", "--ftready-artifacts=from-cli", FTREADY_ARTIFACTS="from-env")]
    ini, env_recipe, env_artifacts, cli = (next(line for line in run.communicate()[0].splitlines()
                                                 if line.startswith("ftready: recipes")) for run in runs)
    assert "recipe.toml (from ini ftready)" in ini and f"{folder / 'from-ini'} (from ini ftready_artifacts)" in ini
    assert ("(from env FTREADY_RECIPE)" in env_recipe
            and f"{folder / 'from-ini'} (from ini ftready_artifacts)" in env_recipe)
    assert ("(from --ftready)" in env_artifacts
            and f"{folder / 'from-env'} (from env FTREADY_ARTIFACTS)" in env_artifacts)
    assert f"{folder / 'from-cli'} (from --ftready-artifacts)" in cli


@pytest.mark.parametrize("option, expected", [
    ("--ftready-hub-timeout=-1", "expected a positive number of seconds, got '-1'"),
    ("--ftready-workers=0", "expected at least 1 process, got '0'"),
])
def test_bad_option_values_are_usage_errors_naming_the_option(pytester, option, expected):
    result = pytester.runpytest_subprocess(option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{option.split('=')[0]}*{expected}*"])


def test_ftready_tiny_writes_a_runnable_example_anywhere(tmp_path, monkeypatch):
    """Outside the checkout: the recipe (and its data manifest) come with the model and data."""
    from pytest_ftready.recipe import load_recipe
    from pytest_ftready.tiny import main

    monkeypatch.chdir(tmp_path)
    assert main(["somewhere"]) == 0
    example = ROOT / "examples" / "tiny"
    assert (tmp_path / "somewhere" / "recipe.toml").read_text() == (example / "recipe.toml").read_text()
    assert (tmp_path / "somewhere" / "data" / "MANIFEST.json").read_text() == (example / "data" / "MANIFEST.json").read_text()
    recipe = load_recipe(tmp_path / "somewhere" / "recipe.toml")
    assert recipe.model.path == (tmp_path / "somewhere" / "model").resolve() and recipe.data.manifest.is_file()


def test_ci_runs_the_readmes_first_commands():
    """The README's first block is what a new user types; .ci/run runs the same commands."""
    block = readme.code_blocks(readme.readme_text(), "bash")[0]
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [c.strip() for line in block.splitlines() for c in line.split("&&")]
    assert commands[0].startswith("pip install torch==2.13.0") and '-e ".[test]"' in ci
    for command in commands[1:]:
        assert command.replace("pytest --", "python -m pytest --") in ci or command in ci, command
