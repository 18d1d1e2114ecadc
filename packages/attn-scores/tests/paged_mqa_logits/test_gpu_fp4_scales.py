"""The SM90 MXFP4 kernel on group scales far apart (skipped without an SM90 GPU).

The kernel decodes E2M1 to E4M3 after rebasing each token's (and each q row's) group scales
on its largest one; decoded values are exact while a row's group exponents lie within 14 of
each other, and beyond that the smaller groups are rounded with a stated error bound (see the
header comment of csrc/fp4_paged_mqa_logits.cu). These tests put scales on both sides of that
line and at the UE8M0 extremes 0 and 254, always against the float64 reference built from the
dequantised bytes.
"""

from __future__ import annotations

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import (
    PagedCase,
    _paging,
    assert_rows_close,
    decode_mxfp4,
    make_fp4_case,
    pack_nibbles,
)
from flashinfer_attn_scores.paged_mqa_logits.reference import (
    fp4_paged_mqa_logits_reference,
    valid_mask,
)
from flashinfer_layouts import unpack_mxfp4_kv_cache
from test_gpu import (
    EDGE_LENGTHS,
    MAX_SEQ_LEN,
    absolute_floor,
    check_result,
    poisoned_out,
    tolerance,
)

pytestmark = pytest.mark.gpu

EXACT_WINDOW = 14  # group exponents within 14 of the row's largest decode exactly


def magnitude(args, interleaved=False):
    """The reference with |weights|: the size of the head terms each logit sums."""
    q, q_sf, kv, w, *rest = args
    return fp4_paged_mqa_logits_reference(
        q, q_sf, kv, w.abs(), *rest, is_kv_sf_interleaved=interleaved
    )


def run(case, output_dtype=torch.float32, epi_dtype=torch.float32, interleaved=False):
    out = poisoned_out(case.rows, case.max_seq_len, output_dtype)
    got = fa.fp4_paged_mqa_logits(
        *case.fp4_args(),
        output_dtype=output_dtype,
        epi_dtype=epi_dtype,
        is_kv_sf_interleaved=interleaved,
        out=out,
    )
    return got, out


@pytest.mark.parametrize("exponent_range", [(113, 127), (127, 141), (100, 114)])
@pytest.mark.parametrize("output_dtype", [torch.float32, torch.bfloat16])
def test_group_scales_spanning_the_exact_window(exponent_range, output_dtype):
    case = make_fp4_case(
        EDGE_LENGTHS,
        next_n=2,
        block_size=64,
        max_seq_len=MAX_SEQ_LEN,
        spare_blocks=16,
        exponent_range=exponent_range,
        seed=sum(exponent_range),
    ).to("cuda")
    got, out = run(case, output_dtype)
    expected = fp4_paged_mqa_logits_reference(*case.fp4_args())
    check_result(
        got,
        out,
        expected,
        case.seq_lens,
        2,
        tolerance(output_dtype),
        magnitude(case.fp4_args()),
        column_scale=case.token_scales(),
        abs_floor=absolute_floor(output_dtype),
    )


# fp4 (output_dtype, epi_dtype): every epilogue, the bfloat16 one on the tensor cores.
EPILOGUES = [
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16),
]


def check_against_expectation(case, output_dtype, epi_dtype, unit=1.0):
    """One call into a poisoned buffer against the float64 expectation of the test cases
    (`attn_scores_cases.expected_logits`, not the package's reference). The logits are compared
    in units of `unit` (exact powers of two): `assert_rows_close` floors a row's magnitude at
    1e-30, which would swallow logits near 2^-120 whole. Per token (`column_scale`), so a
    token far below its row's largest is held to its own size."""
    got, out = run(case, output_dtype, epi_dtype)
    torch.cuda.synchronize()
    check_result(
        got.double() / unit,
        out,
        case.expected() / unit,
        case.seq_lens,
        case.next_n,
        tolerance(output_dtype, epi_dtype),
        case.expected(abs_weights=True) / unit,
        column_scale=case.token_scales(),
        abs_floor=absolute_floor(output_dtype, epi_dtype) / unit,
    )


