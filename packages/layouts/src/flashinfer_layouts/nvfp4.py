"""NVFP4: E2M1 values, one E4M3 block scale per 16 elements, and a float32 global scale.

Global-scale convention (an ENCODE scale, as ``flashinfer.nvfp4_quantize`` takes it)::

    a_global_sf = 448 * 6 / amax(a)
    block_scale = e4m3(amax(block) / 6 * a_global_sf)          # stored byte
    value       = e2m1(x * (a_global_sf / float(block_scale)))  # stored nibble
    x          ~= e2m1_value * float(block_scale) / a_global_sf

Block scales are stored either linearly (``[M, K/16]``) or in the 128x4-swizzled layout the
tensor-core block-scaled MMAs read. Rows are padded to a multiple of 128 and scale columns to
a multiple of 4; with ``C`` the padded column count, scale ``(r, c)`` lives at byte::

    ((r // 128) * (C // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4

i.e. 512-byte tiles of 128 rows x 4 columns, tiles row-major, and inside a tile row ``r``
is split into ``r % 32`` (16-byte stride) and ``(r % 128) // 32`` (4-byte stride).
"""

from __future__ import annotations

import torch

from . import _checks
from ._bits import (
    E2M1_MAX,
    E4M3_MAX,
    div_to_float32,
    e2m1_decode,
    e2m1_encode,
    e4m3_bits_to_float32,
    float32_to_e4m3_bits,
    magnitude,
    mul_to_float32,
    pack_nibbles,
    unpack_nibbles,
)

__all__ = [
    "NVFP4_SF_VEC_SIZE",
    "nvfp4_dequantize",
    "nvfp4_global_scale",
    "nvfp4_quantize",
    "swizzle_128x4",
    "swizzle_128x4_offset",
    "swizzled_128x4_shape",
    "unswizzle_128x4",
]

NVFP4_SF_VEC_SIZE = 16
"""Elements per E4M3 block scale in NVFP4."""
_SF_VEC_SIZES = (16, 32)
_SCALE_DTYPES = (torch.uint8, torch.float8_e4m3fn)
_TILE_ROWS, _TILE_COLS = 128, 4
_TILE_BYTES = _TILE_ROWS * _TILE_COLS  # one 128x4 tile: 512 bytes


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def swizzled_128x4_shape(rows: int, cols: int) -> tuple[int, int]:
    """Padded ``(rows, cols)`` of a 128x4-swizzled scale buffer.

    Args:
        rows: unpadded scale rows (``M``).
        cols: unpadded scale columns (``K / sf_vec_size``).

    Returns:
        ``(ceil(rows / 128) * 128, ceil(cols / 4) * 4)``.

    Raises:
        TypeError: ``rows`` or ``cols`` is not an int.
        ValueError: a negative size.
    """
    rows, cols = _checks.exact_int("rows", rows), _checks.exact_int("cols", cols)
    if rows < 0 or cols < 0:
        raise ValueError(
            "rows and cols must be non-negative; "
            f"got rows={_checks.plain(rows)}, cols={_checks.plain(cols)}"
        )
    return _round_up(rows, _TILE_ROWS), _round_up(cols, _TILE_COLS)


