"""Every always-on check: one parametrised case per restriction, each with its message."""

from __future__ import annotations

import re
from pathlib import Path

import flashinfer_attn_scores as fa
import numpy as np
import pytest
import torch
from attn_scores_cases import make_fp4_case, make_fp8_case
from flashinfer_attn_scores import _validation
from flashinfer_attn_scores.paged_mqa_logits import fp8_sm90


def fp8_call(overrides=None, **case_kwargs):
    """Call fp8_paged_mqa_logits on a small valid case with some arguments replaced."""
    params = {"next_n": 2, "num_heads": 8, "head_dim": 32, "max_seq_len": 64, "seed": 0}
    params.update(case_kwargs)
    lens = params.pop("lens", [40, 10])
    case = make_fp8_case(lens, **params)
    kwargs = {
        "q": case.q,
        "kv_fused": case.kv_fused,
        "weights": case.weights,
        "block_tables": case.block_tables,
        "seq_lens": case.seq_lens,
        "max_seq_len": case.max_seq_len,
    }
    kwargs.update(overrides(case) if overrides else {})
    return fa.fp8_paged_mqa_logits(**kwargs)


def fp4_call(overrides=None, **case_kwargs):
    params = {"next_n": 2, "max_seq_len": 64, "seed": 0}
    params.update(case_kwargs)
    lens = params.pop("lens", [40, 10])
    case = make_fp4_case(lens, **params)
    kwargs = {
        "q": case.q,
        "q_sf": case.q_sf,
        "kv_fused": case.kv_fused,
        "weights": case.weights,
        "block_tables": case.block_tables,
        "seq_lens": case.seq_lens,
        "max_seq_len": case.max_seq_len,
    }
    kwargs.update(overrides(case) if overrides else {})
    return fa.fp4_paged_mqa_logits(**kwargs)


def test_valid_base_calls_succeed():
    assert fp8_call().shape == (4, 64)
    assert fp4_call().shape == (4, 64)


META = torch.device("meta")


def pitched(kv_fused: torch.Tensor, extra_bytes: int) -> torch.Tensor:
    """The same blocks in a pool view whose pitch is `extra_bytes` wider than a block."""
    num_blocks, block_bytes = kv_fused.shape[0], kv_fused[0].numel()
    storage = torch.zeros(num_blocks, block_bytes + extra_bytes, dtype=torch.uint8)
    storage[:, :block_bytes] = kv_fused.reshape(num_blocks, block_bytes)
    return storage[:, :block_bytes].view(kv_fused.shape)


def overlapping(kv_fused: torch.Tensor) -> torch.Tensor:
    """Every block id naming the same bytes (stride(0) == 0)."""
    return kv_fused[:1].expand(kv_fused.shape)


def two_overlapping(kv_fused: torch.Tensor) -> torch.Tensor:
    """A pool of two blocks on the same bytes: the smallest pool whose pitch is used."""
    return kv_fused[:1].expand(2, *kv_fused.shape[1:])


def partly_overlapping(kv_fused: torch.Tensor) -> torch.Tensor:
    """Blocks 16 bytes closer than a block: each one's last 16 bytes are the next one's first
    (the pitch is 16-byte aligned, so only the overlap is wrong)."""
    block_bytes = kv_fused[0].numel()
    flat = kv_fused.reshape(-1)
    return flat.as_strided(kv_fused.shape, (block_bytes - 16, *kv_fused.stride()[1:]))


BLOCK_PITCH_MESSAGE = r"kv_fused blocks must not overlap and must start at multiples of 16 bytes"

