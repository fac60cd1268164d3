"""The pytest face starts light: importing the plugin loads neither the check modules, the
run state, the outputs nor torch, and the area markers it registers at startup are those the
check modules register."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_plugin_loads_nothing_heavy():
    code = ("import sys, pytest_ftready.plugin; heavy = ('torch', 'transformers', 'pytest_ftready.session.state', "
            "'pytest_ftready.collect', 'pytest_ftready.outputs.report', 'pytest_ftready.checks.data'); "
            "print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_static_area_names_match_the_registered_checks():
    from pytest_ftready.checks.registry import AREAS, areas

    assert sorted(AREAS) == areas()


def test_help_lists_the_options_and_the_area_markers(pytester):
    result = pytester.runpytest_subprocess("--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*--ftready*"])
    markers = pytester.runpytest_subprocess("--markers")
    markers.stdout.fnmatch_lines(["*ftready_privacy: pytest-ftready privacy checks*"])
