"""examples/ci: the workflows parse, wire JUnit, artifacts and the baseline as documented, and
their pytest commands run against the tiny example (the GPU checks skip here). The GitHub
summary they rely on is appended and matches a golden file (volatile figures normalised)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.helpers import outcomes
from tests.outputs.test_summary import matches_golden

yaml = pytest.importorskip("yaml", reason="the workflow tests need pyyaml (pip install pytest-ftready[test])")

CI = Path(__file__).resolve().parents[2] / "examples" / "ci"
FIGURE = re.compile(r"[+-]?\d[\d,.]*(e[+-]?\d+)?( ?(B|KiB|MiB|GiB|TiB|tokens/s|tokens|nats|s|h|C|%))")


def pytest_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("pytest ")]


def github():
    return yaml.safe_load((CI / "github-ftready.yml").read_text())


def junit_of(command: str) -> str:
    return next(a.split("=", 1)[1] for a in shlex.split(command) if a.startswith("--junitxml="))


def test_the_github_workflow_wires_runners_reports_and_the_baseline():
    flow = github()
    on = flow.get("on", flow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert {"push", "pull_request", "schedule"} <= set(on)
    cheap, gpu = flow["jobs"]["cheap"], flow["jobs"]["gpu"]
    assert cheap["runs-on"] == "ubuntu-latest" and "if" not in cheap
    assert {"self-hosted", "gpu"} <= set(gpu["runs-on"]) and "schedule" in gpu["if"]
    for job in (cheap, gpu):
        steps = job["steps"]
        command = next(line for s in steps for line in pytest_lines(s.get("run", "")))
        junit = junit_of(command)
        uploaded = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
        assert junit in uploaded["with"]["path"] and "ftready-artifacts/" in uploaded["with"]["path"]
        report = next(s for s in steps if "junit-report" in s.get("uses", ""))
        assert report["with"]["report_paths"] == junit and report["if"] == "always()"
    gpu_command = next(line for s in gpu["steps"] for line in pytest_lines(s.get("run", "")))
    assert "--benchmark-autosave" in gpu_command and "--benchmark-compare" in gpu_command
    cached = [s for s in gpu["steps"] if s.get("uses", "").startswith("actions/cache")]
    assert [s["uses"].split("@")[0] for s in cached] == ["actions/cache/restore", "actions/cache/save"]
    assert all(s["with"]["path"] == ".benchmarks" for s in cached)
    assert "--ftready-nightly" not in pytest_lines(cheap["steps"][3]["run"])[0] and "--ftready-nightly" in gpu_command


def test_the_gitlab_job_runs_the_same_commands():
    flow = yaml.safe_load((CI / "gitlab-ftready.yml").read_text())
    gitlab = [line for job in ("ftready:cheap", "ftready:gpu") for line in flow[job]["script"]
              if line.startswith("pytest ")]
    assert gitlab == [line for job in github()["jobs"].values() for s in job["steps"]
                      for line in pytest_lines(s.get("run", ""))]
    assert flow["ftready:gpu"]["tags"] == ["gpu"] and flow["ftready:gpu"]["cache"]["paths"] == [".benchmarks/"]
    assert flow["ftready:cheap"]["artifacts"]["reports"]["junit"] == "junit-cheap.xml"


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_the_workflow_commands_run_against_the_tiny_example(pytester, tiny_example, monkeypatch):
    flow = github()
    monkeypatch.setenv("FTREADY_RECIPE", str(tiny_example / "recipe.toml"))
    for name, value in flow["env"].items():
        if name != "FTREADY_RECIPE":
            monkeypatch.setenv(name, str(value))
    summary = pytester.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    cheap = pytest_lines(flow["jobs"]["cheap"]["steps"][3]["run"])[0]
    gpu = next(line for s in flow["jobs"]["gpu"]["steps"] for line in pytest_lines(s.get("run", "")))

    pytester.runpytest_subprocess(*shlex.split(cheap)[1:])
    cheap_results = outcomes(pytester.path / junit_of(cheap))
    assert cheap_results["model.step_memory"][0] == "passed"
    assert not any(n.startswith(("sustained.", "levers.sweep")) for n in cheap_results)  # nightly: not on push
    assert summary.read_text().count("## pytest-ftready: tiny") == 1 and "(full run)" in summary.read_text()
    artifacts = pytester.path / "ftready-artifacts" / "tiny"
    assert (artifacts / "report.html").is_file() and not (artifacts / "report-partial.html").exists()

    # the nightly command as written: every check, autosaved for tomorrow's --benchmark-compare
    # (the gate against a saved run is exercised in test_regression_gate.py)
    pytester.runpytest_subprocess(*shlex.split(gpu)[1:])
    gpu_results = outcomes(pytester.path / junit_of(gpu))
    state, reason = gpu_results["sustained.throughput"]
    assert state == "skipped" and "needs a CUDA/ROCm GPU" in reason
    assert gpu_results["model.step_memory"][0] == "passed" and "levers.sweep[recipe]" in gpu_results
    assert len(list((pytester.path / ".benchmarks").rglob("*.json"))) == 1
    assert summary.read_text().count("## pytest-ftready: tiny") == 2


def normalise(text: str, base: Path) -> str:
    text = text.replace(str(base), "<tmp>")
    return FIGURE.sub(lambda m: "<n>" + (m.group(2) or ""), text)


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_the_step_summary_of_a_failing_gated_run_matches_the_golden_file(pytester, tiny_example, edit_recipe,
                                                                      monkeypatch):
    summary = pytester.path / "step-summary.md"
    summary.write_text("# an earlier step's summary\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    edit_recipe(tiny_example / "recipe.toml", max_length="1024")  # above the model's 512 positions
    baseline = pytester.path / "last-night.json"
    baseline.write_text('[{"recipe": "tiny", "check": "model.step_memory", "case": "", "name": "peak_tensor_bytes", '
                        '"value": 1000, "unit": "bytes", "estimate": false}]')
    pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", f"--ftready-baseline={baseline}",
                                  "-k", "data.format or data.lengths or model.step_memory", "-p", "no:benchmark")
    matches_golden(normalise(summary.read_text(), pytester.path), "step-summary-tiny.md")
