"""The sizes of one validated paged MQA logits call, and the argument checks both ops share.

The checks read tensor metadata only (dtype, rank, shape, strides, device), so their outcome
is a function of the call's argument signature and `dispatch` can remember it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from flashinfer_schedule import padded_seq_len

from .. import _validation as v
from . import fp8_sm90

FP8_OUTPUT_DTYPES = (torch.float32, torch.float16)
FP8_EPI_DTYPES = (torch.float32, torch.float16)
FP8_ACC_DTYPES = (torch.float32, torch.float16)
FP4_OUTPUT_DTYPES = (torch.bfloat16, torch.float32, torch.float16)
FP4_EPI_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

FP8_BF16_REFUSAL = {
    torch.bfloat16: (
        "bfloat16 is deliberately unsupported for the FP8 variant (its epilogue has no "
        "bfloat16 store path and would silently miscompute); use float32 or float16"
    )
}

# fp4 kernel: a single problem shape.
FP4_NUM_HEADS = 64
FP4_HEAD_DIM = 128
FP4_MAX_NEXT_N = 4
FP4_SF_VEC_SIZE = 32
FP4_INTERLEAVED_BLOCK_SIZE = 128
# Bytes of scale data per token in kv_fused: one float32 (fp8) or head_dim/32 UE8M0 (fp4).
KV_SCALE_BYTES = 4


@dataclass(frozen=True)
class Problem:
    """Sizes of one validated call."""

    batch_size: int
    next_n: int
    num_heads: int
    head_dim: int
    num_blocks: int
    block_size: int
    max_seq_len: int

    @property
    def rows(self) -> int:
        return self.batch_size * self.next_n

    @property
    def padded_cols(self) -> int:
        return padded_seq_len(self.max_seq_len)


def check_common(
    *,
    variant: str,
    q: torch.Tensor,
    head_dim: int,
    kv_fused: object,
    weights: object,
    block_tables: object,
    seq_lens: object,
    max_seq_len: object,
    extra_tensors: dict[str, object],
) -> Problem:
    """Checks shared by both variants once q's dtype/rank are known."""
    kv_fused = v.check_tensor("kv_fused", kv_fused)
    weights = v.check_tensor("weights", weights)
    block_tables = v.check_tensor("block_tables", block_tables)
    seq_lens = v.check_tensor("seq_lens", seq_lens)
    batch_size, next_n, num_heads = q.shape[:3]

    v.check_dtype("weights", weights, torch.float32)
    v.check_ndim("weights", weights, 2, "[batch_size*next_n, num_heads]")
    v.check_dim(
        "weights", weights, 0, batch_size * next_n, "batch_size*next_n (q.shape[0]*q.shape[1])"
    )
    v.check_dim("weights", weights, 1, num_heads, "num_heads (q.shape[2])")
    v.check_block_tables(block_tables, batch_size)
    v.check_seq_lens(seq_lens, batch_size)

    v.check_dtype("kv_fused", kv_fused, torch.uint8)
    row_meaning = "head_dim + 4" if variant == "fp8" else "head_dim/2 + 4"
    v.check_ndim("kv_fused", kv_fused, 4, f"[num_blocks, block_size, 1, {row_meaning}]")
    v.check_dim("kv_fused", kv_fused, 2, 1, "the KV head count (MQA: one KV head)")
    value_bytes = head_dim if variant == "fp8" else head_dim // 2
    if kv_fused.shape[3] != value_bytes + KV_SCALE_BYTES:
        # Formatted only when raising: printing a traced head_dim specialises the graph to it.
        source = "q.shape[3]" if variant == "fp8" else "2*q.shape[3]"
        meaning = f"{row_meaning} (head_dim={head_dim} = {source}, q shape {v.sizes(q.shape)})"
        v.check_dim("kv_fused", kv_fused, 3, value_bytes + KV_SCALE_BYTES, meaning)
    block_size = v.check_block_size(kv_fused)
    v.check_kv_fused_blocks_contiguous(kv_fused)
    v.check_kv_fused_block_stride(kv_fused)
    v.check_kv_fused_num_blocks(kv_fused)

    v.check_head_geometry(num_heads, head_dim, next_n, q_shape=tuple(q.shape))
    if variant == "fp8":
        check_fp8_shared_memory_fit(num_heads, head_dim, next_n)

    v.check_supported_device_type("q", q)
    v.check_same_device(
        "q",
        q,
        kv_fused=kv_fused,
        weights=weights,
        block_tables=block_tables,
        seq_lens=seq_lens,
        **extra_tensors,
    )
    v.check_int("max_seq_len", max_seq_len, minimum=0)
    return Problem(
        batch_size=batch_size,
        next_n=next_n,
        num_heads=num_heads,
        head_dim=head_dim,
        num_blocks=kv_fused.shape[0],
        block_size=block_size,
        max_seq_len=max_seq_len,
    )


def check_fp8_shared_memory_fit(num_heads: int, head_dim: int, next_n: int) -> None:
    """The spec's last head-geometry restriction: q's two slots plus at least two KV stages
    must fit one SM90 CTA's shared memory.

    Not while a tracer runs (torch.compile, `make_fx`): with dynamic shapes these sizes can
    be symbols, which the shared-memory sizing cannot take, and dynamo cannot trace it
    anyway. The custom op then runs the check itself, on the real sizes, whenever the traced
    code runs (`custom_ops.fp8_paged_mqa_logits_into`), so the error still comes on the
    first call.
    """
    sizes = (num_heads, head_dim, next_n)
    if not torch.compiler.is_compiling() and all(type(size) is int for size in sizes):
        fp8_sm90.check_shared_memory_fit(num_heads, head_dim, next_n)


def check_call_outputs(
    problem: Problem,
    q: torch.Tensor,
    output_dtype: torch.dtype,
    schedule_meta: object,
    out: object,
) -> None:
    """Checks of `schedule_meta`, `out` and the output's 32-bit offset span."""
    if schedule_meta is not None:
        v.check_schedule_meta(schedule_meta, q)
    if out is not None:
        out = v.check_out(
            out,
            rows=problem.rows,
            padded_cols=problem.padded_cols,
            output_dtype=output_dtype,
            q=q,
        )
    v.check_output_span(problem.rows, problem.padded_cols, out)
