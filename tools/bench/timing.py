"""Timing: CUDA events around CUDA-graph replays, the copy ceiling, and host time per call.

Every GPU figure is a median over many samples. A sample is one replay of a graph holding
`calls` back-to-back calls, each on its own rotation set of inputs (see data.py), so the per-call
time includes what a call costs inside a serving graph (schedule kernel and launch gaps) and no
call finds its pages in L2 from the previous one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

WARMUP_CALLS = 3
WARMUP_REPLAYS = 3
MIN_SAMPLES = 20
MAX_SAMPLES = 200
# Stop sampling once this much GPU time has been spent on one case (after MIN_SAMPLES).
SAMPLE_BUDGET_S = 0.5


# Pause before a case is timed, after its float64 check. Measured on the H200 (2026-11-29,
# fp8 next_n 1, block 64 and 128, B 128, L 64k, run_case twice per arrangement): timed right
# after the check, the op read 298-306 us; with the memory the check had cached given back to
# the driver (`empty_cache`) and then 0.3, 1 or 3 s without GPU work, 281-285 us. Neither the
# pause nor `empty_cache` alone changed the figure. The mechanism is not known; 281-285 us is
# also what the same data read in a process that ran no check.
SETTLE_S = 0.5


def settle(device: torch.device) -> None:
    """Give cached memory back to the driver and leave the GPU idle for `SETTLE_S`."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    time.sleep(SETTLE_S)


@dataclass(frozen=True)
class Timing:
    """Median per-call time and the spread of the samples.

    Attributes:
        median_us: Median time of one call, microseconds.
        p10_us: 10th percentile, microseconds.
        p90_us: 90th percentile, microseconds.
        samples: Number of samples the statistics come from.
        method: How the time was taken (CUDA graph replays, or host wall clock on CPU).
    """

    median_us: float
    p10_us: float
    p90_us: float
    samples: int
    method: str


def _summarise(per_call_us: list[float], method: str) -> Timing:
    ordered = sorted(per_call_us)
    n = len(ordered)
    return Timing(
        median_us=statistics.median(ordered),
        p10_us=ordered[int(0.1 * (n - 1))],
        p90_us=ordered[int(0.9 * (n - 1))],
        samples=n,
        method=method,
    )