FP8_ERRORS = {
    # q
    "q_not_tensor": (lambda c: {"q": [[1.0]]}, TypeError, "q must be a torch.Tensor"),
    "q_dtype": (
        lambda c: {"q": c.q.float().to(torch.bfloat16)},
        TypeError,
        "q must have dtype torch.float8_e4m3fn, got torch.bfloat16",
    ),
    "q_rank": (lambda c: {"q": c.q[0]}, ValueError, "q must be 4-D"),
    # kv_fused
    "kv_not_tensor": (lambda c: {"kv_fused": None}, TypeError, "kv_fused must be a torch.Tensor"),
    "kv_dtype": (
        lambda c: {"kv_fused": c.kv_fused.view(torch.int8)},
        TypeError,
        "kv_fused must have dtype torch.uint8, got torch.int8",
    ),
    "kv_rank": (lambda c: {"kv_fused": c.kv_fused[:, :, 0]}, ValueError, "kv_fused must be 4-D"),
    "kv_dim2": (
        lambda c: {"kv_fused": torch.cat([c.kv_fused, c.kv_fused], dim=2)},
        ValueError,
        r"kv_fused.shape\[2\] must be the KV head count \(MQA: one KV head\) = 1, got 2",
    ),
    "kv_row_bytes": (
        lambda c: {"kv_fused": torch.zeros(10, 32, 1, 40, dtype=torch.uint8)},
        ValueError,
        r"kv_fused.shape\[3\] must be head_dim \+ 4 \(head_dim=32 = q.shape\[3\], q shape "
        r"\[2, 2, 8, 32\]\) = 36, got 40",
    ),
    "kv_block_not_contiguous": (
        lambda c: {"kv_fused": torch.zeros(10, 32, 1, 72, dtype=torch.uint8)[..., ::2]},
        ValueError,
        "kv_fused must store each block's bytes contiguously",
    ),
    "kv_block_pitch_unaligned": (
        lambda c: {"kv_fused": pitched(c.kv_fused, 8)},
        ValueError,
        BLOCK_PITCH_MESSAGE + r".*>= the block's 1152 bytes, got strides \(1160, 36, 36, 1\)",
    ),
    "kv_blocks_overlap": (
        lambda c: {"kv_fused": overlapping(c.kv_fused)},
        ValueError,
        BLOCK_PITCH_MESSAGE + r".*got strides \(0, 36, 36, 1\)",
    ),
    "kv_two_blocks_overlap": (
        lambda c: {"kv_fused": two_overlapping(c.kv_fused)},
        ValueError,
        BLOCK_PITCH_MESSAGE + r".*got strides \(0, 36, 36, 1\) for shape \[2, 32, 1, 36\]",
    ),
    "kv_blocks_overlap_by_16_bytes": (
        lambda c: {"kv_fused": partly_overlapping(c.kv_fused)},
        ValueError,
        BLOCK_PITCH_MESSAGE + r".*>= the block's 1152 bytes, got strides \(1136, 36, 36, 1\)",
    ),
    "shared_memory_fit": (
        lambda c: {
            "q": torch.zeros(2, 2, 8, 1472).to(torch.float8_e4m3fn),
            "kv_fused": torch.zeros(6, 32, 1, 1476, dtype=torch.uint8),
        },
        ValueError,
        r"head_dim=1472 with num_heads=8 and next_n=2 does not fit the SM90 kernel's shared "
        r"memory .* at next_n\*num_heads = 16 the largest head_dim that fits is 1440",
    ),
    # weights
    "weights_not_tensor": (lambda c: {"weights": 1.0}, TypeError, "weights must be a torch.Tensor"),
    "weights_dtype": (
        lambda c: {"weights": c.weights.double()},
        TypeError,
        "weights must have dtype torch.float32, got torch.float64",
    ),
    "weights_rank": (
        lambda c: {"weights": c.weights.view(2, 2, 8)},
        ValueError,
        "weights must be 2-D",
    ),
    "weights_rows": (
        lambda c: {"weights": c.weights[:3]},
        ValueError,
        r"weights.shape\[0\] must be batch_size\*next_n \(q.shape\[0\]\*q.shape\[1\]\) = 4, got 3",
    ),
    "weights_heads": (
        lambda c: {"weights": c.weights[:, :4]},
        ValueError,
        r"weights.shape\[1\] must be num_heads \(q.shape\[2\]\) = 8, got 4",
    ),
    # block_tables
    "tables_not_tensor": (
        lambda c: {"block_tables": [[0, 1]]},
        TypeError,
        "block_tables must be a torch.Tensor",
    ),
    "tables_dtype": (
        lambda c: {"block_tables": c.block_tables.long()},
        TypeError,
        "block_tables must have dtype torch.int32, got torch.int64",
    ),
    "tables_rank": (
        lambda c: {"block_tables": c.block_tables.flatten()},
        ValueError,
        "block_tables must be 2-D",
    ),
    "tables_rows": (
        lambda c: {"block_tables": c.block_tables[:1]},
        ValueError,
        r"block_tables.shape\[0\] must be batch_size \(q.shape\[0\]\) = 2, got 1",
    ),
    "tables_row_entries_strided": (
        lambda c: {"block_tables": torch.zeros(2, 8, dtype=torch.int32)[:, ::2]},
        ValueError,
        r"block_tables must have contiguous rows \(stride\(1\) == 1\)",
    ),
    "tables_two_entries_strided": (
        # Two entries per row, the narrowest table whose entry stride matters.
        lambda c: {"block_tables": c.block_tables.repeat_interleave(2, dim=1)[:, ::2]},
        ValueError,
        r"block_tables must have contiguous rows \(stride\(1\) == 1\), got strides \(4, 2\)",
    ),
    # seq_lens
    "lens_not_tensor": (
        lambda c: {"seq_lens": [40, 10]},
        TypeError,
        "seq_lens must be a torch.Tensor",
    ),
    "lens_dtype": (
        lambda c: {"seq_lens": c.seq_lens.long()},
        TypeError,
        "seq_lens must have dtype torch.int32, got torch.int64",
    ),
    "lens_rank": (lambda c: {"seq_lens": c.seq_lens[None]}, ValueError, "seq_lens must be 1-D"),
    "lens_size": (
        lambda c: {"seq_lens": torch.tensor([1, 2, 3], dtype=torch.int32)},
        ValueError,
        r"seq_lens.shape\[0\] must be batch_size \(q.shape\[0\]\) = 2, got 3",
    ),
    # devices (meta tensors stand in for "another device" on a CPU-only machine)
    "kv_device": (
        lambda c: {"kv_fused": c.kv_fused.to(META)},
        ValueError,
        "kv_fused must be on q's device cpu, got meta",
    ),
    "weights_device": (
        lambda c: {"weights": c.weights.to(META)},
        ValueError,
        "weights must be on q's device cpu, got meta",
    ),
    "tables_device": (
        lambda c: {"block_tables": c.block_tables.to(META)},
        ValueError,
        "block_tables must be on q's device cpu, got meta",
    ),
    "lens_device": (
        lambda c: {"seq_lens": c.seq_lens.to(META)},
        ValueError,
        "seq_lens must be on q's device cpu, got meta",
    ),
    "schedule_device": (
        lambda c: {"schedule_meta": torch.zeros(133, 2, dtype=torch.int32, device=META)},
        ValueError,
        "schedule_meta must be on q's device cpu, got meta",
    ),
    "out_device": (
        lambda c: {"out": torch.zeros(4, 256, device=META)},
        ValueError,
        "out must be on q's device cpu, got meta",
    ),
    "unsupported_device_type": (
        lambda c: {
            name: getattr(c, name).to(META)
            for name in ("q", "kv_fused", "weights", "block_tables", "seq_lens")
        },
        RuntimeError,
        "q is on a 'meta' device; supported are CUDA tensors on NVIDIA Hopper",
    ),
    # dtype arguments
    "output_dtype_bf16": (
        lambda c: {"output_dtype": torch.bfloat16},
        ValueError,
        "output_dtype must be one of .*got torch.bfloat16: bfloat16 is deliberately unsupported",
    ),
    "output_dtype_int": (
        lambda c: {"output_dtype": torch.int32},
        ValueError,
        r"output_dtype must be one of \(torch.float32, torch.float16\), got torch.int32",
    ),
    "output_dtype_not_dtype": (
        lambda c: {"output_dtype": "float32"},
        TypeError,
        "output_dtype must be a torch.dtype",
    ),
    "epi_dtype_bf16": (
        lambda c: {"epi_dtype": torch.bfloat16},
        ValueError,
        r"epi_dtype must be one of \(torch.float32, torch.float16\), got torch.bfloat16",
    ),
    "acc_dtype_bf16": (
        lambda c: {"acc_dtype": torch.bfloat16},
        ValueError,
        r"acc_dtype must be one of \(torch.float32, torch.float16\), got torch.bfloat16",
    ),
    # max_seq_len
    "max_seq_len_negative": (
        lambda c: {"max_seq_len": -1},
        ValueError,
        "max_seq_len must be >= 0, got -1",
    ),
    "max_seq_len_bool": (lambda c: {"max_seq_len": True}, TypeError, "max_seq_len must be an int"),
    "max_seq_len_float": (lambda c: {"max_seq_len": 64.0}, TypeError, "max_seq_len must be an int"),
    "max_seq_len_numpy_bool": (
        lambda c: {"max_seq_len": np.bool_(True)},
        TypeError,
        r"max_seq_len must be an int, got numpy\.bool",
    ),
    "max_seq_len_tensor": (
        lambda c: {"max_seq_len": torch.tensor(64)},
        TypeError,
        r"max_seq_len must be an int, got torch\.Tensor .*; pass a Python int such as int\(t",
    ),
    "max_seq_len_numpy_negative": (
        lambda c: {"max_seq_len": np.int64(-1)},
        ValueError,
        "max_seq_len must be >= 0, got -1",
    ),
    # schedule_meta
    "schedule_not_tensor": (
        lambda c: {"schedule_meta": [[0, 0]]},
        TypeError,
        "schedule_meta must be a torch.Tensor",
    ),
    "schedule_dtype": (
        lambda c: {"schedule_meta": torch.zeros(133, 2, dtype=torch.int64)},
        TypeError,
        "schedule_meta must have dtype torch.int32, got torch.int64",
    ),
    "schedule_shape": (
        lambda c: {"schedule_meta": torch.zeros(132, 2, dtype=torch.int32)},
        ValueError,
        r"schedule_meta must have shape \[num_sms \+ 1, 2\] = \[133, 2\] .*got \[132, 2\]",
    ),
    "schedule_not_contiguous": (
        lambda c: {"schedule_meta": torch.zeros(2, 133, dtype=torch.int32).t()},
        ValueError,
        r"schedule_meta must be contiguous \(strides \(2, 1\)\), got strides \(1, 133\)",
    ),
    # out
    "out_not_tensor": (lambda c: {"out": 0}, TypeError, "out must be a torch.Tensor"),
    "out_dtype": (
        lambda c: {"out": torch.zeros(4, 256, dtype=torch.float16)},
        TypeError,
        "out must have dtype output_dtype = torch.float32, got torch.float16",
    ),
    "out_rank": (lambda c: {"out": torch.zeros(4 * 256)}, ValueError, "out must be 2-D"),
    "out_rows": (
        lambda c: {"out": torch.zeros(3, 256)},
        ValueError,
        r"out must have at least batch_size\*next_n = 4 rows, got shape \[3, 256\]",
    ),
    "out_width": (
        lambda c: {"out": torch.zeros(4, 255)},
        ValueError,
        r"out must have at least padded_seq_len\(max_seq_len\) = 256 columns",
    ),
    "out_row_entries_strided": (
        lambda c: {"out": torch.zeros(4, 512)[:, ::2]},
        ValueError,
        r"out must have contiguous rows \(stride\(1\) == 1\)",
    ),
    "out_two_strided_columns_at_max_seq_len_0": (
        lambda c: {"out": torch.zeros(4, 4)[:, ::2], "max_seq_len": 0, "seq_lens": c.seq_lens * 0},
        ValueError,
        r"out must have contiguous rows \(stride\(1\) == 1\), got strides \(4, 2\)",
    ),
    "out_expanded_row": (
        lambda c: {"out": torch.zeros(1, 256).expand(4, 256)},
        ValueError,
        r"out rows must not overlap: stride\(0\) must be >= .* = 256, got strides \(0, 1\)",
    ),
    "out_as_strided_pitch": (
        lambda c: {"out": torch.zeros(1024).as_strided((4, 256), (128, 1))},
        ValueError,
        r"out rows must not overlap: stride\(0\) must be >= .* = 256, got strides \(128, 1\)",
    ),
    "out_pitch_one_element_short": (
        lambda c: {"out": torch.zeros(1024).as_strided((4, 256), (255, 1))},
        ValueError,
        r"out rows must not overlap: stride\(0\) must be >= .* = 256, got strides \(255, 1\)",
    ),
    # the 2**31 output span
    "span_too_large": (
        lambda c: {"max_seq_len": 2**29},
        ValueError,
        r"batch_size\*next_n \* padded_seq_len\(max_seq_len\) = 4 \* 536870912 = 2147483648 "
        r"elements must be < 2\*\*31",
    ),
}


