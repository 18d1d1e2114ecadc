"""The benchmark's one-call-per-replay timing, on a GPU kernel of known length."""

from __future__ import annotations

import pytest
import torch


def _timing():
    from bench import timing

    return timing


@pytest.mark.gpu
def test_single_replays_time_one_call_alone_without_the_host_launch() -> None:
    timing = _timing()
    cycles = 100_000  # about 50 us
    # The spin's own length, from events around it in a stream of many.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)
    start.record()
    for _ in range(20):
        torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    alone_us = start.elapsed_time(end) * 1e3 / 20

    for cold in (True, False):  # one replay after an L2 flush, or 32 in a row
        measured = timing.time_single_replays(
            lambda: torch.cuda._sleep(cycles), cold=cold, samples=5
        )
        assert measured.samples == 5
        # The call itself plus a graph launch on the device: a few microseconds, never the
        # host's launch latency of each replay (which the spin hides).
        assert alone_us * 0.95 <= measured.median_us <= alone_us + 8.0, (cold, measured, alone_us)
