"""The CI Markdown summary: against a golden file, and appended only where GITHUB_STEP_SUMMARY is set."""

from __future__ import annotations

import os
from pathlib import Path

from pytest_ftready.outputs.summary import append_step_summary, markdown
from tests.outputs.sample_run import sample_run

GOLDEN = Path(__file__).parent / "golden"


def matches_golden(text: str, name: str) -> None:
    """Compare with golden/NAME; FTREADY_REGENERATE_GOLDEN=1 rewrites it (review the diff)."""
    path = GOLDEN / name
    if os.environ.get("FTREADY_REGENERATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_summary_matches_the_golden_file():
    matches_golden(markdown([sample_run()], {"demo": Path("ftready-artifacts/demo/report.html")}), "summary.md")


def test_the_summary_names_failures_with_their_fix_line_and_the_regressions():
    text = markdown([sample_run(partial=True)])
    assert "**partial run**: 1 check(s) not selected" in text
    assert "- **data.masking**: truncation cuts the response of 3 of 50 rows" in text
    assert "  - Fix: raise [data] max_length (now 128) or shorten those rows" in text
    assert "| model.step_memory | peak_tensor_bytes | 7.02 MiB | 13.46 MiB | +91.8% | 10% (peak_device_bytes) |" in text
    assert "| data | ❌ failed | 2 | 1 | 0 | 0 |" in text


def test_appended_only_where_github_step_summary_is_set(tmp_path):
    assert append_step_summary([sample_run()], environ={}) is None
    target = tmp_path / "summary.md"
    target.write_text("# earlier step\n")
    append_step_summary([sample_run()], environ={"GITHUB_STEP_SUMMARY": str(target)})
    text = target.read_text()
    assert text.startswith("# earlier step\n## pytest-ftready: demo") and text.count("## pytest-ftready") == 1


def test_a_levers_header_brings_its_first_lever():
    from pytest_ftready.outputs.records import CheckRow

    row = CheckRow("model.step_memory", "model", "failed", "the worst-case step needs 30 GiB but ...\n"
                   "Levers for this recipe:\n  - activation checkpointing: gradient_checkpointing = true; saves ~9 GiB")
    assert row.fix_line == "Levers for this recipe: - activation checkpointing: gradient_checkpointing = true; saves ~9 GiB"
    assert CheckRow("x.y", "x", "failed", "one line only").fix_line == ""
