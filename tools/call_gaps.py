"""Where the time of an fp8 logits call goes, CTA by CTA, in a graph of calls (GPU only).

    python tools/call_gaps.py [--calls 4] [--replays 10] [--pdl-order 1,0] [--shapes 1:64:128:4096,...]

For each shape (next_n:block:B:L), `--calls` cases with their own page pools (so no call finds
its pages in L2) are captured into one graph, once per entry of `--pdl-order` (FLASHINFER_PDL).
The graph of plain calls gives the period per call (CUDA events, median of `--replays`).
The same graph of `EXP_TIMESTAMPS=2` kernels gives each CTA's %globaltimer readings (see the
FP8 kernel's header), from which, in us from the call's first CTA entry (after the PDL wait):

    span          consumer warpgroup 0's last exit (the kernel's own time)
    gap           the next call's first CTA entry after that exit
    rows          the median CTA's schedule rows known
    issue_med     the median CTA's first KV copy issued (producer warp 0)
    staged_med    the median CTA's first q staged (staging warp 1)
    q_held_med    the median CTA's consumer 0 holding its first q slot
    data_med      the median CTA's consumer 0 finding its first stage full
    producer_med  the median CTA's producer warp 0 done (its last copy issued)
    end_min, end_med   the first and the median CTA's consumer 0 exit

and, per number of requests in a CTA's range of the schedule, the CTAs' streaming time (first
full stage to consumer 0's exit): what a request switch inside a CTA's run costs. Medians over
the calls after the first of each replay (the first waits for the host) and over the replays.

What balancing the CTAs' work could gain, from the same stamps (each CTA streaming at its own
measured rate, its work movable at no cost):

    bal_all       the span if all CTAs shared one pool of units: the median first full stage
                  plus the harmonic mean of the streaming times
    bal_group     the span if each group of `--cluster` CTAs (blockIdx 2i, 2i+1, ... for
                  --cluster 2) shared its units: the latest group's first full stage plus the
                  harmonic mean of its streaming times (the span itself with --cluster 1)

`--clock` adds, per shape, the median CTA's SM cycles (%clock64, exact inside one CTA) from its
rows known to its walker start, first copy, first q slot held, first full stage and consumer 0's
exit: %globaltimer does not resolve steps under about 1 us. `--define NAME=VALUE` (repeatable) compiles both graphs' kernels with that define, e.g. a
measurement knob. `--cluster N` launches both graphs in clusters of N CTAs (the `EXP_CLUSTER` launch knob), so a
group is what the hardware co-schedules in one GPC; `entry_max` then shows whether every
cluster found room at once (a CTA entering after others exit means a second wave).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_kernel_check as check

SHAPES = [  # next_n, block size, batch, average length
    (1, 64, 64, 4096),
    (1, 64, 128, 4096),
    (2, 64, 64, 4096),
    (1, 64, 128, 16384),
    (1, 64, 8, 16384),
]


def _period_us(calls, replays: int) -> float:
    """Median time per call of a graph of `calls` (fp8_kernel_check.bench over the whole list)."""
    return check.bench(lambda: [call() for call in calls], iters=replays) * 1e6 / len(calls)


def _harmonic_mean(values: list[float]) -> float:
    return len(values) / sum(1.0 / max(v, 1e-3) for v in values)


def _balanced_spans(starts: list[float], streaming: list[float], group: int) -> tuple[float, float]:
    """(bal_all, bal_group): the spans if the CTAs, or each group of `group` consecutive CTAs,
    shared their units, each CTA keeping its measured streaming rate."""
    bal_all = statistics.median(starts) + _harmonic_mean(streaming)
    bal_group = max(
        max(starts[i : i + group]) + _harmonic_mean(streaming[i : i + group])
        for i in range(0, len(starts), group)
    )
    return bal_all, bal_group


def _captured(calls) -> torch.cuda.CUDAGraph:
    """One graph of `calls`, each run once eagerly first (compiles, prepared launches)."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for call in calls:
            call()
    return graph


