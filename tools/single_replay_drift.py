"""Why the benchmark times one-call graph replays with one graph: a window of different graphs
drifts upward within a process.

    PYTHONPATH=packages/layouts/src:packages/jit/src:packages/schedule/src:packages/attn-scores/src:tools \\
        python tools/single_replay_drift.py [--cases 15]

Runs the benchmark's small-batch fp8 cases one after another (`bench.cli.run_case`, no gather)
and, after every third, times one call of fp8 next_n 1, B 8, L 4k, block 64 alone per graph
replay four ways: a window of 32 different one-call graphs (one per rotation set) with and
without an L2 flush before each window (the form `tools/bench` used up to the twentieth run),
one graph replayed 32 times in a row, and one graph replayed once after an L2 flush (the two
forms `bench.timing.time_single_replays` uses now). On the H200 (2026-11-30) the two windows of
different graphs read 4-5 us more per replay from about the tenth case of the process on; the
one-graph forms did not move (kernel notes, twenty-eighth round).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench.cli import run_case
from bench.data import build_case
from bench.ops import op_call
from bench.shapes import IndexerShape, gpu_grid
from bench.timing import flush_l2, settle, time_single_replays

TARGET = IndexerShape("fp8", 8, 4096, 1, 64)
WINDOW = 32
SAMPLES = 20


def distinct_graphs_window(calls, device: torch.device, *, flush: bool) -> float:
    """Median us per replay of windows of up to 32 different one-call graphs replayed in turn."""
    graphs = []
    for call in calls[:WINDOW]:
        call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        graph.replay()
        graphs.append(graph)
    torch.cuda.synchronize()
    per_call = []
    for _ in range(SAMPLES):
        if flush:
            flush_l2(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(2_000_000)  # about 1 ms: outlasts queueing 32 replays
        start.record()
        for graph in graphs:
            graph.replay()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / len(graphs))
    return statistics.median(per_call)


def measure(device: torch.device, label: str) -> None:
    case = build_case(TARGET, device)
    calls = [op_call(case, inputs) for inputs in case.sets]
    settle(device)
    flushed = distinct_graphs_window(calls, device, flush=True)
    unflushed = distinct_graphs_window(calls, device, flush=False)
    warm = time_single_replays(calls[0], cold=False).median_us
    cold = time_single_replays(calls[0]).median_us
    print(
        f"{time.strftime('%H:%M:%S')} {label:>14s} | {flushed:8.2f} {unflushed:8.2f} | "
        f"{warm:8.2f} {cold:8.2f}",
        flush=True,
    )
    del case, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=15, help="benchmark cases to run in between")
    args = parser.parse_args()
    device = torch.device("cuda")
    print(
        "us per replay, fp8 next_n 1, B 8, L 4k, block 64\n"
        "                        32 different graphs | one graph\n"
        "time     after cases    flushed   as is   | 32 in a row  1 after a flush"
    )
    measure(device, "none")
    shapes = [shape for shape in gpu_grid(["fp8"], False) if shape.small_batch]
    for i, shape in enumerate(shapes[: args.cases]):
        run_case(shape, device, gather=False)
        if i % 3 == 2:
            measure(device, str(i + 1))


if __name__ == "__main__":
    main()
