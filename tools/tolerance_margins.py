"""How much of each dtype's test tolerance the kernels use (SM90 GPU only).

    python tools/tolerance_margins.py [--seeds 0,1,2,3] [--lengths 1,127,0,128,129,0,256,257,1000,1300]

The GPU tests accept |kernel - float64 reference| up to `tolerance(output, epi, acc)` of the
largest |weights|-reference term in the row (test_gpu.TOLERANCES). This runs the suite's own
cases (`test_gpu.fp8_case` / `fp4_case`: shuffled pages, negative weights, the edge lengths)
at every block size and next_n for every dtype combination of both ops, and prints per
combination the largest measured error as a fraction of that row magnitude, next to the
tolerance the tests use and their ratio. Used to set the table from measurement, not guesses.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packages/attn-scores/tests/paged_mqa_logits"))

import flashinfer_attn_scores as fa  # noqa: E402
from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask  # noqa: E402
from test_gpu import (  # noqa: E402
    FP8_DTYPES,
    VARIANTS,
    fp4_case,
    fp8_case,
    magnitude_of,
    tolerance,
)

FP4_DTYPES = list(
    itertools.product(
        (torch.bfloat16, torch.float32, torch.float16),
        (torch.float32, torch.float16, torch.bfloat16),
    )
)


def worst_fraction(got, expected, magnitude, mask) -> float:
    """max over valid elements of |got - expected| / (row max of the |weights| magnitude);
    inf where a valid element is NaN."""
    got64 = got.detach().cpu().to(torch.float64)
    expected, magnitude, mask = expected.cpu(), magnitude.cpu().abs(), mask.cpu()
    zeros = torch.zeros_like(expected)
    row_size = torch.where(mask, magnitude, zeros).amax(dim=1).clamp_min(1e-30)
    err = torch.where(mask, (got64 - expected).abs(), zeros)
    # A NaN (an unwritten or poisoned logit) must not vanish in the callers' max(): inf.
    return float((err / row_size[:, None]).nan_to_num(nan=float("inf")).amax())


def fp8_worst(dtypes, seeds, lengths) -> float:
    output_dtype, epi_dtype, acc_dtype = dtypes
    worst = 0.0
    for block_size, next_n, seed in itertools.product((32, 64, 128), (1, 2, 3, 4), seeds):
        case = fp8_case(block_size, next_n, seed=1000 * seed + block_size + next_n, lens=lengths)
        args = case.fp8_args()
        got = fa.fp8_paged_mqa_logits(
            *args, output_dtype=output_dtype, epi_dtype=epi_dtype, acc_dtype=acc_dtype
        )
        reference = VARIANTS["fp8"].reference
        expected = reference(*args)
        mask = valid_mask(case.seq_lens.cpu(), next_n, got.shape[1])
        worst = max(worst, worst_fraction(got, expected, magnitude_of(reference, args), mask))
    return worst


def fp4_worst(dtypes, seeds, lengths) -> float:
    output_dtype, epi_dtype = dtypes
    worst = 0.0
    shapes = itertools.product((32, 64, 128), (1, 2, 3, 4), (False, True), seeds)
    for block_size, next_n, interleaved, seed in shapes:
        if interleaved and block_size != 128:
            continue
        # The GPU matrix's group-scale spread (test_fp4_matches_reference).
        spread = (120, 128) if epi_dtype == torch.float16 else (114, 128)
        case = fp4_case(
            block_size,
            next_n,
            1000 * seed + block_size + next_n,
            interleaved,
            lens=lengths,
            exponents=spread,
        )
        args = case.fp4_args()
        got = fa.fp4_paged_mqa_logits(
            *args,
            output_dtype=output_dtype,
            epi_dtype=epi_dtype,
            is_kv_sf_interleaved=interleaved,
        )
        reference = VARIANTS["fp4"].reference
        expected = reference(*args, is_kv_sf_interleaved=interleaved)
        magnitude = magnitude_of(reference, args, is_kv_sf_interleaved=interleaved)
        mask = valid_mask(case.seq_lens.cpu(), next_n, got.shape[1])
        worst = max(worst, worst_fraction(got, expected, magnitude, mask))
    return worst


def name(dtype: torch.dtype) -> str:
    return str(dtype).split(".")[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--lengths", default="1,127,0,128,129,0,256,257,1000,1300")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    lengths = [int(s) for s in args.lengths.split(",")]
    print(
        "| op | output | epilogue | accumulator | largest error / row magnitude | tolerance "
        "| used |"
    )
    print("|---|---|---|---|---|---|---|")
    for dtypes in FP8_DTYPES:
        worst = fp8_worst(dtypes, seeds, lengths)
        tol = tolerance(*dtypes)
        print(
            f"| fp8 | {' | '.join(name(d) for d in dtypes)} | {worst:.3e} | {tol:.0e} "
            f"| {worst / tol:.2f} |",
            flush=True,
        )
    for output_dtype, epi_dtype in FP4_DTYPES:
        worst = fp4_worst((output_dtype, epi_dtype), seeds, lengths)
        tol = tolerance(output_dtype, epi_dtype)
        print(
            f"| fp4 | {name(output_dtype)} | {name(epi_dtype)} | float32 | {worst:.3e} "
            f"| {tol:.0e} | {worst / tol:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
