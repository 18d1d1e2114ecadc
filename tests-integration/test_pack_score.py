"""Pack a paged cache with flashinfer_layouts, score it with flashinfer_attn_scores, pick top-k.

The expectation is computed here in float64 from the dequantised cache (values times scales,
position by position), independently of the attn-scores package's reference. The top-k over
the spec's valid region must select the same KV positions as the expectation's top-k, ties
aside. CPU tensors (the reference path); the same flow on an SM90 GPU is marked `gpu`.
"""

from __future__ import annotations

import flashinfer_attn_scores as fa
import flashinfer_layouts as fl
import pytest
import torch

TOP_K = 64
ROW_TOL = 1e-6  # float32 output of a float64 computation, relative to the row maximum
# The SM90 kernel's FP8 accumulation error at head_dim 128 with a float32 accumulator, per
# element, as a fraction of sum_h |w_h| sum_d |q_hd k_d| (dequantised k): the bound the
# attn-scores GPU tests use (`accumulation_error` in their attn_scores_cases.py, from
# tools/fp8_accumulation_error.py's measurement).
GPU_ACCUMULATION_ERROR = 2.0**-11


def shuffled_tables(gen, lens, block_size, spare):
    used = [-(-n // block_size) for n in lens]
    num_blocks = sum(used) + spare
    physical = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    width = max([1, *used])
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    start = 0
    for b, n in enumerate(used):
        table[b, :n] = physical[start : start + n]
        start += n
    return table, num_blocks


def expected_from_dequantised(q64, keys64, weights, table, lens, max_seq_len):
    """float64 logits from dequantised queries and keys ([num_blocks, block_size, D])."""
    batch_size, next_n = q64.shape[:2]
    block_size = keys64.shape[1]
    w64 = weights.to(torch.float64)
    out = torch.full((batch_size * next_n, max_seq_len), float("nan"), dtype=torch.float64)
    for b, length in enumerate(lens):
        pos = torch.arange(length)
        keys = keys64[table[b].long()[pos // block_size], pos % block_size]  # [L, D]
        dots = torch.einsum("thd,ld->thl", q64[b], keys)
        rows = slice(b * next_n, (b + 1) * next_n)
        out[rows, :length] = (w64[rows, :, None] * dots.clamp_min(0)).sum(dim=1)
    return out


def spec_valid_mask(lens, next_n, max_seq_len):
    last = torch.tensor([n - next_n + t for n in lens for t in range(next_n)])
    return torch.arange(max_seq_len)[None, :] <= last[:, None]


def assert_same_topk(got, expected, mask, k=TOP_K):
    """Top-k of `got` picks positions whose expected scores are the expected top-k scores."""
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float64)
    checked = 0
    for row in range(got.shape[0]):
        n_valid = int(mask[row].sum())
        if n_valid == 0:
            continue
        kk = min(k, n_valid)
        ref_row = torch.where(mask[row], expected[row], neg_inf)
        got_row = torch.where(mask[row], got[row].to(torch.float64), neg_inf)
        ref_values, ref_index = ref_row.topk(kk)
        picked = got_row.topk(kk).indices
        tol = ROW_TOL * float(ref_row[mask[row]].abs().max())
        # Same multiset of scores: a different pick is only allowed between (near-)ties.
        picked_values = expected[row, picked].sort(descending=True).values
        assert torch.allclose(picked_values, ref_values, rtol=0, atol=tol), f"row {row}"
        if kk < n_valid and float(ref_values[-1] - ref_row.topk(kk + 1).values[-1]) > 2 * tol:
            assert set(picked.tolist()) == set(ref_index.tolist()), f"row {row}"
        checked += 1
    assert checked > 0


def assert_rows_close(got, expected, mask, dot_magnitude=None, dot_tol=0.0):
    """|got - expected| <= ROW_TOL * (row max of |expected|) + dot_tol * dot_magnitude on
    every masked element; a NaN or inf in the valid region fails."""
    got64 = got.to(torch.float64)
    for row in range(got.shape[0]):
        if mask[row].any():
            scale = float(expected[row, mask[row]].abs().max())
            err = (got64[row, mask[row]] - expected[row, mask[row]]).abs()
            bound = ROW_TOL * scale
            if dot_magnitude is not None:
                bound = bound + dot_tol * dot_magnitude[row, mask[row]]
            worst = float((err - bound).max())
            assert worst <= 0, f"row {row}: error exceeds its bound by {worst} (row max {scale})"


@pytest.mark.parametrize("scale_mode", ["pow2", "amax"])
def test_fp8_pack_score_topk(scale_mode):
    gen = torch.Generator().manual_seed(1)
    lens, next_n, num_heads, head_dim, block_size = [700, 0, 1500, 65], 2, 64, 128, 64
    max_seq_len = 1600
    table, num_blocks = shuffled_tables(gen, lens, block_size, spare=5)
    # Token magnitudes spread over several binades so the per-token scales matter.
    magnitude = torch.exp(torch.randn(num_blocks, block_size, 1, generator=gen))
    k = torch.randn(num_blocks, block_size, head_dim, generator=gen) * magnitude
    values, scales = fl.quantize_fp8_per_token(k, scale_mode=scale_mode)
    kv_fused = fl.pack_fp8_kv_cache(values, scales)
    q = torch.randn(len(lens), next_n, num_heads, head_dim, generator=gen).to(torch.float8_e4m3fn)
    weights = torch.randn(len(lens) * next_n, num_heads, generator=gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    schedule = fa.compute_paged_mqa_logits_schedule(seq_lens, next_n=next_n, variant="fp8")

    out = torch.full((len(lens) * next_n, fa.padded_seq_len(max_seq_len)), float("nan"))
    logits = fa.fp8_paged_mqa_logits(
        q, kv_fused, weights, table, seq_lens, max_seq_len, schedule_meta=schedule, out=out
    )

    keys64 = values.to(torch.float64) * scales.to(torch.float64)[..., None]
    expected = expected_from_dequantised(
        q.to(torch.float64), keys64, weights, table, lens, max_seq_len
    )
    mask = spec_valid_mask(lens, next_n, max_seq_len)
    assert_rows_close(logits, expected, mask)
    assert torch.isnan(out[next_n : 2 * next_n]).all()  # the empty request is never written
    assert_same_topk(logits, expected, mask)


@pytest.mark.parametrize(("block_size", "interleaved"), [(32, False), (128, False), (128, True)])
def test_mxfp4_pack_score_topk(block_size, interleaved):
    gen = torch.Generator().manual_seed(2)
    lens, next_n, num_heads, head_dim = [450, 130, 0, 257], 3, 64, 128
    max_seq_len = 500
    table, num_blocks = shuffled_tables(gen, lens, block_size, spare=3)
    # Each 32-element group gets its own magnitude so the UE8M0 group scales differ.
    group_scale = torch.exp(torch.randn(num_blocks, block_size, 4, 1, generator=gen))
    k = (torch.randn(num_blocks, block_size, 4, 32, generator=gen) * group_scale).flatten(2)
    kv_fused = fl.quantize_mxfp4_kv_cache(k, interleaved=interleaved)
    q_packed, q_sf = fl.quantize_mxfp4_q(
        torch.randn(len(lens), next_n, num_heads, head_dim, generator=gen)
    )
    weights = torch.randn(len(lens) * next_n, num_heads, generator=gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32)

    logits = fa.fp4_paged_mqa_logits(
        q_packed,
        q_sf,
        kv_fused,
        weights,
        table,
        seq_lens,
        max_seq_len,
        output_dtype=torch.float32,
        is_kv_sf_interleaved=interleaved,
    )

    keys64 = fl.dequantize_mxfp4_kv_cache(kv_fused, interleaved=interleaved, dtype=torch.float64)
    q64 = fl.dequantize_mxfp4_q(q_packed, q_sf, dtype=torch.float64)
    expected = expected_from_dequantised(q64, keys64, weights, table, lens, max_seq_len)
    mask = spec_valid_mask(lens, next_n, max_seq_len)
    assert_rows_close(logits, expected, mask)
    assert_same_topk(logits, expected, mask)


def test_fp8_serving_write_path_then_score():
    """Tokens scattered into a pool slot by slot score like a pool packed in one go."""
    gen = torch.Generator().manual_seed(3)
    lens, next_n, num_heads, head_dim, block_size = [300, 77], 1, 64, 128, 32
    table, num_blocks = shuffled_tables(gen, lens, block_size, spare=2)
    pool = torch.randint(0, 256, (num_blocks, block_size, 1, head_dim + 4), generator=gen).to(
        torch.uint8
    )
    tokens = [torch.randn(n, head_dim, generator=gen) for n in lens]
    for b, rows in enumerate(tokens):
        pos = torch.arange(rows.shape[0])
        slots = table[b].long()[pos // block_size] * block_size + pos % block_size
        fl.write_fp8_kv_cache(pool, rows, slots)
    q = torch.randn(len(lens), next_n, num_heads, head_dim, generator=gen).to(torch.float8_e4m3fn)
    weights = torch.randn(len(lens) * next_n, num_heads, generator=gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    logits = fa.fp8_paged_mqa_logits(q, pool, weights, table, seq_lens, max(lens))

    # Expected from the quantiser's own outputs for each request's tokens, in order.
    expected = torch.full((len(lens), max(lens)), float("nan"), dtype=torch.float64)
    for b, rows in enumerate(tokens):
        values, scales = fl.quantize_fp8_per_token(rows)
        keys = values.to(torch.float64) * scales.to(torch.float64)[:, None]
        dots = torch.einsum("hd,ld->hl", q[b, 0].to(torch.float64), keys)
        expected[b, : rows.shape[0]] = (weights[b].double()[:, None] * dots.clamp_min(0)).sum(0)
    mask = spec_valid_mask(lens, next_n, max(lens))
    assert_rows_close(logits, expected, mask)
    assert_same_topk(logits, expected, mask)


@pytest.mark.gpu
def test_fp8_pack_score_topk_on_gpu():
    gen = torch.Generator().manual_seed(4)
    lens, next_n, num_heads, head_dim, block_size = [2000, 0, 4000], 2, 64, 128, 64
    max_seq_len = 4096
    table, num_blocks = shuffled_tables(gen, lens, block_size, spare=16)
    k = torch.randn(num_blocks, block_size, head_dim, generator=gen)
    values, scales = fl.quantize_fp8_per_token(k.cuda())
    kv_fused = fl.pack_fp8_kv_cache(values, scales)
    q = torch.randn(len(lens), next_n, num_heads, head_dim, generator=gen).to(torch.float8_e4m3fn)
    weights = torch.randn(len(lens) * next_n, num_heads, generator=gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    logits = fa.fp8_paged_mqa_logits(
        q.cuda(), kv_fused, weights.cuda(), table.cuda(), seq_lens.cuda(), max_seq_len
    ).cpu()
    keys64 = values.cpu().to(torch.float64) * scales.cpu().to(torch.float64)[..., None]
    expected = expected_from_dequantised(
        q.to(torch.float64), keys64, weights, table, lens, max_seq_len
    )
    mask = spec_valid_mask(lens, next_n, max_seq_len)
    dot_magnitude = expected_from_dequantised(
        q.to(torch.float64).abs(), keys64.abs(), weights.abs(), table, lens, max_seq_len
    )
    assert_rows_close(
        logits, expected, mask, dot_magnitude=dot_magnitude, dot_tol=GPU_ACCUMULATION_ERROR
    )
    assert_topk_scores_close(logits, expected, mask)


@pytest.mark.gpu
@pytest.mark.parametrize(("block_size", "interleaved"), [(64, False), (128, True)])
def test_mxfp4_pack_score_topk_on_gpu(block_size, interleaved):
    """The SM90 fp4 kernel scoring a cache written by `quantize_mxfp4_kv_cache`, against the
    float64 expectation from the layouts package's dequantised cache and q."""
    gen = torch.Generator().manual_seed(5)
    lens, next_n, num_heads, head_dim = [1500, 0, 3000], 2, 64, 128
    max_seq_len = 3072
    table, num_blocks = shuffled_tables(gen, lens, block_size, spare=8)
    group_scale = torch.exp(torch.randn(num_blocks, block_size, 4, 1, generator=gen))
    k = (torch.randn(num_blocks, block_size, 4, 32, generator=gen) * group_scale).flatten(2)
    kv_fused = fl.quantize_mxfp4_kv_cache(k.cuda(), interleaved=interleaved)
    q_packed, q_sf = fl.quantize_mxfp4_q(
        torch.randn(len(lens), next_n, num_heads, head_dim, generator=gen).cuda()
    )
    weights = torch.randn(len(lens) * next_n, num_heads, generator=gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    logits = fa.fp4_paged_mqa_logits(
        q_packed, q_sf, kv_fused, weights.cuda(), table.cuda(), seq_lens.cuda(), max_seq_len,
        output_dtype=torch.float32, is_kv_sf_interleaved=interleaved,
    ).cpu()  # fmt: skip
    keys64 = fl.dequantize_mxfp4_kv_cache(
        kv_fused.cpu(), interleaved=interleaved, dtype=torch.float64
    )
    q64 = fl.dequantize_mxfp4_q(q_packed.cpu(), q_sf.cpu(), dtype=torch.float64)
    expected = expected_from_dequantised(q64, keys64, weights, table, lens, max_seq_len)
    dot_magnitude = expected_from_dequantised(
        q64.abs(), keys64.abs(), weights.abs(), table, lens, max_seq_len
    )
    mask = spec_valid_mask(lens, next_n, max_seq_len)
    assert_rows_close(
        logits, expected, mask, dot_magnitude=dot_magnitude, dot_tol=GPU_ACCUMULATION_ERROR
    )
    assert_topk_scores_close(logits, expected, mask)


def assert_topk_scores_close(logits, expected, mask):
    """The kernel's FP8 accumulation (see the attn-scores GPU tolerance table) can reorder
    near-ties, so the picks are compared by their expected scores, with the 2e-3 row bound."""
    for row in range(logits.shape[0]):
        if not mask[row].any():
            continue
        ref_row = torch.where(
            mask[row], expected[row], torch.tensor(float("-inf"), dtype=torch.float64)
        )
        got_row = torch.where(
            mask[row], logits[row].double(), torch.tensor(float("-inf"), dtype=torch.float64)
        )
        kk = min(TOP_K, int(mask[row].sum()))
        picked = expected[row, got_row.topk(kk).indices].sort(descending=True).values
        tol = 2e-3 * float(ref_row[mask[row]].abs().max())
        assert torch.allclose(picked, ref_row.topk(kk).values, rtol=0, atol=2 * tol)
