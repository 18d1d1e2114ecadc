"""The benchmark's two paged-gather ceiling kernels on the same cases, twice each, interleaved,
each launched without and with programmatic dependent launch (PDL).

    PYTHONPATH=packages/layouts/src:packages/jit/src:packages/schedule/src:packages/attn-scores/src:tools \\
        python tools/gather_kinds.py

`tools/bench` times both kernels (`bench.gather.KINDS`) on every case and keeps the faster as
the case's read-only ceiling. This prints both, as fractions of a copy measured in the same
run, on large, mid-size and small fp8 / fp4 cases at next_n 1 (the cases the benchmark builds:
lengths 0.7-1.3 of L, shuffled blocks in a pool well beyond L2, rotation sets). Up to the
thirty-sixth run the benchmark launched the gathers without PDL and the ops with it; the
`pdl` cells show what that difference was worth.
"""

from __future__ import annotations

import torch
from bench.cli import time_gather
from bench.data import build_case
from bench.gather import KINDS
from bench.shapes import IndexerShape
from bench.timing import copy_bandwidth
from script_start import script_start

# (op, B, L, block size)
CASES = [
    *[("fp8", 128, 65536, bs) for bs in (32, 64, 128)],
    *[("fp4", 128, 65536, bs) for bs in (32, 64, 128)],
    ("fp8", 128, 4096, 64),
    ("fp8", 64, 16384, 64),
    ("fp8", 1, 4096, 64),
    ("fp8", 8, 65536, 32),
]


def main() -> None:
    script_start(__doc__, "gather_kinds", needs_gpu=True)
    device = torch.device("cuda")
    copy = copy_bandwidth(device, 1 << 30)
    print(f"copy {copy / 1e9:.0f} GB/s (read + written); per kernel: us per call, of copy")
    for op, batch, avg_len, block_size in CASES:
        case = build_case(IndexerShape(op, batch, avg_len, 1, block_size), device)
        cells = []
        for _ in range(2):
            for kind in KINDS:
                for programmatic in (False, True):
                    ceiling = time_gather(case, kind, device, programmatic)
                    label = kind + (" pdl" if programmatic else "")
                    cells.append(
                        f"{label} {ceiling.timing.median_us:7.1f} {ceiling.bytes_per_s / copy:5.3f}"
                    )
        print(f"{op} B {batch:3d} L {avg_len:5d} block {block_size:3d}: " + " | ".join(cells))
        del case
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
