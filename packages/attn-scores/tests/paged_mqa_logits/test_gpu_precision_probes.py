"""Each precision argument reaches the kernel, shown on data whose result is known exactly.

The value tests of test_gpu.py bound the error by a fraction of each row's magnitude, which
leaves room for a path that is less precise than the one asked for (a float32 weight or token
scale rounded to 16 bits costs 2**-9-2**-12 of an element, under the float32 bound of the
table). Here the inputs make every dot product an exact small integer, so a float32 epilogue
must be exact to float32 rounding, an accumulator or epilogue of float16 must overflow where
the spec says it saturates, and a 16-bit output must be the float32 result rounded once.
"""

from __future__ import annotations

import pytest
import torch
from attn_scores_cases import keep_one_head_per_row, with_fp8_values
from flashinfer_attn_scores.paged_mqa_logits.reference import (
    fp8_paged_mqa_logits_reference,
    valid_mask,
)
from test_gpu import VARIANTS, fp8_case, poisoned_out

pytestmark = pytest.mark.gpu

FLOAT16_MAX = 65504.0


def masked(case, *tensors):
    mask = valid_mask(case.seq_lens.cpu(), case.next_n, case.max_seq_len)
    return [t.cpu()[mask] for t in tensors]


def call_fp8(case, **dtypes):
    out = poisoned_out(case.rows, case.max_seq_len, dtypes.get("output_dtype", torch.float32))
    return VARIANTS["fp8"].op(*case.fp8_args(), out=out, **dtypes)


def integer_fp8_case(block_size, next_n, seed):
    """q and k drawn from the integers -3..3 (exact in E4M3): every q_h . k is an integer of
    magnitude <= 9 * 128 = 1152, which a float16 accumulator (exact to 2048) and the tensor
    cores' float32 accumulation hold exactly. One head per row, with a weight of full float32
    mantissa and either sign; the token scales keep their full mantissas too."""
    case = fp8_case(block_size, next_n, seed, device="cpu")
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-3, 4, case.q.shape, generator=gen).double()
    k = torch.randint(-3, 4, case.k64.shape, generator=gen).double()
    case = with_fp8_values(case, q, k)
    keep_one_head_per_row(case)
    magnitudes = 0.5 + 1.5 * torch.rand(case.rows, generator=gen)
    signs = torch.where(torch.rand(case.rows, generator=gen) < 0.5, -1.0, 1.0)
    case.weights = case.weights * (magnitudes * signs)[:, None]
    return case.to("cuda")


