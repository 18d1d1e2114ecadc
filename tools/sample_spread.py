"""Why one benchmark case's samples spread: each sample's time beside the SM clock.

    python tools/sample_spread.py                      # fp8, next_n 2, block 64, B 128, L 64k
    python tools/sample_spread.py --shape fp8,1,64,128,65536 --samples 400

Times the benchmark's own case (`bench.data.build_case`, every rotation set in one CUDA graph,
one replay between two CUDA events per sample, as `bench.timing.time_graph_replays` does)
while a thread reads the SM clock and the power draw through NVML every quarter millisecond. Each
sample is paired with the reading nearest the middle of its host-side window (from queueing
the replay to the end event's completion), if one lies within half a millisecond. Prints the spread of the samples, their
correlation with the clock, the median time per clock bin, and the series in chunks, so a
reader can tell whether the slow samples are the low-clock ones (the 700 W cap) or something
else. Needs an NVIDIA GPU and `libnvidia-ml.so.1`.
"""

from __future__ import annotations

import argparse
import bisect
import ctypes
import statistics
import threading
import time

import torch
from bench.data import build_case
from bench.ops import op_call
from bench.shapes import IndexerShape

NVML_CLOCK_SM = 1
# A sample is paired with the NVML reading nearest its host-side midpoint, if that close.
MAX_PAIRING_S = 0.5e-3


class ClockPoller(threading.Thread):
    """Reads (host time, SM MHz, W) through NVML every `period_s` until stopped."""

    def __init__(self, period_s: float = 0.25e-3) -> None:
        super().__init__(daemon=True)
        self.period_s = period_s
        self.readings: list[tuple[float, int, float]] = []
        self._done = threading.Event()
        self._nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if self._nvml.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self._handle = ctypes.c_void_p()
        if self._nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self._handle)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex_v2(0) failed")

    def run(self) -> None:
        mhz, milliwatts = ctypes.c_uint(), ctypes.c_uint()
        while not self._done.is_set():
            self._nvml.nvmlDeviceGetClockInfo(self._handle, NVML_CLOCK_SM, ctypes.byref(mhz))
            self._nvml.nvmlDeviceGetPowerUsage(self._handle, ctypes.byref(milliwatts))
            self.readings.append((time.perf_counter(), mhz.value, milliwatts.value / 1e3))
            time.sleep(self.period_s)

    def stop(self) -> None:
        self._done.set()
        self.join()


def pearson(xs: list[float], ys: list[float]) -> float:
    """Pearson's r, or NaN where one side is constant (a clock that never moved)."""
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="fp8,2,64,128,65536", help="op,next_n,block,B,L")
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--preheat-s", type=float, default=2.0, help="replays before sampling")
    args = parser.parse_args()
    op, next_n, block, batch, avg = args.shape.split(",")
    shape = IndexerShape(op, int(batch), int(avg), int(next_n), int(block))
    case = build_case(shape, torch.device("cuda"))
    calls = [op_call(case, inputs) for inputs in case.sets]
    for call in calls:
        call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    began = time.perf_counter()
    while time.perf_counter() - began < args.preheat_s:
        graph.replay()
        torch.cuda.synchronize()

    poller = ClockPoller()
    poller.start()
    samples: list[tuple[float, float, float]] = []  # (host start, host end, us per call)
    for _ in range(args.samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host_start = time.perf_counter()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(
            (host_start, time.perf_counter(), start.elapsed_time(end) * 1e3 / len(calls))
        )
    poller.stop()

    times, clocks, watts = [], [], []
    stamps = [t for t, _, _ in poller.readings]
    for host_start, host_end, us in samples:
        middle = (host_start + host_end) / 2
        i = bisect.bisect_left(stamps, middle)
        near = [j for j in (i - 1, i) if 0 <= j < len(stamps)]
        if not near:
            continue
        j = min(near, key=lambda k: abs(stamps[k] - middle))
        if abs(stamps[j] - middle) <= MAX_PAIRING_S:
            times.append(us)
            clocks.append(poller.readings[j][1])
            watts.append(poller.readings[j][2])
    all_us = sorted(us for _, _, us in samples)

    def pct(q: float) -> float:
        return all_us[min(len(all_us) - 1, int(q * len(all_us)))]

    print(
        f"{args.shape}: {len(calls)} call(s) per replay, {len(samples)} samples, "
        f"{len(poller.readings)} NVML readings"
    )
    print(
        f"us per call: p10 {pct(0.1):.1f}  median {statistics.median(all_us):.1f}  "
        f"p90 {pct(0.9):.1f}  min {all_us[0]:.1f}  max {all_us[-1]:.1f}"
    )
    if len(times) < 10:
        print(f"only {len(times)} samples had an NVML reading inside them; no correlation")
        return
    print(
        f"{len(times)} samples with readings: SM clock {min(clocks):.0f}-{max(clocks):.0f} MHz, "
        f"power {min(watts):.0f}-{max(watts):.0f} W; "
        f"correlation of time with clock {pearson(times, clocks):+.2f}, with power "
        f"{pearson(times, watts):+.2f}"
    )
    print("clock bin (MHz)   samples  median us")
    width = 75
    bins: dict[int, list[float]] = {}
    for us, mhz in zip(times, clocks):
        bins.setdefault(int(mhz // width) * width, []).append(us)
    for low in sorted(bins):
        print(
            f"{low:5d}-{low + width:<5d}      {len(bins[low]):7d} {statistics.median(bins[low]):10.1f}"
        )
    print("series, chunks of 20 samples: median us / mean MHz")
    chunk = 20
    series = []
    for i in range(0, len(times), chunk):
        part_t, part_c = times[i : i + chunk], clocks[i : i + chunk]
        series.append(f"{statistics.median(part_t):.0f}/{statistics.fmean(part_c):.0f}")
    print("  ".join(series))


if __name__ == "__main__":
    main()
