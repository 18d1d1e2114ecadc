"""MXFP4: E2M1 values with one UE8M0 (power-of-two) scale per 32 elements.

Value nibbles: byte ``j`` of a row holds element ``2j`` in its LOW nibble (bits 0-3) and
element ``2j + 1`` in its HIGH nibble (bits 4-7). A nibble is ``sign(bit 3) | code(bits
0-2)`` with codes 0..7 meaning 0, 0.5, 1, 1.5, 2, 3, 4, 6.

A UE8M0 scale byte is a raw float32 exponent field: byte ``b`` means ``2 ** (b - 127)``.
That rule holds for byte 255 too: OCP MX reserves it for NaN, but the SM90 logits kernel
reads it as the exponent 128, so this module decodes it as ``2 ** 128`` (and never produces
it when quantising) to stay bit-consistent with the kernel.

``q_sf`` packs the four scale bytes of a 128-element row into one little-endian int32
(byte ``k`` = scale of elements ``[32k, 32k + 32)``).

MXFP4 ``kv_fused`` is ``[num_blocks, block_size, 1, head_dim/2 + head_dim/32]`` uint8; each
block's flattened bytes are ``[packed values, token-major | scale slots]`` where a scale
slot is one token's ``head_dim/32`` scale bytes, in token order or in the interleaved order
(block size 128 only): slot ``k`` holds token ``(k % 4) * (block_size // 4) + k // 4``.
"""

from __future__ import annotations

import torch

from . import _checks
from ._bits import (
    e2m1_decode,
    e2m1_encode,
    exp2_float64,
    float64_fields,
    int32_to_le_bytes,
    le_bytes_to_int32,
    magnitude,
    pack_nibbles,
    unpack_nibbles,
)

__all__ = [
    "MXFP4_SF_VEC_SIZE",
    "dequantize_mxfp4",
    "dequantize_mxfp4_kv_cache",
    "dequantize_mxfp4_q",
    "mxfp4_interleaved_slot_of_token",
    "mxfp4_interleaved_token_of_slot",
    "mxfp4_kv_cache_head_dim",
    "pack_mxfp4_kv_cache",
    "pack_mxfp4_q",
    "quantize_mxfp4",
    "quantize_mxfp4_kv_cache",
    "quantize_mxfp4_q",
    "ue8m0_scale_bytes",
    "unpack_mxfp4_kv_cache",
    "unpack_mxfp4_q",
]

MXFP4_SF_VEC_SIZE = 32
"""Elements per UE8M0 scale in MXFP4 (the MX block size)."""
Q_HEAD_DIM = 128  # four 32-element groups: exactly one int32 of q_sf
INTERLEAVED_BLOCK_SIZE = 128
_KV_LAYOUT = "[num_blocks, block_size, 1, head_dim/2 + head_dim/32]"


def ue8m0_scale_bytes(amax: torch.Tensor) -> torch.Tensor:
    """UE8M0 scale byte for groups whose largest magnitude is ``amax``.

    Rule: ``byte = clamp(ceil(log2(amax / 6)) + 127, 0, 254)``, i.e. the smallest power of
    two ``s`` with ``amax / s <= 6`` (the largest E2M1 magnitude), and byte 0 for
    ``amax == 0``. It is computed exactly from the float64 bit pattern (integer arithmetic,
    the same on every device): with ``amax = (1 + f) * 2**E`` and ``6 = 1.5 * 2**2``,
    ``6 * 2**e >= amax`` first holds at ``e = E - 2`` when ``1 + f <= 1.5`` and at
    ``e = E - 1`` otherwise. 255 (NaN in UE8M0) is never produced; groups beyond
    ``6 * 2**127`` saturate when rounded, and an infinite or NaN ``amax`` gives 254.

    Args:
        amax: non-negative floating tensor of group maxima, any shape (the sign bit is
            ignored).

    Returns:
        uint8 tensor of the same shape.

    Raises:
        TypeError: ``amax`` is not a floating tensor.
    """
    amax = _checks.tensor("amax", amax)
    _checks.dtype("amax", amax, _checks.FLOAT_DTYPES)
    biased, fraction = float64_fields(amax)
    e = biased - 1025 + (fraction > (1 << 51)).to(torch.int64)  # 2**51 / 2**52 = 0.5
    # Zero and float64 subnormals (biased exponent 0) give e <= -1024, hence byte 0.
    return (e + 127).clamp(0, 254).to(torch.uint8)


