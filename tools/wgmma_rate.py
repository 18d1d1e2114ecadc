"""FP8 WGMMA on one SM90 GPU: RS against SS, and how CUDA-core work overlaps it.

    PYTHONPATH=packages/jit/src:packages/attn-scores/src python tools/wgmma_rate.py

The logits consumers alternate CUDA-core work (the fp4 E2M1 decode, the epilogue) with
m64nNk32 WGMMAs over K = 128 (a "unit"). This times that pattern in isolation, one CTA per SM
(`tools/wgmma_rate.cu`): A from registers (RS, as the fp4 kernel) or shared memory (SS, as the
fp8 kernel); 1-4 warpgroups; 0 or 128 CUDA-core instructions per thread and unit of one kind
(LOP3, PRMT, FFMA, IMAD); every warpgroup doing both, or half of them only MMAs and half only
the CUDA-core work; optionally a logits epilogue after each MMA wait, and the CUDA-core
warpgroups storing their results as shared-memory tiles. Prints cycles per unit (median over warpgroups), the SM's FP8 rate in FLOP
per cycle (dense peak 8192 per SM on Hopper) and its CUDA-core rate in warp instructions per
cycle (LOP3/PRMT/IMAD: 2 per SM per cycle at most, FFMA 4).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from flashinfer_jit import KernelSpec, load_kernel, sm_count, u32

CSRC = (
    Path(__file__).resolve().parents[1]
    / "packages/attn-scores/src/flashinfer_attn_scores/paged_mqa_logits/csrc"
)
SOURCE = Path(__file__).resolve().parent / "wgmma_rate.cu"
OPS = {"LOP3": 0, "PRMT": 1, "FFMA": 2, "IMAD": 3, "FADD": 4, "HFMA2": 5, "FMNMX": 6}
SPLITS = {"both": 0, "halves": 1, "no MMA": 2}

# (N, RS, warpgroups, CUDA-core instructions per thread and unit, op, split[, epilogue, store,
# overlap])
CONFIGS = [
    (64, False, 4, 0, "LOP3", "both"),
    (64, True, 4, 0, "LOP3", "both"),
    (64, True, 1, 0, "LOP3", "both"),
    *[(64, True, 4, 128, op, "no MMA") for op in OPS],
    *[(64, True, 4, 128, op, "both") for op in ("LOP3", "PRMT", "FFMA", "IMAD")],
    *[(64, False, 4, 128, op, "both") for op in ("LOP3", "FFMA")],
    (64, True, 2, 0, "LOP3", "both"),
    (64, True, 2, 256, "LOP3", "no MMA"),
    *[(64, False, 4, 256, op, "halves") for op in ("LOP3", "FFMA")],
    (128, True, 4, 0, "LOP3", "both"),
    *[(128, True, 4, 128, op, "both") for op in ("LOP3", "FFMA")],
    (128, False, 4, 256, "FFMA", "halves"),
    # The fp4 consumer as built (decode, RS MMA, epilogue in every warpgroup) against decode
    # warpgroups that store E4M3 tiles for MMA warpgroups with the epilogue.
    (64, True, 4, 96, "PRMT", "both", True, False),
    (64, False, 4, 192, "PRMT", "halves", True, False),
    (64, False, 4, 192, "PRMT", "halves", True, True),
    (64, False, 4, 192, "LOP3", "halves", True, True),
    (64, False, 4, 0, "LOP3", "both", True, False),
    # More instruction kinds, and the CUDA-core work issued while the MMAs are in flight.
    *[(64, True, 4, 128, op, "both") for op in ("FADD", "HFMA2", "FMNMX")],
    *[
        (64, rs, 4, 128, op, "both", False, False, True)
        for rs in (False, True)
        for op in ("LOP3", "FFMA")
    ],
    (128, False, 4, 128, "FFMA", "both", False, False, True),
]


def measure(
    n, rs, warpgroups, alu_ops, op, split, epilogue, store, overlap, iters
) -> tuple[float, float]:
    """Median cycles per unit of the MMA-issuing and of the CUDA-core-only warpgroups."""
    defines = {
        "TILE_N": n,
        "RS": int(rs),
        "WARPGROUPS": warpgroups,
        "ITERS": iters,
        "ALU_OPS": alu_ops,
        "OP": OPS[op],
        "SPLIT": SPLITS[split],
        "EPI": int(epilogue),
        "STORE": int(store),
        "OVERLAP": int(overlap),
    }
    kernel = load_kernel(KernelSpec.make("wgmma_rate", SOURCE, defines, include_dirs=(CSRC,)))
    sms = sm_count()
    threads = 128 * warpgroups
    cycles = torch.zeros(sms, warpgroups, dtype=torch.int64, device="cuda")
    sink = torch.zeros(sms * threads, device="cuda")
    for seed in (1, 2):  # the first launch warms up
        shared = (64 + n) * 128 + 4 * 8192 + 1024
        kernel.launch(sms, threads, cycles, sink, u32(seed), shared_mem=shared)
    torch.cuda.synchronize()
    per_wg = cycles.cpu() / iters
    mma_wgs = {"both": warpgroups, "halves": warpgroups // 2, "no MMA": 0}[split]
    mma = statistics.median(per_wg[:, :mma_wgs].flatten().tolist()) if mma_wgs else float("nan")
    alu = statistics.median(per_wg[:, mma_wgs:].flatten().tolist()) if mma_wgs < warpgroups else mma
    return mma, alu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument(
        "--only", type=int, nargs="*", help="indices into CONFIGS (e.g. one config under ncu)"
    )
    args = parser.parse_args()
    print(
        f"{'N':>4} {'form':>4} {'WGs':>3} {'split':>7} {'op':>5} {'ops':>4} {'epi':>3} {'st':>2} {'ov':>2}"
        f" {'MMA WG cyc/unit':>16} {'ALU WG cyc/unit':>16} {'FLOP/cyc/SM':>12} {'ALU instr/cyc/SM':>17}"
    )
    chosen = [CONFIGS[i] for i in args.only] if args.only else CONFIGS
    for n, rs, warpgroups, alu_ops, op, split, *extra in chosen:
        epilogue, store, overlap = (*extra, False, False, False)[:3]
        mma, alu = measure(
            n, rs, warpgroups, alu_ops, op, split, epilogue, store, overlap, args.iters
        )
        mma_wgs = {"both": warpgroups, "halves": warpgroups // 2, "no MMA": 0}[split]
        alu_wgs = warpgroups - mma_wgs if split != "both" else warpgroups
        flops = 2 * 64 * n * 128 * mma_wgs / mma if mma_wgs else 0.0
        alu_rate = 4 * alu_wgs * alu_ops / alu if alu_ops else 0.0
        print(
            f"{n:>4} {'RS' if rs else 'SS':>4} {warpgroups:>3} {split:>7} {op:>5} {alu_ops:>4}"
            f" {'y' if epilogue else '-':>3} {'y' if store else '-':>2} {'y' if overlap else '-':>2}"
            f" {mma:>16.1f} {alu:>16.1f} {flops:>12.0f} {alu_rate:>17.2f}"
        )


if __name__ == "__main__":
    main()