@pytest.mark.parametrize("acc_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
@pytest.mark.parametrize("block_size", [32, 64, 128])
def test_fp8_float32_epilogue_is_exact_to_float32_rounding(block_size, next_n, acc_dtype):
    """With the dot products exact, a logit is w * relu(dot) * scale: two float32 roundings at
    most (the head product and the scale), 2**-23 of the element. A weight or token scale
    taken through bfloat16 or float16 anywhere errs by 2**-9 / 2**-12: 16x-4000x over."""
    case = integer_fp8_case(block_size, next_n, seed=200 + 10 * block_size + next_n)
    got = call_fp8(case, output_dtype=torch.float32, epi_dtype=torch.float32, acc_dtype=acc_dtype)
    expected = fp8_paged_mqa_logits_reference(*case.fp8_args())
    got, expected = masked(case, got, expected)
    assert (expected != 0).any() and (expected == 0).any()  # both sides of the ReLU drawn
    error = (got.double() - expected).abs()
    bound = 2.0**-23 * expected.abs()
    worst = (error / expected.abs().clamp_min(1e-300)).max().item()
    assert (error <= bound).all(), f"largest error {worst:.3g} of the element, bound 2**-23"


def constant_fp8_case(next_n, value, weight):
    """Every q and k element `value`, every weight `weight`, positive token scales: each logit
    is 64 * weight * (value**2 * 128) * scale."""
    case = fp8_case(64, next_n, seed=300 + next_n, device="cpu")
    case = with_fp8_values(case, torch.full_like(case.q64, value), torch.full_like(case.k64, value))
    case.weights = torch.full_like(case.weights, weight)
    return case.to("cuda")


@pytest.mark.parametrize("next_n", [1, 4])
def test_fp8_float16_accumulator_overflows_where_float32_does_not(next_n):
    """q = k = 24 at head_dim 128: q_h . k = 73728, past float16's 65504. The spec says a
    float16 accumulator saturates; a float32 one holds the product exactly."""
    case = constant_fp8_case(next_n, value=24.0, weight=1.0)
    assert 24.0**2 * 128 > FLOAT16_MAX
    expected = fp8_paged_mqa_logits_reference(*case.fp8_args())
    wide = call_fp8(case, acc_dtype=torch.float32, epi_dtype=torch.float32)
    narrow = call_fp8(case, acc_dtype=torch.float16, epi_dtype=torch.float32)
    wide, narrow, expected = masked(case, wide, narrow, expected)
    assert torch.allclose(wide.double(), expected, rtol=2.0**-22, atol=0)
    assert torch.isposinf(narrow).all(), "acc_dtype=float16 did not overflow: not applied?"


@pytest.mark.parametrize("next_n", [1, 4])
def test_fp8_float16_epilogue_overflows_where_float32_does_not(next_n):
    """q = k = 16: q_h . k = 32768, exact in float16; a weight of 4 makes each head term
    131072, past float16's range, so a float16 epilogue saturates and a float32 one does not
    (whichever accumulator)."""
    case = constant_fp8_case(next_n, value=16.0, weight=4.0)
    expected = fp8_paged_mqa_logits_reference(*case.fp8_args())
    results = {
        (epi, acc): call_fp8(case, epi_dtype=epi, acc_dtype=acc)
        for epi in (torch.float32, torch.float16)
        for acc in (torch.float32, torch.float16)
    }
    for (epi, acc), got in results.items():
        got, want = masked(case, got, expected)
        if epi == torch.float32:
            assert torch.allclose(got.double(), want, rtol=2.0**-22, atol=0), (epi, acc)
        else:
            assert torch.isposinf(got).all(), f"epi_dtype=float16 (acc {acc}) did not overflow"


FLOAT32_MAX = torch.finfo(torch.float32).max


@pytest.mark.parametrize("next_n", [1, 4])
def test_fp8_float32_head_sum_overflows_from_2_to_the_127(next_n):
    """numerics.md's range: the float32 epilogue sums the head terms doubled, w * (x + |x|),
    and halves once in the final scale, so the raw head sum sum_h w_h relu(x_h) is finite up to
    just below 2^127 and inf from 2^127, whatever the token scale. q = k = 1 at head_dim 128:
    each x = 128; 64 heads of weight 2^113 sum to 2^126 (exact), of weight 2^114 to 2^127. The
    float16 accumulator's epilogue takes the ReLU as a max, undoubled: finite at both."""
    below = constant_fp8_case(next_n, value=1.0, weight=2.0**113)
    at = constant_fp8_case(next_n, value=1.0, weight=2.0**114)
    for case, doubled_sum_finite in ((below, True), (at, False)):
        expected = fp8_paged_mqa_logits_reference(*case.fp8_args())
        wide = call_fp8(case, acc_dtype=torch.float32, epi_dtype=torch.float32)
        narrow = call_fp8(case, acc_dtype=torch.float16, epi_dtype=torch.float32)
        wide, narrow, expected = masked(case, wide, narrow, expected)
        in_range = expected.abs() < FLOAT32_MAX
        assert in_range.any()  # the logits themselves are float32 numbers
        assert torch.allclose(narrow[in_range].double(), expected[in_range], rtol=2.0**-22, atol=0)
        if doubled_sum_finite:
            assert torch.allclose(wide[in_range].double(), expected[in_range], rtol=2.0**-22)
        else:
            assert torch.isposinf(wide).all(), "the doubled head sum did not overflow at 2^127"


@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
@pytest.mark.parametrize(
    ("variant", "output_dtype"),
    [("fp8", torch.float16), ("fp4", torch.float16), ("fp4", torch.bfloat16)],
)
def test_16_bit_output_is_the_float32_result_rounded_once(variant, output_dtype, next_n):
    """With the float32 epilogue the output dtype only changes the store: the 16-bit logits
    are the float32 logits rounded to nearest, bit for bit. A value rounded twice (through
    another 16-bit type) or stored before the last scale differs in some elements."""
    kind = VARIANTS[variant]
    case = kind.make_case(64, next_n, seed=400 + next_n)
    args = kind.args(case)
    wide_out = poisoned_out(case.rows, case.max_seq_len, torch.float32)
    wide = kind.op(*args, output_dtype=torch.float32, epi_dtype=torch.float32, out=wide_out)
    narrow_out = poisoned_out(case.rows, case.max_seq_len, output_dtype)
    narrow = kind.op(*args, output_dtype=output_dtype, epi_dtype=torch.float32, out=narrow_out)
    narrow, rounded = masked(case, narrow, wide.to(output_dtype))
    assert narrow.numel() > 0
    differ = (narrow != rounded).sum().item()
    assert differ == 0, f"{differ} of {narrow.numel()} logits are not the float32 ones rounded"