def swizzle_128x4_offset(
    row: int | torch.Tensor, col: int | torch.Tensor, num_cols: int
) -> int | torch.Tensor:
    """Byte offset of scale ``(row, col)`` in a 128x4-swizzled buffer.

    ``((row // 128) * (C // 4) + col // 4) * 512 + (row % 32) * 16 + ((row % 128) // 32) * 4
    + col % 4`` with ``C = ceil(num_cols / 4) * 4``.

    The ranges of tensor ``row`` / ``col`` are read (a host synchronisation), so they are
    checked as in `write_fp8_kv_cache`: always on CPU, on a GPU only with
    ``FLASHINFER_VALIDATE_INPUTS=1`` outside CUDA-graph capture.

    Args:
        row: scale row, ``>= 0``: an int or an int32 / int64 tensor.
        col: scale column, in ``[0, num_cols)``: an int or an int32 / int64 tensor
            (broadcast with ``row``).
        num_cols: unpadded (or padded) scale column count of the buffer, ``>= 1``.

    Returns:
        The offset(s): an int for int inputs, an int64 tensor when ``row`` or ``col`` is a
        tensor (int32 indices included: a buffer past 2 GiB has offsets past int32).

    Raises:
        TypeError: ``num_cols`` is not an int, or ``row`` / ``col`` is neither an int nor an
            int32 / int64 tensor (a bool or float is refused too).
        ValueError: ``num_cols < 1``, ``row < 0``, ``col`` outside ``[0, num_cols)``, or
            tensor ``row`` and ``col`` that do not broadcast or lie on different devices.
    """
    num_cols = _checks.positive_int("num_cols", num_cols)
    row = _check_scale_index("row", row, None)
    col = _check_scale_index("col", col, num_cols)
    if isinstance(row, torch.Tensor) and isinstance(col, torch.Tensor):
        _check_broadcast("row", row, "col", col)
        # torch combines a 0-d CPU tensor with a tensor on any device, as a scalar.
        scalar = any(t.dim() == 0 and t.device.type == "cpu" for t in (row, col))
        if row.device != col.device and not scalar:
            raise ValueError(
                f"col must be on the same device as row ({row.device}); got {col.device}"
            )
    # The offset arithmetic in int64 whatever the index dtype: row * 16 and the tile term
    # wrap silently in int32 once the buffer passes 2 GiB.
    row, col = (v.long() if isinstance(v, torch.Tensor) else v for v in (row, col))
    padded_cols = _round_up(num_cols, _TILE_COLS)
    tile = (row // _TILE_ROWS) * (padded_cols // _TILE_COLS) + col // _TILE_COLS
    return tile * 512 + (row % 32) * 16 + ((row % _TILE_ROWS) // 32) * 4 + col % _TILE_COLS


def _check_scale_index(name: str, value: object, high: int | None) -> int | torch.Tensor:
    """``value`` (a Python or numpy int as a Python int) if it is an int or an int32/int64
    tensor with entries in ``[0, high)``."""
    if isinstance(value, torch.Tensor):
        # Narrower integer dtypes would overflow in the offset arithmetic (row * 16).
        _checks.dtype(name, _checks.tensor(name, value), _checks.INDEX_DTYPES)
        if value.numel() == 0 or not _checks.device_data_checks_enabled(value):
            return value
        low_value, high_value = int(value.min()), int(value.max())
        _checks.in_range(name, low_value, 0, high)
        _checks.in_range(name, high_value, 0, high)
        return value
    value = _checks.python_int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an int or an int32 / int64 tensor; got {_checks.type_name(value)}"
        )
    _checks.in_range(name, value, 0, high)
    return value


def _check_broadcast(name: str, t: torch.Tensor, other_name: str, other: torch.Tensor) -> None:
    # The broadcasting rule on the sizes, not torch.broadcast_shapes: under torch.compile its
    # RuntimeError surfaces as a dynamo error instead of reaching an ``except`` here.
    for size, other_size in zip(reversed(t.shape), reversed(other.shape)):
        if size != other_size and size != 1 and other_size != 1:
            raise ValueError(
                f"{name} and {other_name} must broadcast together; got shapes "
                f"{_checks.plain(t.shape)} and {_checks.plain(other.shape)}"
            )


def swizzle_128x4(sf: torch.Tensor) -> torch.Tensor:
    """Reorder a linear ``[M, C]`` scale matrix into the 128x4-swizzled layout.

    Args:
        sf: ``[M, C]`` uint8 or ``torch.float8_e4m3fn`` scales, row ``r`` column ``c``.

    Returns:
        A new ``[ceil(M/128)*128, ceil(C/4)*4]`` tensor of ``sf``'s dtype whose
        row-major (flattened) bytes are the swizzled buffer: ``out.flatten()[offset(r, c)]
        == sf[r, c]`` with the offset of `swizzle_128x4_offset`. Padding bytes are 0.
        Note that ``out[i, j]`` is in general NOT scale ``(i, j)``: the 2-D shape only
        carries the padded extents.

    Raises:
        TypeError: ``sf`` has another dtype.
        ValueError: ``sf`` is not 2-D.
    """
    sf = _checks.tensor("sf", sf)
    _checks.dtype("sf", sf, _SCALE_DTYPES)
    _checks.ndim("sf", sf, 2, "[rows, scale_cols]")
    raw = sf.view(torch.uint8)
    # Two forms of one layout. Under torch.compile each output byte gathers its source scale:
    # with dynamic shapes Inductor (PyTorch 2.13) dropped the row-tile term of the permute's
    # index and copied rows 0-127 into every row tile once M passed 128. Eagerly the permute
    # is about 40x faster than the gather on the CPU.
    swizzle = _swizzle_by_gather if torch.compiler.is_compiling() else _swizzle_by_permute
    return swizzle(raw).view(sf.dtype)


def _swizzle_by_permute(raw: torch.Tensor) -> torch.Tensor:
    rows, cols = raw.shape
    prows, pcols = swizzled_128x4_shape(rows, cols)
    padded = torch.zeros((prows, pcols), dtype=torch.uint8, device=raw.device)
    padded[:rows, :cols] = raw
    # [row tile, (r%128)//32, r%32, col tile, c%4] -> [row tile, col tile, r%32, (r%128)//32, c%4]
    tiles = padded.view(prows // _TILE_ROWS, 4, 32, pcols // _TILE_COLS, _TILE_COLS)
    return tiles.permute(0, 3, 2, 1, 4).contiguous().view(prows, pcols)


def _swizzle_by_gather(raw: torch.Tensor) -> torch.Tensor:
    """Each output byte's source scale, by the inverse of `swizzle_128x4_offset`."""
    rows, cols = raw.shape
    prows, pcols = swizzled_128x4_shape(rows, cols)
    offset = torch.arange(prows * pcols, device=raw.device)
    tile, within = offset // _TILE_BYTES, offset % _TILE_BYTES  # within = (r%32, (r%128)//32, c%4)
    col_tiles = pcols // _TILE_COLS
    row = (tile // col_tiles) * _TILE_ROWS + ((within % 16) // _TILE_COLS) * 32 + within // 16
    col = (tile % col_tiles) * _TILE_COLS + within % _TILE_COLS
    inside = (row < rows) & (col < cols)
    gathered = raw[row.clamp(max=max(rows - 1, 0)), col.clamp(max=max(cols - 1, 0))]
    return torch.where(inside, gathered, torch.zeros_like(gathered)).view(prows, pcols)


def unswizzle_128x4(sf_swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Recover the linear ``[rows, cols]`` scales from a 128x4-swizzled buffer.

    Args:
        sf_swizzled: the swizzled buffer, uint8 or ``torch.float8_e4m3fn``, either flat
            (``ceil(rows/128)*128 * ceil(cols/4)*4`` elements) or 2-D with that padded shape.
        rows: unpadded scale rows.
        cols: unpadded scale columns.

    Returns:
        A new ``[rows, cols]`` tensor of ``sf_swizzled``'s dtype.

    Raises:
        TypeError: ``sf_swizzled`` is not a tensor or has a wrong dtype, or ``rows`` /
            ``cols`` is not an int (a bool is refused too).
        ValueError: a negative ``rows`` or ``cols``, or the buffer's size or shape does not
            match ``rows``/``cols``.
    """
    sf_swizzled = _checks.tensor("sf_swizzled", sf_swizzled)
    _checks.dtype("sf_swizzled", sf_swizzled, _SCALE_DTYPES)
    prows, pcols = swizzled_128x4_shape(rows, cols)
    _check_swizzled_buffer("sf_swizzled", sf_swizzled, prows, pcols)
    return _unswizzle(sf_swizzled, rows, cols)


def _unswizzle(sf_swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    prows, pcols = swizzled_128x4_shape(rows, cols)
    raw = sf_swizzled.reshape(prows // 128, pcols // 4, 32, 4, 4).view(torch.uint8)
    linear = raw.permute(0, 3, 2, 1, 4).reshape(prows, pcols)
    return linear[:rows, :cols].contiguous().view(sf_swizzled.dtype)


def _check_swizzled_buffer(name: str, buf: torch.Tensor, prows: int, pcols: int) -> None:
    if buf.dim() == 1:
        if buf.numel() != prows * pcols:
            prows, pcols = _checks.plain(prows), _checks.plain(pcols)
            raise ValueError(
                f"{name} (flat swizzled) must hold {prows} * {pcols} = {prows * pcols} "
                f"elements; got {_checks.plain(buf.numel())}"
            )
    elif buf.dim() == 2:
        _checks.same_shape(name, buf, (prows, pcols), "[padded_rows, padded_scale_cols]")
    else:
        raise ValueError(
            f"{name} must be 1-D (flat) or 2-D [padded_rows, padded_scale_cols] "
            f"{_checks.plain((prows, pcols))}; got shape {_checks.plain(buf.shape)}"
        )


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """The conventional encode global scale ``448 * 6 / amax(x)`` as a 0-d float32 tensor.

    ``amax`` is taken after rounding ``x`` to float32 and the quotient is correctly rounded
    to float32 (the same bits on every device). An all-zero ``x``, or one whose ``amax`` is
    inf or NaN, gets 1.0; a quotient beyond float32's range (``amax`` below about 7.9e-36)
    gets float32's largest finite value, so the result is always a scale `nvfp4_quantize`
    accepts. The result stays on ``x``'s device (no synchronisation).

    Args:
        x: floating tensor of any shape.

    Returns:
        0-d float32 tensor on ``x``'s device.

    Raises:
        TypeError: ``x`` is not a floating tensor.
    """
    x = _checks.tensor("x", x)
    _checks.dtype("x", x, _checks.FLOAT_DTYPES)
    amax = magnitude(x.to(torch.float32)).amax() if x.numel() else torch.zeros((), device=x.device)
    one = torch.ones((), dtype=torch.float32, device=x.device)
    # Not ``2688 / amax``: a Python number over a tensor is ``amax.reciprocal() * 2688``
    # (two roundings) in PyTorch; div_to_float32 rounds the true quotient once.
    quotient = div_to_float32(E4M3_MAX * E2M1_MAX, amax).clamp(max=torch.finfo(torch.float32).max)
    # amax >= 0 or NaN, so this is "positive and finite" with comparisons only.
    return torch.where((amax > 0) & (amax < float("inf")), quotient, one)


def quantize_rows(
    x: torch.Tensor, global_sf: torch.Tensor, sf_vec_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4-quantise the last dimension of ``x`` with linear scales (internal helper).

    Returns ``(packed [..., K/2] uint8, scales [..., K/sf_vec_size] uint8 e4m3 bits)``.
    Every rounding is the correctly rounded float32 one (see `div_to_float32`,
    `mul_to_float32`) or integer / comparison arithmetic, so all devices give the same bytes.
    """
    # Explicit sizes, not -1: a reshape of an empty tensor cannot infer a dimension.
    *lead, k = x.shape
    groups = x.to(torch.float32).reshape(*lead, k // sf_vec_size, sf_vec_size)
    amax = magnitude(groups).amax(dim=-1)
    # fl32(fl32(amax / 6) * global_sf), rounded to e4m3 with saturation at 448 (the clamp).
    scale_target = mul_to_float32(div_to_float32(amax, E2M1_MAX), global_sf)
    scale_bits = float32_to_e4m3_bits(scale_target)
    scale_f32 = e4m3_bits_to_float32(scale_bits)
    encode = torch.where(
        scale_f32 == 0, torch.zeros_like(scale_f32), div_to_float32(global_sf, scale_f32)
    )
    scaled = mul_to_float32(groups, encode.unsqueeze(-1))
    # A global scale near float32's largest over a small block scale overflows the float32
    # factor (the global scale is finite: checked). Those blocks take the product in float64
    # instead, so their small elements are not saturated to 6; every other block keeps the
    # float32 formula. Selected element-wise rather than branched on, which would read device
    # data (a synchronisation) on CUDA.
    factor64 = global_sf.to(torch.float64) / scale_f32.to(torch.float64)
    wide = (groups.to(torch.float64) * factor64.unsqueeze(-1)).to(torch.float32)
    scaled = torch.where(encode.isinf().unsqueeze(-1), wide, scaled)
    codes = e2m1_encode(scaled).reshape(*lead, k)
    return pack_nibbles(codes), scale_bits


def dequantize_rows(
    packed: torch.Tensor,
    scales: torch.Tensor,
    global_sf: torch.Tensor,
    sf_vec_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Inverse of `quantize_rows`: ``e2m1 * e4m3_scale / global_sf`` (internal helper).

    ``e2m1 * e4m3_scale`` is exact. For float32 and narrower dtypes the quotient is rounded
    once to float32 (`div_to_float32`), then cast to ``dtype``. For float64 it is the product
    times the float64 reciprocal of ``global_sf`` (within one float64 ulp of the quotient,
    both roundings being correct), not a division: Inductor rewrites a division by a
    constant - a Python-number global scale becomes one - into that product on CUDA, which
    would give compiled code other float64 bytes than eager. The float32 quotient is immune
    to that rewrite: a quotient of two float32 numbers is at least 2**-47 (relative) away
    from a float32 rounding midpoint unless it is one, far beyond the rewrite's error of
    about 2**-52.
    """
    *lead, half = packed.shape
    k = 2 * half
    values = e2m1_decode(unpack_nibbles(packed), torch.float32)
    values = values.reshape(*lead, k // sf_vec_size, sf_vec_size)
    scale = e4m3_bits_to_float32(scales.view(torch.uint8)).unsqueeze(-1)
    if dtype == torch.float64:
        out = (values * scale).to(torch.float64) * global_sf.to(torch.float64).reciprocal()
    else:
        out = div_to_float32(values * scale, global_sf).to(dtype)
    return out.reshape(*lead, k)


def _check_sf_vec_size(sf_vec_size: object) -> int:
    sf_vec_size = _checks.exact_int("sf_vec_size", sf_vec_size)
    _checks.choice("sf_vec_size", sf_vec_size, _SF_VEC_SIZES)
    return sf_vec_size


def nvfp4_quantize(
    a: torch.Tensor,
    a_global_sf: float | torch.Tensor,
    *,
    sf_vec_size: int = NVFP4_SF_VEC_SIZE,
    swizzled: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a matrix to NVFP4 (E2M1 values, E4M3 block scales, encode global scale).

    For each block of ``sf_vec_size`` consecutive elements of a row (float32 arithmetic,
    every operation correctly rounded, so CPU and CUDA tensors give the same bytes):
    ``scale = e4m3(min(amax(block) / 6 * a_global_sf, 448))`` (round to nearest even), and
    each element becomes ``e2m1(x * (a_global_sf / float(scale)))`` (0 when the scale is 0)
    with the E2M1 rounding of `quantize_mxfp4`: nearest, ties to the even code, saturating
    at 6, sign copied from the input. Dequantisation is ``e2m1 * scale / a_global_sf``; per
    element ``|error| <= max(0.25, |v| / 4) * scale / a_global_sf + 2**-22 * |x|`` with
    ``v = x * a_global_sf / scale`` (exact) while the scale is an E4M3 normal (``>= 2**-6``)
    and not clamped at 448 (``amax(block) / 6 * a_global_sf <= 448``; past that, ``|v|``
    exceeds 6 and saturates). The second term is the float32 rounding of the factor and of
    the product: a ``v`` just past an E2M1 rounding midpoint can round onto it and then to the
    even code on the far side.

    Args:
        a: ``[M, K]`` float16, bfloat16, float32 or float64 matrix, ``K`` a multiple of
            ``sf_vec_size``.
        a_global_sf: the ENCODE global scale, conventionally ``448 * 6 / amax(a)`` (see
            `nvfp4_global_scale`): a positive float or a 0-d / 1-element floating tensor
            (CPU or ``a``'s device; a CUDA tensor's value is not checked).
        sf_vec_size: elements per block scale, 16 (NVFP4, default) or 32.
        swizzled: return the scales in the 128x4-swizzled layout (default) or linear.

    Returns:
        ``(a_fp4, a_sf)``: ``a_fp4`` is ``[M, K/2]`` uint8 (element ``2j`` in the low
        nibble of byte ``j``). ``a_sf`` holds the E4M3 scale bytes as uint8: with
        ``swizzled=True`` a 2-D ``[ceil(M/128)*128, ceil(K/sf_vec_size/4)*4]`` tensor whose
        flattened bytes are the swizzled buffer (``a_sf.flatten()[offset(r, c)]`` is the
        scale of row ``r``, block ``c``; padding is 0; ``a_sf[i, j]`` is NOT scale
        ``(i, j)``); with ``swizzled=False`` the linear ``[M, K/sf_vec_size]`` matrix.

    Raises:
        TypeError: wrong dtype of ``a`` or ``a_global_sf``, non-int ``sf_vec_size``, a
            ``swizzled`` that is not a bool (``1`` is refused), or an ``a_global_sf`` that is
            a bool or neither a real number nor a tensor.
        ValueError: ``a`` is not 2-D, ``K`` is not a multiple of ``sf_vec_size``,
            ``sf_vec_size`` is not 16 or 32, or ``a_global_sf`` is not a finite positive
            scalar.
    """
    a = _checks.tensor("a", a)
    _checks.dtype("a", a, _checks.FLOAT_DTYPES)
    _checks.ndim("a", a, 2, "[M, K]")
    sf_vec_size = _check_sf_vec_size(sf_vec_size)
    _checks.divisible("a", a.shape[1], sf_vec_size, "K (a.shape[1])")
    _checks.flag("swizzled", swizzled)
    global_sf = _checks.global_scale("a_global_sf", a_global_sf, a.device)

    a_fp4, a_sf = quantize_rows(a, global_sf, sf_vec_size)
    return a_fp4, swizzle_128x4(a_sf) if swizzled else a_sf


def nvfp4_dequantize(
    a_fp4: torch.Tensor,
    a_sf: torch.Tensor,
    a_global_sf: float | torch.Tensor,
    *,
    m: int | None = None,
    k: int | None = None,
    sf_vec_size: int = NVFP4_SF_VEC_SIZE,
    swizzled: bool = True,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Dequantise the output of `nvfp4_quantize`: ``e2m1 * e4m3_scale / a_global_sf``.

    Args:
        a_fp4: ``[M, K/2]`` uint8 packed E2M1 values.
        a_sf: E4M3 scale bytes (uint8 or ``torch.float8_e4m3fn``): swizzled, flat or 2-D
            ``[ceil(M/128)*128, ceil(K/sf_vec_size/4)*4]``; or linear ``[M, K/sf_vec_size]``
            when ``swizzled=False``.
        a_global_sf: the same encode global scale that was passed to `nvfp4_quantize`.
        m: optional ``M``; when given it must equal ``a_fp4.shape[0]``.
        k: optional ``K``; when given it must equal ``2 * a_fp4.shape[1]``.
        sf_vec_size: elements per block scale, 16 (default) or 32.
        swizzled: whether ``a_sf`` is in the 128x4-swizzled layout.
        dtype: floating output dtype (default float32): the quotient rounded once to float32,
            then to ``dtype``; for float64, the exact product times the float64 reciprocal of
            ``a_global_sf`` (within one ulp of the quotient; the form Inductor compiles a
            division by a constant into on CUDA, so compiled and eager bytes agree).

    Returns:
        ``[M, K]`` tensor of ``dtype``.

    Raises:
        TypeError: a wrong dtype (``a_fp4``, ``a_sf``, ``dtype``, or a non-floating tensor
            ``a_global_sf``), ``m``, ``k`` or ``sf_vec_size`` that is not an int (a bool is
            refused too), a ``swizzled`` that is not a bool, or an ``a_global_sf`` that is a
            bool or neither a real number nor a tensor.
        ValueError: ``sf_vec_size`` is not 16 or 32, inconsistent shapes, ``m``/``k``
            disagreeing with ``a_fp4``, mixed devices, or an invalid ``a_global_sf``.
    """
    a_fp4 = _checks.tensor("a_fp4", a_fp4)
    a_sf = _checks.tensor("a_sf", a_sf)
    _checks.dtype("a_fp4", a_fp4, torch.uint8)
    _checks.dtype("a_sf", a_sf, _SCALE_DTYPES)
    _checks.ndim("a_fp4", a_fp4, 2, "[M, K/2]")
    dtype = _checks.output_float_dtype("dtype", dtype)
    sf_vec_size = _check_sf_vec_size(sf_vec_size)
    rows, cols_k = a_fp4.shape[0], a_fp4.shape[1] * 2
    if m is not None and _checks.exact_int("m", m) != rows:
        raise ValueError(
            f"m must equal a_fp4.shape[0] ({_checks.plain(rows)}); got {_checks.plain(m)}"
        )
    if k is not None and _checks.exact_int("k", k) != cols_k:
        raise ValueError(
            f"k must equal 2 * a_fp4.shape[1] ({_checks.plain(cols_k)}); got {_checks.plain(k)}"
        )
    _checks.divisible("a_fp4", cols_k, sf_vec_size, "K (2 * a_fp4.shape[1])")
    _checks.same_device("a_sf", a_sf, "a_fp4", a_fp4)
    _checks.flag("swizzled", swizzled)
    global_sf = _checks.global_scale("a_global_sf", a_global_sf, a_fp4.device)

    n_sf = cols_k // sf_vec_size
    if swizzled:
        _check_swizzled_buffer("a_sf", a_sf, *swizzled_128x4_shape(rows, n_sf))
        scales = _unswizzle(a_sf, rows, n_sf)
    else:
        _checks.same_shape("a_sf", a_sf, (rows, n_sf), "[M, K/sf_vec_size] (linear)")
        scales = a_sf
    return dequantize_rows(a_fp4, scales.view(torch.uint8), global_sf, sf_vec_size, dtype)
