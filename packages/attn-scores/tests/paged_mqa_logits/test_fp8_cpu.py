"""fp8_paged_mqa_logits on CPU tensors (the float64 reference behind the public contract)."""

from __future__ import annotations

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import (
    assert_rows_close,
    expected_logits,
    is_untouched,
    make_fp8_case,
    untouched_buffer,
)
from flashinfer_attn_scores.paged_mqa_logits.reference import (
    fp8_paged_mqa_logits_reference,
    valid_mask,
)
from test_errors import pitched

FP32_CPU_TOL = 1e-6  # float64 reference rounded once to float32
FP16_CPU_TOL = 1e-3  # rounded once to float16 (2**-11 relative), against the row maximum


def test_spec_example_runs_and_matches_float64():
    """The spec's fp8 example with `flashinfer.` -> `flashinfer_attn_scores.`, on the CPU."""
    torch.manual_seed(0)
    B, next_n, num_heads, head_dim = 2, 3, 64, 128
    block_size, max_seq_len = 32, 8000
    device = "cpu"

    seq_lens = torch.tensor([3000, 8000], dtype=torch.int32, device=device)
    blocks_per_seq = fa.min_block_table_width(max_seq_len, block_size)  # 250
    num_blocks = B * blocks_per_seq
    block_tables = torch.arange(num_blocks, dtype=torch.int32, device=device).view(
        B, blocks_per_seq
    )
    kv = torch.randn(num_blocks, block_size, head_dim, device=device).to(torch.float8_e4m3fn)
    kv_scales = torch.ones(num_blocks, block_size, device=device)
    kv_fused = torch.cat(
        [kv.view(torch.uint8).flatten(1), kv_scales.view(torch.uint8).flatten(1)],
        dim=1,
    ).view(num_blocks, block_size, 1, head_dim + 4)
    q = torch.randn(B, next_n, num_heads, head_dim, device=device).to(torch.float8_e4m3fn)
    weights = torch.rand(B * next_n, num_heads, device=device)

    logits = fa.fp8_paged_mqa_logits(q, kv_fused, weights, block_tables, seq_lens, max_seq_len)
    assert blocks_per_seq == 250
    assert logits.shape == (6, 8000) and logits.dtype == torch.float32
    assert logits.stride() == (fa.padded_seq_len(max_seq_len), 1) == (8192, 1)

    expected = expected_logits(
        q.to(torch.float64),
        kv.to(torch.float64),
        kv_scales.to(torch.float64),
        weights,
        block_tables,
        seq_lens,
        max_seq_len,
    )
    mask = valid_mask(seq_lens, next_n, max_seq_len)
    assert int(mask.sum()) == 2998 + 2999 + 3000 + 7998 + 7999 + 8000
    assert_rows_close(logits, expected, mask, FP32_CPU_TOL)

    out = torch.empty(B * next_n, fa.padded_seq_len(max_seq_len), dtype=torch.float32)
    logits_out = fa.fp8_paged_mqa_logits(
        q, kv_fused, weights, block_tables, seq_lens, max_seq_len, out=out
    )
    assert logits_out.shape == (6, 8000)
    assert logits_out.data_ptr() == out.data_ptr()
    assert torch.equal(logits_out[mask], logits[mask])


def test_token_scale_multiplies_after_the_relu_head_sum():
    # Negative weights and varied per-token scales: scale placement and per-head ReLU show.
    case = make_fp8_case([200, 77], next_n=2, num_heads=16, head_dim=64, seed=1)
    got = fa.fp8_paged_mqa_logits(*case.fp8_args())
    mask = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
    assert (got[mask] < 0).any(), "negative weights must be able to make logits negative"
    assert_rows_close(got, case.expected(), mask, FP32_CPU_TOL)


def test_a_negative_token_scale_multiplies_the_head_sum():
    """The formula's scale[pos] * sum_h w relu(q . k): with a negative scale, applying it to
    the keys before the ReLU would give other numbers."""
    case = make_fp8_case([150, 64], next_n=2, num_heads=16, head_dim=64, negative_scales=True)
    assert (case.token_scale64 < 0).any() and (case.token_scale64 > 0).any()
    got = fa.fp8_paged_mqa_logits(*case.fp8_args())
    mask = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
    assert_rows_close(got, case.expected(), mask, FP32_CPU_TOL)
    keys_scaled_first = expected_logits(
        case.q64,
        case.k64 * case.token_scale64.unsqueeze(-1),
        None,
        case.weights,
        case.block_tables,
        case.seq_lens,
        case.max_seq_len,
    )
    assert not torch.allclose(got[mask].double(), keys_scaled_first[mask], rtol=1e-3)