@pytest.mark.parametrize(
    ("overrides", "error", "match"), FP8_ERRORS.values(), ids=FP8_ERRORS.keys()
)
def test_fp8_argument_errors(overrides, error, match):
    with pytest.raises(error, match=match):
        fp8_call(overrides)


def test_fp8_span_with_wide_out_stride():
    # One output row whose stride alone reaches 2**31 elements (no memory needed for that).
    out = torch.zeros(256).as_strided((1, 256), (2**31, 1))
    with pytest.raises(
        ValueError,
        match=r"out too wide: batch_size\*next_n \* out.stride\(0\) = 1 \* 2147483648",
    ):
        fp8_call(lambda c: {"out": out}, lens=[10], next_n=1)


@pytest.mark.parametrize("output_dtype", [torch.bfloat16, torch.float32])
def test_fp4_span_with_wide_out_stride(output_dtype):
    # The same 2**31 limit on fp4's output span (found untested by an audit).
    out = torch.zeros(256, dtype=output_dtype).as_strided((1, 256), (2**31, 1))
    with pytest.raises(
        ValueError,
        match=r"out too wide: batch_size\*next_n \* out.stride\(0\) = 1 \* 2147483648",
    ):
        fp4_call(lambda c: {"out": out, "output_dtype": output_dtype}, lens=[10], next_n=1)
    just_fits = torch.zeros(256, dtype=output_dtype).as_strided((1, 256), (2**31 - 1, 1))
    fp4_call(lambda c: {"out": just_fits, "output_dtype": output_dtype}, lens=[10], next_n=1)


