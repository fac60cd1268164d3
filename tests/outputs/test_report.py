"""The HTML report from a hand-built run: every section, the figures it was given, the
markers where limits lie, self-contained, and a partial run kept beside the full one."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from pytest_ftready.outputs.report import FULL, PARTIAL, SECTIONS, html_report, write_report
from tests.outputs.sample_run import sample_run


class Sections(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.urls, self.svgs = [], [], 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.ids.append(attrs.get("id"))
        if tag == "svg":
            self.svgs += 1
        self.urls += [v for k, v in attrs.items() if k in ("src", "href") and v]


def parsed(text):
    parser = Sections()
    parser.feed(text)
    return parser


def section(text, key):
    return re.search(rf"<section id='{key}'>.*?</section>", text, re.S).group(0)


def test_every_section_in_order_and_nothing_fetched():
    text = html_report(sample_run())
    page = parsed(text)
    assert page.ids == list(SECTIONS)
    assert page.svgs == 7  # lengths, memory, overfit, tokens/s, temperature, SM clock, power
    assert all(not u.startswith(("http:", "https:", "//")) for u in page.urls), page.urls
    assert "<script" not in text and "@import" not in text


def test_verdicts_carry_each_reason_and_the_selection_says_what_did_not_run():
    text = html_report(sample_run())
    verdicts = section(text, "verdicts")
    assert "truncation cuts the response of 3 of 50 rows" in verdicts
    assert "Fix: raise [data] max_length (now 128)" in verdicts  # the whole message, folded under its first line
    assert "needs a CUDA/ROCm GPU or an Apple GPU: no NVIDIA driver" in verdicts
    selection = section(text, "selection")
    assert "selected 12 of 13 checks" in selection and "nightly: deselected unless --ftready-nightly" in selection
    assert "Partial run" not in selection
    partial = html_report(sample_run(partial=True), full_report=FULL)
    assert "Partial run" in section(partial, "selection") and f"href='{FULL}'" in partial
    assert "<p id='run-kind'>Partial run" in partial


def test_masking_shows_each_token_with_its_label():
    masking = section(html_report(sample_run()), "masking")
    tokens = re.search(r"<div class='tokens'>(.*?)</div>", masking, re.S).group(1)
    assert re.findall(r"<span class='tok (t|m)'>([^<]*)</span>", tokens) == [
        ("m", "&lt;|im_start|&gt;"), ("m", "user↵\n"), ("m", "Hi"), ("t", "Hello"), ("t", " there"),
        ("t", "&lt;|im_end|&gt;")]
    assert "generation-markers" in masking and "truncated_part: response cut at 128 tokens" in masking


def test_charts_mark_the_limits_and_events_they_were_given():
    text = html_report(sample_run())
    lengths = section(text, "lengths")
    assert "max_length 128" in lengths and "truncated: 6% of rows" in lengths
    memory = section(text, "memory")
    for label in ("weights: 587.25 KiB", "gradients: 16.00 KiB", "optimizer state: 32.03 KiB",
                  "activations and workspace (estimate): 12.84 MiB", "headroom 10%", "23.54 GiB"):
        assert label in memory, label
    assert "overfit_loss 0.1" in section(text, "overfit")
    sustained = section(text, "sustained")
    assert sustained.count("hw_thermal_slowdown from 42 s") >= 3  # marked on each telemetry chart
    assert "max_temperature_c 87.0" in sustained
    levers = section(text, "levers")
    assert re.search(r"micro_batch=8.*?13.71 MiB.*?10,200 tokens/s", levers, re.S)
    assert "not available on this device" in levers and "activation checkpointing" in levers
    assert "+91.8%" in section(text, "regressions")
    assert "NVIDIA L4" in section(text, "environment") and "transformers" in section(text, "environment")


def test_absent_data_says_which_check_and_why():
    run = sample_run(partial=True)
    run.series.pop("model.overfit")
    run.environment = None
    text = html_report(run)
    assert "No loss curve: model.overfit passed without recording it." in text
    assert "No environment record: repro.environment passed without recording it." in text


def test_a_partial_run_keeps_the_full_report_and_a_full_run_replaces_both(tmp_path):
    write_report(tmp_path, sample_run())
    full = (tmp_path / FULL).read_text()
    written = write_report(tmp_path, sample_run(partial=True))
    assert written.name == PARTIAL and (tmp_path / FULL).read_text() == full
    assert (tmp_path / PARTIAL).stat().st_mode & 0o077 == 0  # owner-only, like every artifact
    write_report(tmp_path, sample_run())
    assert not (tmp_path / PARTIAL).exists()
    first_partial = write_report(tmp_path / "fresh", sample_run(partial=True))
    assert "No full report exists yet" in first_partial.read_text()
