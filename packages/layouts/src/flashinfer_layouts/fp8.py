"""FP8 (E4M3) per-token indexer cache: quantise, pack into ``kv_fused``, unpack, dequantise.

``kv_fused`` is ``[num_blocks, block_size, 1, head_dim + 4]`` uint8, but the shape is a
size contract only. Each block's ``block_size * (head_dim + 4)`` bytes are two regions::

    byte 0                       bs*D                      bs*(D+4)
    | tok0: D values | tok1 | ... | s0 | s1 | ... | s(bs-1) |
    '-- region 1: e4m3 values ---'-- region 2: fp32 LE ---'

Token i's values start at byte ``i * D``; its little-endian float32 scale at
``bs * D + 4 * i``. It is NOT a sequence of ``D + 4``-byte per-token rows.
"""

from __future__ import annotations

import torch

from . import _checks
from ._bits import (
    E4M3_MAX,
    div_to_float32,
    e4m3_bits_to_float32,
    float32_fields,
    float32_to_e4m3_bits,
    float32_to_le_bytes,
    le_bytes_to_float32,
    magnitude,
    mul_to_float32,
    pow2_float32,
)

__all__ = [
    "dequantize_fp8_kv_cache",
    "fp8_kv_cache_head_dim",
    "pack_fp8_kv_cache",
    "quantize_fp8_per_token",
    "unpack_fp8_kv_cache",
]

FP8_SCALE_MODES = ("pow2", "amax")
# Zero (or tiny) rows would otherwise get scale 0 and divide 0 by 0.
AMAX_FLOOR = 1e-4
_KV_LAYOUT = "[num_blocks, block_size, 1, head_dim + 4]"


def _pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """Smallest power of two ``s`` with ``amax / s <= 448``, from the bits of ``amax``.

    With ``amax = (1 + f) * 2**E`` (``f`` the fraction, ``E`` the unbiased exponent) and
    ``448 = 1.75 * 2**8``, ``448 * 2**e >= amax`` first holds at ``e = E - 8`` when
    ``1 + f <= 1.75`` and at ``e = E - 7`` otherwise. This equals
    ``2**ceil(log2(amax / 448))`` without the rounding of a division or a logarithm, and
    without ``frexp``, whose exponent for infinity and NaN is unspecified. ``amax`` must be
    float32 and at least ``AMAX_FLOOR`` (a normal number); a non-finite ``amax`` is returned
    as its own scale.
    """
    biased, fraction = float32_fields(amax)
    e = biased - 135 + (fraction > 0x600000).to(torch.int64)  # 0x600000 / 2**23 = 0.75
    return torch.where(biased == 255, amax, pow2_float32(e.clamp(-126, 127)))