@pytest.mark.parametrize("call", [fp8_call, fp4_call], ids=["fp8", "fp4"])
def test_a_pool_of_more_blocks_than_the_kernels_int32_count_is_refused(call):
    """The kernels take the block count as an int32: a pool of 2^31 blocks was refused only at
    launch, by a message naming no argument (found by an audit). Meta tensors carry the size
    without the memory; the pool check runs before the device check."""

    def pool(c, num_blocks):
        shape = (num_blocks, *c.kv_fused.shape[1:])
        return {"kv_fused": torch.empty(shape, dtype=torch.uint8, device=META)}

    with pytest.raises(
        ValueError,
        match=r"^kv_fused has too many blocks: num_blocks \(kv_fused.shape\[0\]\) must be <= "
        r"2\*\*31 - 1 = 2147483647 \(the kernels take it as an int32\), got 2147483648 "
        r"\(kv_fused shape \[2147483648, 32, 1, \d+\]\)$",
    ):
        call(lambda c: pool(c, 2**31))
    with pytest.raises(ValueError, match="kv_fused must be on q's device cpu, got meta"):
        call(lambda c: pool(c, 2**31 - 1))


@pytest.mark.parametrize("call", [fp8_call, fp4_call], ids=["fp8", "fp4"])
def test_empty_batch_width_limit(call):
    # With no rows the span is 0, but a width past 2**31 columns is still refused, up to
    # max_seq_len = 2**63 - 1 whose padded width does not even fit an int64 stride.
    widest = 2**31 - 256
    logits = call(lambda c: {"max_seq_len": widest}, lens=[])
    assert logits.shape == (0, widest)
    for max_seq_len in (widest + 1, 2**62, 2**63 - 1):
        padded = -(-max_seq_len // 256) * 256
        with pytest.raises(
            ValueError,
            match=rf"max_seq_len too large: padded_seq_len\(max_seq_len\) = {padded} columns "
            r"must be < 2\*\*31",
        ):
            call(lambda c, m=max_seq_len: {"max_seq_len": m}, lens=[])


FP8_GEOMETRY_ERRORS = {
    "head_dim_not_multiple_of_32": (
        {"head_dim": 48},
        r"head_dim \(q.shape\[3\]\) must be a positive multiple of 32, got 48 "
        r"\(q shape \[2, 2, 8, 48\]\)",
    ),
    "num_heads_not_multiple_of_4": (
        {"num_heads": 6, "next_n": 4},
        r"num_heads \(q.shape\[2\]\) must be a positive multiple of 4, got 6",
    ),
    "rows_below_8": (
        {"num_heads": 4, "next_n": 1},
        r"next_n \* num_heads must be a multiple of 8 in \[8, 256\], got next_n=1 \* num_heads=4 = 4",
    ),
    "rows_not_multiple_of_8": (
        {"num_heads": 4, "next_n": 3},
        r"must be a multiple of 8 in \[8, 256\], got next_n=3 \* num_heads=4 = 12",
    ),
    "rows_above_256": (
        {"num_heads": 128, "next_n": 4},
        r"must be a multiple of 8 in \[8, 256\], got next_n=4 \* num_heads=128 = 512",
    ),
    "next_n_0": (
        {"next_n": 0},
        r"next_n \* num_heads must be a multiple of 8 in \[8, 256\], got next_n=0 \* num_heads=8 = 0",
    ),
    "head_dim_0": (
        {"head_dim": 0, "lens": [0, 0]},
        r"head_dim \(q.shape\[3\]\) must be a positive multiple of 32, got 0",
    ),
    "block_size_16": (
        {"block_size": 16},
        r"block_size \(kv_fused.shape\[1\]\) must be one of \(32, 64, 128\), got 16",
    ),
    "block_size_256": (
        {"block_size": 256},
        r"block_size \(kv_fused.shape\[1\]\) must be one of \(32, 64, 128\), got 256",
    ),
}


@pytest.mark.parametrize(
    ("case_kwargs", "match"), FP8_GEOMETRY_ERRORS.values(), ids=FP8_GEOMETRY_ERRORS.keys()
)
def test_fp8_kernel_restrictions(case_kwargs, match):
    with pytest.raises(ValueError, match=match):
        fp8_call(None, **case_kwargs)


FP4_ERRORS = {
    "q_dtype": (
        lambda c: {"q": c.q.view(torch.int8)},
        TypeError,
        "q must have dtype torch.uint8, got torch.int8",
    ),
    "q_rank": (lambda c: {"q": c.q[0]}, ValueError, "q must be 4-D"),
    "q_sf_not_tensor": (lambda c: {"q_sf": None}, TypeError, "q_sf must be a torch.Tensor"),
    "q_sf_dtype": (
        lambda c: {"q_sf": c.q_sf.long()},
        TypeError,
        "q_sf must have dtype torch.int32, got torch.int64",
    ),
    "q_sf_rank": (lambda c: {"q_sf": c.q_sf[0]}, ValueError, "q_sf must be 3-D"),
    "q_sf_uint8_bytes": (
        lambda c: {"q_sf": c.q_sf[..., None].view(torch.uint8)},
        TypeError,
        r"got torch.uint8: pass a \[batch_size, next_n, num_heads, 4\] uint8 scale tensor as "
        r"q_sf.view\(torch.int32\)",
    ),
    "interleaved_numpy_bool": (
        lambda c: {"is_kv_sf_interleaved": np.bool_(False)},
        TypeError,
        r"is_kv_sf_interleaved must be a bool, got numpy.bool",
    ),
    "q_sf_rank_4_not_1": (
        lambda c: {"q_sf": c.q_sf[..., None].expand(-1, -1, -1, 2)},
        ValueError,
        r"q_sf must be 3-D \[batch_size, next_n, num_heads\] \(or \[..., 1\]\), got 4-D",
    ),
    "q_sf_batch": (
        lambda c: {"q_sf": c.q_sf[:1]},
        ValueError,
        r"q_sf.shape\[0\] must be batch_size \(q.shape\[0\]\) = 2, got 1",
    ),
    # The recipe's [..., 1] form is squeezed before the checks; the message shows it as given.
    "q_sf_batch_of_the_recipe_shape": (
        lambda c: {"q_sf": c.q_sf[:1, ..., None]},
        ValueError,
        r"q_sf.shape\[0\] must be batch_size \(q.shape\[0\]\) = 2, got 1 "
        r"\(q_sf shape \[1, 2, 64, 1\]\)",
    ),
    "q_sf_next_n": (
        lambda c: {"q_sf": c.q_sf[:, :1]},
        ValueError,
        r"q_sf.shape\[1\] must be next_n \(q.shape\[1\]\) = 2, got 1",
    ),
    "q_sf_heads": (
        lambda c: {"q_sf": c.q_sf[..., :32]},
        ValueError,
        r"q_sf.shape\[2\] must be num_heads \(q.shape\[2\]\) = 64, got 32",
    ),
    "num_heads_not_64": (
        lambda c: {"q": c.q[:, :, :32], "q_sf": c.q_sf[..., :32], "weights": c.weights[:, :32]},
        ValueError,
        r"num_heads \(q.shape\[2\]\) must be 64 for the FP4 kernel, got 32",
    ),
    "head_dim_not_128": (
        lambda c: {"q": c.q[..., :32]},
        ValueError,
        r"head_dim \(2 \* q.shape\[3\]\) must be 128 for the FP4 kernel, got 64",
    ),
    "next_n_5": (
        lambda c: {
            "q": torch.zeros(2, 5, 64, 64, dtype=torch.uint8),
            "q_sf": torch.zeros(2, 5, 64, dtype=torch.int32),
            "weights": torch.randn(10, 64),
        },
        ValueError,
        r"next_n \(q.shape\[1\]\) must be in 1..4 for the FP4 kernel, got 5",
    ),
    "sf_vec_size_16": (lambda c: {"sf_vec_size": 16}, ValueError, "sf_vec_size must be 32, got 16"),
    # A multiple of 32 is not 32: the packing of q_sf and the cache's scales fixes it.
    "sf_vec_size_64": (lambda c: {"sf_vec_size": 64}, ValueError, "sf_vec_size must be 32, got 64"),
    "sf_vec_size_bool": (lambda c: {"sf_vec_size": True}, TypeError, "sf_vec_size must be an int"),
    "interleaved_not_bool": (
        lambda c: {"is_kv_sf_interleaved": 1},
        TypeError,
        "is_kv_sf_interleaved must be a bool",
    ),
    "interleaved_at_block_size_32": (
        lambda c: {"is_kv_sf_interleaved": True},
        ValueError,
        r"is_kv_sf_interleaved=True requires block_size 128, got block_size 32",
    ),
    "kv_row_bytes": (
        lambda c: {"kv_fused": torch.zeros(10, 32, 1, 132, dtype=torch.uint8)},
        ValueError,
        r"kv_fused.shape\[3\] must be head_dim/2 \+ 4 \(head_dim=128 = 2\*q.shape\[3\], q shape "
        r"\[[0-9, ]+\]\) = 68, got 132",
    ),
    "kv_block_pitch_unaligned": (
        lambda c: {"kv_fused": pitched(c.kv_fused, 24)},
        ValueError,
        BLOCK_PITCH_MESSAGE + r".*>= the block's 2176 bytes, got strides \(2200, 68, 68, 1\)",
    ),
    "kv_blocks_overlap": (
        lambda c: {"kv_fused": overlapping(c.kv_fused)},
        ValueError,
        BLOCK_PITCH_MESSAGE,
    ),
    "kv_two_blocks_overlap": (
        lambda c: {"kv_fused": two_overlapping(c.kv_fused)},
        ValueError,
        BLOCK_PITCH_MESSAGE + r".*got strides \(0, 68, 68, 1\)",
    ),
    "kv_blocks_overlap_by_16_bytes": (
        lambda c: {"kv_fused": partly_overlapping(c.kv_fused)},
        ValueError,
        BLOCK_PITCH_MESSAGE + r".*>= the block's 2176 bytes, got strides \(2160, 68, 68, 1\)",
    ),
    "block_size_16": (
        lambda c: {"kv_fused": torch.zeros(10, 16, 1, 68, dtype=torch.uint8)},
        ValueError,
        r"block_size \(kv_fused.shape\[1\]\) must be one of \(32, 64, 128\), got 16",
    ),
    "q_sf_device": (
        lambda c: {"q_sf": c.q_sf.to(META)},
        ValueError,
        "q_sf must be on q's device cpu, got meta",
    ),
    "output_dtype_float64": (
        lambda c: {"output_dtype": torch.float64},
        ValueError,
        r"output_dtype must be one of \(torch.bfloat16, torch.float32, torch.float16\)",
    ),
    "epi_dtype_float64": (
        lambda c: {"epi_dtype": torch.float64},
        ValueError,
        r"epi_dtype must be one of \(torch.float32, torch.float16, torch.bfloat16\)",
    ),
    "out_dtype_vs_bf16_default": (
        lambda c: {"out": torch.zeros(4, 256)},
        TypeError,
        "out must have dtype output_dtype = torch.bfloat16, got torch.float32",
    ),
    "schedule_shape": (
        lambda c: {"schedule_meta": torch.zeros(5, 2, dtype=torch.int32)},
        ValueError,
        r"schedule_meta must have shape \[num_sms \+ 1, 2\] = \[133, 2\]",
    ),
}


@pytest.mark.parametrize(
    ("overrides", "error", "match"), FP4_ERRORS.values(), ids=FP4_ERRORS.keys()
)
def test_fp4_argument_errors(overrides, error, match):
    with pytest.raises(error, match=match):
        fp4_call(overrides)


@pytest.mark.parametrize("integer", [np.int64, np.int32, np.uint16])
def test_numpy_integers_are_accepted_as_ints(integer):
    # The schedule helpers take numpy integers; the ops they size must take them too.
    def zeroed_out(dtype):
        return torch.zeros(4, 256, dtype=dtype)  # columns past a length stay 0

    fp8_int = fp8_call(lambda c: {"out": zeroed_out(torch.float32)})
    fp8_numpy = fp8_call(
        lambda c: {"max_seq_len": integer(c.max_seq_len), "out": zeroed_out(torch.float32)}
    )
    assert fp8_numpy.shape == (4, 64)
    torch.testing.assert_close(fp8_numpy, fp8_int, rtol=0, atol=0)
    fp4_int = fp4_call(lambda c: {"out": zeroed_out(torch.bfloat16)})
    fp4_numpy = fp4_call(
        lambda c: {
            "max_seq_len": integer(c.max_seq_len),
            "sf_vec_size": integer(32),
            "out": zeroed_out(torch.bfloat16),
        }
    )
    torch.testing.assert_close(fp4_numpy, fp4_int, rtol=0, atol=0)


def test_a_numpy_sf_vec_size_is_still_checked():
    with pytest.raises(ValueError, match="sf_vec_size must be 32, got 16"):
        fp4_call(lambda c: {"sf_vec_size": np.int64(16)})
    with pytest.raises(TypeError, match=r"sf_vec_size must be an int, got numpy\.float64"):
        fp4_call(lambda c: {"sf_vec_size": np.float64(32.0)})


def test_fp4_interleaved_allowed_at_block_size_128():
    got = fp4_call(lambda c: {"is_kv_sf_interleaved": True}, block_size=128, interleaved=True)
    assert got.shape == (4, 64)


def test_fp4_q_sf_of_the_recipe_shape_is_accepted_from_a_tensor_subclass():
    # [B, next_n, H, 1] (the spec's uint8 [..., 4] viewed as int32) is squeezed for a plain
    # tensor; a subclass such as a frozen Parameter must get the same treatment.
    def zeroed_out():
        return torch.zeros(4, 256, dtype=torch.bfloat16)  # columns past a length stay 0

    plain = fp4_call(lambda c: {"q_sf": c.q_sf[..., None], "out": zeroed_out()})
    got = fp4_call(
        lambda c: {
            "q_sf": torch.nn.Parameter(c.q_sf[..., None], requires_grad=False),
            "out": zeroed_out(),
        }
    )
    torch.testing.assert_close(got, plain)


def test_fp4_interleaved_refused_at_block_size_64():
    with pytest.raises(ValueError, match="requires block_size 128, got block_size 64"):
        fp4_call(lambda c: {"is_kv_sf_interleaved": True}, block_size=64)


def test_non_sm90_gpu_is_refused_with_its_capability(monkeypatch):
    # No GPU here: stand in for an sm_80 device to check the error names what it found.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(RuntimeError) as info:
        _validation.check_cuda_arch("fp8_paged_mqa_logits", torch.device("cuda", 0))
    message = str(info.value)
    assert "NVIDIA A100" in message and "compute capability 8.0" in message
    assert "SM90 (compute capability 9.0)" in message


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
@pytest.mark.parametrize("name", ["weights", "block_tables", "seq_lens"])
def test_tensors_of_other_layouts_are_named(name, layout):
    def sparse(c):
        dense = getattr(c, name)
        return {name: dense.to_sparse() if layout == "sparse_coo" else dense.to_sparse_csr()}

    if layout == "sparse_csr" and name == "seq_lens":
        pytest.skip("a CSR tensor is 2-D")
    with pytest.raises(
        TypeError, match=rf"{name} must be a dense \(torch.strided\) tensor, got layout"
    ):
        fp8_call(sparse)


# paged_mqa_logits/ -> tests/ -> attn-scores/ -> packages/ -> repository root
MIGRATION = Path(__file__).resolve().parent.parent.parent.parent.parent / "docs" / "migration.md"
TABLE_ROWS = [8, 16, 32, 64, 128, 192, 256]  # the next_n * num_heads the tables list


def docstring_head_dim_limits() -> dict[int, int]:
    """`next_n * num_heads -> largest head_dim` as fp8_paged_mqa_logits' docstring states it
    ("... that fits, by `next_n * num_heads`: 8: 1600, 16: 1440, ...")."""
    text = " ".join(fa.fp8_paged_mqa_logits.__doc__.split())
    table = text.split("the largest `head_dim` that fits, by `next_n * num_heads`: ", 1)[1]
    table = table.split(".", 1)[0]
    return {int(rows): int(largest) for rows, largest in re.findall(r"(\d+): (\d+)", table)}


def migration_head_dim_limits() -> dict[int, int]:
    """The same table as docs/migration.md states it ("... is 1600 (8), 1440 (16), ...")."""
    text = MIGRATION.read_text()
    table = text.split("the largest fp8 `head_dim` by `next_n * num_heads` is ", 1)[1]
    table = table.split(", and", 1)[0]
    return {int(rows): int(largest) for largest, rows in re.findall(r"(\d+) \((\d+)\)", table)}


def test_the_docstring_states_the_head_dim_limit_of_every_row_count():
    assert sorted(docstring_head_dim_limits()) == TABLE_ROWS


@pytest.mark.skipif(not MIGRATION.exists(), reason="docs/migration.md is not in this checkout")
def test_the_migration_guide_states_the_docstrings_head_dim_limits():
    assert migration_head_dim_limits() == docstring_head_dim_limits()


@pytest.mark.parametrize("rows", TABLE_ROWS)
def test_the_documented_head_dim_limits_are_the_kernels(rows):
    """The largest head_dim the docstring states for next_n * num_heads = rows is the one the
    op accepts (for two splits of rows into next_n and num_heads), and 32 more is refused."""
    largest = docstring_head_dim_limits()[rows]
    for num_heads in (4, 8):
        next_n = rows // num_heads
        assert fp8_sm90.largest_fitting_head_dim(num_heads, next_n) == largest
        shape = {"lens": [3, 0], "max_seq_len": 8, "num_heads": num_heads, "next_n": next_n}
        assert fp8_call(None, head_dim=largest, **shape).shape == (2 * next_n, 8)
        with pytest.raises(ValueError, match=rf"the largest head_dim that fits is {largest}$"):
            fp8_call(None, head_dim=largest + 32, **shape)
