"""Serving write path: quantise new K rows and scatter them into a paged ``kv_fused`` pool.

A slot is ``block * block_size + offset`` (the vLLM ``slot_mapping`` convention); slot -1
means "no cache slot for this row" and the row is skipped.

The scatter never synchronises with the device and never reads ``slot_mapping`` on the
host, so it can be captured in a CUDA graph: rows with slot -1 are redirected onto a row
that IS written, carrying that row's bytes (duplicate writes of identical bytes are
harmless). Only if every row is -1 do they rewrite slot 0's current bytes unchanged.
"""

from __future__ import annotations

import torch

from . import _checks
from ._bits import float32_to_le_bytes
from .fp8 import FP8_SCALE_MODES, fp8_kv_cache_head_dim, quantize_fp8_per_token
from .mxfp4 import (
    MXFP4_SF_VEC_SIZE,
    _check_interleaved_flag,
    mxfp4_interleaved_slot_of_token,
    mxfp4_kv_cache_head_dim,
    quantize_mxfp4,
)

__all__ = ["write_fp8_kv_cache", "write_mxfp4_kv_cache"]


def _check_rows(
    kv_fused: torch.Tensor, k: torch.Tensor, slot_mapping: torch.Tensor, head_dim: int
) -> None:
    _checks.tensor("k", k)
    _checks.tensor("slot_mapping", slot_mapping)
    _checks.dtype("k", k, _checks.FLOAT_DTYPES)
    _checks.ndim("k", k, 2, "[num_tokens, head_dim]")
    _checks.dim_size("k", k, 1, head_dim, "head_dim, from kv_fused")
    _checks.dtype("slot_mapping", slot_mapping, _checks.INDEX_DTYPES)
    _checks.ndim("slot_mapping", slot_mapping, 1, "[num_tokens]")
    _checks.dim_size("slot_mapping", slot_mapping, 0, k.shape[0], "num_tokens, k.shape[0]")
    _checks.same_device("k", k, "kv_fused", kv_fused)
    _checks.same_device("slot_mapping", slot_mapping, "kv_fused", kv_fused)
    if _checks.device_data_checks_enabled(slot_mapping) and slot_mapping.numel() > 0:
        num_slots = kv_fused.shape[0] * kv_fused.shape[1]
        low, high = int(slot_mapping.min()), int(slot_mapping.max())
        if low < -1 or high >= num_slots:
            bad = low if low < -1 else high
            raise ValueError(
                f"slot_mapping entries must be -1 (skip) or in [0, {num_slots}) "
                f"(num_blocks * block_size); got {bad}"
            )


def _check_pool_layout(kv_fused: torch.Tensor) -> None:
    # The scatter writes through whatever strides it is given: overlapping blocks (an
    # expanded pool) would silently overwrite each other. The kernels read the same layout.
    _checks.blocks_contiguous("kv_fused", kv_fused)
    _checks.blocks_disjoint("kv_fused", kv_fused)
    _checks.writable_here("kv_fused", kv_fused)