@pytest.mark.parametrize("block_size", [32, 64, 128])
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_block_sizes_and_draft_depths(block_size, next_n):
    lens = [1, 127, 0, 128, 129, 257]
    case = make_fp8_case(
        lens,
        next_n=next_n,
        num_heads=8,
        head_dim=32,
        block_size=block_size,
        max_seq_len=400,  # beyond every length
        seed=block_size * 10 + next_n,
    )
    out = torch.full((case.rows, fa.padded_seq_len(400)), float("nan"))
    got = fa.fp8_paged_mqa_logits(*case.fp8_args(), out=out)
    mask = valid_mask(case.seq_lens, next_n, 400)
    assert_rows_close(got, case.expected(), mask, FP32_CPU_TOL)


def test_float16_output():
    case = make_fp8_case([300, 45], next_n=2, seed=4)
    got = fa.fp8_paged_mqa_logits(
        *case.fp8_args(),
        output_dtype=torch.float16,
        epi_dtype=torch.float16,
        acc_dtype=torch.float16,
    )
    assert got.dtype == torch.float16
    mask = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
    assert_rows_close(got, case.expected(), mask, FP16_CPU_TOL)


def test_zero_length_requests_leave_rows_untouched():
    lens = [300, 0, 129, 0, 1]
    next_n = 2
    case = make_fp8_case(lens, next_n=next_n, max_seq_len=333, seed=5)
    out = untouched_buffer(case.rows, fa.padded_seq_len(333))
    got = fa.fp8_paged_mqa_logits(*case.fp8_args(), out=out)
    for b in (1, 3):
        assert is_untouched(out[b * next_n : (b + 1) * next_n])
    # The CPU path writes exactly the positions the kernel computes, p < seq_lens[b].
    row_lens = case.seq_lens.repeat_interleave(next_n)
    computed = torch.arange(333)[None, :] < row_lens[:, None].long()
    assert torch.isfinite(got[computed]).all()
    assert is_untouched(got[~computed])
    assert is_untouched(out[:, 333:])
    assert_rows_close(got, case.expected(), valid_mask(case.seq_lens, next_n, 333), FP32_CPU_TOL)


def test_all_requests_empty():
    case = make_fp8_case([0, 0, 0], next_n=1, max_seq_len=50, seed=6)
    out = untouched_buffer(3, 256)
    got = fa.fp8_paged_mqa_logits(*case.fp8_args(), out=out)
    assert got.shape == (3, 50)
    assert is_untouched(out)


def test_an_empty_pool_refuses_lengths_that_would_read_it():
    # On CUDA this is the caller's precondition (no kernel runs on a pool of no blocks); the
    # CPU reference checks every block id it reads, even with validate mode off.
    case = make_fp8_case([40, 10], next_n=1, max_seq_len=50, seed=8)
    args = list(case.fp8_args())
    args[1] = args[1][:0]
    with pytest.raises(ValueError, match=r"outside kv_fused's \[0, 0\) blocks"):
        fa.fp8_paged_mqa_logits(*args)
    args[4] = torch.zeros(2, dtype=torch.int32)
    assert is_untouched(fa.fp8_paged_mqa_logits(*args, out=untouched_buffer(2, 256)))


def test_strided_block_tables_and_seq_lens():
    next_n = 3
    case = make_fp8_case([150, 0, 64, 65], next_n=next_n, seed=7)
    # A per-draft-token table and length vector, de-expanded with [::next_n] (no copy).
    tables_per_token = case.block_tables.repeat_interleave(next_n, dim=0)
    lens_per_token = case.seq_lens.repeat_interleave(next_n)
    strided_tables = tables_per_token[::next_n]
    strided_lens = lens_per_token[::next_n]
    assert strided_tables.stride(0) == next_n * case.block_tables.shape[1]
    assert strided_lens.stride(0) == next_n
    got = fa.fp8_paged_mqa_logits(
        case.q, case.kv_fused, case.weights, strided_tables, strided_lens, case.max_seq_len
    )
    mask = valid_mask(case.seq_lens, next_n, case.max_seq_len)
    assert_rows_close(got, case.expected(), mask, FP32_CPU_TOL)
    contiguous = fa.fp8_paged_mqa_logits(*case.fp8_args())
    assert torch.equal(got[mask], contiguous[mask])


