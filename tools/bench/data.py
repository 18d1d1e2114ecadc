"""Benchmark inputs: a shuffled page pool larger than L2 and rotation sets of call arguments.

A case holds one KV page pool and `R` rotation sets. Every set has its own q, weights, block
table and output buffer; the tables of different sets point at disjoint, randomly chosen pages
of the pool. Timing replays the sets back to back, so by the time a set comes round again the
pages it reads have been evicted from L2 by the other sets' traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import flashinfer_layouts
import torch
from flashinfer_schedule import min_block_table_width, padded_seq_len

from .models import DEFAULT_OUTPUT_DTYPE, kv_bytes_per_token
from .shapes import IndexerShape

GIB = 1 << 30
# PERFORMANCE.md: the page pool must be far larger than the 60 MB L2.
MIN_GPU_POOL_BYTES = 2 * GIB
POOL_WORKING_SET_FACTOR = 4
# Rotation sets together should move at least this many times the L2 size per replay.
ROTATION_L2_FACTOR = 4
# Enough for the smallest grid case (B = 1, L = 4k, MXFP4: about 900 sets). Up to the eleventh
# run the cap was 256, and there one pass over the sets moved only 0.87-2.5x the L2 at B = 1.
MAX_ROTATIONS = 1024
# Never take more than this fraction of the free device memory for one case.
FREE_MEMORY_FRACTION = 0.6
# Pool pages are generated in chunks of about this many bytes.
FILL_CHUNK_BYTES = 256 << 20


class CaseTooLarge(RuntimeError):
    """The case does not fit in the free device memory."""


@dataclass
class CallInputs:
    """Arguments of one op call (one rotation set).

    Attributes:
        q: fp8 `[B, next_n, H, D]` float8_e4m3fn, or fp4 `[B, next_n, H, D/2]` uint8.
        q_sf: fp4 only: `[B, next_n, H]` int32 packed UE8M0 scales; None for fp8.
        weights: `[B*next_n, H]` float32, both signs.
        block_tables: `[B, width]` int32, shuffled physical pages of the pool.
        seq_lens: `[B]` int32.
        out: `[B*next_n, padded_seq_len(max_seq_len)]` output storage.
    """

    q: torch.Tensor
    q_sf: torch.Tensor | None
    weights: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    out: torch.Tensor


@dataclass
class CaseData:
    """Everything one benchmark case needs.

    Attributes:
        shape: The case.
        seq_lens: Per-request lengths, on the host.
        max_seq_len: `max(seq_lens)`.
        kv_fused: The page pool, `[pool_blocks, block_size, 1, row_bytes]` uint8.
        sets: Rotation sets of call arguments; all read the same pool.
        output_dtype: The op's output dtype.
    """

    shape: IndexerShape
    seq_lens: list[int]
    max_seq_len: int
    kv_fused: torch.Tensor
    sets: list[CallInputs]
    output_dtype: torch.dtype

    @property
    def pool_bytes(self) -> int:
        return self.kv_fused.numel()


def _random_kv_blocks(
    shape: IndexerShape, num_blocks: int, gen: torch.Generator, device: torch.device
) -> torch.Tensor:
    """Quantise random K rows and pack `num_blocks` blocks of the op's `kv_fused` layout."""
    k = torch.randn(num_blocks, shape.block_size, shape.head_dim, generator=gen, device=device)
    if shape.op == "fp8":
        values, scales = flashinfer_layouts.quantize_fp8_per_token(k)
        return flashinfer_layouts.pack_fp8_kv_cache(values, scales)
    return flashinfer_layouts.quantize_mxfp4_kv_cache(k)