def _resolve_slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Map every row to the row whose bytes it writes, without reading data on the host.

    Returns ``(source_row, slot, live)``: row ``i`` writes row ``source_row[i]``'s bytes to
    ``slot[i]``; ``live[i]`` is False only when no row at all has a valid slot (then
    ``slot[i]`` is 0 and the current bytes must be written back unchanged).
    """
    slots = slot_mapping.to(torch.int64)
    valid = slots >= 0
    rows = torch.arange(slots.shape[0], device=slots.device)
    first_valid = torch.argmax(valid.to(torch.int32))  # 0 when no row is valid
    source = torch.where(valid, rows, first_valid)
    live = valid[source]
    return source, slots[source].clamp_min(0), live


def _write_rows(
    kv_fused: torch.Tensor,
    slot: torch.Tensor,
    live: torch.Tensor,
    data: torch.Tensor,
    offsets_in_block: torch.Tensor,
) -> None:
    """Scatter ``data[i]`` to byte offsets ``offsets_in_block[i]`` of the block of ``slot[i]``.

    Offsets are into a block's flattened ``block_size * width`` bytes; they are turned into
    ``kv_fused[block, offset // width, 0, offset % width]`` coordinates so any strided
    ``kv_fused`` works.
    """
    block_size, width = kv_fused.shape[1], kv_fused.shape[3]
    block = (slot // block_size).unsqueeze(1)
    rows, cols = offsets_in_block // width, offsets_in_block % width
    index = (block, rows, torch.zeros_like(rows), cols)
    current = kv_fused[index]
    kv_fused[index] = torch.where(live.unsqueeze(1), data, current)


def write_fp8_kv_cache(
    kv_fused: torch.Tensor,
    k: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    scale_mode: str = "pow2",
) -> None:
    """Quantise new K rows to FP8 and write them into an FP8 ``kv_fused`` pool in place.

    Row ``i`` is quantised with `quantize_fp8_per_token` and stored at slot
    ``slot_mapping[i] = block * block_size + offset``: its ``head_dim`` value bytes at
    ``offset * head_dim`` and its little-endian float32 scale at
    ``block_size * head_dim + 4 * offset`` of that block. No other byte changes. Rows with
    slot -1 are skipped. If two rows name the same slot, its bytes are unspecified: each comes
    from one of those rows, on CUDA not necessarily all from the same one (the scatter
    writes byte by byte).

    Slot range checks read ``slot_mapping``: they run on every eager call with CPU tensors;
    on a GPU only with ``FLASHINFER_VALIDATE_INPUTS=1`` outside CUDA-graph capture; never
    while torch.compile or torch.export traces (a trace has no data). Where they do not run,
    a slot below -1 is skipped like -1 and a slot past the pool is an indexing error (on a
    GPU, device-side).

    The pool may be a view whose blocks are further apart than one block (``stride(0)``
    larger than a block's bytes, e.g. one layer of a layer-interleaved cache), but each
    block's bytes must be contiguous and blocks must not overlap, as the kernels read them.

    Args:
        kv_fused: ``[num_blocks, block_size, 1, head_dim + 4]`` uint8 pool, modified in place.
        k: ``[num_tokens, head_dim]`` float16, bfloat16, float32 or float64 new rows.
        slot_mapping: ``[num_tokens]`` int32 or int64 slots (-1 = skip).
        scale_mode: ``"pow2"`` (default) or ``"amax"``, see `quantize_fp8_per_token`.

    Raises:
        TypeError: a dtype is wrong.
        ValueError: a rank, shape or device mismatch, a pool whose blocks are not contiguous
            or overlap, an unknown ``scale_mode``, or (when checked) a slot outside
            ``[-1, num_blocks * block_size)``.
        RuntimeError: ``kv_fused`` was created under ``torch.inference_mode()`` and the call
            is outside it (PyTorch allows no in-place update of it there). Not checked while
            torch.compile traces the call.
    """
    head_dim = fp8_kv_cache_head_dim(kv_fused)
    _check_pool_layout(kv_fused)
    _check_rows(kv_fused, k, slot_mapping, head_dim)
    _checks.choice("scale_mode", scale_mode, FP8_SCALE_MODES)
    if k.shape[0] == 0 or kv_fused.numel() == 0:  # nothing to write, or no slot (all -1)
        return
    values, scales = quantize_fp8_per_token(k, scale_mode=scale_mode)
    row_bytes = torch.cat((values.view(torch.uint8), float32_to_le_bytes(scales)), dim=1)

    source, slot, live = _resolve_slots(slot_mapping)
    token = (slot % kv_fused.shape[1]).unsqueeze(1)
    value_offsets = token * head_dim + torch.arange(head_dim, device=k.device)
    scale_offsets = kv_fused.shape[1] * head_dim + 4 * token + torch.arange(4, device=k.device)
    offsets = torch.cat((value_offsets, scale_offsets), dim=1)
    _write_rows(kv_fused, slot, live, row_bytes[source], offsets)


def write_mxfp4_kv_cache(
    kv_fused: torch.Tensor,
    k: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    interleaved: bool = False,
) -> None:
    """Quantise new K rows to MXFP4 and write them into an MXFP4 ``kv_fused`` pool in place.

    Row ``i`` is quantised with `quantize_mxfp4` (32-element UE8M0 groups) and stored at
    slot ``slot_mapping[i] = block * block_size + offset``: its ``head_dim/2`` value bytes
    at ``offset * head_dim/2`` and its ``head_dim/32`` scale bytes in scale slot ``k`` at
    ``block_size * head_dim/2 + (head_dim/32) * k`` of that block, where ``k = offset``
    (token order) or, with ``interleaved=True`` (block size 128),
    ``k = 4 * (offset % 32) + offset // 32``. No other byte changes. Slot -1 skips the row;
    duplicate slots leave the slot's bytes unspecified, as in `write_fp8_kv_cache`. Slot range checks and the pool's
    layout rules (contiguous, non-overlapping blocks) as in `write_fp8_kv_cache`.

    Args:
        kv_fused: ``[num_blocks, block_size, 1, head_dim/2 + head_dim/32]`` uint8 pool,
            modified in place.
        k: ``[num_tokens, head_dim]`` float16, bfloat16, float32 or float64 new rows.
        slot_mapping: ``[num_tokens]`` int32 or int64 slots (-1 = skip).
        interleaved: the pool's scale slots are in the interleaved order.

    Raises:
        TypeError: a dtype is wrong or ``interleaved`` is not a bool.
        ValueError: a rank, shape or device mismatch, a pool whose blocks are not contiguous
            or overlap, ``interleaved`` with ``block_size != 128``, or (when checked) a slot
            outside ``[-1, num_blocks * block_size)``.
        RuntimeError: ``kv_fused`` was created under ``torch.inference_mode()`` and the call
            is outside it, as in `write_fp8_kv_cache`.
    """
    head_dim = mxfp4_kv_cache_head_dim(kv_fused)
    _check_pool_layout(kv_fused)
    block_size = kv_fused.shape[1]
    _check_interleaved_flag(interleaved, block_size)
    _check_rows(kv_fused, k, slot_mapping, head_dim)
    if k.shape[0] == 0 or kv_fused.numel() == 0:  # nothing to write, or no slot (all -1)
        return
    packed, scales = quantize_mxfp4(k, sf_vec_size=MXFP4_SF_VEC_SIZE)
    row_bytes = torch.cat((packed, scales), dim=1)

    half, n_sf = head_dim // 2, head_dim // MXFP4_SF_VEC_SIZE
    source, slot, live = _resolve_slots(slot_mapping)
    token = slot % block_size
    if interleaved:
        scale_slot = mxfp4_interleaved_slot_of_token(block_size, k.device)[token]
    else:
        scale_slot = token
    value_offsets = token.unsqueeze(1) * half + torch.arange(half, device=k.device)
    scale_offsets = (
        block_size * half + n_sf * scale_slot.unsqueeze(1) + torch.arange(n_sf, device=k.device)
    )
    offsets = torch.cat((value_offsets, scale_offsets), dim=1)
    _write_rows(kv_fused, slot, live, row_bytes[source], offsets)
