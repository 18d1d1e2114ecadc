"""The benchmark's host time of one eager call: its table (CPU) and a measurement (SM90 GPU)."""

from __future__ import annotations

import pytest
import torch


def _host_time():
    """Import tools/bench/host_time.py as part of the `bench` package."""
    from bench import host_time

    return host_time


def test_table_marks_the_target_the_device_bound_case_and_skips() -> None:
    ht = _host_time()
    rows = [
        ht.HostTime(
            "fp8", ht.SCHEDULE_MODES[0], ht.MEASURED, 2000, 5, 12.5, 12.1, 15.0, 14.0, True
        ),
        ht.HostTime("fp8", ht.SCHEDULE_MODES[1], ht.MEASURED, 2000, 5, 8.25, 8.0, 9.0, 6.0, False),
        ht.HostTime("fp4", ht.SCHEDULE_MODES[0], ht.SKIPPED, detail="fp4 kernel not built: soon"),
    ]
    lines = ht.host_time_table(rows).splitlines()
    assert "host us/call" in lines[0] and "graph us/call" in lines[0]
    assert "target <= 10 us" in lines[0] and "B=1 L=4096" in lines[0]
    first, second, skipped = lines[2:]
    assert first.split()[:3] == ["fp8", "schedule_meta=None", "12.50"]
    assert "over target" in first and "upper bound" in first
    assert "meets target" in second and "upper bound" not in second
    assert "8.25" in second and "6.00" in second
    assert skipped.startswith("fp4") and skipped.endswith("fp4 kernel not built: soon")


@pytest.mark.gpu
def test_host_time_rows_are_measured_for_fp8() -> None:
    ht = _host_time()
    rows = ht.measure_host_times(["fp8"], torch.device("cuda"), calls=50, repeats=2)
    assert [r.schedule for r in rows] == list(ht.SCHEDULE_MODES)
    for r in rows:
        assert r.status == ht.MEASURED, r.detail
        assert r.calls == 50 and r.repeats == 2
        assert 0 < r.host_us_min <= r.host_us
        assert r.device_us > 0 and r.graph_us > 0
        assert r.device_bound == (r.graph_us >= ht.DEVICE_BOUND_RATIO * r.host_us)
