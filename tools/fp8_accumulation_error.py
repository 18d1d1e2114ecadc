"""How the FP8 tensor cores' accumulation error grows with head_dim (SM90 GPU only).

    python tools/fp8_accumulation_error.py [--head-dims 32,128,576] [--seeds 0,1,2]
    python tools/fp8_accumulation_error.py --random-seed 4420017 --shapes wide --batches large

Hopper's FP8 WGMMA does not add in IEEE float32: each k step's products are aligned to the
largest exponent and summed with fewer bits (docs/numerics.md). A head_dim of D is D / 32 such
steps into one accumulator, so the error of one dot product, as a fraction of its summed
|products| (sum_d |q_d k_d|), may grow with D. This measures it directly: 4 heads, and weights
that keep one head per row (`keep_one_head_per_row`), so each logit is one relu(q_h . k)
times the token scale, compared with the float64 expectation of `attn_scores_cases`. Prints,
per head_dim and accumulator dtype, the largest, the 99.9th percentile and the median of
|error| / (scale * sum_d |q_hd k_d|) over every valid logit, as log2, beside the bound the
GPU tests accept (`accumulation_error`).

`--random-seed` instead replays seeds of `tools/random_cases.py` and prints the same ratio of
their worst element (the random-call test's per-element accumulation term, with all of a row's
heads summed: sum_h |w_h| sum_d |q_hd k_d|).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packages/attn-scores/tests/paged_mqa_logits"))

import flashinfer_attn_scores as fa  # noqa: E402
from attn_scores_cases import accumulation_error  # noqa: E402
from test_gpu_accumulation import error_ratios, one_head_error_ratios  # noqa: E402

LENGTHS = [2048] * 16  # 16 requests x 2 draft rows x ~2k positions: ~65k logits per call


def log2_text(value: float) -> str:
    return "-inf" if value == 0 else f"{math.log2(value):6.2f}"


def sweep(head_dims: list[int], seeds: list[int]) -> None:
    print(
        "| head_dim | k steps | acc_dtype | logits | log2 max | log2 p99.9 | log2 median "
        "| log2 bound |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for head_dim in head_dims:
        for acc_dtype in (torch.float32, torch.float16):
            ratios = []
            for seed in seeds:
                ratios.append(one_head_error_ratios(head_dim, acc_dtype, LENGTHS, seed))
            every = torch.cat(ratios)
            print(
                f"| {head_dim} | {head_dim // 32} | {str(acc_dtype).split('.')[-1]} | "
                f"{every.numel()} | {log2_text(float(every.max()))} | "
                f"{log2_text(float(torch.quantile(every.float(), 0.999)))} | "
                f"{log2_text(float(every.median()))} | "
                f"{log2_text(accumulation_error(acc_dtype, head_dim))} |",
                flush=True,
            )


def replay(seeds: list[int], shapes: str, batches: str) -> None:
    from test_gpu_random_cases import build_case, draw_call

    for seed in seeds:
        call = draw_call(seed, "fp8", shapes, batches)
        case = build_case(call, "fp8", seed)
        output_dtype, epi_dtype, acc_dtype = call["dtypes"]
        got = fa.fp8_paged_mqa_logits(
            case.q,
            case.kv_fused,
            case.weights,
            case.block_tables,
            case.seq_lens,
            case.max_seq_len,
            output_dtype=output_dtype,
            epi_dtype=epi_dtype,
            acc_dtype=acc_dtype,
        )
        ratio = error_ratios(got, case)  # the expectation sums where the case is
        print(
            f"seed {seed}: heads {call['num_heads']}, head_dim {call['head_dim']}, next_n "
            f"{call['next_n']}, dtypes {[str(d).split('.')[-1] for d in call['dtypes']]}: "
            f"worst |error| / (scale sum_h |w_h| sum_d |q_hd k_d|) = 2^"
            f"{log2_text(float(ratio.max())).strip()} over {ratio.numel()} logits"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", default="32,64,128,160,256,384,512,576,1024,1600")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--random-seed", action="append", type=int, default=[])
    parser.add_argument("--shapes", default="suite")
    parser.add_argument("--batches", default="small")
    args = parser.parse_args()
    if args.random_seed:
        replay(args.random_seed, args.shapes, args.batches)
        return
    head_dims = [int(d) for d in args.head_dims.split(",")]
    sweep(head_dims, [int(s) for s in args.seeds.split(",")])


if __name__ == "__main__":
    main()
