"""Readable float64 reference of the paged MQA logits contract.

For request `b`, draft slot `t` and KV position `p`:

    logits[b*next_n + t, p] = scale[p] * sum_h w[b*next_n + t, h] * relu(q[b, t, h] . k[p])

(`scale[p]` only for the fp8 cache; MXFP4 scales are folded into the dequantised values.)
The steps run in exactly that order, in float64, on inputs dequantised by
`flashinfer_layouts`: the per-head dot product, the per-head ReLU, the weighted sum over
heads, then the per-token scale. Products of FP8/FP4 values are exact in float64 and so are
their sums over head_dim unless the MXFP4 group scales of one dot product lie more than about
2^40 apart, so the only rounding is in the weighted head sum and, for fp8, the multiply by
the token's scale.

These functions are meant for tests and for users checking a kernel: they loop over
requests (the work inside a request is vectorised) and read `seq_lens` on the host.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from flashinfer_layouts import (
    dequantize_mxfp4_kv_cache,
    dequantize_mxfp4_q,
    unpack_fp8_kv_cache,
)

__all__ = [
    "fp4_paged_mqa_logits_reference",
    "fp8_paged_mqa_logits_reference",
    "valid_mask",
]

# KV positions scored per step; bounds the [next_n, num_heads, chunk] float64 intermediate.
_POSITIONS_PER_CHUNK = 4096


def valid_mask(seq_lens: torch.Tensor, next_n: int, max_seq_len: int) -> torch.Tensor:
    """Mark the output elements the spec defines.

    Row `b*next_n + t` is meaningful for KV positions `0 .. seq_lens[b] - next_n + t`
    inclusive: the newest slot `t = next_n - 1` sees the whole sequence, each earlier slot
    one position fewer. Everything else (later columns, rows of empty requests) is
    unspecified and must be masked before use, e.g. before a top-k.

    Args:
        seq_lens: `[batch_size]` integer KV lengths, any stride, any device.
        next_n: Query positions per request (`q.shape[1]`), `>= 1`.
        max_seq_len: Column count of the logits, `>= 0`.

    Returns:
        `[batch_size*next_n, max_seq_len]` bool tensor on `seq_lens.device`.
    """
    lens = seq_lens.to(torch.int64).repeat_interleave(next_n)
    slot = torch.arange(next_n, device=seq_lens.device).repeat(seq_lens.shape[0])
    last_valid = lens - next_n + slot
    positions = torch.arange(max_seq_len, device=seq_lens.device)
    return positions[None, :] <= last_valid[:, None]


def _check_request(
    b: int, length: int, max_seq_len: int, row: torch.Tensor, num_blocks: int, block_size: int
) -> torch.Tensor:
    """Return the block ids request `b` reads, raising on a violated paging precondition."""
    if length < 0 or length > max_seq_len:
        raise ValueError(f"seq_lens[{b}] = {length} must be in [0, max_seq_len = {max_seq_len}]")
    n_blocks = -(-length // block_size)
    if row.shape[0] < n_blocks:
        raise ValueError(
            f"block_tables has {row.shape[0]} columns but seq_lens[{b}] = {length} needs "
            f"{n_blocks} blocks of {block_size} tokens"
        )
    ids = row[:n_blocks].to(torch.int64)
    bad = (ids < 0) | (ids >= num_blocks)
    if bad.any():
        j = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"block_tables[{b}, {j}] = {int(ids[j])} is outside kv_fused's [0, {num_blocks}) blocks"
        )
    return ids


def _weighted_relu_scores(q_b: torch.Tensor, k: torch.Tensor, w_b: torch.Tensor) -> torch.Tensor:
    """`[next_n, L]` = sum_h w[t, h] * relu(q[t, h] . k[p]), all float64, chunked over p."""
    pieces = []
    for start in range(0, k.shape[0], _POSITIONS_PER_CHUNK):
        k_chunk = k[start : start + _POSITIONS_PER_CHUNK]
        per_head = torch.einsum("thd,pd->thp", q_b, k_chunk)  # per-head dot products
        pieces.append(torch.einsum("th,thp->tp", w_b, per_head.relu()))  # ReLU, then head sum
    if not pieces:
        return q_b.new_zeros(q_b.shape[0], 0)
    return torch.cat(pieces, dim=1)


def _logits_by_request(
    q64: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    num_blocks: int,
    block_size: int,
    keys_of_blocks,
) -> Iterator[tuple[int, torch.Tensor]]:
    """`(b, [next_n, seq_lens[b]] float64 logits)` for every non-empty request `b`, one at a
    time: a request's keys and logits are built when the iterator reaches it.

    `keys_of_blocks(ids)` returns `([n*bs, D] keys, [n*bs] scales or None)`. Every request is
    checked here, before the iterator is returned, so a violated precondition raises before
    any result.
    """
    batch_size, next_n, num_heads = q64.shape[:3]
    lengths = seq_lens.tolist()
    block_ids = [
        _check_request(b, length, max_seq_len, block_tables[b], num_blocks, block_size)
        for b, length in enumerate(lengths)
    ]
    w64 = weights.to(torch.float64).reshape(batch_size, next_n, num_heads)

    def each_request() -> Iterator[tuple[int, torch.Tensor]]:
        for b, (length, ids) in enumerate(zip(lengths, block_ids, strict=True)):
            if length == 0:
                continue
            keys, scales = keys_of_blocks(ids)
            logits = _weighted_relu_scores(q64[b], keys[:length], w64[b])
            if scales is not None:
                logits = logits * scales[:length]  # per-token scale, after the head sum
            yield b, logits

    return each_request()


def request_rows(matrix: torch.Tensor, b: int, next_n: int, length: int) -> torch.Tensor:
    """The view of `matrix` that holds request `b`'s logits: its `next_n` rows, `length`
    columns."""
    return matrix[b * next_n : (b + 1) * next_n, :length]


def _as_matrix(
    by_request: Iterator[tuple[int, torch.Tensor]], q: torch.Tensor, max_seq_len: int
) -> torch.Tensor:
    """The per-request logits placed in a NaN-filled `[batch_size*next_n, max_seq_len]`."""
    next_n = q.shape[1]
    out = torch.full(
        (q.shape[0] * next_n, max_seq_len), float("nan"), dtype=torch.float64, device=q.device
    )
    for b, logits in by_request:
        request_rows(out, b, next_n, logits.shape[1]).copy_(logits)
    return out


def fp8_paged_mqa_logits_reference(
    q: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
) -> torch.Tensor:
    """Float64 reference of `fp8_paged_mqa_logits`.

    Computes `scale[p] * sum_h weights[b*next_n + t, h] * relu(q[b, t, h] . k[p])` for every
    slot `t` of request `b` and every position `p < seq_lens[b]` (the region the kernel
    computes; only `p <= seq_lens[b] - next_n + t` is meaningful, see `valid_mask`).

    Args:
        q: `[batch_size, next_n, num_heads, head_dim]` float8_e4m3fn.
        kv_fused: `[num_blocks, block_size, 1, head_dim + 4]` uint8 FP8 cache (two regions
            per block: values, then little-endian float32 per-token scales).
        weights: `[batch_size*next_n, num_heads]` float32.
        block_tables: `[batch_size, >= max blocks]` integer physical block ids.
        seq_lens: `[batch_size]` integer KV lengths, each in `[0, max_seq_len]`.
        max_seq_len: Column count of the result.

    Returns:
        `[batch_size*next_n, max_seq_len]` float64 on `q.device`; NaN where nothing is
        computed (positions `>= seq_lens[b]`, rows of empty requests).

    Raises:
        ValueError: A length is outside `[0, max_seq_len]`, the table is too narrow for a
            length, or a block id that is read is outside `kv_fused`.
    """
    by_request = fp8_logits_by_request(q, kv_fused, weights, block_tables, seq_lens, max_seq_len)
    return _as_matrix(by_request, q, max_seq_len)


def fp8_logits_by_request(
    q: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
) -> Iterator[tuple[int, torch.Tensor]]:
    """`fp8_paged_mqa_logits_reference` request by request: `(b, [next_n, seq_lens[b]])`
    float64 for each non-empty request, one at a time, without the `[rows, max_seq_len]`
    matrix. The paging preconditions are checked on the call, before any request."""
    num_blocks, block_size = kv_fused.shape[:2]
    head_dim = q.shape[-1]

    def keys_of_blocks(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, scales = unpack_fp8_kv_cache(kv_fused[ids])
        return values.to(torch.float64).reshape(-1, head_dim), scales.to(torch.float64).reshape(-1)

    return _logits_by_request(
        q.to(torch.float64),
        weights,
        block_tables,
        seq_lens,
        max_seq_len,
        num_blocks,
        block_size,
        keys_of_blocks,
    )


def fp4_paged_mqa_logits_reference(
    q: torch.Tensor,
    q_sf: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    *,
    is_kv_sf_interleaved: bool = False,
) -> torch.Tensor:
    """Float64 reference of `fp4_paged_mqa_logits`.

    Dequantises q (E2M1 nibbles times the UE8M0 group scales of `q_sf`) and the MXFP4 cache,
    then computes `sum_h weights[b*next_n + t, h] * relu(q[b, t, h] . k[p])` for every slot
    `t` of request `b` and every position `p < seq_lens[b]`. There is no per-token factor.

    Args:
        q: `[batch_size, next_n, num_heads, head_dim/2]` uint8, two E2M1 values per byte
            (even element in the low nibble).
        q_sf: `[batch_size, next_n, num_heads]` int32, four UE8M0 bytes per int32, byte `k`
            (little-endian) scaling elements `[32k, 32k + 32)`.
        kv_fused: `[num_blocks, block_size, 1, head_dim/2 + 4]` uint8 MXFP4 cache.
        weights: `[batch_size*next_n, num_heads]` float32.
        block_tables: `[batch_size, >= max blocks]` integer physical block ids.
        seq_lens: `[batch_size]` integer KV lengths, each in `[0, max_seq_len]`.
        max_seq_len: Column count of the result.
        is_kv_sf_interleaved: Whether each block's scale tail uses the interleaved token
            order (slot `k` holds token `(k % 4) * (block_size // 4) + k // 4`).

    Returns:
        `[batch_size*next_n, max_seq_len]` float64 on `q.device`; NaN where nothing is
        computed.

    Raises:
        ValueError: A length is outside `[0, max_seq_len]`, the table is too narrow for a
            length, or a block id that is read is outside `kv_fused`.
    """
    by_request = fp4_logits_by_request(
        q,
        q_sf,
        kv_fused,
        weights,
        block_tables,
        seq_lens,
        max_seq_len,
        is_kv_sf_interleaved=is_kv_sf_interleaved,
    )
    return _as_matrix(by_request, q, max_seq_len)


def fp4_logits_by_request(
    q: torch.Tensor,
    q_sf: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    *,
    is_kv_sf_interleaved: bool = False,
) -> Iterator[tuple[int, torch.Tensor]]:
    """`fp4_paged_mqa_logits_reference` request by request: `(b, [next_n, seq_lens[b]])`
    float64 for each non-empty request, one at a time, without the `[rows, max_seq_len]`
    matrix. The paging preconditions are checked on the call, before any request."""
    num_blocks, block_size = kv_fused.shape[:2]
    head_dim = 2 * q.shape[-1]

    def keys_of_blocks(ids: torch.Tensor) -> tuple[torch.Tensor, None]:
        keys = dequantize_mxfp4_kv_cache(
            kv_fused[ids], interleaved=is_kv_sf_interleaved, dtype=torch.float64
        )
        return keys.reshape(-1, head_dim), None

    return _logits_by_request(
        dequantize_mxfp4_q(q, q_sf, dtype=torch.float64),
        weights,
        block_tables,
        seq_lens,
        max_seq_len,
        num_blocks,
        block_size,
        keys_of_blocks,
    )
