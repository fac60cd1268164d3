"""One whole run of the tiny example, shared by the plugin tests that only read its outputs
(the report's sections, the README's contract): every check, nightly ones in the CPU short
mode, a team's test file using every documented fixture, and the README's own example."""

from __future__ import annotations

import pytest

from tests.conftest import copy_example
from tests.plugin.full_run import MARKER_DUMP, TEAM_TESTS, FullRun, readme_python_example, run_pytest


@pytest.fixture(scope="session")
def tiny_full_run(tmp_path_factory, tiny_model_dir) -> FullRun:
    folder = copy_example(tmp_path_factory.mktemp("full-run") / "tiny", tiny_model_dir)
    (folder / "conftest.py").write_text(MARKER_DUMP)
    (folder / "test_team.py").write_text(TEAM_TESTS)
    (folder / "test_readme_example.py").write_text(readme_python_example())
    result = run_pytest(folder, "--ftready-nightly", "--ftready-cpu-short", "test_team.py", "test_readme_example.py",
                        "--junitxml=out.xml", "--benchmark-json=bench.json")
    artifacts = folder / "arts" / "tiny"
    assert (artifacts / "report.html").is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    return FullRun(folder, result, artifacts)
