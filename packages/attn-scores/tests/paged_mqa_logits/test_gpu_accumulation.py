"""The FP8 tensor cores' accumulation error of one dot product, against the bound the GPU
tests accept per element (`attn_scores_cases.accumulation_error`), from one WGMMA k step to
the largest head_dim that fits.

Hopper's FP8 WGMMA aligns each k step's products to the largest exponent and sums them with
fewer bits than float32 (docs/numerics.md), so the error scales with sum_d |q_hd k_d|, not
with q_h . k, and a head_dim of D feeds D / 32 steps into one accumulator. With one head per
row (`keep_one_head_per_row`) no other head averages the error away: the worst case of the
random-call test's rows of four heads. `tools/fp8_accumulation_error.py` runs the same
measurement over more head dims and seeds.
"""

from __future__ import annotations

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import PagedCase, accumulation_error, keep_one_head_per_row, make_fp8_case
from flashinfer_attn_scores.paged_mqa_logits import fp8_sm90
from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask

pytestmark = pytest.mark.gpu

NUM_HEADS, NEXT_N = 4, 2


def error_ratios(got: torch.Tensor, case: PagedCase) -> torch.Tensor:
    """|got - expected| / dot_magnitude over the valid logits whose product sum is nonzero."""
    mask = valid_mask(case.seq_lens.cpu(), case.next_n, case.max_seq_len)
    dots = case.dot_magnitude()
    keep = mask & (dots > 0)
    err = (got.cpu().to(torch.float64) - case.expected()).abs()
    return err[keep] / dots[keep]


def one_head_error_ratios(
    head_dim: int, acc_dtype: torch.dtype, lengths: list[int], seed: int
) -> torch.Tensor:
    """`error_ratios` of one call with NUM_HEADS heads at NEXT_N, one head kept per row."""
    case = make_fp8_case(
        lengths,
        next_n=NEXT_N,
        num_heads=NUM_HEADS,
        head_dim=head_dim,
        block_size=64,
        seed=seed,
    )
    keep_one_head_per_row(case)
    gpu = case.to("cuda")
    got = fa.fp8_paged_mqa_logits(
        gpu.q,
        gpu.kv_fused,
        gpu.weights,
        gpu.block_tables,
        gpu.seq_lens,
        gpu.max_seq_len,
        acc_dtype=acc_dtype,
    )
    return error_ratios(got, case)


@pytest.mark.parametrize("acc_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [32, 128, 160, 576, "largest"])
def test_accumulation_error_of_one_head_stays_within_the_bound(head_dim, acc_dtype):
    if head_dim == "largest":
        head_dim = fp8_sm90.largest_fitting_head_dim(NUM_HEADS, NEXT_N)
    ratio = one_head_error_ratios(head_dim, acc_dtype, [2048] * 8 + [1, 33, 0, 700], head_dim)
    assert ratio.numel() > 30_000
    bound = accumulation_error(acc_dtype, head_dim)
    worst = float(ratio.max())
    assert worst <= bound, f"head_dim {head_dim}: error up to {worst / bound:.3g} x the bound"