@pytest.mark.parametrize(("output_dtype", "epi_dtype"), EPILOGUES)
@pytest.mark.parametrize("next_n", [2, 3, 4])
def test_draft_slots_whose_q_scales_differ(next_n, output_dtype, epi_dtype):
    """Draft slot t's q scales are shifted by (0, -6, -2, -9)[t] binades, so each slot has its
    own largest q exponent Q_t, which the kernel folds out of the slot's weights and back into
    its sums. A slot that took another slot's Q_t would be off by 2^2 to 2^9. (Drawn alike, as
    in the random cases, every slot's largest exponent is the range's top: a kernel mixing up
    the slots' Q_t passed them all; tools/kernel_mutants.py, fp4-slot-exponent.)"""
    shifts = (0, -6, -2, -9)[:next_n]
    case = make_fp4_case(
        EDGE_LENGTHS,
        next_n=next_n,
        block_size=64,
        max_seq_len=MAX_SEQ_LEN,
        spare_blocks=16,
        q_slot_exponent_shifts=shifts,
        seed=60 + next_n,
    ).to("cuda")
    check_against_expectation(case, output_dtype, epi_dtype)


@pytest.mark.parametrize(
    ("output_dtype", "epi_dtype"), [e for e in EPILOGUES if e[1] != torch.float16]
)
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_every_scale_far_below_one(next_n, output_dtype, epi_dtype):
    """Every k and q scale in [2^-69, 2^-63] (UE8M0 58-64): a logit's final power of two
    2^(M + Q_t - 266) is about 2^-140, below float32's normal range, while each row's largest
    logits (about 2^-120 to 2^-116) are normal float32 and bfloat16 numbers (a few smaller
    ones are subnormal, rounded by at most 2^-150 in float32 and 2^-134 in bfloat16, far below
    the bound). A power-of-two scaling clamped at
    2^-126 passed every earlier test (tools/kernel_mutants.py, pow2-clamp). Not with the
    float16 epilogue, which rounds each head term to float16 and so, correctly, to 0."""
    case = make_fp4_case(
        EDGE_LENGTHS,
        next_n=next_n,
        block_size=32,
        max_seq_len=MAX_SEQ_LEN,
        spare_blocks=16,
        exponent_range=(58, 64),
        seed=70 + next_n,
    ).to("cuda")
    expected = case.expected()
    valid = valid_mask(case.seq_lens.cpu(), next_n, case.max_seq_len)
    # The premise: the logits are normal numbers far below 1.
    largest = expected[valid].abs().max()
    assert 2.0**-126 < largest < 2.0**-100, float(largest)
    check_against_expectation(case, output_dtype, epi_dtype, unit=2.0**-120)


