"""Units for people, one percentile, and measurements as the terminal shows them."""

import pytest

from pytest_ftready.outputs.measurements import Measurement, measurements_payload, summary_lines
from pytest_ftready.units import format_value, human_bytes, percentile


def test_human_bytes_and_format_value():
    assert human_bytes(512) == "512 B" and human_bytes(1536) == "1.50 KiB" and human_bytes(3 * 1024 ** 3) == "3.00 GiB"
    assert format_value(2048, "bytes") == "2.00 KiB" and format_value(0.123456, "share") == "12.3%"
    assert format_value("sdpa", "") == "sdpa"


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert percentile(list(range(101)), 0.95) == pytest.approx(95.0)
    assert percentile([7], 0.95) == 7 and percentile([], 0.5) == 0.0


def test_measurements_keys_display_and_summary():
    a = Measurement("tiny", "model.step_memory", "peak_tensor_bytes", 4096, "bytes")
    b = Measurement("tiny", "model.step_memory", "activations", 1024, "bytes", estimate=True)
    c = Measurement("tiny", "headroom.time", "eta", 0.5, "h")
    assert a.key == "peak_tensor_bytes[bytes]" and b.display() == "activations = 1.00 KiB (estimate)"
    assert summary_lines([a, b, c]) == ["tiny :: model.step_memory", "    peak_tensor_bytes = 4.00 KiB",
                                        "    activations = 1.00 KiB (estimate)", "tiny :: headroom.time", "    eta = 0.5 h"]
    assert measurements_payload([c]) == [{"recipe": "tiny", "check": "headroom.time", "name": "eta", "value": 0.5,
                                          "unit": "h", "estimate": False, "case": ""}]
