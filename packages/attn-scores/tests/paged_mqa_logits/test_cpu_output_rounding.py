"""The CPU ops round the float64 reference once to the output dtype (PyTorch's own float64 ->
float16/bfloat16 conversion rounds twice, through float32)."""

from __future__ import annotations

import math
import struct

import pytest
import torch
from attn_scores_cases import assert_rows_close, make_fp8_case
from flashinfer_attn_scores.paged_mqa_logits.custom_ops import round_once
from flashinfer_attn_scores.paged_mqa_logits.reference import (
    fp8_paged_mqa_logits_reference,
    valid_mask,
)


def float16_once(x: float) -> float:
    """CPython packs a float into IEEE half precision rounding once, to nearest even."""
    try:
        return struct.unpack("<e", struct.pack("<e", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def bfloat16_once(x: float) -> float:
    """Round to an 8-bit significand, to nearest even, on bfloat16's grid (float32's
    exponent range, subnormal step 2^-133); overflow to infinity."""
    if not math.isfinite(x) or x == 0:
        return x
    exponent = max(math.frexp(x)[1], -125)  # |x| in [2^(e-1), 2^e); subnormals share one grid
    step = math.ldexp(1.0, exponent - 8)
    rounded = round(x / step) * step  # exact: a power-of-two scale; round() ties to even
    return math.copysign(math.inf, x) if abs(rounded) >= 2.0**128 else rounded


ONCE = {torch.float16: float16_once, torch.bfloat16: bfloat16_once}
# Half an ulp relative to the value: the most a single rounding moves it.
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def draws(dtype: torch.dtype) -> list[float]:
    """Midpoints of the 16-bit grid nudged by far less than a float32 ulp (where rounding
    twice goes wrong), exact midpoints, random values of every magnitude, the edges."""
    gen = torch.Generator().manual_seed(11)
    bits = 11 if dtype == torch.float16 else 8
    top = 15 if dtype == torch.float16 else 127
    values = []
    for exponent in range(-30 if dtype == torch.float16 else -140, top + 1, 3):
        for _ in range(6):
            m = int(torch.randint(2 ** (bits - 1), 2**bits, (), generator=gen))
            midpoint = math.ldexp(2 * m + 1, exponent - bits - 1)
            for nudge in (0.0, 2.0**-40, -(2.0**-40), 2.0**-30):
                for sign in (1.0, -1.0):
                    values.append(sign * midpoint * (1 + nudge))
    values += (
        torch.randn(2000, generator=gen, dtype=torch.float64)
        * 2.0 ** torch.randint(-40, 40, (2000,), generator=gen)
    ).tolist()
    values += [0.0, -0.0, math.inf, -math.inf, 65504.0, 65520.0, 65519.99, 3.4e38, 3.5e38, 1e300]
    return values


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_round_once_matches_a_single_rounding(dtype):
    values = draws(dtype)
    got = round_once(torch.tensor(values, dtype=torch.float64), dtype).double().tolist()
    expected = [ONCE[dtype](x) for x in values]
    wrong = [(x, g, e) for x, g, e in zip(values, got, expected, strict=True) if g != e]
    assert not wrong, f"{len(wrong)} of {len(values)} differ, first {wrong[:3]}"
    # The premise: PyTorch's own conversion rounds twice on some of these.
    twice = torch.tensor(values, dtype=torch.float64).to(dtype).double().tolist()
    assert sum(t != e for t, e in zip(twice, expected, strict=True)) > 50


def test_round_once_keeps_nan_and_passes_other_dtypes_through():
    values = torch.tensor([math.nan, 1 + 2.0**-30, -3.0], dtype=torch.float64)
    assert torch.isnan(round_once(values, torch.float16)[0])
    same = {"rtol": 0, "atol": 0, "equal_nan": True}
    torch.testing.assert_close(round_once(values, torch.float32), values.float(), **same)
    torch.testing.assert_close(round_once(values, torch.float64), values, **same)
    assert (
        round_once(
            torch.tensor([1 + 2.0**-11 + 2.0**-40], dtype=torch.float64), torch.float16
        ).item()
        == 1 + 2.0**-10
    )


@pytest.mark.parametrize("output_dtype", [torch.float16, torch.float32])
def test_cpu_op_output_is_the_reference_rounded_once(output_dtype):
    import flashinfer_attn_scores as fa

    case = make_fp8_case([300, 0, 77], next_n=2, num_heads=32, head_dim=64, block_size=32)
    args = case.fp8_args()
    got = fa.fp8_paged_mqa_logits(*args, output_dtype=output_dtype)
    reference = fp8_paged_mqa_logits_reference(*args)
    mask = valid_mask(case.seq_lens, 2, case.max_seq_len)
    expected = [
        ONCE.get(output_dtype, lambda x: struct.unpack("<f", struct.pack("<f", x))[0])(x)
        for x in reference[mask].tolist()
    ]
    assert got[mask].double().tolist() == expected
    # The reference rounded here must be the formula itself: against the position-by-position
    # expectation (float64 sums in another order, so equal to a few float64 ulps).
    assert_rows_close(reference, case.expected(), mask, 1e-12)
    assert_rows_close(got, case.expected(), mask, UNIT_ROUNDOFF[output_dtype])


@pytest.mark.parametrize("output_dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_cpu_op_writes_one_nan_pattern(output_dtype):
    """NaN logits (here from a negative-NaN weight and an infinite one times a zero score)
    are written as the dtype's default NaN, whatever sign and payload produced them."""
    from attn_scores_cases import make_fp4_case
    from flashinfer_attn_scores import fp4_paged_mqa_logits

    case = make_fp4_case([90, 40], next_n=2, seed=5)
    weights = case.weights.clone()
    weights[0, 0] = -torch.tensor(float("nan"))
    weights[3, :] = float("inf")
    args = case.fp4_args()
    got = fp4_paged_mqa_logits(*args[:3], weights, *args[4:], output_dtype=output_dtype)
    written = torch.arange(got.shape[1]) < torch.tensor([90, 90, 40, 40])[:, None]
    nan = got.isnan() & written  # the rest of `got` is whatever the allocation held
    assert nan[0, :90].all() and nan[3, :40].any()  # the rows the NaNs reach
    bits = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}
    default = torch.tensor(float("nan"), dtype=output_dtype).view(bits[output_dtype])
    assert (got[nan].view(bits[output_dtype]) == default).all()
