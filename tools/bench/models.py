"""Byte and FLOP models of PERFORMANCE.md: what must move, each input once, each output once."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .shapes import IndexerShape

OUTPUT_BYTES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}

# The spec's default output dtype of each op.
DEFAULT_OUTPUT_DTYPE = {"fp8": torch.float32, "fp4": torch.bfloat16}


@dataclass(frozen=True)
class WorkModel:
    """The work of one call.

    Attributes:
        kv_tokens: KV tokens read, summed over requests.
        kv_bytes: Cache bytes read (values and scales).
        output_bytes: Logits the spec defines (`valid_outputs`), about `next_n` per KV token.
        small_input_bytes: q (and q_sf), weights, block tables and seq_lens, read once.
        flops: 2 * H * D * next_n per KV token (the per-head dot products).
    """

    kv_tokens: int
    kv_bytes: int
    output_bytes: int
    small_input_bytes: int
    flops: int

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.output_bytes + self.small_input_bytes


def kv_bytes_per_token(op: str, head_dim: int) -> int:
    """Cache bytes per KV token: fp8 D values + one fp32 scale (132 B at D = 128); fp4 D/2
    packed bytes + D/32 UE8M0 scales (68 B at D = 128)."""
    if op == "fp8":
        return head_dim + 4
    if op == "fp4":
        return head_dim // 2 + head_dim // 32
    raise ValueError(f"op must be 'fp8' or 'fp4', got {op!r}")


def valid_outputs(seq_lens: list[int], next_n: int) -> int:
    """Logits the spec defines: draft slot t of a request of length L sees positions
    0 .. L - next_n + t, so the request has next_n * L - next_n * (next_n - 1) / 2 of them
    (fewer for L < next_n, where early slots see none)."""
    return sum(max(0, length - next_n + t + 1) for length in seq_lens for t in range(next_n))


def work_model(shape: IndexerShape, seq_lens: list[int], output_dtype: torch.dtype) -> WorkModel:
    """Bytes and FLOPs of one call of `shape.op` with these lengths."""
    h, d, n, b = shape.num_heads, shape.head_dim, shape.next_n, shape.batch
    tokens = sum(seq_lens)
    rows = b * n
    if shape.op == "fp8":
        q_bytes = rows * h * d
    else:
        q_bytes = rows * h * (d // 2) + rows * h * 4  # packed q + one int32 of scales per head
    # The kernel reads a request's block-table row only up to its own last block.
    table_entries = sum(-(-length // shape.block_size) for length in seq_lens)
    small = q_bytes + rows * h * 4 + table_entries * 4 + b * 4
    return WorkModel(
        kv_tokens=tokens,
        kv_bytes=tokens * kv_bytes_per_token(shape.op, d),
        output_bytes=valid_outputs(seq_lens, n) * OUTPUT_BYTES[output_dtype],
        small_input_bytes=small,
        flops=2 * h * d * n * tokens,
    )


# The roofline of a logits call (PERFORMANCE.md): max(bytes / copy bandwidth, FLOPs / FP8 tensor
# peak), with the FP8 peak measured there with cuBLAS on the H200.
FP8_TENSOR_FLOPS_PER_S = 1.48e15

# The MXFP4 kernel's decode on the CUDA cores, for "the roofline with the dequantise cost
# counted in": 8 ALU-pipe instructions per 8 E2M1 values (mask, shift, four byte permutes, two
# merges; the ninth, a shift, goes to the FMA pipe), the floor of the table-lookup decode
# (kernel notes, twentieth and twenty-second rounds). The ALU pipe retires 64 thread
# instructions per clock per SM (16 lanes per scheduler); the clock is the H200's highest
# (1.98 GHz), which gives the decode its smallest time and the roofline its strictest value.
DECODE_ALU_INSTRUCTIONS_PER_VALUE = 1.0
ALU_INSTRUCTIONS_PER_CLOCK_PER_SM = 64
SM_CLOCK_HZ = 1.98e9


def decode_seconds(kv_tokens: int, head_dim: int, sm_count: int) -> float:
    """The E2M1 decode of `kv_tokens` tokens at the ALU pipe's peak on every SM."""
    instructions = kv_tokens * head_dim * DECODE_ALU_INSTRUCTIONS_PER_VALUE
    return instructions / (ALU_INSTRUCTIONS_PER_CLOCK_PER_SM * sm_count * SM_CLOCK_HZ)


def roofline_seconds(
    total_bytes: int,
    flops: int,
    copy_bytes_per_s: float,
    decode_s: float = 0.0,
) -> float:
    """max(bytes / copy, FLOPs / FP8 peak + decode). The decode adds to the MMA time rather
    than overlapping it: on one SM, CUDA-core work beside WGMMAs costs close to the sum of the
    two (`tools/wgmma_rate.py`, kernel notes, fifteenth round)."""
    return max(total_bytes / copy_bytes_per_s, flops / FP8_TENSOR_FLOPS_PER_S + decode_s)
