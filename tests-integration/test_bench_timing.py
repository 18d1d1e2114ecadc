"""The benchmark's timing, on a GPU kernel of known length."""

from __future__ import annotations

import pytest
import torch


def _timing():
    from bench import timing

    return timing


def _spin_alone_us(cycles: int) -> float:
    """A spin kernel's own length, from events around it in a stream of many."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)
    start.record()
    for _ in range(20):
        torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / 20


@pytest.mark.gpu
def test_single_replays_time_one_call_alone_without_the_host_launch() -> None:
    timing = _timing()
    cycles = 100_000  # about 50 us
    alone_us = _spin_alone_us(cycles)

    for cold in (True, False):  # one replay after an L2 flush, or 32 in a row
        measured = timing.time_single_replays(
            lambda: torch.cuda._sleep(cycles), cold=cold, samples=5
        )
        assert measured.samples == 5
        # The call itself plus a graph launch on the device: a few microseconds, never the
        # host's launch latency of each replay (which the spin hides).
        assert alone_us * 0.95 <= measured.median_us <= alone_us + 8.0, (cold, measured, alone_us)


@pytest.mark.gpu
def test_spin_timer_keeps_a_slow_host_launch_out_of_the_sample() -> None:
    import time

    timing = _timing()
    cycles = 20_000  # about 10 us
    alone_us = _spin_alone_us(cycles)

    def slow_launch() -> None:
        time.sleep(300e-6)  # a host that takes 300 us to queue the kernel
        torch.cuda._sleep(cycles)

    # The first spin (about 20 us) is shorter than the host's queueing: the timer must notice,
    # lengthen the spin and take the sample again.
    timer = timing.SpinTimer(timing.SPIN_CYCLES_PER_GRAPH)
    samples_us = [timer.sample_ms(slow_launch) * 1e3 for _ in range(5)]
    assert timer.spin_cycles > timing.SPIN_CYCLES_PER_GRAPH
    for sample_us in samples_us:
        assert alone_us * 0.95 <= sample_us <= alone_us + 5.0, (samples_us, alone_us)


@pytest.mark.gpu
def test_graph_replays_hold_no_host_launch() -> None:
    timing = _timing()
    cycles = 20_000
    alone_us = _spin_alone_us(cycles)
    measured = timing.time_graph_replays([lambda: torch.cuda._sleep(cycles)], min_samples=10)
    assert alone_us * 0.95 <= measured.median_us <= alone_us + 5.0, (measured, alone_us)