def _set_request_exponents(
    case, request: int, k_exponents, q_exponents, gen, highest: int = 254
) -> None:
    """Overwrite the UE8M0 bytes of one request's KV blocks (each token drawn alike, so the
    scale order does not matter) and q rows; k bytes are clamped to [0, `highest`]."""
    block_size = case.kv_fused.shape[1]
    n_blocks = -(-int(case.seq_lens[request]) // block_size)
    blocks = case.block_tables[request, :n_blocks].long()
    scale_region = case.kv_fused.view(case.kv_fused.shape[0], -1)[:, block_size * 64 :]
    picked = torch.tensor(k_exponents, dtype=torch.int64)
    per_token = picked[torch.randint(0, len(picked), (n_blocks, block_size, 1), generator=gen)]
    jitter = torch.randint(0, 7, (n_blocks, block_size, 4), generator=gen)
    k_bytes = (per_token + jitter).clamp(0, highest).to(torch.uint8)  # groups within 6
    scale_region[blocks] = k_bytes.view(n_blocks, block_size * 4)
    low, high = q_exponents
    q_bytes = torch.randint(low, high + 1, (*case.q_sf[request].shape, 4), generator=gen)
    case.q_sf[request] = q_bytes.to(torch.uint8).view(torch.int32).squeeze(-1)


def test_ue8m0_extremes_0_and_254():
    """Tokens scaled 2^127 / 2^0 / 2^-127 against q scaled 2^-127 and the mirror image; every
    product of scales stays inside float32 or underflows to values far below the row."""
    gen = torch.Generator().manual_seed(11)
    case = make_fp4_case([700, 513, 64], next_n=1, block_size=32, spare_blocks=8, seed=11)
    _set_request_exponents(case, 0, [0, 127, 248], (0, 6), gen)  # k up to 2^127, q near 2^-127
    _set_request_exponents(case, 1, [0, 6], (248, 254), gen)  # the mirror image
    _set_request_exponents(case, 2, [248], (0, 6), gen)
    case = case.to("cuda")
    # Per token, in units of 2^-120 (check_per_token_in_units): request 0's tokens at 2^0
    # against q near 2^-127 give logits near 2^-106, which a row bound set by its tokens at
    # 2^121 would cover whole; those at 2^-127 underflow, which the absolute floor accepts.
    for output_dtype in (torch.float32, torch.bfloat16):
        got, out = run(case, output_dtype)
        expected = fp4_paged_mqa_logits_reference(*case.fp4_args())
        check_per_token_in_units(case, got, out, expected, magnitude(case.fp4_args()), output_dtype)


def check_per_token_in_units(
    case, got, out, expected, size, output_dtype, interleaved=False, unit=2.0**-120
):
    """`check_result` per token (next_n 1), every figure divided by `unit` first, so that rows
    whose magnitude is far below `assert_rows_close`'s 1e-30 floor are still compared."""
    check_result(
        got.double() / unit,
        out,
        expected / unit,
        case.seq_lens,
        1,
        tolerance(output_dtype),
        size / unit,
        column_scale=case.token_scales(interleaved),
        abs_floor=absolute_floor(output_dtype) / unit,
    )


@pytest.mark.parametrize(("block_size", "interleaved"), [(64, False), (128, True)])
def test_ue8m0_byte_255_reads_as_2_to_the_128(block_size, interleaved):
    """OCP MX reserves byte 255 for NaN; here it is the exponent 128 (docs/layouts.md), in the
    kernel as in the reference. k groups up to 2^128 against q near 2^-127, the mirror image,
    and a request whose every k group is at 2^128. Per token, in units of 2^-120 (as
    `test_ue8m0_extremes_0_and_254`): a token whose largest byte is 255 is divided by 2^128
    (finite in float64, as the reference decodes it), and requests 0 and 1 have tokens up to
    6 and 12 binades apart, so the smaller ones are held to their own size."""
    gen = torch.Generator().manual_seed(12)
    case = make_fp4_case(
        [300, 257, 64],
        next_n=1,
        block_size=block_size,
        interleaved=interleaved,
        spare_blocks=8,
        seed=12,
    )
    _set_request_exponents(case, 0, [249], (0, 6), gen, highest=255)
    _set_request_exponents(case, 1, [0, 6], (249, 255), gen, highest=255)
    _set_request_exponents(case, 2, [255], (0, 6), gen, highest=255)
    scale_bytes = case.kv_fused.view(case.kv_fused.shape[0], -1)[:, block_size * 64 :]
    assert (scale_bytes == 255).any() and (case.q_sf.view(torch.uint8) == 255).any()
    case = case.to("cuda")
    # Divided by their tokens' 2^122-2^128, the magnitudes of requests 0 and 2 are near
    # 2^-111, under assert_rows_close's 1e-30 floor of a row's magnitude: without the unit
    # (2^-120) their rows would pass whatever the kernel wrote.
    for output_dtype in (torch.float32, torch.bfloat16):
        got, out = run(case, output_dtype, interleaved=interleaved)
        args = case.fp4_args()
        expected = fp4_paged_mqa_logits_reference(*args, is_kv_sf_interleaved=interleaved)
        size = magnitude(args, interleaved)
        check_per_token_in_units(case, got, out, expected, size, output_dtype, interleaved)


def case_from_codes(
    q_codes, q_exp, k_codes, k_exp, weights, table, lens: list[int], next_n: int
) -> PagedCase:
    """A PagedCase from E2M1 codes and UE8M0 bytes: q [B, next_n, H, D] / [B, next_n, H, 4],
    K [blocks, block_size, D] / [blocks, block_size, 4] (token-major scales), weights
    [B, next_n, H] or [B * next_n, H]."""
    num_blocks, block_size, head_dim = k_codes.shape
    kv_fused = torch.cat(
        [pack_nibbles(k_codes).flatten(1), k_exp.to(torch.uint8).flatten(1)], dim=1
    ).view(num_blocks, block_size, 1, head_dim // 2 + 4)
    return PagedCase(
        q=pack_nibbles(q_codes),
        q_sf=q_exp.to(torch.uint8).contiguous().view(torch.int32).squeeze(-1),
        kv_fused=kv_fused,
        weights=weights.reshape(len(lens) * next_n, -1).float(),
        block_tables=table,
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        max_seq_len=MAX_SEQ_LEN,
        next_n=next_n,
        q64=decode_mxfp4(q_codes, q_exp),
        k64=decode_mxfp4(k_codes, k_exp),
        token_scale64=None,
    )


def make_far_apart_heads_case(
    top: int, spread: int, weight_exponent: int, negative_top_heads: bool, next_n: int, seed: int
) -> PagedCase:
    """Every k element >= 0; in each draft slot 48 "top" heads have q scale bytes near `top` and
    16 heads bytes near `top - spread` (groups within 6 of each other). With
    `negative_top_heads` the top heads' q elements are all <= 0, so their ReLU is zero at every
    position and each logit is the small heads' sum alone, however far below the top heads they
    are. Weights are N(0, 1) times 2^weight_exponent."""
    num_heads, head_dim, block_size = 64, 128, 64
    gen = torch.Generator().manual_seed(seed)
    lens = [700, 129, 0, 1, 256]
    table, num_blocks = _paging(gen, lens, block_size, 8, None)
    k_codes = torch.randint(0, 8, (num_blocks, block_size, head_dim), generator=gen)  # sign clear
    k_exp = torch.randint(120, 129, (num_blocks, block_size, 4), generator=gen)
    shape = (len(lens), next_n, num_heads)
    top_head = torch.rand(*shape, generator=gen).argsort(dim=-1) < 48
    q_codes = torch.randint(0, 16, (*shape, head_dim), generator=gen)
    if negative_top_heads:  # sign bit set, magnitude nonzero
        negative = torch.randint(9, 16, (*shape, head_dim), generator=gen)
        q_codes = torch.where(top_head[..., None], negative, q_codes)
    base = torch.where(top_head, top, top - spread)[..., None]
    q_exp = (base - torch.randint(0, 7, (*shape, 4), generator=gen)).clamp(0, 254)
    weights = torch.randn(len(lens) * next_n, num_heads, generator=gen) * 2.0**weight_exponent
    return case_from_codes(q_codes, q_exp, k_codes, k_exp, weights, table, lens, next_n)


# (top, spread, weight exponent, negative top heads): heads 100-200 binades below the largest
# of their slot, on every position the only ones with a nonzero ReLU (folding their scale into
# the weights relative to the largest head underflowed from about 126 binades); weights far
# below and far above 1 (weights near 2^108 overflowed the float32 sums while the logits were
# near 2^118).
FAR_APART_HEADS = [
    (254, 100, 0, True),
    (254, 150, 0, True),
    (254, 200, 0, True),
    (200, 60, -100, True),
    (127, 0, 108, False),
    (130, 30, 100, False),
]


@pytest.mark.parametrize(
    ("output_dtype", "epi_dtype"), [e for e in EPILOGUES if e[1] != torch.float16]
)
@pytest.mark.parametrize(
    ("top", "spread", "weight_exponent", "negative_top_heads"), FAR_APART_HEADS
)
def test_heads_far_apart_in_one_draft_slot(
    top, spread, weight_exponent, negative_top_heads, output_dtype, epi_dtype
):
    """The float32 and tensor-core epilogues fold each head's q scale into its weight against
    a per-slot anchor chosen from the weights and q exponents (fold_anchor in the kernel). Not
    the float16 epilogue, which is exact only while M + Q_t lies in [156, 367] (its
    header comment)."""
    case = make_far_apart_heads_case(
        top, spread, weight_exponent, negative_top_heads, next_n=2, seed=top + spread
    )
    expected = case.expected()
    valid = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
    # The premise: logits are nonzero normal floats, far from float32's overflow.
    largest = expected[valid].abs().max()
    assert 2.0**-100 < largest < 2.0**120, float(largest)
    unit = 2.0 ** int(torch.log2(largest).floor())
    check_against_expectation(case.to("cuda"), output_dtype, epi_dtype, unit=unit)


def _rounding_bound(case) -> torch.Tensor:
    """Per-logit bound on the error of decoding groups beyond the exact window.

    A rounded element moves by at most 2^(M - 143) in true units (M: the largest exponent of its
    token or q row); |relu(a) - relu(b)| <= |a - b|, so
    |err[t, p]| <= sum_h |w_th| * sum_i ((|q_i| + dq_i) * dk_i + |k_i| * dq_i).
    """
    block_size = case.kv_fused.shape[1]
    _, k_scales = unpack_mxfp4_kv_cache(case.kv_fused.cpu())  # [blocks, bs, 4] token order
    k_exp = k_scales.to(torch.int64)
    k_max = k_exp.amax(-1, keepdim=True)
    k_delta = torch.where(
        k_max - k_exp > EXACT_WINDOW, torch.pow(2.0, (k_max - 143).double()), 0.0
    ).repeat_interleave(32, dim=-1)
    q_exp = case.q_sf.cpu().contiguous().view(torch.uint8).view(*case.q_sf.shape, 4).to(torch.int64)
    q_max = q_exp.amax(-1, keepdim=True)
    q_delta = torch.where(
        q_max - q_exp > EXACT_WINDOW, torch.pow(2.0, (q_max - 143).double()), 0.0
    ).repeat_interleave(32, dim=-1)
    q_abs, k_abs = case.q64.abs().cpu(), case.k64.abs().cpu()
    w_abs = case.weights.cpu().abs().double()
    next_n = case.next_n
    bound = torch.zeros(case.rows, case.max_seq_len, dtype=torch.float64)
    for b, length in enumerate(case.seq_lens.tolist()):
        if length == 0:
            continue
        pos = torch.arange(length)
        blocks = case.block_tables[b].cpu().long()[pos // block_size]
        keys, dk = k_abs[blocks, pos % block_size], k_delta[blocks, pos % block_size]
        per_head = torch.einsum("thd,pd->thp", q_abs[b] + q_delta[b], dk) + torch.einsum(
            "thd,pd->thp", q_delta[b], keys
        )
        rows = slice(b * next_n, (b + 1) * next_n)
        bound[rows, :length] = torch.einsum("th,thp->tp", w_abs[rows], per_head)
    return bound


def test_group_scales_beyond_the_exact_window_stay_within_the_stated_bound():
    case = make_fp4_case(
        EDGE_LENGTHS,
        next_n=2,
        block_size=128,
        max_seq_len=MAX_SEQ_LEN,
        spare_blocks=8,
        exponent_range=(90, 160),  # up to 70 binades between the groups of one token
        seed=12,
    ).to("cuda")
    got, _ = run(case, torch.float32)
    expected = fp4_paged_mqa_logits_reference(*case.fp4_args()).cpu()
    mask = valid_mask(case.seq_lens.cpu(), case.next_n, case.max_seq_len)
    size = torch.where(mask, magnitude(case.fp4_args()).cpu().abs(), 0.0).amax(dim=1)
    allowed = _rounding_bound(case) + tolerance(torch.float32) * size[:, None]
    err = (got.cpu().double() - expected).abs()
    assert torch.isfinite(got.cpu()[mask]).all()
    assert (err[mask] <= allowed[mask]).all(), float((err / allowed)[mask].max())
    # The bound is not vacuous here: some logits do have rounded groups.
    assert (_rounding_bound(case)[mask] > 0).any()


def test_spec_zero_placeholder_example_on_gpu():
    B, next_n, num_heads, head_dim = 2, 3, 64, 128
    block_size, max_seq_len = 32, 8000
    seq_lens = torch.tensor([3000, 8000], dtype=torch.int32, device="cuda")
    width = fa.min_block_table_width(max_seq_len, block_size)
    block_tables = torch.arange(B * width, dtype=torch.int32, device="cuda").view(B, width)
    weights = torch.rand(B * next_n, num_heads, device="cuda")
    q = torch.zeros(B, next_n, num_heads, head_dim // 2, dtype=torch.uint8, device="cuda")
    q_sf = torch.zeros(B, next_n, num_heads, dtype=torch.int32, device="cuda")
    kv_fused = torch.zeros(
        B * width, block_size, 1, head_dim // 2 + 4, dtype=torch.uint8, device="cuda"
    )
    logits = fa.fp4_paged_mqa_logits(
        q, q_sf, kv_fused, weights, block_tables, seq_lens, max_seq_len
    )
    assert logits.shape == (6, 8000) and logits.dtype == torch.bfloat16
    mask = valid_mask(seq_lens.cpu(), next_n, max_seq_len)
    assert (logits.cpu()[mask] == 0).all()

    # NaN first: fresh memory may already hold the zeros this call must write.
    out = torch.full(
        (B * next_n, fa.padded_seq_len(max_seq_len)),
        float("nan"),
        dtype=torch.bfloat16,
        device="cuda",
    )
    again = fa.fp4_paged_mqa_logits(
        q, q_sf, kv_fused, weights, block_tables, seq_lens, max_seq_len, out=out
    )
    assert again.data_ptr() == out.data_ptr()
    assert (again.cpu()[mask] == 0).all()


@pytest.mark.parametrize("interleaved", [False, True])
def test_fp4_precomputed_schedule_and_random_magnitudes(interleaved):
    """A caller-built schedule (variant='fp4') gives the same bits as the internal one, and
    those match the reference per token (group scales 120-128: tokens up to 8 binades apart
    in one row)."""
    case = make_fp4_case(
        [4000, 0, 130, 2500],
        next_n=4,
        block_size=128,
        interleaved=interleaved,
        spare_blocks=4,
        seed=13,
    ).to("cuda")
    schedule = fa.compute_paged_mqa_logits_schedule(case.seq_lens, next_n=4, variant="fp4")
    args = case.fp4_args()
    # NaN-poisoned outputs: without `out`, the second call's fresh storage would be the one
    # the first call's result was cloned out of, and pass (the reference check too) unwritten.
    outs = [poisoned_out(case.rows, case.max_seq_len, torch.bfloat16) for _ in range(2)]
    given = fa.fp4_paged_mqa_logits(
        *args, is_kv_sf_interleaved=interleaved, schedule_meta=schedule, out=outs[0]
    )
    internal = fa.fp4_paged_mqa_logits(*args, is_kv_sf_interleaved=interleaved, out=outs[1])
    mask = valid_mask(case.seq_lens, 4, case.max_seq_len)
    assert torch.equal(given[mask], internal[mask])  # NaN != NaN: an unwritten element fails
    expected = fp4_paged_mqa_logits_reference(*args, is_kv_sf_interleaved=interleaved)
    assert_rows_close(
        internal,
        expected,
        mask.cpu(),
        tolerance(torch.bfloat16),
        magnitude(args, interleaved),
        column_scale=case.token_scales(interleaved),
        abs_floor=absolute_floor(torch.bfloat16),
    )


def make_fold_edge_case(next_n: int, edge: str, seed: int) -> PagedCase:
    """Cases at the ends of the fold's exponent ranges (fold_anchor in the kernel). In every
    draft slot 16 "anchor" heads have q scale bytes 255 and every q element < 0 (k >= 0, so
    their ReLU is zero at every position) and weights that set the slot's anchor R_t; the other
    48 heads make the logits.

    - "anchor-253": anchor weights 2^92, so R_t = 92 + 255 - 94 = 253; the other heads have q
      bytes 0 and weights of either sign near 2^126, so w_h 2^(Mq_h - R_t) needs 2^-253 (the
      fold clamped it to 2^-252 and doubled those heads until 2026-12-02).
    - "final-253": anchor weights 2^104, so R_t = 265 (kMaxAnchor); k's group 0 has byte 255
      (M = 255) and groups 1-3 byte 241 (within the exact window), and the other heads read only
      groups 1-3, with q bytes 120 and weights +-1: the float32 epilogue's final power of two is
      2^(M + R_t - 267) = 2^253 (next_n 3 clamped it to 2^252 and halved every logit). Their
      |w_h| 2^Mq_h is 2^239 below the anchor heads', beyond the documented 2^220 window, but
      exact powers of two fold exactly in float32.
    """
    num_heads, head_dim, block_size = 64, 128, 64
    gen = torch.Generator().manual_seed(seed)
    lens = [300, 0, 129, 1, 64]
    table, num_blocks = _paging(gen, lens, block_size, 8, None)
    shape = (len(lens), next_n, num_heads)
    anchor_head = torch.rand(*shape, generator=gen).argsort(dim=-1) < 16
    negative = torch.randint(9, 16, (*shape, head_dim), generator=gen)  # sign set, nonzero
    if edge == "anchor-253":
        k_codes = torch.randint(0, 8, (num_blocks, block_size, head_dim), generator=gen)
        k_exp = torch.randint(120, 129, (num_blocks, block_size, 4), generator=gen)
        q_codes = torch.randint(0, 16, (*shape, head_dim), generator=gen)
        small_exp, anchor_weight = 0, 2.0**92
        small_weight = (1 + torch.rand(*shape, generator=gen)) * 2.0**126
    else:
        k_codes = torch.randint(0, 8, (num_blocks, block_size, head_dim), generator=gen)
        k_codes[..., 32:] = torch.randint(0, 2, (num_blocks, block_size, 96), generator=gen)
        k_exp = torch.tensor([255, 241, 241, 241]).expand(num_blocks, block_size, 4)
        choices = torch.tensor([0, 0, 0, 1, 9])  # mostly 0, else +-0.5
        q_codes = choices[torch.randint(0, 5, (*shape, head_dim), generator=gen)]
        q_codes[..., :32] = 0  # k's group 0 (2^128) never meets a nonzero q element
        small_exp, anchor_weight = 120, 2.0**104
        small_weight = torch.ones(*shape)
    sign = torch.where(torch.rand(*shape, generator=gen) < 0.5, -1.0, 1.0)
    weights = torch.where(anchor_head, anchor_weight, sign * small_weight)
    q_codes = torch.where(anchor_head[..., None], negative, q_codes)
    q_exp = torch.where(anchor_head, 255, small_exp)[..., None].expand(*shape, 4)
    return case_from_codes(q_codes, q_exp, k_codes, k_exp, weights, table, lens, next_n)


@pytest.mark.parametrize(
    ("edge", "output_dtype", "epi_dtype"),
    [
        ("anchor-253", torch.float32, torch.float32),
        ("anchor-253", torch.bfloat16, torch.bfloat16),
        ("final-253", torch.float32, torch.float32),
    ],
)
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_fold_at_the_ends_of_its_exponent_ranges(next_n, edge, output_dtype, epi_dtype):
    """Found by reading the kernel (2026-12-02): the fold's and the next_n 3 epilogue's power
    of two went through a helper that clamps its exponent to +-252."""
    case = make_fold_edge_case(next_n, edge, seed=7 + next_n)
    expected = case.expected()
    valid = valid_mask(case.seq_lens, next_n, case.max_seq_len)
    # The premise: normal float32 logits, most of them nonzero, far from overflow.
    largest = expected[valid].abs().max()
    assert 2.0**-100 < largest < 2.0**120, float(largest)
    assert (expected[valid] != 0).float().mean() > 0.5
    unit = 2.0 ** int(torch.log2(largest).floor())
    check_against_expectation(case.to("cuda"), output_dtype, epi_dtype, unit=unit)