def quantize_fp8_per_token(
    x: torch.Tensor, *, scale_mode: str = "pow2"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise rows to FP8 E4M3 with one float32 scale per row (per token).

    For each row (last dimension) ``amax = max(|x|, 1e-4)`` (the floor keeps all-zero rows
    finite; their values quantise to 0). The scale is

    * ``"pow2"`` (DeepSeek convention, the default): ``2 ** ceil(log2(amax / 448))``,
      computed exactly from the binary exponent of ``amax``, so ``amax / scale <= 448``
      always and ``x / scale`` is exact before rounding;
    * ``"amax"``: ``amax / 448`` correctly rounded to float32.

    Values are ``round_to_nearest_even(x / scale)`` saturated to ``[-448, 448]``, where
    ``x / scale`` is the correctly rounded float32 quotient (float64 inputs are rounded to
    float32 first). A row holding infinity or NaN gets that non-finite scale in both modes
    (NaN scales are the canonical quiet NaN), so its values become 0 or NaN; NaN values are
    stored as 0x7F. Every step is exactly rounded or integer arithmetic, so CPU and CUDA
    tensors give the same bytes.

    ``values.float() * scale[..., None]`` reconstructs ``x`` to within
    ``max(2**-4 * |x|, 2**-10 * scale)`` per element in ``"pow2"`` mode with float32, float16
    or bfloat16 input: E4M3 keeps 3 mantissa bits (half an ulp is ``2**-4`` relative) down to
    its smallest normal ``2**-6``, below which the subnormal step is ``2**-9`` (half-step
    ``2**-10``, absolute, in units of the scale). In ``"amax"`` mode, and for float64 input in
    either mode, add ``2**-22 * |x|``: the input, the quotient or the product is rounded to
    float32 there, and a value just past an E4M3 rounding midpoint can round onto it and then
    to the even neighbour on the far side.

    Args:
        x: ``[..., head_dim]`` float16, bfloat16, float32 or float64 tensor, any device.
        scale_mode: ``"pow2"`` or ``"amax"``, as above.

    Returns:
        ``(values, scales)``: ``values`` is ``[..., head_dim]`` ``torch.float8_e4m3fn``;
        ``scales`` is ``[...]`` float32, the dequantisation multiplier of each row.

    Raises:
        TypeError: ``x`` is not a floating tensor.
        ValueError: ``x`` is 0-D or has an empty last dimension, or ``scale_mode`` is unknown.
    """
    x = _checks.tensor("x", x)
    _checks.dtype("x", x, _checks.FLOAT_DTYPES)
    _checks.min_ndim("x", x, 1, "[..., head_dim]")
    if x.shape[-1] == 0:
        raise ValueError(
            f"x must have a non-empty last dimension; got shape {_checks.plain(x.shape)}"
        )
    _checks.choice("scale_mode", scale_mode, FP8_SCALE_MODES)

    xf = x.to(torch.float32)
    amax = magnitude(xf).amax(dim=-1)
    floor = amax.new_full((), AMAX_FLOOR)  # float32 1e-4, compared and used as the same value
    # where, not clamp_min: NaN must stay NaN (the comparison is False for NaN).
    amax = torch.where(amax < floor, floor, amax)
    scales = _pow2_scale(amax) if scale_mode == "pow2" else div_to_float32(amax, E4M3_MAX)
    scales = torch.where(torch.isnan(scales), scales.new_full((), float("nan")), scales)
    quotient = div_to_float32(xf, scales.unsqueeze(-1))
    return float32_to_e4m3_bits(quotient).view(torch.float8_e4m3fn), scales


def fp8_kv_cache_head_dim(kv_fused: torch.Tensor) -> int:
    """Return ``head_dim`` of an FP8 ``kv_fused`` pool (its last dimension minus 4).

    Args:
        kv_fused: ``[num_blocks, block_size, 1, head_dim + 4]`` uint8.

    Returns:
        ``head_dim``.

    Raises:
        TypeError: ``kv_fused`` is not a uint8 tensor.
        ValueError: ``kv_fused`` is not 4-D, its dim 2 is not 1, or its last dim is <= 4.
    """
    _check_kv_fused(kv_fused)
    return kv_fused.shape[-1] - 4


def _check_kv_fused(kv_fused: torch.Tensor) -> None:
    _checks.tensor("kv_fused", kv_fused)
    _checks.dtype("kv_fused", kv_fused, torch.uint8)
    _checks.ndim("kv_fused", kv_fused, 4, _KV_LAYOUT)
    _checks.dim_size("kv_fused", kv_fused, 2, 1, "the singleton KV-head dimension")
    if kv_fused.shape[3] <= 4:
        raise ValueError(
            f"kv_fused.shape[3] (head_dim + 4) must be greater than 4; "
            f"got {_checks.plain(kv_fused.shape[3])} (shape {_checks.plain(kv_fused.shape)})"
        )


def pack_fp8_kv_cache(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Pack E4M3 values and per-token float32 scales into the two-region ``kv_fused`` pool.

    Each block's flattened bytes are ``[all values, token-major | all scales]``: token
    ``i``'s value byte ``j`` at offset ``i * head_dim + j`` and its little-endian float32
    scale at ``block_size * head_dim + 4 * i``. The result has the same bytes as the spec's
    ``torch.cat([values.view(uint8).flatten(1), scales.view(uint8).flatten(1)], 1)``
    recipe on a little-endian host (the kernels accept ``block_size`` 32, 64 or 128; the
    layout itself works for any).

    Args:
        values: ``[num_blocks, block_size, head_dim]`` ``torch.float8_e4m3fn``.
        scales: ``[num_blocks, block_size]`` float32 dequantisation scales.

    Returns:
        A new contiguous ``[num_blocks, block_size, 1, head_dim + 4]`` uint8 tensor.

    Raises:
        TypeError: a dtype is wrong.
        ValueError: a rank or shape is wrong, or the tensors are on different devices.
    """
    values = _checks.tensor("values", values)
    scales = _checks.tensor("scales", scales)
    _checks.dtype("values", values, torch.float8_e4m3fn)
    _checks.ndim("values", values, 3, "[num_blocks, block_size, head_dim]")
    _checks.dtype("scales", scales, torch.float32)
    nb, bs, d = values.shape
    _checks.same_shape("scales", scales, (nb, bs), "[num_blocks, block_size]")
    _checks.same_device("scales", scales, "values", values)
    if d == 0:
        raise ValueError(f"values must have head_dim >= 1; got shape {_checks.plain(values.shape)}")

    value_region = values.contiguous().view(torch.uint8).reshape(nb, bs * d)
    scale_region = float32_to_le_bytes(scales).reshape(nb, bs * 4)
    return torch.cat((value_region, scale_region), dim=1).view(nb, bs, 1, d + 4)


def unpack_fp8_kv_cache(kv_fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split an FP8 ``kv_fused`` pool back into its values and per-token scales.

    The inverse of `pack_fp8_kv_cache`. ``kv_fused``
    may be any strided view (for example a slice of blocks); its logical bytes are read.

    Args:
        kv_fused: ``[num_blocks, block_size, 1, head_dim + 4]`` uint8.

    Returns:
        ``(values, scales)``: new tensors (not aliasing ``kv_fused``), ``values``
        ``[num_blocks, block_size, head_dim]`` ``torch.float8_e4m3fn`` and ``scales``
        ``[num_blocks, block_size]`` float32.

    Raises:
        TypeError: ``kv_fused`` is not a uint8 tensor.
        ValueError: ``kv_fused`` does not have the ``[nb, bs, 1, head_dim + 4]`` shape.
    """
    _check_kv_fused(kv_fused)
    nb, bs, _, width = kv_fused.shape
    d = width - 4
    flat = kv_fused.reshape(nb, bs * width)
    values = flat[:, : bs * d].reshape(nb, bs, d).clone().view(torch.float8_e4m3fn)
    scales = le_bytes_to_float32(flat[:, bs * d :].reshape(nb, bs, 4))
    return values, scales


def dequantize_fp8_kv_cache(
    kv_fused: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Dequantise an FP8 ``kv_fused`` pool to ``values * scale`` per token.

    The product is exact in float64; for other dtypes it is rounded once to float32 (the
    IEEE float32 product, alike on every device), then cast to ``dtype``. A NaN value byte,
    a NaN scale, or a zero value under an infinite scale gives NaN, whose sign and payload
    are not specified (compiled code may write another NaN than eager PyTorch).

    Args:
        kv_fused: ``[num_blocks, block_size, 1, head_dim + 4]`` uint8.
        dtype: floating output dtype (default float32).

    Returns:
        ``[num_blocks, block_size, head_dim]`` tensor of ``dtype``.

    Raises:
        TypeError: ``kv_fused`` is not uint8 or ``dtype`` is not a floating dtype.
        ValueError: ``kv_fused`` has the wrong shape.
    """
    dtype = _checks.output_float_dtype("dtype", dtype)
    values, scales = unpack_fp8_kv_cache(kv_fused)
    values = e4m3_bits_to_float32(values.view(torch.uint8))
    if dtype == torch.float64:
        return values.to(torch.float64) * scales.to(torch.float64).unsqueeze(-1)
    return mul_to_float32(values, scales.unsqueeze(-1)).to(dtype)
