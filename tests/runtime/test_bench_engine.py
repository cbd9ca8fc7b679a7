"""perf.bench_engine's marginal attribution of a step's device timeline."""

from __future__ import annotations

import pytest

from perf.bench_engine import marginal_times


def _kernel(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_marginal_times_charge_overlap_once_and_idle_to_the_next_kernel():
    """A dependent launch that starts before its predecessor ends adds only its end past the
    predecessor's; a gap before a kernel is that kernel's idle time; host events are ignored; the
    additions and the idle time sum to the span (from the first start to the last end)."""
    events = [
        _kernel("a", 0, 10),
        _kernel("b", 4, 10),  # launched early, waited: adds 14 - 10 = 4
        _kernel("c", 20, 5),  # 6 idle before it, adds 5
        {"ph": "X", "cat": "cpu_op", "name": "host", "ts": 0, "dur": 100},
        _kernel("a", 25, 2, cat="gpu_memcpy"),  # adds 2 more to "a"
    ]
    res = marginal_times(events, steps=2, top=30)
    by = {k["kernel"]: k for k in res["top"]}
    assert by["a"]["us_per_step"] == pytest.approx((10 + 2) / 2) and by["a"]["calls_per_step"] == 1.0
    assert by["b"]["us_per_step"] == pytest.approx(4 / 2) and by["b"]["idle_us_per_step"] == 0
    assert by["c"]["us_per_step"] == pytest.approx(5 / 2) and by["c"]["idle_us_per_step"] == pytest.approx(6 / 2)
    assert "host" not in by
    total = sum(k["us_per_step"] + k["idle_us_per_step"] for k in res["top"])
    assert total == pytest.approx(res["span_us_per_step"]) == pytest.approx(27 / 2)
    assert res["idle_us_per_step"] == pytest.approx(3)


def test_marginal_times_of_no_device_events():
    assert marginal_times([], steps=1, top=5) == {"span_us_per_step": 0.0, "idle_us_per_step": 0, "top": []}