def _check_sf_vec_size(
    sf_vec_size: int, head_dim: int, arg: str, what: str = "the last dimension (head_dim)"
) -> int:
    sf_vec_size = _checks.positive_int("sf_vec_size", sf_vec_size)
    if sf_vec_size % 2 != 0:
        raise ValueError(
            f"sf_vec_size must be even (a multiple of 2: two nibbles per byte); got {_checks.plain(sf_vec_size)}"
        )
    # Larger than a non-empty head_dim, it cannot be a group size: the fault is sf_vec_size.
    if 0 < head_dim < sf_vec_size:
        raise ValueError(
            f"sf_vec_size must be an even divisor of {arg}'s head_dim "
            f"({_checks.plain(head_dim)}); got {_checks.plain(sf_vec_size)}"
        )
    _checks.divisible(arg, head_dim, sf_vec_size, what, "sf_vec_size")
    return sf_vec_size


def quantize_mxfp4(
    x: torch.Tensor, *, sf_vec_size: int = MXFP4_SF_VEC_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise rows to MXFP4: packed E2M1 nibbles and one UE8M0 scale per group.

    Each group of ``sf_vec_size`` consecutive elements of the last dimension gets the scale
    byte of `ue8m0_scale_bytes` (the smallest power of two ``s`` with ``amax / s <= 6``;
    byte 0 for an all-zero group). Every element is divided by its group's scale (exactly,
    in float64) and rounded to the nearest E2M1 value ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``;
    a value exactly between two neighbours goes to the one with the even code (mantissa bit
    0): 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
    Magnitudes above 6 (only possible when the scale byte is clamped) saturate to 6. The
    sign bit is copied from the input, so tiny negatives become negative zero (nibble 0x8).
    Per element, ``|dequantised - x| <= max(0.25, |x| / (4 * s)) * s`` (half the E2M1 step
    at ``|x| / s``) while the byte is not clamped at 254 (``amax <= 6 * 2**127``, reachable
    only from float64 input; past that the values saturate at ``6 * s``). Inputs should be
    finite (a group with infinity or NaN gets byte 254, NaN elements nibble 0). Scale bytes come from integer arithmetic on the bit patterns, the
    division by the power-of-two scale is exact and the rounding is by exact comparisons,
    so CPU and CUDA tensors give the same bytes.

    Nibble order: byte ``j`` holds element ``2j`` in its low nibble and ``2j + 1`` in its
    high nibble; nibble bit 3 is the sign.

    Args:
        x: ``[..., head_dim]`` float16, bfloat16, float32 or float64 tensor.
        sf_vec_size: elements per scale (default 32, the MX block size); must be even and
            divide ``head_dim``.

    Returns:
        ``(packed, scales)``: ``packed`` is ``[..., head_dim/2]`` uint8; ``scales`` is
        ``[..., head_dim/sf_vec_size]`` uint8 UE8M0 bytes.

    Raises:
        TypeError: ``x`` is not a floating tensor or ``sf_vec_size`` is not an int.
        ValueError: ``sf_vec_size`` is not positive and even or exceeds ``head_dim``, ``x``
            is 0-D or has an empty last dimension, or ``head_dim`` is not a multiple of
            ``sf_vec_size``.
    """
    sf_vec_size = _check_float_rows("x", x, sf_vec_size)
    return _quantize(x, sf_vec_size)


def _check_float_rows(name: str, x: object, sf_vec_size: int) -> int:
    """Check ``x`` and return ``sf_vec_size`` as a Python int."""
    _checks.tensor(name, x)
    _checks.dtype(name, x, _checks.FLOAT_DTYPES)
    _checks.min_ndim(name, x, 1, "[..., head_dim]")
    sf_vec_size = _check_sf_vec_size(sf_vec_size, x.shape[-1], name)
    if x.shape[-1] == 0:
        raise ValueError(
            f"{name} must have a non-empty last dimension; got shape {_checks.plain(x.shape)}"
        )
    return sf_vec_size


def _quantize(x: torch.Tensor, sf_vec_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Explicit sizes, not -1: a reshape of an empty tensor cannot infer a dimension.
    *lead, head_dim = x.shape
    groups = x.to(torch.float64).reshape(*lead, head_dim // sf_vec_size, sf_vec_size)
    scales = ue8m0_scale_bytes(magnitude(groups).amax(dim=-1))
    inv_scale = exp2_float64(127 - scales.to(torch.int64)).unsqueeze(-1)
    codes = e2m1_encode(groups * inv_scale).reshape(*lead, head_dim)
    return pack_nibbles(codes), scales


def dequantize_mxfp4(
    packed: torch.Tensor,
    scales: torch.Tensor,
    *,
    sf_vec_size: int = MXFP4_SF_VEC_SIZE,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Dequantise MXFP4 rows: ``e2m1(nibble) * 2 ** (scale_byte - 127)``.

    Computed exactly in float64, then cast to ``dtype``. Scale byte 255 (NaN in OCP MX) is
    decoded as ``2 ** 128``, as the SM90 kernel reads it, not as NaN: in float32 and bfloat16
    its group's elements of magnitude 1 or more become ``±inf`` (±0.5 gives ``±2 ** 127``),
    in float16 every nonzero element does, and zeros stay zero.

    Args:
        packed: ``[..., head_dim/2]`` uint8, two E2M1 nibbles per byte (even element low).
        scales: ``[..., head_dim/sf_vec_size]`` uint8 UE8M0 bytes, same leading shape.
        sf_vec_size: elements per scale (default 32).
        dtype: floating output dtype (default float32).

    Returns:
        ``[..., head_dim]`` tensor of ``dtype``.

    Raises:
        TypeError: a dtype is wrong or ``sf_vec_size`` is not an int.
        ValueError: shapes disagree, ``sf_vec_size`` is not positive and even or exceeds
            ``head_dim``, ``head_dim`` is not a multiple of ``sf_vec_size`` or the tensors
            are on different devices.
    """
    packed = _checks.tensor("packed", packed)
    scales = _checks.tensor("scales", scales)
    _checks.dtype("packed", packed, torch.uint8)
    _checks.dtype("scales", scales, torch.uint8)
    dtype = _checks.output_float_dtype("dtype", dtype)
    _checks.min_ndim("packed", packed, 1, "[..., head_dim/2]")
    head_dim = packed.shape[-1] * 2
    sf_vec_size = _check_sf_vec_size(
        sf_vec_size, head_dim, "packed", "head_dim (2 * packed.shape[-1])"
    )
    expected = (*packed.shape[:-1], head_dim // sf_vec_size)
    _checks.same_shape("scales", scales, expected, "[..., head_dim/sf_vec_size]")
    _checks.same_device("scales", scales, "packed", packed)
    return _dequantize(packed, scales, sf_vec_size, dtype)


def _dequantize(
    packed: torch.Tensor, scales: torch.Tensor, sf_vec_size: int, dtype: torch.dtype
) -> torch.Tensor:
    *lead, half = packed.shape
    head_dim = 2 * half
    values = e2m1_decode(unpack_nibbles(packed), torch.float64)
    values = values.reshape(*lead, head_dim // sf_vec_size, sf_vec_size)
    scale = exp2_float64(scales.to(torch.int64) - 127).unsqueeze(-1)
    return (values * scale).reshape(*lead, head_dim).to(dtype)


# --- q / q_sf -------------------------------------------------------------------------------


def _check_q_float(q: torch.Tensor) -> None:
    _checks.tensor("q", q)
    _checks.dtype("q", q, _checks.FLOAT_DTYPES)
    _checks.ndim("q", q, 4, "[batch_size, next_n, num_heads, head_dim]")
    _checks.dim_size("q", q, 3, Q_HEAD_DIM, "head_dim: four 32-element groups per int32 q_sf")


def quantize_mxfp4_q(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a query tensor to the ``q`` / ``q_sf`` pair of ``fp4_paged_mqa_logits``.

    Uses the rules of `quantize_mxfp4` with ``sf_vec_size=32``, then packs each
    (token, head)'s four scale bytes into one little-endian int32.

    Args:
        q: ``[batch_size, next_n, num_heads, 128]`` float16, bfloat16, float32 or float64.

    Returns:
        ``(q_packed, q_sf)``: ``q_packed`` ``[batch_size, next_n, num_heads, 64]`` uint8;
        ``q_sf`` ``[batch_size, next_n, num_heads]`` int32 whose byte ``k`` (``k``-th least
        significant) is the UE8M0 scale of elements ``[32k, 32k + 32)``.

    Raises:
        TypeError: ``q`` is not a floating tensor.
        ValueError: ``q`` is not 4-D or ``head_dim != 128``.
    """
    _check_q_float(q)
    packed, scales = quantize_mxfp4(q, sf_vec_size=MXFP4_SF_VEC_SIZE)
    return packed, le_bytes_to_int32(scales)


def pack_mxfp4_q(packed: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Assemble ``q`` / ``q_sf`` from packed nibbles and per-group UE8M0 scale bytes.

    Scale bytes are copied unchecked; byte 255 (NaN in OCP MX) is kept and means ``2 ** 128``
    to `dequantize_mxfp4_q` and to the SM90 kernel.

    Args:
        packed: ``[batch_size, next_n, num_heads, 64]`` uint8 (two E2M1 values per byte).
        scales: ``[batch_size, next_n, num_heads, 4]`` uint8, byte ``k`` the scale of
            elements ``[32k, 32k + 32)``.

    Returns:
        ``(q, q_sf)``: ``q`` is a contiguous copy of ``packed``; ``q_sf`` is
        ``[batch_size, next_n, num_heads]`` int32 with ``scales[..., k]`` in byte ``k``
        (little-endian), i.e. ``scales.view(torch.int32)`` on a little-endian host.

    Raises:
        TypeError: a dtype is wrong.
        ValueError: a rank or shape is wrong, or the tensors are on different devices.
    """
    packed = _checks.tensor("packed", packed)
    scales = _checks.tensor("scales", scales)
    _checks.dtype("packed", packed, torch.uint8)
    _checks.dtype("scales", scales, torch.uint8)
    _checks.ndim("packed", packed, 4, "[batch_size, next_n, num_heads, head_dim/2]")
    _checks.dim_size("packed", packed, 3, Q_HEAD_DIM // 2, "head_dim/2")
    expected = (*packed.shape[:3], Q_HEAD_DIM // MXFP4_SF_VEC_SIZE)
    _checks.same_shape("scales", scales, expected, "[batch_size, next_n, num_heads, 4]")
    _checks.same_device("scales", scales, "packed", packed)
    return packed.clone(memory_format=torch.contiguous_format), le_bytes_to_int32(scales)


def _check_q_packed(q: torch.Tensor, q_sf: torch.Tensor) -> None:
    _checks.tensor("q", q)
    _checks.tensor("q_sf", q_sf)
    _checks.dtype("q", q, torch.uint8)
    _checks.dtype("q_sf", q_sf, torch.int32)
    _checks.ndim("q", q, 4, "[batch_size, next_n, num_heads, head_dim/2]")
    _checks.dim_size("q", q, 3, Q_HEAD_DIM // 2, "head_dim/2")
    _checks.same_shape("q_sf", q_sf, q.shape[:3], "[batch_size, next_n, num_heads]")
    _checks.same_device("q_sf", q_sf, "q", q)


def unpack_mxfp4_q(q: torch.Tensor, q_sf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split ``q`` / ``q_sf`` back into packed nibbles and ``[..., 4]`` scale bytes.

    Args:
        q: ``[batch_size, next_n, num_heads, 64]`` uint8.
        q_sf: ``[batch_size, next_n, num_heads]`` int32.

    Returns:
        ``(packed, scales)``: ``packed`` is a contiguous copy of ``q``; ``scales`` is
        ``[batch_size, next_n, num_heads, 4]`` uint8 with byte ``k`` of each int32 at
        index ``k``.

    Raises:
        TypeError: a dtype is wrong.
        ValueError: a rank or shape is wrong, or the tensors are on different devices.
    """
    _check_q_packed(q, q_sf)
    return q.clone(memory_format=torch.contiguous_format), int32_to_le_bytes(q_sf)


def dequantize_mxfp4_q(
    q: torch.Tensor, q_sf: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Dequantise ``q`` / ``q_sf`` to ``[batch_size, next_n, num_heads, 128]``.

    Scale byte 255 is decoded as ``2 ** 128``, not NaN (see `dequantize_mxfp4`).

    Args:
        q: ``[batch_size, next_n, num_heads, 64]`` uint8.
        q_sf: ``[batch_size, next_n, num_heads]`` int32 (four little-endian UE8M0 bytes).
        dtype: floating output dtype (default float32).

    Returns:
        ``[batch_size, next_n, num_heads, 128]`` tensor of ``dtype``.

    Raises:
        TypeError: a dtype is wrong.
        ValueError: a rank or shape is wrong, or the tensors are on different devices.
    """
    dtype = _checks.output_float_dtype("dtype", dtype)
    packed, scales = unpack_mxfp4_q(q, q_sf)
    return _dequantize(packed, scales, MXFP4_SF_VEC_SIZE, dtype)


# --- kv_fused -------------------------------------------------------------------------------


def mxfp4_interleaved_token_of_slot(
    block_size: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Token index held by each scale slot in the interleaved order.

    Slot ``k`` holds token ``(k % 4) * (block_size // 4) + k // 4``: the block's tokens are
    cut into 4 equal runs which are then dealt round-robin (slot 0 = token 0, slot 1 =
    token 32, slot 2 = token 64, slot 3 = token 96, slot 4 = token 1, ... for 128).

    Args:
        block_size: tokens per block; only 128 is supported.
        device: device of the returned tensor (default CPU): a ``torch.device``, a device
            string or an index, as torch's factory functions take it.

    Returns:
        ``[block_size]`` int64 tensor ``t`` with ``t[k]`` the token of slot ``k``.

    Raises:
        TypeError: ``block_size`` is not an int (a bool or float is refused too), or
            ``device`` is not a device, string or int.
        ValueError: ``block_size != 128`` or ``device`` is not a valid device.
    """
    block_size = _check_interleaved_block_size(block_size)
    k = torch.arange(block_size, device=_checks.device("device", device))
    return (k % 4) * (block_size // 4) + k // 4


def mxfp4_interleaved_slot_of_token(
    block_size: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Scale slot of each token in the interleaved order (inverse of the token-of-slot map).

    Token ``t`` sits in slot ``4 * (t % (block_size // 4)) + t // (block_size // 4)``.

    Args:
        block_size: tokens per block; only 128 is supported.
        device: device of the returned tensor (default CPU): a ``torch.device``, a device
            string or an index, as torch's factory functions take it.

    Returns:
        ``[block_size]`` int64 tensor ``s`` with ``s[t]`` the slot of token ``t``.

    Raises:
        TypeError: ``block_size`` is not an int (a bool or float is refused too), or
            ``device`` is not a device, string or int.
        ValueError: ``block_size != 128`` or ``device`` is not a valid device.
    """
    block_size = _check_interleaved_block_size(block_size)
    t = torch.arange(block_size, device=_checks.device("device", device))
    run = block_size // 4
    return 4 * (t % run) + t // run


def _check_interleaved_block_size(block_size: object) -> int:
    block_size = _checks.exact_int("block_size", block_size)
    if block_size != INTERLEAVED_BLOCK_SIZE:
        raise ValueError(
            f"the interleaved scale order needs block_size == {INTERLEAVED_BLOCK_SIZE}; "
            f"got block_size {_checks.plain(block_size)}"
        )
    return block_size


def _check_kv_fused(kv_fused: torch.Tensor) -> int:
    """Validate an MXFP4 kv_fused pool and return its head_dim."""
    _checks.tensor("kv_fused", kv_fused)
    _checks.dtype("kv_fused", kv_fused, torch.uint8)
    _checks.ndim("kv_fused", kv_fused, 4, _KV_LAYOUT)
    _checks.dim_size("kv_fused", kv_fused, 2, 1, "the singleton KV-head dimension")
    width = kv_fused.shape[3]
    if width == 0 or width % 17 != 0:
        raise ValueError(
            "kv_fused.shape[3] must be head_dim/2 + head_dim/32 = 17 * head_dim / 32 for a "
            f"head_dim that is a multiple of 32 (e.g. 68 for head_dim 128); got {_checks.plain(width)}"
        )
    return width * 32 // 17


def mxfp4_kv_cache_head_dim(kv_fused: torch.Tensor) -> int:
    """Return ``head_dim`` of an MXFP4 ``kv_fused`` pool (last dim is ``17 * head_dim / 32``).

    Args:
        kv_fused: ``[num_blocks, block_size, 1, head_dim/2 + head_dim/32]`` uint8.

    Returns:
        ``head_dim`` (e.g. 128 for a last dimension of 68).

    Raises:
        TypeError: ``kv_fused`` is not uint8.
        ValueError: ``kv_fused`` does not have that shape.
    """
    return _check_kv_fused(kv_fused)


def _check_interleaved_flag(interleaved: object, block_size: int) -> None:
    _checks.flag("interleaved", interleaved)
    if interleaved:
        _check_interleaved_block_size(block_size)


def pack_mxfp4_kv_cache(
    packed: torch.Tensor, scales: torch.Tensor, *, interleaved: bool = False
) -> torch.Tensor:
    """Pack MXFP4 values and scales into the two-region MXFP4 ``kv_fused`` pool.

    Each block's flattened bytes are ``[packed values | scale slots]``: token ``i``'s
    ``head_dim/2`` value bytes at ``i * head_dim/2``; scale slot ``k`` (``head_dim/32``
    bytes, group order inside) at ``block_size * head_dim/2 + (head_dim/32) * k``. With
    ``interleaved=False`` slot ``k`` holds token ``k``; with ``interleaved=True`` (block
    size 128 only) it holds token ``(k % 4) * (block_size // 4) + k // 4``.
    Scale bytes are copied unchecked; byte 255 (NaN in OCP MX) is kept and means ``2 ** 128``
    to `dequantize_mxfp4_kv_cache` and to the SM90 kernel.

    Args:
        packed: ``[num_blocks, block_size, head_dim/2]`` uint8 nibbles (even element low).
        scales: ``[num_blocks, block_size, head_dim/32]`` uint8 UE8M0 bytes, token-major.
        interleaved: write the scale slots in the interleaved order.

    Returns:
        A new contiguous ``[num_blocks, block_size, 1, head_dim/2 + head_dim/32]`` uint8.

    Raises:
        TypeError: a dtype is wrong or ``interleaved`` is not a bool.
        ValueError: a rank or shape is wrong, ``head_dim`` is not a multiple of 32,
            ``interleaved`` with ``block_size != 128``, or mixed devices.
    """
    packed = _checks.tensor("packed", packed)
    scales = _checks.tensor("scales", scales)
    _checks.dtype("packed", packed, torch.uint8)
    _checks.dtype("scales", scales, torch.uint8)
    _checks.ndim("packed", packed, 3, "[num_blocks, block_size, head_dim/2]")
    nb, bs, half = packed.shape
    _checks.divisible("packed", half * 2, MXFP4_SF_VEC_SIZE, "head_dim (2 * packed.shape[2])")
    if half == 0:
        raise ValueError(
            f"packed must have head_dim >= 32; got shape {_checks.plain(packed.shape)}"
        )
    n_sf = half * 2 // MXFP4_SF_VEC_SIZE
    _checks.same_shape("scales", scales, (nb, bs, n_sf), "[num_blocks, block_size, head_dim/32]")
    _checks.same_device("scales", scales, "packed", packed)
    _check_interleaved_flag(interleaved, bs)

    if interleaved:
        scales = scales[:, mxfp4_interleaved_token_of_slot(bs, scales.device)]
    value_region = packed.reshape(nb, bs * half)
    scale_region = scales.reshape(nb, bs * n_sf)
    return torch.cat((value_region, scale_region), dim=1).view(nb, bs, 1, half + n_sf)


def unpack_mxfp4_kv_cache(
    kv_fused: torch.Tensor, *, interleaved: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split an MXFP4 ``kv_fused`` pool into packed values and token-major scales.

    The inverse of `pack_mxfp4_kv_cache`; ``interleaved`` must say how the pool was written.

    Args:
        kv_fused: ``[num_blocks, block_size, 1, head_dim/2 + head_dim/32]`` uint8, any strides.
        interleaved: the scale slots are in the interleaved order (block size 128 only).

    Returns:
        ``(packed, scales)``: new tensors, ``packed`` ``[num_blocks, block_size,
        head_dim/2]`` uint8 and ``scales`` ``[num_blocks, block_size, head_dim/32]`` uint8
        in token order.

    Raises:
        TypeError: ``kv_fused`` is not uint8 or ``interleaved`` is not a bool.
        ValueError: a wrong shape, or ``interleaved`` with ``block_size != 128``.
    """
    head_dim = _check_kv_fused(kv_fused)
    nb, bs, _, width = kv_fused.shape
    _check_interleaved_flag(interleaved, bs)
    half, n_sf = head_dim // 2, head_dim // MXFP4_SF_VEC_SIZE
    flat = kv_fused.reshape(nb, bs * width)
    packed = flat[:, : bs * half].reshape(nb, bs, half).clone()
    scales = flat[:, bs * half :].reshape(nb, bs, n_sf)
    if interleaved:
        scales = scales[:, mxfp4_interleaved_slot_of_token(bs, kv_fused.device)]
    else:
        scales = scales.clone()
    return packed, scales


def dequantize_mxfp4_kv_cache(
    kv_fused: torch.Tensor, *, interleaved: bool = False, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Dequantise an MXFP4 ``kv_fused`` pool to ``[num_blocks, block_size, head_dim]``.

    Scale byte 255 is decoded as ``2 ** 128``, not NaN (see `dequantize_mxfp4`).

    Args:
        kv_fused: ``[num_blocks, block_size, 1, head_dim/2 + head_dim/32]`` uint8.
        interleaved: the scale slots are in the interleaved order (block size 128 only).
        dtype: floating output dtype (default float32); values are exact in float64.

    Returns:
        ``[num_blocks, block_size, head_dim]`` tensor of ``dtype``.

    Raises:
        TypeError: a dtype is wrong or ``interleaved`` is not a bool.
        ValueError: a wrong shape, or ``interleaved`` with ``block_size != 128``.
    """
    dtype = _checks.output_float_dtype("dtype", dtype)
    packed, scales = unpack_mxfp4_kv_cache(kv_fused, interleaved=interleaved)
    return _dequantize(packed, scales, MXFP4_SF_VEC_SIZE, dtype)


def quantize_mxfp4_kv_cache(k: torch.Tensor, *, interleaved: bool = False) -> torch.Tensor:
    """Quantise a whole K pool to MXFP4 and pack it into ``kv_fused`` in one call.

    ``pack_mxfp4_kv_cache(*quantize_mxfp4(k), interleaved=interleaved)``.

    Args:
        k: ``[num_blocks, block_size, head_dim]`` floating tensor, ``head_dim`` a multiple
            of 32.
        interleaved: write the scale slots in the interleaved order (block size 128 only).

    Returns:
        ``[num_blocks, block_size, 1, head_dim/2 + head_dim/32]`` uint8.

    Raises:
        TypeError: ``k`` is not floating or ``interleaved`` is not a bool.
        ValueError: ``k`` is not 3-D, ``head_dim`` is 0 or not a multiple of 32, or
            ``interleaved`` with ``block_size != 128``.
    """
    k = _checks.tensor("k", k)
    _checks.dtype("k", k, _checks.FLOAT_DTYPES)
    _checks.ndim("k", k, 3, "[num_blocks, block_size, head_dim]")
    _checks.divisible("k", k.shape[2], MXFP4_SF_VEC_SIZE, "head_dim (k.shape[2])")
    _check_float_rows("k", k, MXFP4_SF_VEC_SIZE)
    _check_interleaved_flag(interleaved, k.shape[1])
    packed, scales = _quantize(k, MXFP4_SF_VEC_SIZE)
    return pack_mxfp4_kv_cache(packed, scales, interleaved=interleaved)