def _warm_up(calls: list[Callable[[], object]]) -> None:
    """Run every call `WARMUP_CALLS` times eagerly, on a side stream as graph capture wants."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


# Before each sample a GPU spin kernel holds the stream while the host queues the timed work,
# so no kernel of it waits for the host: the samples hold no host launch time. The spin must
# outlast the queueing (checked on every sample).
SPIN_CYCLES_PER_GRAPH = 40_000  # about 20 us at 1.98 GHz


class SpinTimer:
    """Times work queued behind a GPU spin, lengthening the spin whenever the host's queueing
    outlasted it (such a sample is taken again)."""

    def __init__(self, spin_cycles: int) -> None:
        self.spin_cycles = spin_cycles

    def sample_ms(
        self, launch: Callable[[], object], before: Callable[[], object] | None = None
    ) -> float:
        """Milliseconds between the spin's end and the end of what `launch` queued.

        `before` (e.g. an L2 flush) is queued ahead of the spin on every attempt.
        """
        while True:
            if before is not None:
                before()
            spin_start = torch.cuda.Event(enable_timing=True)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            spin_start.record()
            torch.cuda._sleep(self.spin_cycles)
            start.record()
            queue_began = time.perf_counter()
            launch()
            queue_s = time.perf_counter() - queue_began
            end.record()
            end.synchronize()
            # With a 20 % margin: the spin starts on the GPU no earlier than it was queued.
            if 1.2 * queue_s * 1e3 < spin_start.elapsed_time(start):
                return start.elapsed_time(end)
            self.spin_cycles *= 2  # the host may still have been queueing when the spin ended
            if self.spin_cycles > 1 << 36:
                raise RuntimeError("the spin kernel never outlasted the host's launches")


def time_graph_replays(
    calls: list[Callable[[], object]],
    *,
    min_samples: int = MIN_SAMPLES,
    budget_s: float = SAMPLE_BUDGET_S,
    before_samples: Callable[[], object] | None = None,
) -> Timing:
    """Capture `calls` into one CUDA graph and time its replays with CUDA events.

    Each replay is queued behind a spin kernel (`SpinTimer`), so a sample holds the graph's
    device-side launch but not the host's: before the twenty-ninth run (2026-12-02) it held
    both, which lengthened the samples of graphs with few calls (the largest shapes).

    Args:
        calls: Closures, one per rotation set; each launches one op call on the current stream.
        min_samples: Samples taken whatever the budget.
        budget_s: GPU seconds after which sampling stops (once `min_samples` are taken).
        before_samples: Queued after the warm-up calls and replays, before the first timed
            replay (the benchmark poisons an output there, so what the timed replays wrote
            can be checked afterwards).

    Returns:
        The median (and spread) of replay time divided by `len(calls)`.
    """
    _warm_up(calls)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(WARMUP_REPLAYS):
        graph.replay()
    if before_samples is not None:
        before_samples()
    torch.cuda.synchronize()

    timer = SpinTimer(SPIN_CYCLES_PER_GRAPH)
    per_call_us: list[float] = []
    spent_s = 0.0
    while len(per_call_us) < MAX_SAMPLES and (len(per_call_us) < min_samples or spent_s < budget_s):
        elapsed_ms = timer.sample_ms(graph.replay)
        spent_s += elapsed_ms * 1e-3
        per_call_us.append(elapsed_ms * 1e3 / len(calls))
    del graph
    return _summarise(
        per_call_us, f"CUDA events over graph replays of {len(calls)} calls, host launch hidden"
    )


# L2-warm samples of `time_single_replays` queue this many replays. Measured on the H200
# (2026-11-29): with 256 one-kernel graph launches queued behind a spin, even a one-element add_
# took 27 us per graph (against 3.8 us with 32 queued).
SINGLE_REPLAY_WINDOW = 32
SINGLE_REPLAY_SAMPLES = 40
# A cold sample starts after a read of this many times the L2's size.
L2_FLUSH_FACTOR = 4
_l2_flush_buffers: dict[torch.device, torch.Tensor] = {}  # kept for the process (240 MB on an H200)


def flush_l2(device: torch.device) -> None:
    """Evict the L2 by reading a buffer `L2_FLUSH_FACTOR` times its size (queued, not waited
    for). A read leaves clean lines, so no write-back of the flush lands in what is timed next."""
    buffer = _l2_flush_buffers.get(device)
    if buffer is None:
        size = L2_FLUSH_FACTOR * torch.cuda.get_device_properties(device).L2_cache_size
        buffer = torch.ones(size // 4, dtype=torch.float32, device=device)
        _l2_flush_buffers[device] = buffer
    buffer.sum()


def time_single_replays(
    call: Callable[[], object],
    *,
    cold: bool = True,
    samples: int = SINGLE_REPLAY_SAMPLES,
    before_samples: Callable[[], object] | None = None,
) -> Timing:
    """Time one call per CUDA-graph replay: the small-batch target's measurement.

    The call is captured into a graph of its own. Cold: each sample flushes the L2 and times one
    replay between two CUDA events, so the call's pages, table and q come from HBM. L2-warm
    (`cold=False`): each sample times `SINGLE_REPLAY_WINDOW` replays in turn and divides by
    their number, each finding its inputs in L2 from the replay before. Consecutive graph
    launches do not overlap (a graph starts when the one before it has finished), so each
    replay is one whole call alone on the GPU, with its own device-side graph launch: unlike
    `time_graph_replays`, no call's launch or prologue hides under the previous call. The
    host's launch time is kept out: a spin kernel queued before the first event holds the
    stream until every replay is queued, and a sample whose queueing outlasted the spin is
    refused (the spin is lengthened and the sample taken again). `before_samples` is queued
    after the warm-up calls and replay, before the first timed one, as in `time_graph_replays`.

    One graph on purpose. On the H200 (2026-11-30), once a benchmark process had run some ten
    cases, a window of 32 different one-call graphs (one per rotation set, the form used up
    to the twentieth run) took 4-5 us longer per replay than in a fresh process, flushed or
    not, while one graph replayed, cold or warm, and graphs of many calls read as before
    (kernel notes, twenty-eighth round). The cause was not found.
    """
    device = torch.device("cuda", torch.cuda.current_device())
    _warm_up([call])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    graph.replay()
    if before_samples is not None:
        before_samples()
    torch.cuda.synchronize()

    window = 1 if cold else SINGLE_REPLAY_WINDOW
    timer = SpinTimer(SPIN_CYCLES_PER_GRAPH * window)

    def replay_window() -> None:
        for _ in range(window):
            graph.replay()

    flush = (lambda: flush_l2(device)) if cold else None
    per_call_us = [
        timer.sample_ms(replay_window, before=flush) * 1e3 / window for _ in range(samples)
    ]
    if cold:
        method = "CUDA events around one replay of a one-call graph after an L2 flush"
    else:
        method = f"CUDA events around {window} replays of a one-call graph"
    return _summarise(per_call_us, method + ", host launch hidden")


def time_host(call: Callable[[], object], repeats: int = 3) -> Timing:
    """Host wall-clock time of `call` (the CPU reference path; not a kernel measurement)."""
    call()
    per_call_us = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        per_call_us.append((time.perf_counter() - start) * 1e6)
    return _summarise(per_call_us, "host wall clock (CPU reference path)")


def _time_events(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of `fn` measured with CUDA events behind a spin, after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    timer = SpinTimer(SPIN_CYCLES_PER_GRAPH)
    return statistics.median(timer.sample_ms(fn) * 1e-3 for _ in range(repeats))


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 20) -> float:
    """Device copy bandwidth in bytes/s, counting the bytes read plus the bytes written.

    On CUDA this is a device-to-device copy timed with events; on CPU, a host memcpy timed with
    the wall clock (only there to keep the pipeline's columns filled).
    """
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 256)
    dst = torch.empty_like(src)
    if device.type == "cuda":
        seconds = _time_events(lambda: dst.copy_(src), repeats)
    else:
        dst.copy_(src)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            dst.copy_(src)
            samples.append(time.perf_counter() - start)
        seconds = statistics.median(samples)
    return 2 * nbytes / seconds
