"""The packed NVFP4 MSA page: K and V of one 128-token page in a single uint8 row.

For ``H = num_kv_heads``, ``page_size = 128``, ``head_dim = 128`` one page is four planar
regions (byte offsets from the start of the page)::

    0                 H*8192          H*9216            H*17408         H*18432
    | K data          | K scales      | V data          | V scales      |
    | [H][128 t][64B] | [H][128 t][8] | [H][128 t][64B] | [H][1024B]    |

    H = 4:  K data 0, K scales 32768, V data 36864, V scales 69632, page 73728 bytes.

Data rows are NVFP4 nibbles (element ``2j`` low, ``2j + 1`` high; 64 bytes = 128 values).
Scales are E4M3 bytes, one per 16 elements (8 per token). K scales are linear: token ``t``'s
scale ``s`` of head ``h`` at ``H*8192 + h*1024 + 8*t + s``. V scales are linear by head
but, inside each head's 1024-byte (128 tokens x 8 scales) tile, (4, 4)-swizzled: token ``t``
scale ``s`` at ``32 * (t // 4) + 4 * s + t % 4`` (groups of 4 tokens, 32 bytes each, scale
index outer, token-in-group inner).

Global scales follow `nvfp4_quantize`: ``k_global_sf`` / ``v_global_sf`` are ENCODE
scales (conventionally ``448 * 6 / amax``). ``msa_sparse_decode_attention`` takes DEQUANT
scales instead: pass ``k_global_scale = 1 / k_global_sf`` and ``v_global_scale =
1 / v_global_sf``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _checks
from ._bits import e4m3_bits_to_float32
from .nvfp4 import NVFP4_SF_VEC_SIZE, dequantize_rows, quantize_rows

__all__ = [
    "MSA_HEAD_DIM",
    "MSA_PAGE_SIZE",
    "MsaPageOffsets",
    "dequantize_msa_v_scales",
    "msa_page_offsets",
    "msa_page_views",
    "pack_nvfp4_msa_pages",
    "swizzle_msa_v_scales",
    "unpack_nvfp4_msa_pages",
    "unswizzle_msa_v_scales",
]

MSA_PAGE_SIZE = 128
"""Tokens per packed NVFP4 MSA page."""
MSA_HEAD_DIM = 128
"""Head dimension of the packed NVFP4 MSA page (64 data bytes, 8 scales per token)."""
_DATA_BYTES_PER_TOKEN = MSA_HEAD_DIM // 2  # 64
_SCALES_PER_TOKEN = MSA_HEAD_DIM // NVFP4_SF_VEC_SIZE  # 8
_KV_LAYOUT = "[num_pages, num_kv_heads, 128, 128]"


class MsaPageOffsets(NamedTuple):
    """Byte offsets of the four regions of a packed NVFP4 MSA page, and its size."""

    k_data: int
    k_scale: int
    v_data: int
    v_scale: int
    page_bytes: int


def msa_page_offsets(num_kv_heads: int) -> MsaPageOffsets:
    """Region offsets of a packed NVFP4 MSA page for ``num_kv_heads`` heads.

    Args:
        num_kv_heads: KV heads per page (positive int).

    Returns:
        `MsaPageOffsets`; for 4 heads ``(0, 32768, 36864, 69632, 73728)``.

    Raises:
        TypeError: ``num_kv_heads`` is not an int.
        ValueError: ``num_kv_heads`` is not positive.
    """
    num_kv_heads = _checks.positive_int("num_kv_heads", num_kv_heads)
    data = num_kv_heads * MSA_PAGE_SIZE * _DATA_BYTES_PER_TOKEN
    scale = num_kv_heads * MSA_PAGE_SIZE * _SCALES_PER_TOKEN
    return MsaPageOffsets(0, data, data + scale, 2 * data + scale, 2 * (data + scale))


def swizzle_msa_v_scales(scales: torch.Tensor) -> torch.Tensor:
    """Reorder token-major V scales ``[..., 128, 8]`` into the (4, 4)-swizzled tile order.

    Args:
        scales: ``[..., 128, 8]`` uint8 or ``torch.float8_e4m3fn``, ``scales[..., t, s]``.

    Returns:
        A new ``[..., 128, 8]`` tensor whose flattened last two dims are the tile bytes:
        ``out.flatten(-2)[..., 32 * (t // 4) + 4 * s + t % 4] == scales[..., t, s]``.

    Raises:
        TypeError: wrong dtype.
        ValueError: the last two dims are not ``(128, 8)``.
    """
    _check_v_scale_tile("scales", scales)
    lead = scales.shape[:-2]
    # [t//4, t%4, s] -> [t//4, s, t%4]
    tiles = scales.reshape(*lead, MSA_PAGE_SIZE // 4, 4, _SCALES_PER_TOKEN).transpose(-1, -2)
    return tiles.reshape(*lead, MSA_PAGE_SIZE, _SCALES_PER_TOKEN)


def unswizzle_msa_v_scales(raw: torch.Tensor) -> torch.Tensor:
    """Inverse of `swizzle_msa_v_scales`: tile bytes ``[..., 128, 8]`` -> ``[..., t, s]``.

    Accepts the ``v_scale`` view of `msa_page_views` directly.

    Args:
        raw: ``[..., 128, 8]`` uint8 or ``torch.float8_e4m3fn`` tile bytes, any strides.

    Returns:
        A new ``[..., 128, 8]`` tensor with ``out[..., t, s]`` the scale of token ``t``,
        elements ``[16 s, 16 s + 16)``.

    Raises:
        TypeError: wrong dtype.
        ValueError: the last two dims are not ``(128, 8)``.
    """
    _check_v_scale_tile("raw", raw)
    lead = raw.shape[:-2]
    # [t//4, s, t%4] -> [t//4, t%4, s]
    tiles = raw.reshape(*lead, MSA_PAGE_SIZE // 4, _SCALES_PER_TOKEN, 4).transpose(-1, -2)
    return tiles.reshape(*lead, MSA_PAGE_SIZE, _SCALES_PER_TOKEN)


def _check_v_scale_tile(name: str, t: torch.Tensor) -> None:
    _checks.tensor(name, t)
    _checks.dtype(name, t, (torch.uint8, torch.float8_e4m3fn))
    _checks.min_ndim(name, t, 2, "[..., 128 tokens, 8 scales]")
    if tuple(t.shape[-2:]) != (MSA_PAGE_SIZE, _SCALES_PER_TOKEN):
        raise ValueError(
            f"{name} must end in ({MSA_PAGE_SIZE}, {_SCALES_PER_TOKEN}) "
            f"[tokens, scales per token]; got shape {_checks.plain(t.shape)}"
        )


def pack_nvfp4_msa_pages(
    k: torch.Tensor,
    v: torch.Tensor,
    k_global_sf: float | torch.Tensor,
    v_global_sf: float | torch.Tensor,
) -> torch.Tensor:
    """Quantise paged K and V to NVFP4 and pack them into packed MSA pages.

    Each token row of 128 elements (per page and head) is quantised with the rules of
    `nvfp4_quantize` (16-element E4M3 block scales, encode global scale). K scales are
    stored linearly per token; V scales in the (4, 4) swizzle inside each (page, head) tile.
    See the module docs for the byte map.

    Args:
        k: ``[num_pages, num_kv_heads, 128, 128]`` float16, bfloat16, float32 or float64.
        v: same shape and device as ``k``, any of the same floating dtypes (quantised on
            its own, so it may differ from ``k``'s).
        k_global_sf: K's ENCODE global scale (e.g. ``nvfp4_global_scale(k)``); a positive
            float or 1-element floating tensor. The decode kernel's ``k_global_scale`` is its
            reciprocal.
        v_global_sf: V's ENCODE global scale, likewise.

    Returns:
        A new contiguous ``[num_pages, 18432 * num_kv_heads]`` uint8 tensor (73,728 bytes
        per page for 4 heads).

    Raises:
        TypeError: a dtype is wrong.
        ValueError: shapes are not ``[P, H, 128, 128]`` or disagree, mixed devices, or an
            invalid global scale.
    """
    k = _checks.tensor("k", k)
    v = _checks.tensor("v", v)
    for name, t in (("k", k), ("v", v)):
        _checks.dtype(name, t, _checks.FLOAT_DTYPES)
        _checks.ndim(name, t, 4, _KV_LAYOUT)
        _checks.dim_size(name, t, 2, MSA_PAGE_SIZE, "page_size")
        _checks.dim_size(name, t, 3, MSA_HEAD_DIM, "head_dim")
    _checks.same_shape("v", v, k.shape, "(same as k)")
    _checks.same_device("v", v, "k", k)
    if k.shape[1] == 0:
        raise ValueError(f"k must have num_kv_heads >= 1; got shape {_checks.plain(k.shape)}")
    k_sf = _checks.global_scale("k_global_sf", k_global_sf, k.device)
    v_sf = _checks.global_scale("v_global_sf", v_global_sf, k.device)

    k_data, k_scale = quantize_rows(k, k_sf, NVFP4_SF_VEC_SIZE)
    v_data, v_scale = quantize_rows(v, v_sf, NVFP4_SF_VEC_SIZE)
    regions = (k_data, k_scale, v_data, swizzle_msa_v_scales(v_scale))
    return torch.cat([r.flatten(1) for r in regions], dim=1)


def _check_pages(pages: torch.Tensor, num_kv_heads: int) -> MsaPageOffsets:
    _checks.tensor("pages", pages)
    _checks.dtype("pages", pages, torch.uint8)
    offsets = msa_page_offsets(num_kv_heads)
    _checks.ndim("pages", pages, 2, "[num_pages, page_bytes]")
    # The message is formatted only on failure: under torch.compile(dynamic=True)
    # num_kv_heads is symbolic, and dynamo cannot format a symbolic int into a string.
    if pages.shape[1] != offsets.page_bytes:
        _checks.dim_size(
            "pages",
            pages,
            1,
            offsets.page_bytes,
            f"page bytes for num_kv_heads={_checks.plain(num_kv_heads)}",
        )
    return offsets


def msa_page_views(
    pages: torch.Tensor, num_kv_heads: int, *, scale_dtype: torch.dtype = torch.uint8
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Zero-copy strided views of the four regions of packed MSA pages.

    These are the ``k`` / ``v`` / ``k_scale`` / ``v_scale`` arguments the MSA decode spec
    consumes in place: every view shares ``pages``' storage, with ``stride(0)`` equal to
    ``pages.stride(0)`` (the page pitch), so they are not contiguous.

    Args:
        pages: ``[num_pages, 18432 * num_kv_heads]`` uint8 with ``stride(1) == 1`` (for
            example the output of `pack_nvfp4_msa_pages`, or a row slice of it).
        num_kv_heads: KV heads per page.
        scale_dtype: dtype of the two scale views, uint8 (default) or
            ``torch.float8_e4m3fn`` (same bytes, reinterpreted).

    Returns:
        ``(k_data, k_scale, v_data, v_scale)``: ``k_data`` and ``v_data`` are
        ``[num_pages, num_kv_heads, 128, 64]`` uint8; ``k_scale`` is
        ``[num_pages, num_kv_heads, 128, 8]`` with ``k_scale[p, h, t, s]`` the scale of
        token ``t``, elements ``[16 s, 16 s + 16)``; ``v_scale`` has the same shape but
        exposes the RAW swizzled tile bytes: ``v_scale[p, h, i, j]`` is tile byte
        ``8 i + j``, which holds the scale of token ``t = 4 * (i // 4) + j % 4``, index
        ``s = 2 * (i % 4) + j // 4``. Use `unswizzle_msa_v_scales` (a copy) to get
        ``[p, h, t, s]`` order.

    Raises:
        TypeError: ``pages`` is not a uint8 tensor, ``num_kv_heads`` is not an int (a bool is
            refused too), or ``scale_dtype`` is unsupported.
        ValueError: ``num_kv_heads <= 0``, or ``pages`` has the wrong shape for
            ``num_kv_heads`` or ``stride(1) != 1``.
    """
    offsets = _check_pages(pages, num_kv_heads)
    if scale_dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise TypeError(
            f"scale_dtype must be torch.uint8 or torch.float8_e4m3fn; got {scale_dtype}"
        )
    if pages.shape[0] > 0 and pages.stride(1) != 1:
        raise ValueError(
            f"pages must have contiguous bytes within a page (stride(1) == 1); "
            f"got strides {_checks.plain(pages.stride())}"
        )
    h = num_kv_heads
    data_shape = (h, MSA_PAGE_SIZE, _DATA_BYTES_PER_TOKEN)
    scale_shape = (h, MSA_PAGE_SIZE, _SCALES_PER_TOKEN)

    def region(start: int, end: int, shape: tuple[int, int, int]) -> torch.Tensor:
        return pages[:, start:end].unflatten(1, shape)

    k_data = region(offsets.k_data, offsets.k_scale, data_shape)
    k_scale = region(offsets.k_scale, offsets.v_data, scale_shape).view(scale_dtype)
    v_data = region(offsets.v_data, offsets.v_scale, data_shape)
    v_scale = region(offsets.v_scale, offsets.page_bytes, scale_shape).view(scale_dtype)
    return k_data, k_scale, v_data, v_scale


def dequantize_msa_v_scales(v_scale: torch.Tensor) -> torch.Tensor:
    """Token-major float32 V block scales from the raw ``v_scale`` view.

    Args:
        v_scale: ``[..., 128, 8]`` uint8 or ``torch.float8_e4m3fn`` raw swizzled tile bytes.

    Returns:
        ``[..., 128, 8]`` float32, ``out[..., t, s]`` the E4M3 scale of token ``t``,
        elements ``[16 s, 16 s + 16)`` (without the global scale).

    Raises:
        TypeError: wrong dtype.
        ValueError: the last two dims are not ``(128, 8)``.
    """
    _check_v_scale_tile("v_scale", v_scale)
    return e4m3_bits_to_float32(unswizzle_msa_v_scales(v_scale).view(torch.uint8))


def unpack_nvfp4_msa_pages(
    pages: torch.Tensor,
    num_kv_heads: int,
    k_global_sf: float | torch.Tensor,
    v_global_sf: float | torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantise packed MSA pages back to K and V.

    ``k = e2m1 * e4m3_scale / k_global_sf`` (and likewise V, after undoing the V scale
    swizzle): the quotient rounded once to float32, then to ``dtype``; for float64, the exact
    product times the float64 reciprocal of the global scale (as `nvfp4_dequantize`).

    Args:
        pages: ``[num_pages, 18432 * num_kv_heads]`` uint8 with ``stride(1) == 1``.
        num_kv_heads: KV heads per page.
        k_global_sf: K's ENCODE global scale, as passed to `pack_nvfp4_msa_pages`.
        v_global_sf: V's ENCODE global scale.
        dtype: floating output dtype (default float32).

    Returns:
        ``(k, v)``, each ``[num_pages, num_kv_heads, 128, 128]`` of ``dtype``.

    Raises:
        TypeError: a dtype is wrong, ``pages`` is not a tensor, ``num_kv_heads`` is not an
            int (a bool is refused too), or ``k_global_sf`` / ``v_global_sf`` is a bool,
            neither a real number nor a tensor, or a non-floating tensor.
        ValueError: ``num_kv_heads <= 0``, ``pages`` has the wrong shape or strides, or a
            global scale is invalid.
    """
    dtype = _checks.output_float_dtype("dtype", dtype)
    k_data, k_scale, v_data, v_scale = msa_page_views(pages, num_kv_heads)
    k_sf = _checks.global_scale("k_global_sf", k_global_sf, pages.device)
    v_sf = _checks.global_scale("v_global_sf", v_global_sf, pages.device)
    k = dequantize_rows(k_data, k_scale, k_sf, NVFP4_SF_VEC_SIZE, dtype)
    v = dequantize_rows(v_data, unswizzle_msa_v_scales(v_scale), v_sf, NVFP4_SF_VEC_SIZE, dtype)
    return k, v
