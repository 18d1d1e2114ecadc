"""How much of a one-call-per-replay time any kernel pays: the floor under the small-batch row.

    PYTHONPATH=packages/layouts/src:packages/jit/src:packages/schedule/src:packages/attn-scores/src:tools \\
        python tools/small_batch_floor.py [--rounds 2]

Times, one call per CUDA-graph replay exactly as the benchmark's small-batch rows do
(`bench.timing.time_single_replays`: once after an L2 flush, once L2-warm), three graphs:

- a spin kernel of zero cycles: the graph launch and a kernel that reads nothing;
- a one-element `add_`: the same plus one dependent read (and write) of global memory;
- the op at the small-batch target's shape (fp8 next_n 1, B 1, L 4k, block 64, the benchmark's
  case and first rotation set), checked against nothing: `tools/bench` checks that case.

After the flush the kernels' code, their parameters' backing and their data all come from HBM.
The difference between the first two rows and the op says how much of the op's cold time is
its own; the first row says what no kernel can go under. Rounds alternate, so drift shows up
as a difference between rounds.
"""

from __future__ import annotations

import argparse

import torch
from bench.data import build_case
from bench.ops import op_call
from bench.shapes import IndexerShape
from bench.timing import settle, time_single_replays

TARGET = IndexerShape("fp8", 1, 4096, 1, 64)


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
    calls = {
        "empty kernel (spin of 0 cycles)": lambda: torch.cuda._sleep(0),
        "one-element add_": lambda: one.add_(1.0),
        f"fp8 next_n 1, B 1, L 4k, block {TARGET.block_size}": op_call(case, case.sets[0]),
    }
    settle(device)
    print(f"us per replay on {torch.cuda.get_device_name(device)}, one call per graph replay")
    print(f"{'graph':<40s} {'round':>5s} {'after a flush':>14s} {'L2-warm':>8s}")
    for round_index in range(args.rounds):
        for label, call in calls.items():
            cold = time_single_replays(call).median_us
            warm = time_single_replays(call, cold=False).median_us
            print(f"{label:<40s} {round_index + 1:>5d} {cold:>14.2f} {warm:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
