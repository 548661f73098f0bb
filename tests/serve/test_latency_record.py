"""``LatencyRecord``: the durations ``GET /health`` summarises, read from a given count on so a
load test sees its own window; percentiles as NumPy computes them."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.serve.latency import LatencyRecord

pytestmark = pytest.mark.timeout(10)


def test_a_window_from_a_count_on_is_summarised_alone():
    record = LatencyRecord(keep=100)
    for seconds in [1.0] * 10:  # a warm-up the window must leave out
        record.add(seconds)
    mark = record.summary_ms()["recorded"]
    window = np.linspace(0.001, 0.050, 40)
    for seconds in window:
        record.add(float(seconds))
    summary = record.summary_ms(since=mark)
    assert summary["count"] == 40 and summary["recorded"] == 50
    np.testing.assert_allclose([summary["p50"], summary["p99"], summary["max"]],
                               [np.percentile(window, 50) * 1e3,
                                np.percentile(window, 99) * 1e3, 50.0])
    assert record.summary_ms()["max"] == 1000.0  # from the start: the warm-up too


def test_only_the_kept_durations_count_and_an_empty_window_has_no_figures():
    record = LatencyRecord(keep=5)
    for seconds in range(1, 9):
        record.add(seconds / 1e3)
    assert record.summary_ms(since=0)["count"] == 5  # the 3 oldest are gone
    assert record.summary_ms(since=0)["p50"] == 6.0
    assert record.summary_ms(since=6) == {"count": 2, "recorded": 8, "p50": 7.5,
                                          "p99": pytest.approx(7.99), "max": 8.0}
    assert record.summary_ms(since=8)["p99"] is None
    with pytest.raises(ValueError, match="since must be an integer >= 0, got -1"):
        record.summary_ms(since=-1)
