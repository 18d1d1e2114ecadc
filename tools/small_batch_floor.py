"""How much of a one-call-per-replay time any kernel pays: the floor under the small-batch row.

    PYTHONPATH=packages/layouts/src:packages/jit/src:packages/schedule/src:packages/attn-scores/src:tools \\
        python tools/small_batch_floor.py [--rounds 2]

Three calls, each captured alone in a graph and timed one replay at a time (the host's launch
hidden behind a spin kernel, `bench.timing`):

- a spin kernel of zero cycles: the graph launch and a kernel that reads nothing;
- a one-element `add_`: the same plus one dependent read (and write) of global memory;
- the op at the small-batch target's shape (fp8 next_n 1, B 1, L 4k, block 64, the benchmark's
  case and first rotation set), checked against nothing: `tools/bench` checks that case.

Each is timed the benchmark's two ways (`time_single_replays`): one replay after an L2 flush,
and the L2-warm window (32 replays in a row, divided by 32). Between those, rows that take the
cold reading apart, queued ahead of the timed replay:
- "after a flush and itself": the flush, then one untimed replay of the same graph, so whatever
  that graph reads (code, parameters, data) is back in L2;
- "one replay, no flush": nothing, so the previous sample's replay left everything in L2; this
  differs from the window only in being one replay alone behind the spin. Its samples spread
  most: on 2026-12-02 some rounds read 4-12 us, more than after a flush, and the others read
  as "after a flush and itself". With no flush the GPU has little to do between samples while
  the host prepares the next one (only the spin, on one SM); the cause was not measured;
- for the op, "then code reloaded": after the flush a graph of the op on the case's second
  rotation set (its own q, table and pages) runs, so the kernel's instructions are back in L2
  and the first set's data is not; "then data reloaded": torch reads the first set's q, weights,
  table, lengths and valid pages, so its data is back and the kernel's code is not; both;
  and "then a twin graph": a second graph of the very same call (code and data back in L2, but
  not the timed graph's own copy of the kernel parameters, which hold the KV tensor map).

Rounds alternate, so drift shows up as a difference between rounds.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from bench.data import CallInputs, CaseData, build_case
from bench.ops import op_call
from bench.shapes import IndexerShape
from bench.timing import (
    SINGLE_REPLAY_SAMPLES,
    SPIN_CYCLES_PER_GRAPH,
    SpinTimer,
    flush_l2,
    settle,
    time_single_replays,
)

TARGET = IndexerShape("fp8", 1, 4096, 1, 64)


def read_inputs(case: CaseData, inputs: CallInputs) -> Callable[[], None]:
    """A closure that reads (on the GPU, queued) every byte one call of `inputs` reads."""
    block_size = case.shape.block_size
    pages = torch.cat(
        [
            inputs.block_tables[b, : -(-length // block_size)]
            for b, length in enumerate(case.seq_lens)
        ]
    ).long()
    pool_rows = case.kv_fused.view(case.kv_fused.shape[0], -1)
    small = [inputs.q.view(torch.uint8), inputs.weights, inputs.block_tables, inputs.seq_lens]
    if inputs.q_sf is not None:
        small.append(inputs.q_sf)

    def read() -> None:
        for tensor in small:
            tensor.sum()
        pool_rows.index_select(0, pages).sum()

    return read


def one_call_graph(call: Callable[[], object]) -> torch.cuda.CUDAGraph:
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def time_one_replay(
    call: Callable[[], object], before: Callable[[torch.cuda.CUDAGraph], None] | None
) -> float:
    """Median us of one replay of `call`'s graph behind the spin, `before(graph)` queued ahead
    of the spin on every sample (None: nothing, so the sample before left its data in L2)."""
    graph = one_call_graph(call)
    timer = SpinTimer(SPIN_CYCLES_PER_GRAPH)
    ahead = None if before is None else (lambda: before(graph))
    samples = [
        timer.sample_ms(graph.replay, before=ahead) * 1e3 for _ in range(SINGLE_REPLAY_SAMPLES)
    ]
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "small_batch_floor.py needs a CUDA GPU: torch.cuda.is_available() is False"
        )
    device = torch.device("cuda")
    one = torch.zeros(1, dtype=torch.float32, device=device)
    case = build_case(TARGET, device)
    if len(case.sets) < 2:
        raise SystemExit(f"the case {TARGET} has {len(case.sets)} rotation set; 2 needed")
    op_label = f"fp8 next_n 1, B 1, L 4k, block {TARGET.block_size}"
    op = op_call(case, case.sets[0])
    other_set_graph = one_call_graph(op_call(case, case.sets[1]))  # its own q, table, pages
    # Reloads are graphs too, so each is queued in microseconds: a host gap between the flush
    # and the spin leaves the GPU idle, and an idle GPU's next replay is slower (the "no flush"
    # rows), which would mix into what the reload rows are meant to show.
    # The closure stays referenced: the graph reads its index tensor at the captured address.
    read_closure = read_inputs(case, case.sets[0])
    read_data = one_call_graph(read_closure).replay
    twin_graph = one_call_graph(op)  # the same call, its own kernel-parameter copy

    def flushed_then(*reloads: Callable[[], object]) -> Callable[[torch.cuda.CUDAGraph], None]:
        def before(_graph: torch.cuda.CUDAGraph) -> None:
            flush_l2(device)
            for reload in reloads:
                reload()

        return before

    def flushed_then_itself(graph: torch.cuda.CUDAGraph) -> None:
        flush_l2(device)
        graph.replay()

    empty = lambda: torch.cuda._sleep(0)  # noqa: E731
    add = lambda: one.add_(1.0)  # noqa: E731
    rows: list[tuple[str, Callable[[], float]]] = []
    for label, call in (("empty kernel (spin of 0 cycles)", empty), ("one-element add_", add)):
        rows += [
            (f"{label}: after a flush", lambda c=call: time_single_replays(c).median_us),
            (
                f"{label}: after a flush and itself",
                lambda c=call: time_one_replay(c, flushed_then_itself),
            ),
            (f"{label}: one replay, no flush", lambda c=call: time_one_replay(c, None)),
            (
                f"{label}: L2-warm window",
                lambda c=call: time_single_replays(c, cold=False).median_us,
            ),
        ]
    rows += [
        (f"{op_label}: after a flush", lambda: time_single_replays(op).median_us),
        (
            "  the same, then code reloaded",
            lambda: time_one_replay(op, flushed_then(other_set_graph.replay)),
        ),
        ("  the same, then data reloaded", lambda: time_one_replay(op, flushed_then(read_data))),
        (
            "  the same, then code and data reloaded",
            lambda: time_one_replay(op, flushed_then(other_set_graph.replay, read_data)),
        ),
        (
            "  the same, then a twin graph (this call captured again)",
            lambda: time_one_replay(op, flushed_then(twin_graph.replay)),
        ),
        (f"{op_label}: after a flush and itself", lambda: time_one_replay(op, flushed_then_itself)),
        (f"{op_label}: one replay, no flush", lambda: time_one_replay(op, None)),
        (f"{op_label}: L2-warm window", lambda: time_single_replays(op, cold=False).median_us),
    ]
    settle(device)
    print(f"us per replay on {torch.cuda.get_device_name(device)}, one call per graph replay")
    print(
        f"{'graph: how':<64s} "
        + " ".join(f"{'round ' + str(r + 1):>8s}" for r in range(args.rounds))
    )
    readings = {label: [] for label, _ in rows}
    for _ in range(args.rounds):
        for label, measure in rows:
            readings[label].append(measure())
    for label, values in readings.items():
        print(f"{label:<64s} " + " ".join(f"{v:8.2f}" for v in values), flush=True)


if __name__ == "__main__":
    main()