def _random_q(
    shape: IndexerShape, gen: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    q = torch.randn(
        shape.batch, shape.next_n, shape.num_heads, shape.head_dim, generator=gen, device=device
    )
    if shape.op == "fp8":
        return q.to(torch.float8_e4m3fn), None
    return flashinfer_layouts.quantize_mxfp4_q(q)


def _fill_pool(
    shape: IndexerShape, pool_blocks: int, gen: torch.Generator, device: torch.device
) -> torch.Tensor:
    row_bytes = kv_bytes_per_token(shape.op, shape.head_dim)
    block_bytes = shape.block_size * row_bytes
    pool = torch.empty(
        pool_blocks, shape.block_size, 1, row_bytes, dtype=torch.uint8, device=device
    )
    chunk = max(1, FILL_CHUNK_BYTES // block_bytes)
    for start in range(0, pool_blocks, chunk):
        stop = min(pool_blocks, start + chunk)
        pool[start:stop] = _random_kv_blocks(shape, stop - start, gen, device)
    return pool


def _plan_pool(
    shape: IndexerShape, set_blocks: int, extra_bytes_per_set: int, device: torch.device
) -> tuple[int, int]:
    """Choose (pool_blocks, rotations) for the device."""
    block_bytes = shape.block_size * kv_bytes_per_token(shape.op, shape.head_dim)
    set_kv_bytes = set_blocks * block_bytes
    if device.type != "cuda":
        # CPU: one set, tables shuffled over a pool twice its size.
        return 2 * set_blocks, 1

    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    rotations = max(
        1, math.ceil(ROTATION_L2_FACTOR * l2_bytes / (set_kv_bytes + extra_bytes_per_set))
    )
    rotations = min(rotations, MAX_ROTATIONS)
    pool_bytes = max(
        MIN_GPU_POOL_BYTES, POOL_WORKING_SET_FACTOR * set_kv_bytes, rotations * set_kv_bytes
    )

    free_bytes, _ = torch.cuda.mem_get_info(device)
    budget = int(FREE_MEMORY_FRACTION * free_bytes) - rotations * extra_bytes_per_set
    if pool_bytes > budget:
        pool_bytes = budget
        rotations = min(rotations, max(0, (budget // block_bytes) // set_blocks))
        if rotations < 1:
            raise CaseTooLarge(
                f"{shape.label}: needs {set_kv_bytes / GIB:.2f} GiB of pages plus "
                f"{extra_bytes_per_set / GIB:.2f} GiB of outputs; {free_bytes / GIB:.2f} GiB free"
            )
    return pool_bytes // block_bytes, rotations


def build_case(shape: IndexerShape, device: torch.device) -> CaseData:
    """Build the pool and rotation sets of `shape` on `device`, deterministically.

    Raises:
        CaseTooLarge: On CUDA, not even one set fits in the free memory.
    """
    lens = shape.seq_lens()
    max_seq_len = max(lens)
    blocks_per_request = [min_block_table_width(length, shape.block_size) for length in lens]
    set_blocks = sum(blocks_per_request)
    width = max(blocks_per_request)
    output_dtype = DEFAULT_OUTPUT_DTYPE[shape.op]
    rows = shape.batch * shape.next_n
    out_bytes = rows * padded_seq_len(max_seq_len) * output_dtype.itemsize

    pool_blocks, rotations = _plan_pool(shape, set_blocks, out_bytes, device)
    gen = torch.Generator(device=device).manual_seed(shape.seed())
    kv_fused = _fill_pool(shape, pool_blocks, gen, device)

    # Disjoint shuffled pages per set; unused table entries hold arbitrary valid page ids.
    page_order = torch.randperm(pool_blocks, generator=gen, device=device).to(torch.int32)
    seq_lens_dev = torch.tensor(lens, dtype=torch.int32, device=device)
    sets = []
    for r in range(rotations):
        pages = page_order[r * set_blocks : (r + 1) * set_blocks]
        table = torch.randint(
            0, pool_blocks, (shape.batch, width), generator=gen, device=device, dtype=torch.int32
        )
        offset = 0
        for b, nb in enumerate(blocks_per_request):
            table[b, :nb] = pages[offset : offset + nb]
            offset += nb
        q, q_sf = _random_q(shape, gen, device)
        weights = torch.randn(rows, shape.num_heads, generator=gen, device=device)
        out = torch.empty(rows, padded_seq_len(max_seq_len), dtype=output_dtype, device=device)
        sets.append(CallInputs(q, q_sf, weights, table, seq_lens_dev.clone(), out))
    return CaseData(shape, lens, max_seq_len, kv_fused, sets, output_dtype)
