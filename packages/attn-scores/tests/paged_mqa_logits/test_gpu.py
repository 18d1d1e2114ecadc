"""SM90 kernels against the float64 reference (skipped without an SM90 GPU)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import UNTOUCHED, assert_rows_close, make_fp4_case, make_fp8_case
from flashinfer_attn_scores.paged_mqa_logits.reference import (
    fp4_paged_mqa_logits_reference,
    fp8_paged_mqa_logits_reference,
    valid_mask,
)

pytestmark = pytest.mark.gpu

# Allowed |kernel - float64 reference| on the valid region, as a fraction of the largest
# |reference| in the same row. One table: the output dtype sets the base bound; a
# reduced-precision epilogue or accumulator raises it to its own entry (the max is used).
#
# Why relative to the row and not to each element: Hopper's FP8 WGMMA does not accumulate in
# full IEEE float32. Within each k-group the products are aligned to the largest exponent and
# summed with a narrower adder (about 22 mantissa bits per the brief; DeepSeek-V3 reports as
# few as ~14 retained bits on H800), truncating the rest. So a head's dot product carries an
# absolute error of up to roughly 2**-13 * sum_d |q_hd * k_d| (the pessimistic reading), and
# after the weighted head sum |err| <= 2**-13 * sum_h |w_h| * sum_d |q_hd| |k_d| * scale.
# For the random data here sum_d |q_hd k_d| is a few times |q_h . k| and the row's largest
# logit is at least a few times a typical head term, so that bound stays below ~1e-3 of the
# row maximum; 2e-3 leaves a factor of two. An element-wise relative bound would be wrong:
# logits near zero come from cancelling heads (weights of both signs) and keep the absolute
# error of their large terms. float16/bfloat16 outputs add one rounding of 2**-11 / 2**-8
# of the element, at most that of the row maximum: 2**-8 + 2e-3 = 5.9e-3 for bfloat16, so
# 8e-3. A float16 epilogue rounds each of the 64 head terms and partial sums (random-walk
# ~sqrt(64) * 2**-11). The bfloat16 epilogue (fp4 only) rounds each relu(score) and each
# folded weight once to bfloat16 and sums their exact products in float32 (a tensor-core
# MMA): at most 2 * 2**-8 of the row magnitude, 7.8e-3; with fp4's default bfloat16 output
# (2**-8) and the float32 path's 2e-3 at most 1.37e-2, so 1.5e-2 (a 9 % margin at worst). A float16 accumulator rounds each of 128 product additions.
# Measured (tools/tolerance_margins.py, the matrix's cases at every block size and next_n,
# two seeds, H200, 2026-12-02): the largest error over the row magnitude was 1.5e-4 (fp8)
# and 2.5e-4 (fp4) at float32, 3.7e-3 with fp4's bfloat16 output, 5.6e-3 with its bfloat16
# output and epilogue, 1.1e-3 with a float16 epilogue and 3.5e-4 with fp8's float16
# accumulator; until then the bfloat16 bounds were 2e-2 / 3e-2, guesses before measurement.
# The float16 accumulator's entry was 2e-2 (57x its measured error, loose enough to miss one
# dropped head of 64) until 2026-12-04, when the same measurement read 3.2e-4 / 3.5e-4
# (float32 / float16 output): 5e-3 is 14x that. Rows of few heads, where the accumulation
# error is a larger share, are the random calls' and get their per-element term.
# That the float32 path is as precise as float32 allows, and that a float16 accumulator or
# epilogue is applied at all, test_gpu_precision_probes.py shows on exactly known data.
# fp4's bfloat16 epilogue again on 2026-12-06 (an H100, twelve seeds, 10-21): largest error
# 6.5e-3 with bfloat16 output and 4.9e-3 with float32 output. Its entry stays at the bound
# derived above (1.37e-2), which the data could reach, rather than at a measured spread.
#
# The premise "the row's largest logit is a few times a typical head term" fails in rows of
# very few terms (4 heads, one valid position): there every q_h . k can be a small remainder
# of large products, and the accumulation error exceeds the row bound (first seen on the H200
# in 3 of 3500 random calls). The random-call test, which draws such rows, also accepts
# per element a measured fraction of sum_h |w_h| sum_d |q_hd k_d| (assert_rows_close's
# dot_magnitude; attn_scores_cases.accumulation_error, which grows with head_dim).
TOLERANCES = {
    "output": {torch.float32: 2e-3, torch.float16: 5e-3, torch.bfloat16: 8e-3},
    "epilogue": {torch.float32: 0.0, torch.float16: 5e-3, torch.bfloat16: 1.5e-2},
    "accumulator": {torch.float32: 0.0, torch.float16: 5e-3},
}


# Below a dtype's normal range rounding is to a fixed spacing, not relative: half the smallest
# subnormal spacing per rounding. An MXFP4 test that divides each token's scale out of the
# error (`assert_rows_close`'s column_scale) adds it back as an absolute floor: one output
# rounding and, with the float16 epilogue (head terms rounded to float16 in output units, see
# fp4_paged_mqa_logits.cu), a product and a sum per head.
SUBNORMAL_HALF_SPACING = {
    torch.float32: 2.0**-150,
    torch.bfloat16: 2.0**-134,
    torch.float16: 2.0**-25,
}


def absolute_floor(output_dtype, epi_dtype=torch.float32, num_heads=64) -> float:
    floor = SUBNORMAL_HALF_SPACING[output_dtype]
    if epi_dtype == torch.float16:
        floor += 2 * num_heads * SUBNORMAL_HALF_SPACING[torch.float16]
    return floor


def fp4_per_token(case, output_dtype, epi_dtype=torch.float32, interleaved=False) -> dict:
    """`assert_rows_close`'s (and `check_result`'s) per-token keywords for an MXFP4 case, as
    `test_fp4_matches_reference` passes them: its tokens' largest group scales lie binades
    apart in one row (up to 8 in `make_fp4_case`'s default exponent range), so each token's
    2^(M - 127) is divided out before the row bound applies, with `absolute_floor` added."""
    return {
        "column_scale": case.token_scales(interleaved),
        "abs_floor": absolute_floor(output_dtype, epi_dtype, case.q64.shape[2]),
    }


def tolerance(output_dtype, epi_dtype=torch.float32, acc_dtype=torch.float32) -> float:
    return max(
        TOLERANCES["output"][output_dtype],
        TOLERANCES["epilogue"][epi_dtype],
        TOLERANCES["accumulator"][acc_dtype],
    )


# Lengths around block and tile edges, zeros between non-empty requests.
EDGE_LENGTHS = [1, 127, 0, 128, 129, 0, 256, 257, 1000]
MAX_SEQ_LEN = 1300  # beyond every length

# Every (output_dtype, epi_dtype, acc_dtype): each is its own compiled kernel.
FP8_DTYPES = list(itertools.product((torch.float32, torch.float16), repeat=3))


def poisoned_out(
    rows: int, max_seq_len: int, dtype: torch.dtype, extra_rows: int = 2, device="cuda"
):
    """A buffer taller and wider than needed: NaN where the call may write (the first `rows`
    rows, `padded_seq_len(max_seq_len)` columns), so an element it should write and does not
    stays NaN; the finite UNTOUCHED around it, which any stray write changes (NaN included)."""
    padded = fa.padded_seq_len(max_seq_len)
    out = torch.full((rows + extra_rows, padded + 256), UNTOUCHED, dtype=dtype, device=device)
    out[:rows, :padded] = float("nan")
    return out


def assert_nothing_written_around(out: torch.Tensor, rows: int, max_seq_len: int) -> None:
    """Nothing of a `poisoned_out` buffer was written outside its first `rows` rows and
    `padded_seq_len(max_seq_len)` columns."""
    padded = fa.padded_seq_len(max_seq_len)
    assert (out[rows:] == UNTOUCHED).all(), "rows past batch_size*next_n were written"
    assert (out[:rows, padded:] == UNTOUCHED).all(), "columns past the padded row were written"


def repoison(out: torch.Tensor, rows: int, max_seq_len: int) -> None:
    """NaN again where a call may write into a `poisoned_out` buffer."""
    out[:rows, : fa.padded_seq_len(max_seq_len)] = float("nan")


def assert_nothing_written(out: torch.Tensor, rows: int, max_seq_len: int) -> None:
    """A `poisoned_out` buffer exactly as it was made."""
    assert torch.isnan(out[:rows, : fa.padded_seq_len(max_seq_len)]).all(), "out was written"
    assert_nothing_written_around(out, rows, max_seq_len)


def magnitude_of(reference, args, **kwargs):
    """The reference with |weights|: the size of the head terms each logit sums."""
    q_args = list(args)
    weights_index = 2 if reference is fp8_paged_mqa_logits_reference else 3
    q_args[weights_index] = q_args[weights_index].abs()
    return reference(*q_args, **kwargs)


def mark_empty_requests(out: torch.Tensor, seq_lens, next_n: int, max_seq_len: int) -> None:
    """UNTOUCHED (finite) instead of NaN in the rows of a `poisoned_out` buffer that belong to
    zero-length requests, so that a call writing NaN there shows too."""
    padded = fa.padded_seq_len(max_seq_len)
    for b, length in enumerate(seq_lens.tolist()):
        if length == 0:
            out[b * next_n : (b + 1) * next_n, :padded] = UNTOUCHED


def check_result(
    got,
    out,
    expected,
    seq_lens,
    next_n,
    tol,
    magnitude=None,
    empty_marked=False,
    column_scale=None,
    abs_floor=0.0,
):
    """`got` against `expected` on the valid region; nothing of `out` written around it, nor
    in the rows of empty requests (still NaN, or UNTOUCHED after `mark_empty_requests`).
    `column_scale` and `abs_floor` as in `assert_rows_close` (MXFP4: per token)."""
    rows = seq_lens.shape[0] * next_n
    mask = valid_mask(seq_lens.cpu(), next_n, got.shape[1])
    assert_rows_close(
        got, expected, mask, tol, magnitude, column_scale=column_scale, abs_floor=abs_floor
    )
    out = out.cpu()
    padded = fa.padded_seq_len(got.shape[1])
    for b, length in enumerate(seq_lens.tolist()):
        if length == 0:
            empty_rows = out[b * next_n : (b + 1) * next_n, :padded]
            untouched = (empty_rows == UNTOUCHED) if empty_marked else torch.isnan(empty_rows)
            assert untouched.all(), f"rows of the empty request {b} were written"
    assert_nothing_written_around(out, rows, got.shape[1])


def fp8_case(
    block_size,
    next_n,
    seed,
    lens=EDGE_LENGTHS,
    max_seq_len=MAX_SEQ_LEN,
    device="cuda",
    negative_scales=False,
):
    case = make_fp8_case(
        lens,
        next_n=next_n,
        num_heads=64,
        head_dim=128,
        block_size=block_size,
        max_seq_len=max_seq_len,
        spare_blocks=64,  # a pool larger than needed, blocks in shuffled order
        negative_scales=negative_scales,
        seed=seed,
    )
    return case.to(str(device))


def fp4_case(
    block_size, next_n, seed, interleaved=False, lens=EDGE_LENGTHS, device="cuda", exponents=None
):
    case = make_fp4_case(
        lens,
        next_n=next_n,
        block_size=block_size,
        interleaved=interleaved,
        **({} if exponents is None else {"exponent_range": exponents}),
        max_seq_len=MAX_SEQ_LEN,
        spare_blocks=64,
        seed=seed,
    )
    return case.to(str(device))


@dataclass(frozen=True)
class Variant:
    """One op as the tests call it: its public function, float64 reference and default output
    dtype, the suite's case maker, and where kv_fused and block_tables sit in its arguments."""

    name: str
    op: Callable
    reference: Callable
    output_dtype: torch.dtype
    make_case: Callable
    kv_index: int

    @property
    def table_index(self) -> int:
        return self.kv_index + 2

    def args(self, case) -> tuple:
        return case.fp8_args() if self.name == "fp8" else case.fp4_args()

    def per_token(self, case, output_dtype, epi_dtype=torch.float32, interleaved=False) -> dict:
        """fp4: `fp4_per_token` (each token held to its own size); fp8: none, the row bound."""
        if self.name == "fp8":
            return {}
        return fp4_per_token(case, output_dtype, epi_dtype, interleaved)


VARIANTS = {
    "fp8": Variant(
        "fp8", fa.fp8_paged_mqa_logits, fp8_paged_mqa_logits_reference, torch.float32, fp8_case, 1
    ),
    "fp4": Variant(
        "fp4", fa.fp4_paged_mqa_logits, fp4_paged_mqa_logits_reference, torch.bfloat16, fp4_case, 2
    ),
}


@pytest.mark.parametrize(("output_dtype", "epi_dtype", "acc_dtype"), FP8_DTYPES)
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
@pytest.mark.parametrize("block_size", [32, 64, 128])
def test_fp8_matches_reference(block_size, next_n, output_dtype, epi_dtype, acc_dtype):
    case = fp8_case(block_size, next_n, seed=block_size + next_n)
    check_fp8_case(case, next_n, (output_dtype, epi_dtype, acc_dtype))


@pytest.mark.parametrize(("output_dtype", "epi_dtype", "acc_dtype"), FP8_DTYPES)
@pytest.mark.parametrize("next_n", [1, 4])
def test_fp8_negative_token_scales_multiply_the_head_sum(
    next_n, output_dtype, epi_dtype, acc_dtype
):
    """Per-token scales of both signs: the spec's scale[pos] * sum_h w relu(q . k). A scale
    folded into the keys, or applied before the ReLU, gives other numbers."""
    case = fp8_case(64, next_n, seed=90 + next_n, negative_scales=True)
    check_fp8_case(case, next_n, (output_dtype, epi_dtype, acc_dtype))


def check_fp8_case(case, next_n, dtypes=(torch.float32,) * 3):
    """One fp8 call into a NaN-poisoned `out` against the float64 reference; `dtypes` is
    (output_dtype, epi_dtype, acc_dtype)."""
    output_dtype, epi_dtype, acc_dtype = dtypes
    out = poisoned_out(case.rows, case.max_seq_len, output_dtype)
    mark_empty_requests(out, case.seq_lens, next_n, case.max_seq_len)
    got = fa.fp8_paged_mqa_logits(
        *case.fp8_args(),
        output_dtype=output_dtype,
        epi_dtype=epi_dtype,
        acc_dtype=acc_dtype,
        out=out,
    )
    assert got.shape == (case.rows, case.max_seq_len) and got.data_ptr() == out.data_ptr()
    expected = fp8_paged_mqa_logits_reference(*case.fp8_args())
    magnitude = magnitude_of(fp8_paged_mqa_logits_reference, case.fp8_args())
    tol = tolerance(*dtypes)
    check_result(got, out, expected, case.seq_lens, next_n, tol, magnitude, empty_marked=True)


# (num_heads, head_dim, next_n) beyond DeepSeek's (64, 128): the kernel is parametric.
PARAMETRIC_SHAPES = [
    (32, 128, 4),
    (32, 128, 6),
    (32, 128, 8),
    (64, 64, 1),
    (16, 128, 1),
    (8, 96, 1),
    (4, 128, 2),
    (64, 256, 1),
    (12, 160, 2),
    # Wide heads, where shared memory limits the pipeline depth (stages a multiple of the
    # consumer warpgroups; before that rule these ran 9, 3, 6 and 10 stages with 4 consumers).
    (64, 320, 1),
    (64, 640, 1),
    (16, 512, 1),
    (32, 256, 3),
    # 128 < N <= 192 with a wide head: 2 consumer warpgroups and 4 producers over 8 or 4
    # stages (pipeline_depth drops 3 consumers to 2 where 12 stages do not fit).
    (64, 224, 3),
    (64, 256, 3),
    # The largest head_dim that fits at N = 64 and at N = 256: two KV stages.
    (64, 896, 1),
    (64, 352, 4),
    # Many draft slots per thread (the store loop's spare lanes with next_n % 4 != 0), 8-column
    # groups straddling two slots (H % 8 == 4) at large N, a 32-byte swizzle with a wide N.
    (4, 128, 64),
    (8, 64, 31),
    (12, 96, 20),
    (36, 64, 4),
    (100, 128, 2),
    (248, 32, 1),
    (4, 32, 2),
]


def fp8_shape_case(block_size, num_heads, head_dim, next_n, seed, device="cuda"):
    """An fp8 case at a parametric shape on the edge lengths."""
    return make_fp8_case(
        EDGE_LENGTHS,
        next_n=next_n,
        num_heads=num_heads,
        head_dim=head_dim,
        block_size=block_size,
        max_seq_len=MAX_SEQ_LEN,
        spare_blocks=64,
        seed=seed,
    ).to(device)


def check_fp8_shape(block_size, num_heads, head_dim, next_n, seed, dtypes=(torch.float32,) * 3):
    """check_fp8_case at a parametric shape on the edge lengths."""
    check_fp8_case(fp8_shape_case(block_size, num_heads, head_dim, next_n, seed), next_n, dtypes)


@pytest.mark.parametrize(("num_heads", "head_dim", "next_n"), PARAMETRIC_SHAPES)
@pytest.mark.parametrize("block_size", [32, 64, 128])
def test_fp8_parametric_shapes(block_size, num_heads, head_dim, next_n):
    check_fp8_shape(block_size, num_heads, head_dim, next_n, seed=num_heads * head_dim + next_n)


# float16 epilogue (over either accumulator) where an 8-column group straddles two draft
# slots (num_heads % 8 == 4) and where N > 128 (two MMA halves): the packed half2 sums.
@pytest.mark.parametrize("acc_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(
    ("num_heads", "head_dim", "next_n"), [(12, 160, 2), (4, 128, 2), (32, 128, 6)]
)
@pytest.mark.parametrize("block_size", [32, 128])
def test_fp8_float16_epilogue_parametric(block_size, num_heads, head_dim, next_n, acc_dtype):
    dtypes = (torch.float16, torch.float16, acc_dtype)
    check_fp8_shape(block_size, num_heads, head_dim, next_n, 7 * num_heads + next_n, dtypes)


@pytest.mark.parametrize(("output_dtype", "epi_dtype", "acc_dtype"), FP8_DTYPES)
@pytest.mark.parametrize("next_n", [1, 3])
def test_fp8_nan_in_k_reaches_exactly_its_logits(next_n, output_dtype, epi_dtype, acc_dtype):
    """A NaN byte (E4M3 0x7F) in one token's K makes every head's score NaN, and the
    reference's relu keeps it: that token's logit is NaN in each row that sees it, for every
    epilogue and accumulator dtype, and every other logit is unchanged."""
    lens = [300, 0, 129]
    case = fp8_case(64, next_n, seed=40 + next_n, lens=lens)
    num_blocks, block_size, _, row_bytes = case.kv_fused.shape
    head_dim = row_bytes - 4
    table = case.block_tables.cpu()
    pool = case.kv_fused.view(num_blocks, block_size * row_bytes)  # values, then scales
    # Token 37 of request 0 (seen by every draft slot); the last token of request 2 (seen only
    # by the newest slot).
    for request, token, dim in [(0, 37, 5), (2, lens[2] - 1, head_dim - 1)]:
        block = int(table[request, token // block_size])
        pool[block, (token % block_size) * head_dim + dim] = 0x7F

    dtypes = dict(output_dtype=output_dtype, epi_dtype=epi_dtype, acc_dtype=acc_dtype)
    out = poisoned_out(case.rows, case.max_seq_len, output_dtype)
    got = fa.fp8_paged_mqa_logits(*case.fp8_args(), out=out, **dtypes).cpu()
    expected = fp8_paged_mqa_logits_reference(*case.fp8_args()).cpu()
    valid = valid_mask(case.seq_lens.cpu(), next_n, got.shape[1])
    nan_expected = valid & torch.isnan(expected)
    # Every slot of request 0 at token 37, the newest slot of request 2 at its last token.
    assert int(nan_expected.sum()) == next_n + 1
    assert torch.isnan(got[nan_expected]).all()
    # The same call into a finite buffer: those NaN were written by the kernel, not left over.
    finite_out = torch.full_like(out, UNTOUCHED)
    again = fa.fp8_paged_mqa_logits(*case.fp8_args(), out=finite_out, **dtypes).cpu()
    assert torch.isnan(again[nan_expected]).all()
    finite = valid & ~nan_expected
    magnitude = magnitude_of(fp8_paged_mqa_logits_reference, case.fp8_args())
    assert_rows_close(
        got, expected, finite, tolerance(output_dtype, epi_dtype, acc_dtype), magnitude
    )


# Cases where an 8-column group of the MMA's N holds the last heads of draft slot 0 and the
# first of slot 1 (num_heads % 8 == 4, next_n 2): the same (shape, block size, seed, dtypes)
# as cases of test_fp8_parametric_shapes and test_fp8_float16_epilogue_parametric, so every
# row the NaN must not reach is held to a bound those tests hold it to.
NAN_Q_CASES = [
    (4, 128, 64, 4 * 128 + 2, (torch.float32,) * 3),
    (12, 160, 64, 12 * 160 + 2, (torch.float32,) * 3),
    (4, 128, 32, 7 * 4 + 2, (torch.float16, torch.float16, torch.float32)),
    (12, 160, 128, 7 * 12 + 2, (torch.float16, torch.float16, torch.float16)),
]


@pytest.mark.parametrize(("num_heads", "head_dim", "block_size", "seed", "dtypes"), NAN_Q_CASES)
def test_fp8_nan_in_one_draft_slots_q_stays_in_its_row(
    num_heads, head_dim, block_size, seed, dtypes
):
    """A NaN byte in one head of one draft slot's q makes that slot's row NaN at every valid
    position and no other row: the per-slot sums of a group that holds two slots' heads keep
    them apart (slot 0's last head and slot 1's first are the straddling group's columns)."""
    check_nan_in_one_draft_slots_q(num_heads, head_dim, block_size, seed, dtypes, "cuda")


def check_nan_in_one_draft_slots_q(num_heads, head_dim, block_size, seed, dtypes, device):
    next_n = 2
    case = fp8_shape_case(block_size, num_heads, head_dim, next_n, seed, device)
    q_bytes = case.q.view(torch.uint8)
    # (request, slot, head): request 8 (1000 tokens) slot 0's last head, request 3 (128 tokens)
    # slot 1's first head.
    poisoned = [(8, 0, num_heads - 1), (3, 1, 0)]
    for request, slot, head in poisoned:
        q_bytes[request, slot, head, 0] = 0x7F  # E4M3 NaN
    nan_rows = sorted(request * next_n + slot for request, slot, _ in poisoned)

    output_dtype, epi_dtype, acc_dtype = dtypes
    out = poisoned_out(case.rows, case.max_seq_len, output_dtype, device=device)
    got = fa.fp8_paged_mqa_logits(
        *case.fp8_args(),
        output_dtype=output_dtype,
        epi_dtype=epi_dtype,
        acc_dtype=acc_dtype,
        out=out,
    ).cpu()
    expected = fp8_paged_mqa_logits_reference(*case.fp8_args()).cpu()
    valid = valid_mask(case.seq_lens.cpu(), next_n, got.shape[1])
    nan_expected = valid & torch.isnan(expected)
    # The reference: exactly the poisoned rows, each over its whole valid region.
    assert sorted(set(nan_expected.nonzero()[:, 0].tolist())) == nan_rows
    assert torch.equal(nan_expected[nan_rows], valid[nan_rows])
    assert torch.isnan(got[nan_expected]).all()
    # The same call into a finite buffer: those NaN were written by the kernel, not left over.
    finite = fa.fp8_paged_mqa_logits(
        *case.fp8_args(),
        output_dtype=output_dtype,
        epi_dtype=epi_dtype,
        acc_dtype=acc_dtype,
        out=torch.full_like(out, UNTOUCHED),
    ).cpu()
    assert torch.isnan(finite[nan_expected]).all()
    magnitude = magnitude_of(fp8_paged_mqa_logits_reference, case.fp8_args())
    assert_rows_close(got, expected, valid & ~nan_expected, tolerance(*dtypes), magnitude)


def _mean_row_error(got, expected, magnitude, mask):
    """Mean over the valid elements of |got - expected| / (the row maximum of `magnitude`)."""
    got, expected, magnitude, mask = (t.cpu().double() for t in (got, expected, magnitude, mask))
    row_scale = magnitude.abs().masked_fill(mask == 0, 0).amax(dim=1, keepdim=True)
    return float(((got - expected).abs() / row_scale)[mask.bool()].mean())


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize(
    ("variant", "narrow_epilogue"), [("fp8", torch.float16), ("fp4", torch.bfloat16)]
)
def test_float32_epilogue_is_more_precise_than_a_16_bit_one(variant, narrow_epilogue, seed):
    """`epi_dtype` reaches the kernel: on the same inputs the float32 epilogue's mean error is
    well below a 16-bit epilogue's, whose head terms and sums are rounded (11 bits for float16,
    8 for bfloat16). The per-element bounds of the tolerance table leave room for either.
    On the H200 (2026-12-01, seeds 11-16) the ratio read 0.20-0.21 for fp8 against float16 and
    0.050-0.056 for fp4 against bfloat16 (0.026 before the bfloat16 epilogue summed in
    float32 on the tensor cores)."""
    kind = VARIANTS[variant]
    case = kind.make_case(64, 2, seed=seed, lens=[1200, 0, 900, 1300])
    op, args, reference = kind.op, kind.args(case), kind.reference
    expected = reference(*args)
    magnitude = magnitude_of(reference, args)
    mask = valid_mask(case.seq_lens.cpu(), case.next_n, case.max_seq_len)
    errors = {}
    for epi_dtype in (torch.float32, narrow_epilogue):
        out = poisoned_out(case.rows, case.max_seq_len, torch.float32)
        got = op(*args, output_dtype=torch.float32, epi_dtype=epi_dtype, out=out)
        errors[epi_dtype] = _mean_row_error(got, expected, magnitude, mask)
    assert errors[torch.float32] < 0.5 * errors[narrow_epilogue], errors
    if variant == "fp4":
        # And not too much below: fp4's bfloat16 epilogue sums in the tensor cores' float32
        # accumulator. The ratio read 0.050-0.056 (seeds 11-16); bfloat16 partial sums, as
        # before 2026-12-01, read 0.026.
        assert errors[torch.float32] > 0.035 * errors[narrow_epilogue], errors


@pytest.mark.parametrize("epi_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("output_dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
@pytest.mark.parametrize(
    ("block_size", "interleaved"), [(32, False), (64, False), (128, False), (128, True)]
)
def test_fp4_matches_reference(block_size, interleaved, next_n, output_dtype, epi_dtype):
    # Group scales up to 14 binades apart, the edge of the exact decode (docs/numerics.md);
    # the float16 epilogue keeps the narrower default spread (its head terms are float16).
    spread = (120, 128) if epi_dtype == torch.float16 else (114, 128)
    case = fp4_case(
        block_size, next_n, seed=block_size + next_n, interleaved=interleaved, exponents=spread
    )
    out = poisoned_out(case.rows, case.max_seq_len, output_dtype)
    mark_empty_requests(out, case.seq_lens, next_n, case.max_seq_len)
    got = fa.fp4_paged_mqa_logits(
        *case.fp4_args(),
        output_dtype=output_dtype,
        epi_dtype=epi_dtype,
        is_kv_sf_interleaved=interleaved,
        out=out,
    )
    expected = fp4_paged_mqa_logits_reference(*case.fp4_args(), is_kv_sf_interleaved=interleaved)
    magnitude = magnitude_of(
        fp4_paged_mqa_logits_reference, case.fp4_args(), is_kv_sf_interleaved=interleaved
    )
    tol = tolerance(output_dtype, epi_dtype)
    # Per token: the spread puts tokens up to 14 binades apart in one row.
    check_result(
        got,
        out,
        expected,
        case.seq_lens,
        next_n,
        tol,
        magnitude,
        empty_marked=True,
        **fp4_per_token(case, output_dtype, epi_dtype, interleaved),
    )


def many_short_lengths(batch: int, seed: int) -> list[int]:
    """Short requests (1-299 tokens), a fifth of them empty. On 132 SMs the schedule gives
    batch 260 two requests to most CTAs (1-3), 700 four or five (3-5) and 2000 ten to
    fourteen, so both q slots are reused inside a CTA, many times at 2000 (the EDGE_LENGTHS
    cases give a CTA at most two requests)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 300, (batch,), generator=gen)
    lengths[torch.rand(batch, generator=gen) < 0.2] = 0
    return lengths.tolist()


@pytest.mark.parametrize("batch", [260, 700, 2000])
@pytest.mark.parametrize(
    ("variant", "epi_dtype", "next_n"),
    [
        ("fp8", torch.float32, 2),
        ("fp4", torch.float32, 2),
        ("fp4", torch.bfloat16, 2),
        ("fp4", torch.bfloat16, 3),
        ("fp4", torch.bfloat16, 4),
    ],
)
def test_many_short_requests_per_cta(variant, epi_dtype, next_n, batch):
    """Both q slots reused inside each CTA (many_short_lengths says how often); fp4's
    bfloat16 epilogue also rewrites its head-sum tile's weights per request (one atom per
    draft slot, so next_n 2-4)."""
    lens = many_short_lengths(batch, seed=batch)
    kind = VARIANTS[variant]
    if variant == "fp8":
        case = fp8_case(64, next_n, seed=batch, lens=lens, max_seq_len=320)
    else:
        case = fp4_case(64, next_n, seed=batch, lens=lens)
    op, args, reference, dtype = kind.op, kind.args(case), kind.reference, kind.output_dtype
    out = poisoned_out(case.rows, args[-1], dtype)
    got = op(*args, out=out, epi_dtype=epi_dtype)
    expected = reference(*args)
    magnitude = magnitude_of(reference, args)
    tol = tolerance(dtype, epi_dtype)
    per_token = kind.per_token(case, dtype, epi_dtype)
    check_result(got, out, expected, case.seq_lens, next_n, tol, magnitude, **per_token)


def _float32_call(kind, case, epi_dtype):
    """One float32-output call of `case` into a `poisoned_out` buffer: (args, out, the result
    and the float64 reference on the CPU, the valid mask)."""
    args = kind.args(case)
    out = poisoned_out(case.rows, case.max_seq_len, torch.float32)
    got = kind.op(*args, output_dtype=torch.float32, epi_dtype=epi_dtype, out=out).cpu()
    expected = kind.reference(*args).cpu()
    return args, out, got, expected, valid_mask(case.seq_lens.cpu(), case.next_n, got.shape[1])


def _assert_close_where(kind, case, args, got, expected, mask, epi_dtype):
    """`got` within the float32 output's tolerance of `expected` on `mask`."""
    magnitude = magnitude_of(kind.reference, args)
    per_token = kind.per_token(case, torch.float32, epi_dtype)
    tol = tolerance(torch.float32, epi_dtype)
    assert_rows_close(got, expected, mask, tol, magnitude, **per_token)


# Each op with each of its epilogue dtypes.
EVERY_EPILOGUE = [
    ("fp8", torch.float32),
    ("fp8", torch.float16),
    ("fp4", torch.float32),
    ("fp4", torch.float16),
    ("fp4", torch.bfloat16),
]


@pytest.mark.parametrize("next_n", [2, 4])
@pytest.mark.parametrize(("variant", "epi_dtype"), EVERY_EPILOGUE)
def test_a_nan_weight_reaches_exactly_its_row(variant, epi_dtype, next_n):
    """weights[row, h] = NaN makes every valid logit of that row NaN (NaN times relu(score) is
    NaN even where the ReLU gives 0), and leaves every other row as the reference has it:
    each draft slot sums its own heads only. fp4's bfloat16 epilogue sums on the tensor cores
    over all draft slots' columns at once, with the other slots' weights held as zeros there,
    so a NaN in the wrong place of that tile would reach the other slots' rows."""
    kind = VARIANTS[variant]
    case = kind.make_case(64, next_n, seed=60 + next_n, lens=[300, 0, 129])
    poisoned_rows = [0 * next_n + next_n - 1, 2 * next_n + 0]  # request 0's newest, 2's oldest
    for row, head in zip(poisoned_rows, [5, 63]):
        case.weights[row, head] = float("nan")
    args, out, got, expected, valid = _float32_call(kind, case, epi_dtype)
    in_poisoned_row = torch.zeros_like(valid)
    in_poisoned_row[poisoned_rows] = True
    assert torch.isnan(expected[valid & in_poisoned_row]).all()
    assert torch.isnan(got[valid & in_poisoned_row]).all()
    # The same call into a finite buffer: those NaN were written by the kernel, not left over.
    finite_out = torch.full_like(out, UNTOUCHED)
    again = kind.op(*args, output_dtype=torch.float32, epi_dtype=epi_dtype, out=finite_out).cpu()
    assert torch.isnan(again[valid & in_poisoned_row]).all()
    others = valid & ~in_poisoned_row
    assert not torch.isnan(expected[others]).any()
    _assert_close_where(kind, case, args, got, expected, others, epi_dtype)


@pytest.mark.parametrize("next_n", [2, 4])
@pytest.mark.parametrize(("variant", "epi_dtype"), EVERY_EPILOGUE)
def test_infinite_zero_and_subnormal_weights(variant, epi_dtype, next_n):
    """An infinite weight (either sign) makes its row non-finite (written by the kernel, not
    left over) and no other; a row of zero weights is exactly 0; subnormal weights among normal
    ones turn nothing non-finite and keep their row within the tolerance (which a flush of
    them to 0, as the float16 epilogue does below 2^-25, also meets: this does not test how
    they are rounded). fp4 folds group scales into the weights and picks each slot's anchor
    from them, and its bfloat16 epilogue sums all slots' columns on the tensor cores, so a
    non-finite or zero slot must not move another's."""
    kind = VARIANTS[variant]
    case = kind.make_case(64, next_n, seed=70 + next_n, lens=[300, 0, 129])
    infinite_rows = [next_n - 1, 2 * next_n]  # request 0's newest, request 2's oldest
    case.weights[infinite_rows[0], 7] = float("inf")
    case.weights[infinite_rows[1], 40] = -float("inf")
    zero_row = 2 * next_n + 1
    case.weights[zero_row] = 0.0
    case.weights[0, 3] = 1e-42  # subnormal in float32
    case.weights[0, 11] = -1e-40
    args, out, got, expected, valid = _float32_call(kind, case, epi_dtype)
    in_infinite_row = torch.zeros_like(valid)
    in_infinite_row[infinite_rows] = True
    assert not torch.isfinite(expected[valid & in_infinite_row]).any()
    assert not torch.isfinite(got[valid & in_infinite_row]).any()
    # The same call into a finite buffer: the non-finite values were written by the kernel.
    finite_out = torch.full_like(out, UNTOUCHED)
    again = kind.op(*args, output_dtype=torch.float32, epi_dtype=epi_dtype, out=finite_out).cpu()
    assert not torch.isfinite(again[valid & in_infinite_row]).any()
    in_zero_row = torch.zeros_like(valid)
    in_zero_row[zero_row] = True
    assert (valid & in_zero_row).any()
    assert (got[valid & in_zero_row] == 0).all()
    others = valid & ~in_infinite_row
    assert torch.isfinite(expected[others]).all()
    _assert_close_where(kind, case, args, got, expected, others, epi_dtype)


# (next_n, num_heads) with num_heads % 8 == 4: an 8-column group of the MMA's N columns then
# holds the last four heads of one draft slot and the first four of the next (N 24, 16, 80,
# 200 and 144; only the last runs as two MMA halves, with a straddling group in each).
STRADDLING_HEADS = [(2, 12), (4, 4), (4, 20), (2, 100), (4, 36)]


@pytest.mark.parametrize("poison", ["nan", "past_float16"])
@pytest.mark.parametrize(("next_n", "num_heads"), STRADDLING_HEADS)
@pytest.mark.parametrize(
    ("epi_dtype", "acc_dtype"),
    list(itertools.product((torch.float16, torch.float32), repeat=2)),
)
def test_a_weight_beside_a_slot_boundary_inside_a_column_group_stays_in_its_row(
    next_n, num_heads, epi_dtype, acc_dtype, poison
):
    """Where a column group straddles two draft slots, a lane's weights belong to its own
    slot only: a NaN weight, or 7e4 (past float16's 65520, so the float16 epilogue rounds it
    to inf), on either side of the boundary reaches its own row and no other. The float16
    epilogue once leaked it into the neighbouring row; the float32 epilogue, which takes
    another path, is held to the same. (At 64 heads, as in
    `test_a_nan_weight_reaches_exactly_its_row`, no group straddles.)"""
    case = make_fp8_case(
        [300, 0, 129, 77],
        next_n=next_n,
        num_heads=num_heads,
        head_dim=128,
        block_size=64,
        max_seq_len=400,
        seed=70 + next_n + num_heads,
    ).to("cuda")
    value = float("nan") if poison == "nan" else 7.0e4
    # Request 0: slot 1's first head (beside slot 0's last); request 2: slot 0's last head
    # (beside slot 1's first); request 3: the last slot's first head; with four slots also
    # request 0's slot 2's last head (beside slot 3's first, in the second MMA half at N 144).
    poisoned = [(0 * next_n + 1, 0), (2 * next_n + 0, num_heads - 1), (3 * next_n + next_n - 1, 0)]
    if next_n == 4:
        poisoned.append((0 * next_n + 2, num_heads - 1))
    for row, head in poisoned:
        case.weights[row, head] = value
    poisoned_rows = [row for row, _ in poisoned]
    args = case.fp8_args()
    dtypes = {"output_dtype": torch.float32, "epi_dtype": epi_dtype, "acc_dtype": acc_dtype}
    out = poisoned_out(case.rows, case.max_seq_len, torch.float32)
    got = fa.fp8_paged_mqa_logits(*args, **dtypes, out=out).cpu()
    expected = fp8_paged_mqa_logits_reference(*args).cpu()
    valid = valid_mask(case.seq_lens.cpu(), next_n, got.shape[1])
    in_poisoned_row = torch.zeros_like(valid)
    in_poisoned_row[poisoned_rows] = True
    others = valid & ~in_poisoned_row
    assert others.any() and (valid & in_poisoned_row).any()
    magnitude = magnitude_of(fp8_paged_mqa_logits_reference, args)
    tol = tolerance(torch.float32, epi_dtype, acc_dtype)
    assert not torch.isnan(expected[others]).any()
    assert_rows_close(got, expected, others, tol, magnitude)
    if poison == "nan":
        # Into a finite buffer too: the NaN were written by the kernel, not left over.
        finite_out = torch.full_like(out, UNTOUCHED)
        again = fa.fp8_paged_mqa_logits(*args, **dtypes, out=finite_out).cpu()
        assert torch.isnan(again[valid & in_poisoned_row]).all()
        assert torch.isnan(got[valid & in_poisoned_row]).all()
    elif epi_dtype == torch.float32:  # the float16 epilogue may saturate these rows
        assert_rows_close(got, expected, valid & in_poisoned_row, tol, magnitude)


def test_fp8_spec_example_on_gpu():
    torch.manual_seed(0)
    B, next_n, num_heads, head_dim = 2, 3, 64, 128
    block_size, max_seq_len = 32, 8000
    seq_lens = torch.tensor([3000, 8000], dtype=torch.int32, device="cuda")
    width = fa.min_block_table_width(max_seq_len, block_size)
    block_tables = torch.arange(B * width, dtype=torch.int32, device="cuda").view(B, width)
    kv = torch.randn(B * width, block_size, head_dim, device="cuda").to(torch.float8_e4m3fn)
    kv_scales = torch.ones(B * width, block_size, device="cuda")
    kv_fused = torch.cat(
        [kv.view(torch.uint8).flatten(1), kv_scales.view(torch.uint8).flatten(1)], dim=1
    ).view(B * width, block_size, 1, head_dim + 4)
    q = torch.randn(B, next_n, num_heads, head_dim, device="cuda").to(torch.float8_e4m3fn)
    weights = torch.rand(B * next_n, num_heads, device="cuda")
    out = torch.full((6, fa.padded_seq_len(max_seq_len)), float("nan"), device="cuda")
    got = fa.fp8_paged_mqa_logits(
        q, kv_fused, weights, block_tables, seq_lens, max_seq_len, out=out
    )
    expected = fp8_paged_mqa_logits_reference(
        q, kv_fused, weights, block_tables, seq_lens, max_seq_len
    )
    assert_rows_close(got, expected, valid_mask(seq_lens.cpu(), next_n, max_seq_len), 2e-3)


def test_fp8_strided_tables_and_lengths():
    next_n = 2
    case = fp8_case(64, next_n, seed=3)
    tables = case.block_tables.repeat_interleave(next_n, dim=0)[::next_n]
    lens = case.seq_lens.repeat_interleave(next_n)[::next_n]
    out = poisoned_out(case.rows, case.max_seq_len, torch.float32)
    got = fa.fp8_paged_mqa_logits(
        case.q, case.kv_fused, case.weights, tables, lens, case.max_seq_len, out=out
    )
    expected = fp8_paged_mqa_logits_reference(*case.fp8_args())
    check_result(got, out, expected, case.seq_lens, next_n, tolerance(torch.float32))


def test_fp8_row_slice_of_a_wider_buffer():
    case = fp8_case(32, 1, seed=4)
    padded = fa.padded_seq_len(case.max_seq_len)
    # Finite around the slice, so that any stray write shows (NaN included); NaN where the
    # call may write, so that a valid element left unwritten shows.
    big = torch.full((case.rows + 7, 2048), UNTOUCHED, device="cuda")
    big[3 : 3 + case.rows, :padded] = float("nan")
    got = fa.fp8_paged_mqa_logits(*case.fp8_args(), out=big[3 : 3 + case.rows])
    assert (big[:3] == UNTOUCHED).all() and (big[3 + case.rows :] == UNTOUCHED).all()
    assert (big[3 : 3 + case.rows, padded:] == UNTOUCHED).all()
    expected = fp8_paged_mqa_logits_reference(*case.fp8_args())
    mask = valid_mask(case.seq_lens.cpu(), 1, case.max_seq_len)
    assert_rows_close(got, expected, mask, tolerance(torch.float32))


DETERMINISM_DTYPES = {
    # (output_dtype, epi_dtype[, acc_dtype]): the defaults and the 16-bit paths.
    "fp8": [
        (torch.float32,) * 3,
        (torch.float16,) * 3,
        (torch.float32, torch.float32, torch.float16),
    ],
    "fp4": [
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.bfloat16),  # the head sum on the tensor cores
        (torch.float16, torch.float16),
    ],
}


@pytest.mark.parametrize("next_n", [1, 2, 4])
@pytest.mark.parametrize(
    ("variant", "dtypes"),
    [(variant, dtypes) for variant, choices in DETERMINISM_DTYPES.items() for dtypes in choices],
)
def test_deterministic(variant, dtypes, next_n):
    # Each call into its own NaN-poisoned `out`: a fresh allocation would reuse the storage
    # the first call's result was copied out of, and hold its bits whether or not the second
    # call wrote them.
    kind = VARIANTS[variant]
    case = kind.make_case(64, next_n, seed=5)
    op, args = kind.op, kind.args(case)
    names = ("output_dtype", "epi_dtype", "acc_dtype")
    options = dict(zip(names, dtypes, strict=False))
    outs = [poisoned_out(case.rows, case.max_seq_len, dtypes[0]) for _ in range(2)]
    first, second = (op(*args, out=out, **options) for out in outs)
    mask = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
    assert torch.isfinite(first[mask]).all()
    # Bits, not values (torch.equal takes -0.0 for +0.0); the second call's unwritten
    # elements still hold the poison's NaN bits, which differ from the first's finite ones.
    bits = {4: torch.int32, 2: torch.int16}[first.element_size()]
    assert torch.equal(first[mask].view(bits), second[mask].view(bits))


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_back_to_back_calls_into_one_buffer_end_with_the_last(variant):
    """Calls one after another on one stream into one `out`, with no synchronisation between
    them, as a serving loop makes them (programmatic dependent launch on, the default). Two
    cases of the same shapes alternate, bursts of 5 and 6 calls, so each burst ends with
    either; after each burst `out` must hold the last call's logits, bit for bit those of the
    same call made alone. Both calls have the same schedule, so this does not see a kernel
    that writes before its `griddepcontrol.wait` (the next test does)."""
    kind = VARIANTS[variant]
    lens = [1300, 0, 1000, 1250, 1, 700] * 8  # 48 requests: about 5 units per CTA
    cases = [kind.make_case(64, 2, seed=seed, lens=lens) for seed in (21, 22)]
    op, dtype = kind.op, kind.output_dtype
    mask = valid_mask(cases[0].seq_lens, 2, cases[0].max_seq_len)
    alone = []
    for case in cases:
        result = op(*kind.args(case), out=poisoned_out(case.rows, case.max_seq_len, dtype))
        assert torch.isfinite(result[mask]).all()
        alone.append(result.clone())
    assert not torch.equal(alone[0][mask], alone[1][mask])
    out = poisoned_out(cases[0].rows, cases[0].max_seq_len, dtype)
    for burst in range(12):
        calls = 5 + burst % 2
        for i in range(calls):
            got = op(*kind.args(cases[i % 2]), out=out)
        torch.cuda.synchronize()
        last = (calls - 1) % 2
        assert torch.equal(got[mask], alone[last][mask]), f"burst {burst}"


def one_cta_schedule(seq_lens: torch.Tensor, next_n: int, variant: str) -> torch.Tensor:
    """A schedule of the device's shape in which CTA 0 does the whole batch and every other
    CTA starts and stops at the end sentinel (an empty range, as the helper gives idle SMs):
    the one-SM schedule's two rows, the sentinel repeated."""
    num_sms = torch.cuda.get_device_properties(seq_lens.device).multi_processor_count
    one_sm = fa.compute_paged_mqa_logits_schedule(
        seq_lens, next_n=next_n, variant=variant, num_sms=1
    )
    return torch.cat([one_sm[:1], one_sm[1:].expand(num_sms, 2)]).contiguous()


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_a_call_waits_until_the_previous_call_has_finished(variant):
    """The back-to-back test above cannot see a kernel that writes before
    `griddepcontrol.wait`: there both calls have the same schedule, so a CTA of the second call
    would have to overtake the first call's CTA of the same index (measured: both kernels
    with the wait removed passed it). Here the first call runs on one CTA (a hand-made
    schedule, the whole batch on CTA 0) for hundreds of microseconds while every other SM is
    idle, and the second call (same shapes, other data, the helper's schedule) is launched
    into the same `out` right after it. The first call triggers its dependents first thing, so
    under programmatic dependent launch the second call's CTAs are resident at once; only the wait
    keeps them from finishing before the first call does, whose later writes would then
    overwrite theirs. `out` must hold the second call's logits, bit for bit those it gives
    alone."""
    kind = VARIANTS[variant]
    next_n = 2
    lens = [1300, 0, 1000, 1250, 1, 700] * 32  # 192 requests, about 2100 units on one CTA
    slow_case, fast_case = (kind.make_case(64, next_n, seed=s, lens=lens) for s in (23, 24))
    slow_schedule = one_cta_schedule(slow_case.seq_lens, next_n, variant)
    op, dtype = kind.op, kind.output_dtype
    mask = valid_mask(slow_case.seq_lens, next_n, slow_case.max_seq_len)

    def alone(case, schedule=None):
        out = poisoned_out(case.rows, case.max_seq_len, dtype)
        result = op(*kind.args(case), schedule_meta=schedule, out=out)
        torch.cuda.synchronize()
        assert torch.isfinite(result[mask]).all()
        return result.clone()

    fast_alone = alone(fast_case)
    # The hand-made schedule is a valid one: the same logits as the helper's, bit for bit.
    assert torch.equal(alone(slow_case, slow_schedule)[mask], alone(slow_case)[mask])
    assert not torch.equal(alone(slow_case)[mask], fast_alone[mask])
    out = poisoned_out(slow_case.rows, slow_case.max_seq_len, dtype)
    for attempt in range(3):
        op(*kind.args(slow_case), schedule_meta=slow_schedule, out=out)
        got = op(*kind.args(fast_case), out=out)
        torch.cuda.synchronize()
        wrong = int((got[mask] != fast_alone[mask]).sum())
        assert wrong == 0, f"attempt {attempt}: {wrong} of {int(mask.sum())} logits differ"


@pytest.mark.parametrize(("variant", "next_n"), [("fp8", 1), ("fp8", 4), ("fp4", 2)])
def test_batch_invariant(variant, next_n):
    """A request's logits do not depend on the batch around it: bitwise the same alone
    (B = 1, another schedule and CTA) and inside the batch in reversed order."""
    kind = VARIANTS[variant]
    case, op = kind.make_case(64, next_n, seed=11), kind.op
    per_request_q = (case.q,) if variant == "fp8" else (case.q, case.q_sf)

    def call(order):
        index = torch.tensor(order, device="cuda")
        rows = (index[:, None] * next_n + torch.arange(next_n, device="cuda")).flatten()
        qs = tuple(t[index] for t in per_request_q)
        # A fresh NaN-poisoned buffer per call: the caching allocator would otherwise hand a
        # call the block of the one before, and rows it never wrote would hold equal bits.
        out = poisoned_out(len(order) * next_n, case.max_seq_len, kind.output_dtype)
        return op(
            *qs,
            case.kv_fused,
            case.weights[rows],
            case.block_tables[index],
            case.seq_lens[index],
            case.max_seq_len,
            out=out,
        ).clone()

    batch = len(EDGE_LENGTHS)
    whole = call(list(range(batch)))
    reversed_rows = call(list(range(batch - 1, -1, -1)))
    mask = valid_mask(case.seq_lens.cpu(), next_n, case.max_seq_len)
    # The bitwise comparisons below hold for a kernel equally wrong everywhere; the batch
    # itself is checked against the float64 reference.
    args = kind.args(case)
    expected, magnitude = kind.reference(*args), magnitude_of(kind.reference, args)
    per_token = kind.per_token(case, kind.output_dtype)  # fp4: each token to its own size
    assert_rows_close(whole, expected, mask, tolerance(kind.output_dtype), magnitude, **per_token)
    for b in range(batch):
        rows = slice(b * next_n, (b + 1) * next_n)
        alone = call([b])
        back = slice((batch - 1 - b) * next_n, (batch - b) * next_n)
        assert torch.equal(alone[mask[rows]], whole[rows][mask[rows]]), f"request {b} alone"
        assert torch.equal(reversed_rows[back][mask[rows]], whole[rows][mask[rows]]), (
            f"request {b} in the reversed batch"
        )


def test_given_schedule_equals_internal_schedule():
    case = fp8_case(128, 3, seed=6)
    schedule = fa.compute_paged_mqa_logits_schedule(case.seq_lens, next_n=3, variant="fp8")
    num_sms = torch.cuda.get_device_properties(case.q.device).multi_processor_count
    assert schedule.shape == (num_sms + 1, 2) and schedule.device == case.q.device
    # NaN-poisoned outputs: without `out`, the second call's fresh storage would be the one
    # the first call's result was cloned out of, and pass unwritten.
    outs = [poisoned_out(case.rows, case.max_seq_len, torch.float32) for _ in range(2)]
    with_schedule = fa.fp8_paged_mqa_logits(*case.fp8_args(), schedule_meta=schedule, out=outs[0])
    internal = fa.fp8_paged_mqa_logits(*case.fp8_args(), out=outs[1])
    mask = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
    assert torch.isfinite(internal[mask]).all()
    assert torch.equal(with_schedule[mask], internal[mask])


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_a_given_schedule_is_the_one_followed(variant):
    """White-box: with `schedule_meta` the kernel takes its CTA ranges from it, not from
    `seq_lens`. The helper's schedule of all-zero lengths (stale here, a validate-mode error)
    gives every CTA an empty range: nothing is written, and nothing hangs."""
    next_n = 2
    kind = VARIANTS[variant]
    case = kind.make_case(64, next_n, seed=8)
    op, args = kind.op, kind.args(case)
    dtype = torch.float32
    empty = fa.compute_paged_mqa_logits_schedule(
        torch.zeros_like(case.seq_lens), next_n=next_n, variant=variant
    )
    out = poisoned_out(case.rows, case.max_seq_len, dtype)
    op(*args, output_dtype=dtype, schedule_meta=empty, out=out)
    torch.cuda.synchronize()
    assert_nothing_written(out, case.rows, case.max_seq_len)
    # The fresh schedule, into the same buffer: every valid element written.
    schedule = fa.compute_paged_mqa_logits_schedule(case.seq_lens, next_n=next_n, variant=variant)
    got = op(*args, output_dtype=dtype, schedule_meta=schedule, out=out)
    mask = valid_mask(case.seq_lens.cpu(), next_n, case.max_seq_len)
    assert torch.isfinite(got.cpu()[mask]).all()
    assert_nothing_written_around(out, case.rows, case.max_seq_len)


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_negative_schedule_rows_stay_inside_the_problem(variant):
    """Outside validate mode a caller's `schedule_meta` is trusted, and inside graph capture
    never checked: an uninitialised buffer is the likely mistake. Negative rows must not move
    a read or write outside the problem (the walkers clamp a negative start to 0). Here CTAs
    0 and 1 get empty ranges and CTA 2 runs from the first unit to its helper end, so every
    valid element is still written."""
    next_n = 2
    kind = VARIANTS[variant]
    case = kind.make_case(64, next_n, seed=9, lens=[300, 0, 129, 257])
    args = kind.args(case)
    dtype = torch.float32
    schedule = fa.compute_paged_mqa_logits_schedule(case.seq_lens, next_n=next_n, variant=variant)
    assert schedule[3, 0] >= 0  # the helper's end of CTA 2's range, kept
    schedule[:3] = torch.tensor([[0, -3], [-2, 0], [-1, -100_000]], dtype=torch.int32)
    padded, guard = fa.padded_seq_len(case.max_seq_len), 3
    big = torch.full((case.rows + 2 * guard, padded + 256), UNTOUCHED, dtype=dtype, device="cuda")
    big[guard : guard + case.rows, :padded] = float("nan")
    got = kind.op(
        *args, output_dtype=dtype, schedule_meta=schedule, out=big[guard : guard + case.rows]
    )
    torch.cuda.synchronize()
    assert (big[:guard] == UNTOUCHED).all(), "written before out's first row"
    assert (big[guard + case.rows :] == UNTOUCHED).all(), "written past out's last row"
    assert (big[guard : guard + case.rows, padded:] == UNTOUCHED).all(), "written past the row"
    mask = valid_mask(case.seq_lens.cpu(), next_n, case.max_seq_len)
    assert_rows_close(
        got,
        kind.reference(*args),
        mask,
        tolerance(dtype),
        magnitude_of(kind.reference, args),
        **kind.per_token(case, dtype),
    )


# Block ids outside the pool, by how far: -1 (the "no page" mark of serving stacks), the
# first id past the pool, and the largest int32 (its scale address is far outside any
# allocation: a raw read there faults and poisons the CUDA context).
BAD_BLOCK_IDS = {
    "minus_one": lambda num_blocks: -1,
    "pool_end": lambda num_blocks: num_blocks,
    "int32_max": lambda num_blocks: 2**31 - 1,
}


@pytest.mark.parametrize("bad_id", BAD_BLOCK_IDS)
@pytest.mark.parametrize(
    ("variant", "block_size", "interleaved"),
    [
        ("fp8", 32, False),
        ("fp8", 64, False),
        ("fp8", 128, False),
        ("fp4", 32, False),
        ("fp4", 64, False),
        ("fp4", 128, False),
        ("fp4", 128, True),
    ],
)
def test_a_block_id_outside_the_pool_costs_only_its_positions(
    variant, block_size, interleaved, bad_id
):
    """A page id outside [0, num_blocks) inside a request's length is outside the contract,
    but serving stacks mark unallocated pages with -1 and a stale table can hold ids of a
    pool since shrunk, so one in the wrong place must not hang the GPU (the producer expected
    a -1 box's bytes and copied nothing, until 2026-12-02) nor read outside the pool (ids past
    its end went to the scales' bulk copy unchecked, until 2026-12-06). The call completes,
    writes only inside out's padded rows, and every position outside the bad page matches the
    reference computed with the intact table."""
    next_n = 2
    kind = VARIANTS[variant]
    lens = [300, 0, 129, 257]
    if variant == "fp8":
        case = fp8_case(block_size, next_n, seed=19, lens=lens)
    else:
        case = fp4_case(block_size, next_n, seed=19, interleaved=interleaved, lens=lens)
    flags = {"is_kv_sf_interleaved": True} if interleaved else {}
    expected = kind.reference(*kind.args(case), **flags)
    magnitude = magnitude_of(kind.reference, kind.args(case), **flags)
    per_token = kind.per_token(case, torch.float32, interleaved=interleaved)  # intact table
    # request 0's positions [block_size, 2 * block_size)
    case.block_tables[0, 1] = BAD_BLOCK_IDS[bad_id](case.kv_fused.shape[0])
    out = poisoned_out(case.rows, case.max_seq_len, torch.float32)
    got = kind.op(*kind.args(case), output_dtype=torch.float32, out=out, **flags)
    torch.cuda.synchronize()
    assert_nothing_written_around(out.cpu(), case.rows, case.max_seq_len)
    mask = valid_mask(case.seq_lens.cpu(), next_n, case.max_seq_len)
    mask[:next_n, block_size : 2 * block_size] = False
    assert_rows_close(got, expected, mask, tolerance(torch.float32), magnitude, **per_token)


def past_the_clamp_schedule(seq_lens: torch.Tensor, next_n: int, variant: str) -> torch.Tensor:
    """A schedule in which CTA 0 runs from the first unit to unit 100 of request 1, CTA 1 from
    there to unit 2 of request 2, CTA 2 to the end, every other CTA nothing (the end sentinel).
    With request 1 clamped below 100 units, CTA 1 starts past its end and must still compute
    request 2's units 0 and 1."""
    num_sms = torch.cuda.get_device_properties(seq_lens.device).multi_processor_count
    sentinel = fa.compute_paged_mqa_logits_schedule(
        seq_lens, next_n=next_n, variant=variant, num_sms=1
    )[1:]
    starts = torch.tensor([[0, 0], [1, 100], [2, 2]], dtype=torch.int32, device=seq_lens.device)
    return torch.cat([starts, sentinel.expand(num_sms - 2, 2)]).contiguous()


@pytest.mark.parametrize("schedule", ["in_kernel", "helper", "past_the_clamp"])
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_a_length_past_max_seq_len_writes_only_inside_out(variant, schedule, monkeypatch):
    """`seq_lens[b] > max_seq_len` is outside the contract (validate mode refuses it), but
    out's rows are sized from max_seq_len while the schedule follows the lengths, so the
    kernels wrote such a request's later units past its padded row, into the next rows and
    past the buffer (until 2026-12-06). They now clamp each length to max_seq_len: nothing is
    written outside out's rows and padded columns, the long request's first max_seq_len
    positions are its logits, and every other request is intact, including those after it
    in CTAs whose schedule range starts inside the long request past its clamped end (the
    schedule, given or in-kernel, follows the unclamped lengths). Not for lengths near 2^31
    in most of the batch, whose in-kernel schedule sum wraps (see compute_schedule_rows_warp)."""
    monkeypatch.delenv("FLASHINFER_VALIDATE_INPUTS", raising=False)
    next_n, max_seq_len = 2, 400
    kind = VARIANTS[variant]
    lens = [300, 20000, 129, 0, 257, 400, 20001, 70]  # the 20000s are the long ones
    if variant == "fp8":
        case = fp8_case(64, next_n, seed=23, lens=lens, max_seq_len=max(lens))
    else:
        fp4_cpu = make_fp4_case(lens, next_n=next_n, block_size=64, max_seq_len=max(lens), seed=23)
        case = fp4_cpu.to("cuda")
    args = kind.args(case)
    expected = kind.reference(*args)[:, :max_seq_len]
    magnitude = magnitude_of(kind.reference, args)[:, :max_seq_len]
    schedule_meta = None
    if schedule == "helper":
        schedule_meta = fa.compute_paged_mqa_logits_schedule(
            case.seq_lens, next_n=next_n, variant=variant
        )
    elif schedule == "past_the_clamp":
        schedule_meta = past_the_clamp_schedule(case.seq_lens, next_n, variant)
    padded, guard = fa.padded_seq_len(max_seq_len), 3
    dtype = torch.float32
    big = torch.full((case.rows + 2 * guard, padded + 256), UNTOUCHED, dtype=dtype, device="cuda")
    big[guard : guard + case.rows, :padded] = float("nan")
    call_args = (*args[:-1], max_seq_len)
    got = kind.op(
        *call_args,
        output_dtype=dtype,
        schedule_meta=schedule_meta,
        out=big[guard : guard + case.rows],
    )
    torch.cuda.synchronize()
    assert got.shape == (case.rows, max_seq_len)
    assert (big[:guard] == UNTOUCHED).all(), "written before out's first row"
    assert (big[guard + case.rows :] == UNTOUCHED).all(), "written past out's last row"
    assert (big[guard : guard + case.rows, padded:] == UNTOUCHED).all(), "written past the row"
    mask = valid_mask(case.seq_lens.cpu(), next_n, max_seq_len)
    assert mask[2:4].all() and mask[12:14].all()  # every position of the long requests' rows
    per_token = kind.per_token(case, dtype)
    if per_token:  # fp4: the token scales of the first max_seq_len positions, as `expected`
        per_token["column_scale"] = per_token["column_scale"][:, :max_seq_len]
    assert_rows_close(got, expected, mask, tolerance(dtype), magnitude, **per_token)


def in_another_pool(case, *, layers: int = 1, layer: int = 0, min_pool_bytes: int = 0):
    """The case's blocks moved into layer `layer` of a zeroed cache of `layers` interleaved
    layers ([num_blocks, layers, block bytes], so the pool view's pitch is `layers` blocks),
    at the last block ids of a pool of at least `min_pool_bytes`, in a view that starts one
    block into its allocation. The table entries follow the blocks; the garbage entries past
    each request stay as they are (never read)."""
    used, block_shape = case.kv_fused.shape[0], case.kv_fused.shape[1:]
    block_bytes = case.kv_fused[0].numel()
    total = max(-(-min_pool_bytes // (layers * block_bytes)), used)
    cache = torch.zeros(
        (total + 1, layers, block_bytes), dtype=torch.uint8, device=case.kv_fused.device
    )
    pool = cache[1:, layer].view(total, *block_shape)
    offset = total - used
    pool[offset:] = case.kv_fused
    tables = torch.where(case.block_tables >= 0, case.block_tables + offset, case.block_tables)
    return pool, tables


POOLS = {
    # Byte offsets of the used blocks need more than 32 bits (TMA coordinates, scale addresses).
    "past_4_gib": {"min_pool_bytes": 4 * 2**30 + 2**26},
    # One layer of a layer-interleaved cache: the block pitch is 4 blocks.
    "layer_2_of_4": {"layers": 4, "layer": 2},
}


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("block_size", [32, 128])
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_blocks_of_another_pool_layout(variant, block_size, pool):
    next_n = 2
    kind = VARIANTS[variant]
    case = kind.make_case(block_size, next_n, seed=8)
    args, call, reference, output_dtype = (
        kind.args(case),
        kind.op,
        kind.reference,
        kind.output_dtype,
    )
    expected, magnitude = reference(*args), magnitude_of(reference, args)
    kv_fused, tables = in_another_pool(case, **POOLS[pool])
    if pool == "past_4_gib":
        assert int(tables.max()) * kv_fused.stride(0) > 2**32
    moved = list(args)
    moved[kind.kv_index], moved[kind.table_index] = kv_fused, tables
    out = poisoned_out(case.rows, case.max_seq_len, output_dtype)
    got = call(*moved, out=out)
    tol, per_token = tolerance(output_dtype), kind.per_token(case, output_dtype)
    check_result(got, out, expected, case.seq_lens, next_n, tol, magnitude, **per_token)


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_a_negative_length_leaves_the_other_requests_intact(variant):
    """Lengths are >= 0 by contract (validate mode refuses others); without validate mode a
    negative one must not cut short the walk of a CTA whose range runs past it."""
    gen = torch.Generator().manual_seed(12)
    lens = torch.randint(1, 400, (300,), generator=gen)
    negative = torch.arange(300) % 7 == 3
    lens[negative] = 0
    kind = VARIANTS[variant]
    if variant == "fp8":
        case = fp8_case(64, 1, seed=12, lens=lens.tolist(), max_seq_len=400)
    else:
        case = make_fp4_case(lens.tolist(), block_size=64, max_seq_len=400, seed=12).to("cuda")
    args, call, reference, output_dtype = (
        kind.args(case),
        kind.op,
        kind.reference,
        kind.output_dtype,
    )
    expected, magnitude = reference(*args), magnitude_of(reference, args)
    with_negatives = case.seq_lens.clone()
    with_negatives[negative.cuda()] = -200
    moved = [with_negatives if a is case.seq_lens else a for a in args]
    out = poisoned_out(case.rows, case.max_seq_len, output_dtype)
    got = call(*moved, out=out)
    tol, per_token = tolerance(output_dtype), kind.per_token(case, output_dtype)
    check_result(got, out, expected, case.seq_lens, 1, tol, magnitude, **per_token)


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_an_empty_pool_with_empty_requests(variant):
    """No blocks and only zero-length requests: nothing to read or write (TMA cannot describe
    an empty pool, so no kernel is launched)."""
    kind = VARIANTS[variant]
    if variant == "fp8":
        case = make_fp8_case([0, 0], num_heads=64, head_dim=128, max_seq_len=64).to("cuda")
    else:
        case = make_fp4_case([0, 0], max_seq_len=64).to("cuda")
    args = list(kind.args(case))
    args[kind.kv_index] = args[kind.kv_index][:0]
    out = poisoned_out(case.rows, case.max_seq_len, kind.output_dtype)
    got = kind.op(*args, out=out)
    torch.cuda.synchronize()
    assert got.shape == (2, 64)
    assert_nothing_written(out, case.rows, case.max_seq_len)


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_empty_requests_and_max_seq_len_zero(variant):
    """Every request empty and max_seq_len 0 over a pool that has blocks: the kernel runs,
    returns a [rows, 0] view and writes nothing (found by tools/random_cases.py's seeds)."""
    kind = VARIANTS[variant]
    if variant == "fp8":
        case = make_fp8_case(
            [0, 0, 0], next_n=2, num_heads=64, head_dim=128, max_seq_len=0, spare_blocks=5
        ).to("cuda")
    else:
        case = make_fp4_case([0, 0, 0], next_n=2, max_seq_len=0, spare_blocks=5).to("cuda")
    args = kind.args(case)
    out = poisoned_out(case.rows, 0, kind.output_dtype)
    got = kind.op(*args, out=out)
    fresh = kind.op(*args)
    torch.cuda.synchronize()
    assert got.shape == (6, 0) and fresh.shape == (6, 0)
    assert_nothing_written(out, case.rows, 0)


def test_empty_batch_on_gpu():
    case = fp8_case(32, 1, seed=7, lens=[], max_seq_len=100)
    got = fa.fp8_paged_mqa_logits(*case.fp8_args())
    assert got.shape == (0, 100) and got.device.type == "cuda"


def test_validate_mode_refuses_stale_schedule_on_gpu(monkeypatch):
    monkeypatch.setenv("FLASHINFER_VALIDATE_INPUTS", "1")
    case = fp8_case(32, 1, seed=8)
    stale_lens = case.seq_lens.clone()
    stale_lens[0] += 500
    stale = fa.compute_paged_mqa_logits_schedule(stale_lens)
    with pytest.raises(ValueError, match="schedule_meta is stale"):
        fa.fp8_paged_mqa_logits(*case.fp8_args(), schedule_meta=stale)


# Lengths at capture, then new contents for the replay: each new length fits the blocks the
# table already maps, a non-empty request becomes empty and the longest shrinks.
GRAPH_LENGTHS = [300, 64, 500, 129]
REPLAY_LENGTHS = [200, 0, 480, 1]


@pytest.mark.parametrize("validate", [True, False], ids=["validate", "remembered-call"])
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_cuda_graph_replay_follows_new_seq_lens(variant, validate, monkeypatch):
    if validate:  # its device reads must be skipped inside the capture
        monkeypatch.setenv("FLASHINFER_VALIDATE_INPUTS", "1")
    else:  # the warm-up's remembered launch is what the capture records
        monkeypatch.delenv("FLASHINFER_VALIDATE_INPUTS", raising=False)
    next_n = 2
    kind = VARIANTS[variant]
    if variant == "fp8":
        case = fp8_case(64, next_n, seed=9, lens=GRAPH_LENGTHS, max_seq_len=600)
    else:
        case = fp4_case(64, next_n, seed=9, lens=GRAPH_LENGTHS)
    op, args, reference, dtype = kind.op, kind.args(case), kind.reference, kind.output_dtype
    max_seq_len = args[-1]
    out = poisoned_out(case.rows, max_seq_len, dtype)
    op(*args, out=out)  # warm-up: compile and load outside the capture
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(*args, out=out)  # schedule_meta=None: computed on the GPU inside the graph

    case.seq_lens.copy_(torch.tensor(REPLAY_LENGTHS, dtype=torch.int32))
    repoison(out, case.rows, max_seq_len)
    graph.replay()
    torch.cuda.synchronize()
    got = out[: case.rows, :max_seq_len]
    expected = reference(*args)  # args hold the same seq_lens tensor, now with new contents
    magnitude = magnitude_of(reference, args)
    per_token = kind.per_token(case, dtype)  # fp4: the token scales at the new lengths
    check_result(
        got, out, expected, case.seq_lens, next_n, tolerance(dtype), magnitude, **per_token
    )
