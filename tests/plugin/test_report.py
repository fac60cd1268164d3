"""The tiny example's report, from a real run with every check (nightly ones in the CPU short
mode): every section has content, a -k run leaves it intact beside its partial report, and
headless Chromium renders every section visibly (a screenshot is saved with the artifacts)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from pytest_ftready.outputs.report import FULL, PARTIAL, SECTIONS
from tests.plugin.full_run import run_pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


@pytest.fixture(scope="module")
def tiny_report(tiny_full_run) -> Path:
    """The artifacts folder of the shared whole run of the tiny example, nightly checks included."""
    return tiny_full_run.artifacts


def test_every_section_of_the_tiny_report_has_content(tiny_report):
    text = (tiny_report / FULL).read_text()
    assert "<p id='run-kind'>Full run" in text
    for key in SECTIONS:
        assert f"<section id='{key}'>" in text, key
    assert "class='absent'" not in text.split("<section id='masking'>")[1].split("<section id='environment'>")[0]
    assert "<span class='tok t'>" in text and "max_length 128" in text and "overfit_loss 0.1" in text
    assert "Tokens/s per window" in text and "levers.sweep[micro_batch=8]" in text


def test_a_k_run_writes_a_partial_report_and_keeps_the_full_one(tiny_report):
    full = (tiny_report / FULL).read_bytes()
    run_pytest(tiny_report.parents[1], "-k", "data.format", "-p", "no:benchmark")
    assert (tiny_report / FULL).read_bytes() == full
    partial = (tiny_report / PARTIAL).read_text()
    assert "<p id='run-kind'>Partial run" in partial and f"href='{FULL}'" in partial
    assert "not selected by this run (-k, -m or node ids)" in partial


def test_collect_only_writes_no_report_and_no_summary(pytester, tiny_example, monkeypatch):
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "--collect-only", "-q")
    assert not list((pytester.path / ".ftready").rglob("report*.html"))
    assert not (pytester.path / "summary.md").exists()


PROBE = """<script>
const out = {};
for (const s of document.querySelectorAll('main > section')) {
  const r = s.getBoundingClientRect(), st = getComputedStyle(s);
  out[s.id] = {height: r.height, width: r.width, shown: st.display !== 'none' && st.visibility !== 'hidden',
               charts: [...s.querySelectorAll('svg')].map(g => g.getBoundingClientRect().height)};
}
out.pageHeight = document.documentElement.scrollHeight;
const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def chromium(exe: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.browser
def test_the_report_renders_every_section_in_headless_chromium(tiny_report):
    exe = browser()
    if exe is None:
        pytest.skip("needs Chromium for the browser test: apt-get install -y chromium")
    probe = tiny_report / "report-probe.html"
    probe.write_text((tiny_report / FULL).read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium(exe, "--window-size=1280,900", "--dump-dom", probe.as_uri()).stdout
    found = json.loads(dom.split("<pre id=\"probe\">")[1].split("</pre>")[0])
    for key in SECTIONS:
        box = found[key]
        assert box["shown"] and box["height"] > 40 and box["width"] > 600, (key, box)
        assert all(h > 50 for h in box["charts"]), (key, box["charts"])
    assert len(found["lengths"]["charts"]) == 1 and len(found["memory"]["charts"]) == 1
    assert len(found["overfit"]["charts"]) == 1 and len(found["sustained"]["charts"]) >= 1

    shot = tiny_report / "report.png"
    height = min(int(found["pageHeight"]) + 20, 16000)
    chromium(exe, f"--window-size=1280,{height}", f"--screenshot={shot}", (tiny_report / FULL).as_uri())
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (1280, height)
    print(f"screenshot: {shot}")
