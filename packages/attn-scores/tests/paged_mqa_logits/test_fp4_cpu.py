"""fp4_paged_mqa_logits on CPU tensors, with caches built byte by byte from the spec."""

from __future__ import annotations

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import assert_rows_close, is_untouched, make_fp4_case, untouched_buffer
from flashinfer_attn_scores.paged_mqa_logits.reference import (
    fp4_paged_mqa_logits_reference,
    valid_mask,
)

CPU_TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def test_spec_example_returns_6x8000_bfloat16():
    """The spec's fp4 example (zero placeholders) with `flashinfer.` renamed, on the CPU."""
    B, next_n, num_heads, head_dim = 2, 3, 64, 128
    block_size, max_seq_len = 32, 8000
    device = "cpu"
    seq_lens = torch.tensor([3000, 8000], dtype=torch.int32, device=device)
    blocks_per_seq = fa.min_block_table_width(max_seq_len, block_size)
    num_blocks = B * blocks_per_seq
    block_tables = torch.arange(num_blocks, dtype=torch.int32, device=device).view(
        B, blocks_per_seq
    )
    weights = torch.rand(B * next_n, num_heads, device=device)
    q = torch.zeros(B, next_n, num_heads, head_dim // 2, dtype=torch.uint8, device=device)
    q_sf = torch.zeros(B, next_n, num_heads, dtype=torch.int32, device=device)
    kv_fused = torch.zeros(
        num_blocks, block_size, 1, head_dim // 2 + 4, dtype=torch.uint8, device=device
    )

    logits = fa.fp4_paged_mqa_logits(
        q, q_sf, kv_fused, weights, block_tables, seq_lens, max_seq_len
    )
    assert logits.shape == (6, 8000) and logits.dtype == torch.bfloat16
    mask = valid_mask(seq_lens, next_n, max_seq_len)
    assert (logits[mask] == 0).all()  # zero codes decode to 0 whatever the scale

    out = torch.empty(
        B * next_n, fa.padded_seq_len(max_seq_len), dtype=torch.bfloat16, device=device
    )
    logits = fa.fp4_paged_mqa_logits(
        q, q_sf, kv_fused, weights, block_tables, seq_lens, max_seq_len, out=out
    )
    assert logits.shape == (6, 8000) and logits.data_ptr() == out.data_ptr()


@pytest.mark.parametrize("block_size", [32, 64, 128])
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_matches_independent_decode(block_size, next_n):
    case = make_fp4_case(
        [1, 0, 129, 40],
        next_n=next_n,
        block_size=block_size,
        max_seq_len=200,
        seed=100 * next_n + block_size,
    )
    out = untouched_buffer(case.rows, 256)
    got = fa.fp4_paged_mqa_logits(*case.fp4_args(), output_dtype=torch.float32, out=out)
    mask = valid_mask(case.seq_lens, next_n, 200)
    assert_rows_close(got, case.expected(), mask, CPU_TOL[torch.float32])
    assert is_untouched(out[next_n : 2 * next_n])  # the empty request's rows


@pytest.mark.parametrize("output_dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_output_dtypes(output_dtype):
    case = make_fp4_case([150, 66], next_n=2, seed=3)
    got = fa.fp4_paged_mqa_logits(
        *case.fp4_args(), output_dtype=output_dtype, epi_dtype=torch.bfloat16
    )
    assert got.dtype == output_dtype
    mask = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
    assert_rows_close(got, case.expected(), mask, CPU_TOL[output_dtype])


def test_interleaved_scales_at_block_size_128():
    lens = [300, 0, 129]
    inter = make_fp4_case(lens, next_n=2, block_size=128, interleaved=True, seed=4)
    got = fa.fp4_paged_mqa_logits(
        *inter.fp4_args(), output_dtype=torch.float32, is_kv_sf_interleaved=True
    )
    mask = valid_mask(inter.seq_lens, 2, inter.max_seq_len)
    assert_rows_close(got, inter.expected(), mask, CPU_TOL[torch.float32])
    # Reading the interleaved cache as token-ordered must give different numbers.
    wrong = fa.fp4_paged_mqa_logits(*inter.fp4_args(), output_dtype=torch.float32)
    assert not torch.allclose(wrong[mask], got[mask])


def test_group_scales_far_apart():
    # UE8M0 exponents from 2**-40 to 2**+40 in one vector: only per-group scaling is right.
    case = make_fp4_case([100, 37], next_n=1, exponent_range=(87, 167), seed=5)
    got = fa.fp4_paged_mqa_logits(*case.fp4_args(), output_dtype=torch.float32)
    mask = valid_mask(case.seq_lens, 1, case.max_seq_len)
    assert_rows_close(got, case.expected(), mask, CPU_TOL[torch.float32])


def test_strided_tables_and_lengths():
    next_n = 2
    case = make_fp4_case([100, 0, 64], next_n=next_n, seed=6)
    tables = case.block_tables.repeat_interleave(next_n, dim=0)[::next_n]
    lens = case.seq_lens.repeat_interleave(next_n)[::next_n]
    got = fa.fp4_paged_mqa_logits(
        case.q,
        case.q_sf,
        case.kv_fused,
        case.weights,
        tables,
        lens,
        case.max_seq_len,
        output_dtype=torch.float32,
    )
    mask = valid_mask(case.seq_lens, next_n, case.max_seq_len)
    assert_rows_close(got, case.expected(), mask, CPU_TOL[torch.float32])


def test_empty_batch():
    case = make_fp4_case([], next_n=1, max_seq_len=10, seed=7)
    got = fa.fp4_paged_mqa_logits(*case.fp4_args())
    assert got.shape == (0, 10) and got.dtype == torch.bfloat16


def test_reference_is_float64_and_nan_outside_computed_region():
    case = make_fp4_case([70, 0], next_n=2, max_seq_len=90, seed=8)
    ref = fp4_paged_mqa_logits_reference(*case.fp4_args())
    expected = case.expected()
    assert ref.dtype == torch.float64
    assert torch.equal(torch.isnan(ref), torch.isnan(expected))
    finite = ~torch.isnan(expected)
    assert torch.allclose(ref[finite], expected[finite], rtol=1e-12, atol=0)


def test_q_sf_as_the_spec_builds_it():
    """The spec calls q_sf equivalent to a [B, next_n, H, 4] uint8 tensor viewed as int32;
    that view is [B, next_n, H, 1], and it gives the [B, next_n, H] result."""
    case = make_fp4_case([90, 0, 33], next_n=2, seed=11)
    scale_bytes = case.q_sf.view(torch.uint8).view(*case.q_sf.shape, 4)
    spec_view = scale_bytes.view(torch.int32)
    assert spec_view.shape == (*case.q_sf.shape, 1)
    args = list(case.fp4_args())
    expected = fa.fp4_paged_mqa_logits(*args)
    args[1] = spec_view
    got = fa.fp4_paged_mqa_logits(*args)
    mask = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
    assert torch.equal(got[mask], expected[mask])