def _replayed(graph: torch.cuda.CUDAGraph, stamps) -> list[torch.Tensor]:
    """The readings of one replay, on the host (the stamp tensors zeroed before it)."""
    for s in stamps:
        s.zero_()
    graph.replay()
    torch.cuda.synchronize()
    return [s.cpu() for s in stamps]


def _timeline(calls, cases, stamps, replays: int, group: int = 1) -> dict:
    graph = _captured(calls)
    samples: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    by_requests: dict[int, list[float]] = {}
    requests_per_cta = [_requests_per_cta(case["seq_lens"]) for case in cases]
    for _ in range(replays):
        readings = _replayed(graph, stamps)
        # us; in int64 until a base is subtracted (%globaltimer counts ns since an epoch,
        # ~1.7e18, where a double's step is 256 ns)
        base = min(int(r[:, 0].min()) for r in readings)
        timelines = [(r - base).double() / 1e3 for r in readings]
        for i in range(1, len(calls)):  # the first call of a replay waits for the host
            t = timelines[i]
            first = float(t[:, 0].min())
            ends = t[:, 3] - first  # consumer warpgroup 0's exit (EXP_TIMESTAMPS=2)
            add("span", float(ends.max()))
            add("rows", float(t[:, 1].median()) - first)
            add("entry_max", float(t[:, 0].max()) - first)
            add("end_min", float(ends.min()))
            add("end_med", float(ends.median()))
            add("producer_med", float((t[:, 2] - first).median()))
            add("data_med", float((t[:, 7] - first).median()))
            add("issue_med", float((t[:, 4] - first).median()))
            add("q_held_med", float((t[:, 5] - first).median()))
            add("staged_med", float((t[:, 6] - first).median()))
            streaming = (t[:, 3] - t[:, 7]).tolist()  # first full stage to consumer 0's exit
            bal_all, bal_group = _balanced_spans((t[:, 7] - first).tolist(), streaming, group)
            add("bal_all", bal_all)
            add("bal_group", bal_group)
            for requests, duration in zip(requests_per_cta[i], streaming):
                by_requests.setdefault(requests, []).append(duration)
            if i + 1 < len(calls):
                add("gap", float(timelines[i + 1][:, 0].min()) - (first + float(ends.max())))
    result = {name: statistics.median(values) for name, values in samples.items()}
    result["by_requests"] = {
        n: (len(v) // replays, statistics.median(v), max(v)) for n, v in sorted(by_requests.items())
    }
    return result


CLOCK_COLUMNS = (  # (name, slot) under EXP_STAMP_CLOCK=1 with EXP_STAMP_WALK=1
    ("walker", 6),  # producer warp 0 past setmaxnreg and its walker's start
    ("first_copy", 4),
    ("q_held", 5),
    ("first_full", 7),
    ("c0_exit", 3),
)


def _cycles(calls, stamps, replays: int) -> dict:
    """`--clock`: per CTA, SM cycles from its rows known (slot 1) to each CLOCK_COLUMNS reading;
    the median CTA's, median over the calls after the first of each replay and the replays."""
    graph = _captured(calls)
    samples: dict[str, list[float]] = {name: [] for name, _ in CLOCK_COLUMNS}
    for _ in range(replays):
        for t in _replayed(graph, stamps)[1:]:
            for name, slot in CLOCK_COLUMNS:
                samples[name].append(float((t[:, slot] - t[:, 1]).double().median()))
    return {name: statistics.median(values) for name, values in samples.items()}


def _requests_per_cta(seq_lens: torch.Tensor) -> list[int]:
    """How many requests each CTA's range of the schedule touches."""
    from flashinfer_schedule import compute_paged_mqa_logits_schedule

    lens = seq_lens.cpu()
    ctas = torch.cuda.get_device_properties(0).multi_processor_count
    rows = compute_paged_mqa_logits_schedule(lens, "cpu", num_sms=ctas).tolist()
    units = [(n - 1) // 64 + 1 if n > 0 else 0 for n in lens.tolist()]
    counts = []
    for (b0, _), (b1, u1) in itertools.pairwise(rows):
        last = b1 if u1 > 0 else b1 - 1
        counts.append(sum(1 for b in range(b0, min(last, len(units) - 1) + 1) if units[b] > 0))
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument(
        "--pdl-order", default="1,0", help="PDL settings in the order measured, e.g. 0,1,0,1"
    )
    parser.add_argument("--shapes", help="next_n:block:B:L,... (default: the SHAPES list)")
    parser.add_argument(
        "--cluster", type=int, default=1, help="launch in clusters of this many CTAs (1: none)"
    )
    parser.add_argument(
        "--define",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a kernel define for both graphs (a measurement knob such as EXP_SWITCH_Q=1)",
    )
    parser.add_argument(
        "--clock",
        action="store_true",
        help="also print SM cycles from each CTA's rows known to its milestones (EXP_STAMP_CLOCK)",
    )
    args = parser.parse_args()
    launch = (("EXP_CLUSTER", args.cluster),) if args.cluster > 1 else ()
    for define in args.define:
        name, _, value = define.partition("=")
        launch += ((name, int(value)),)
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in shape.split(":")) for shape in args.shapes.split(",")]
    ctas = torch.cuda.get_device_properties(0).multi_processor_count
    columns = (
        "span",
        "gap",
        "rows",
        "issue_med",
        "staged_med",
        "q_held_med",
        "data_med",
        "producer_med",
        "end_min",
        "end_med",
        "entry_max",
        "bal_all",
        "bal_group",
    )
    print(
        "next_n bs    B      L   PDL  period " + " ".join(f"{c:>12}" for c in columns) + "   (us)"
    )
    for next_n, block_size, batch, avg in shapes:
        cases = [
            check.timing_case(next_n, block_size, batch, avg, seed=3 + i)[0]
            for i in range(args.calls)
        ]
        for pdl in args.pdl_order.split(","):
            os.environ["FLASHINFER_PDL"] = pdl
            plain = [check.fp8_call(case, None, launch) for case in cases]
            stamps = [torch.zeros(ctas, 8, dtype=torch.int64, device="cuda") for _ in cases]
            stamped = [
                check.fp8_call(case, None, (("EXP_TIMESTAMPS", 2), *launch), schedule_rows_out=s)
                for case, s in zip(cases, stamps)
            ]
            period = _period_us(plain, args.replays)
            timeline = _timeline(stamped, cases, stamps, args.replays, args.cluster)
            if args.clock:
                clocked = [
                    check.fp8_call(
                        case,
                        None,
                        (
                            ("EXP_TIMESTAMPS", 2),
                            ("EXP_STAMP_CLOCK", 1),
                            ("EXP_STAMP_WALK", 1),
                            *launch,
                        ),
                        schedule_rows_out=s,
                    )
                    for case, s in zip(cases, stamps)
                ]
                cycles = _cycles(clocked, stamps, args.replays)
                print(
                    "    SM cycles from rows known (median CTA): "
                    + ", ".join(f"{name} {value:.0f}" for name, value in cycles.items())
                )
            print(
                f"{next_n:6d} {block_size:2d} {batch:4d} {avg:6d} {pdl:>5} {period:7.2f} "
                + " ".join(f"{timeline[c]:12.2f}" for c in columns)
            )
            print(
                "    streaming (first full stage to consumer 0's exit) by requests in the CTA's range:"
                " requests: CTAs per call, median us, max us: "
                + "; ".join(
                    f"{n}: {c}, {m:.2f}, {x:.2f}"
                    for n, (c, m, x) in timeline["by_requests"].items()
                )
            )
        del cases
        torch.cuda.empty_cache()
    os.environ.pop("FLASHINFER_PDL", None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