def test_wider_out_buffer():
    case = make_fp8_case([100, 260], next_n=2, seed=8)
    padded = fa.padded_seq_len(case.max_seq_len)
    wide = untouched_buffer(case.rows + 5, padded + 300)
    got = fa.fp8_paged_mqa_logits(*case.fp8_args(), out=wide)
    assert got.shape == (case.rows, case.max_seq_len)
    assert got.data_ptr() == wide.data_ptr() and got.stride() == wide.stride()
    assert is_untouched(wide[case.rows :]), "rows past batch_size*next_n were written"
    mask = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
    assert_rows_close(got, case.expected(), mask, FP32_CPU_TOL)


def test_row_slice_of_a_wider_buffer():
    case = make_fp8_case([90, 33], next_n=2, seed=9)
    big = untouched_buffer(10, 1024)
    first = 3
    out = big[first : first + case.rows]
    got = fa.fp8_paged_mqa_logits(*case.fp8_args(), out=out)
    assert got.data_ptr() == big[first].data_ptr()
    assert is_untouched(big[:first]) and is_untouched(big[first + case.rows :])
    mask = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
    assert_rows_close(
        big[first : first + case.rows, : case.max_seq_len], case.expected(), mask, 1e-6
    )


def test_empty_batch_returns_empty_view():
    case = make_fp8_case([], next_n=2, max_seq_len=100, seed=10)
    got = fa.fp8_paged_mqa_logits(*case.fp8_args())
    assert got.shape == (0, 100) and got.dtype == torch.float32
    out = torch.empty(4, 256)
    got = fa.fp8_paged_mqa_logits(*case.fp8_args(), out=out)
    assert got.shape == (0, 100)
    assert got.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()


def test_zero_max_seq_len():
    case = make_fp8_case([0, 0], next_n=1, max_seq_len=0, seed=11)
    got = fa.fp8_paged_mqa_logits(*case.fp8_args())
    assert got.shape == (2, 0)


def test_cpu_schedule_meta_is_accepted():
    case = make_fp8_case([100, 0, 300], next_n=2, seed=12)
    schedule = fa.compute_paged_mqa_logits_schedule(case.seq_lens, next_n=2, variant="fp8")
    assert schedule.shape == (133, 2)
    got = fa.fp8_paged_mqa_logits(*case.fp8_args(), schedule_meta=schedule)
    mask = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
    assert_rows_close(got, case.expected(), mask, FP32_CPU_TOL)


def test_reference_returns_float64_with_nan_outside_computed_region():
    case = make_fp8_case([70, 0, 5], next_n=2, max_seq_len=80, seed=13)
    ref = fp8_paged_mqa_logits_reference(*case.fp8_args())
    expected = case.expected()
    assert ref.dtype == torch.float64 and ref.shape == (6, 80)
    assert torch.equal(torch.isnan(ref), torch.isnan(expected))
    finite = ~torch.isnan(expected)
    assert torch.allclose(ref[finite], expected[finite], rtol=1e-12, atol=1e-12)


def test_reference_refuses_length_beyond_max_seq_len():
    case = make_fp8_case([100], max_seq_len=50, seed=14)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 100 must be in \[0, max_seq_len = 50\]"):
        fp8_paged_mqa_logits_reference(*case.fp8_args())


def test_valid_mask_hand_computed():
    # next_n = 2: slot 0 sees seq_len - 1 positions, slot 1 sees seq_len.
    mask = valid_mask(torch.tensor([3, 0, 1], dtype=torch.int32), 2, 4)
    expected = torch.tensor(
        [
            [1, 1, 0, 0],
            [1, 1, 1, 0],
            [0, 0, 0, 0],
            [0, 0, 0, 0],
            [0, 0, 0, 0],
            [1, 0, 0, 0],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)


def test_a_pool_with_a_wider_block_pitch():
    """kv_fused's block pitch (stride(0)) is free: here 64 bytes wider than a block."""
    next_n = 2
    case = make_fp8_case([150, 0, 64, 65], next_n=next_n, seed=8)
    pool = pitched(case.kv_fused, 64)
    assert pool.stride(0) == case.kv_fused[0].numel() + 64
    got = fa.fp8_paged_mqa_logits(
        case.q, pool, case.weights, case.block_tables, case.seq_lens, case.max_seq_len
    )
    mask = valid_mask(case.seq_lens, next_n, case.max_seq_len)
    assert_rows_close(got, case.expected(), mask, FP32_CPU_TOL)
