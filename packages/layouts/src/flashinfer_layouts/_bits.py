"""Bit-level primitives: exact powers of two, little-endian byte views, E2M1 / E4M3 codes,
nibbles, and the two roundings (division, multiplication) the quantisers need.

Byte orders are built with shifts rather than ``Tensor.view(torch.uint8)`` so the layouts
are little-endian by construction, whatever the host byte order.

Every quantiser must give the same bytes on CPU and CUDA tensors. The rules that make that
hold by construction, not by luck:

* Never divide by a Python number. On CUDA, ``tensor / python_float`` is computed as
  ``tensor * (1 / python_float)`` (``div_true_kernel_cuda`` in PyTorch's
  ``BinaryDivTrueKernel.cu`` takes that path whenever the divisor is a CPU scalar; its own
  comment says the result "may lose one bit of precision"), while the CPU kernel divides.
  Divisions go through `div_to_float32`, which divides two device tensors in float64 and
  rounds once.
* Products of two float32 values are formed exactly in float64 and rounded once
  (`mul_to_float32`), so no device-specific float32 subnormal (flush-to-zero) handling
  can enter.
* Powers of two, exponents and the E4M3 / E2M1 roundings are integer operations on the
  IEEE bit patterns or exact comparisons, never ``frexp`` / ``log2`` / ``exp2`` or a
  dtype cast whose rounding and saturation are backend-defined (PyTorch's CUDA float32 ->
  float8_e4m3fn copy uses the ``__nv_cvt_float_to_fp8`` intrinsic on recent CUDA versions
  and its own C++ routine otherwise).
* Sign bits are read from the bit pattern (`sign_bit`), not with ``torch.signbit``, whose
  float64 form in Inductor's Triton code is ``x < 0`` and misses -0.0; and set on the bit
  pattern, not by negation, which Triton 3.6 compiles as ``0 - x`` (+0.0 for a zero).
* Magnitudes are taken by clearing the sign bit (`magnitude`), an integer operation with
  no flush-to-zero variant for any backend to pick.
* E4M3 bytes are widened by integer arithmetic (`e4m3_bits_to_float32`, on the 256 codes,
  then looked up), not through ``torch.float8_e4m3fn``, whose conversions Triton does not
  lower everywhere.
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0

# E2M1 nibble: sign (bit 3) | code (bits 0-2); codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6.

# Round-to-nearest on the E2M1 grid: the code of |v| is the number of thresholds it passes.
# At a midpoint the tie goes to the even code (mantissa bit 0), hence ">" for midpoints whose
# lower neighbour has the even code and ">=" where the upper neighbour has it.
#   midpoint  0.25 (0 | 0.5)   -> 0     code 0   (">")
#   midpoint  0.75 (0.5 | 1)   -> 1     code 2   (">=")
#   midpoint  1.25 (1 | 1.5)   -> 1     code 2   (">")
#   midpoint  1.75 (1.5 | 2)   -> 2     code 4   (">=")
#   midpoint  2.5  (2 | 3)     -> 2     code 4   (">")
#   midpoint  3.5  (3 | 4)     -> 4     code 6   (">=")
#   midpoint  5    (4 | 6)     -> 4     code 6   (">")
_STRICT_THRESHOLDS = (0.25, 1.25, 2.5, 5.0)
_INCLUSIVE_THRESHOLDS = (0.75, 1.75, 3.5)


_FLOAT32_EXPONENT_MASK = 0x7F800000
_FLOAT32_ABS_MASK = 0x7FFFFFFF
_FLOAT32_SIGN_BIT = -(2**31)  # 0x80000000 as an int32
E4M3_MAX_CODE = 0x7E  # 448
E4M3_NAN_CODE = 0x7F


def _byte_shifts(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # Built with arange, not torch.tensor([...]): no host-to-device copy, so the write path
    # stays capturable in a CUDA graph.
    return torch.arange(0, 32, 8, dtype=dtype, device=device)


def exp2_float64(exponent: torch.Tensor) -> torch.Tensor:
    """Exact ``2.0 ** exponent`` as float64 for integer exponents in [-1022, 1023]."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def pow2_float32(exponent: torch.Tensor) -> torch.Tensor:
    """Exact ``2.0 ** exponent`` as float32 for integer exponents in [-126, 127]."""
    return ((exponent.to(torch.int64) + 127) << 23).to(torch.int32).view(torch.float32)


def float32_fields(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Biased exponent (bits 23-30) and fraction (bits 0-22) of float32 ``x``, as int64.

    The sign is ignored. A finite normal ``|x|`` is
    ``(1 + fraction / 2**23) * 2**(biased - 127)``; ``biased == 255`` means infinity or NaN.
    """
    bits = x.to(torch.float32).resolve_neg().contiguous().view(torch.int32).to(torch.int64)
    return (bits >> 23) & 0xFF, bits & 0x7FFFFF


def float64_fields(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Biased exponent (bits 52-62) and fraction (bits 0-51) of float64 ``x``, as int64.

    The sign is ignored; ``biased == 2047`` means infinity or NaN.
    """
    bits = x.to(torch.float64).resolve_neg().contiguous().view(torch.int64)
    return (bits >> 52) & 0x7FF, bits & ((1 << 52) - 1)


def _as_float64(value: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(torch.float64)
    # A device tensor built by a fill kernel: no host-to-device copy (graph-capturable), and
    # never a CPU scalar, so no backend replaces the division by a reciprocal multiply.
    return like.new_full((), float(value), dtype=torch.float64)


def div_to_float32(
    numerator: torch.Tensor | float, denominator: torch.Tensor | float
) -> torch.Tensor:
    """``numerator / denominator`` correctly rounded to float32, bit-identical on every device.

    Operands are float32 tensors (or Python numbers exactly representable in float32) on
    one device; at least one is a tensor. The quotient is a true float64 division of two
    tensors, then one cast to float32:

    * IEEE float64 division is correctly rounded on x86 and in CUDA device code (there is
      no approximate double division), and the divisor is a device tensor, so CUDA's
      reciprocal-multiply shortcut for CPU-scalar divisors is never taken.
    * Rounding that float64 quotient to float32 gives the correctly rounded float32
      quotient: for ``+ - * /`` of p-bit operands, double rounding through a format with
      at least ``2p + 2`` bits is innocuous (53 >= 2 * 24 + 2), and when the float32 result
      is subnormal its grid is coarser, which only widens the margin. An exact tie
      (possible only there) is representable in float64 and reaches the final cast intact.
    """
    like = numerator if isinstance(numerator, torch.Tensor) else denominator
    if not isinstance(like, torch.Tensor):
        raise TypeError("div_to_float32 needs at least one tensor operand")
    quotient = _as_float64(numerator, like) / _as_float64(denominator, like)
    return quotient.to(torch.float32)


def mul_to_float32(a: torch.Tensor, b: torch.Tensor | float) -> torch.Tensor:
    """``a * b`` of float32 values correctly rounded to float32, bit-identical on every device.

    The product of two 24-bit significands has at most 48 bits and float32 exponents stay far
    inside float64's range, so the float64 product is exact and the cast is the only rounding.
    """
    return (a.to(torch.float64) * _as_float64(b, a)).to(torch.float32)


def float32_to_e4m3_bits(x: torch.Tensor) -> torch.Tensor:
    """Round float32 ``x`` to E4M3 (fn) bytes, nearest with ties to even, saturating at 448.

    Integer arithmetic on the float32 bit pattern, so every device gives the same bytes.
    Magnitudes from 464 up (including infinity), which round beyond 448, become +-448
    (0x7E / 0xFE). The sign is kept, so negative zero and tiny negatives give 0x80. NaN gives
    0x7F whatever its sign or payload (the NaN sign bit is not preserved alike by all
    backends).

    Args:
        x: float32 tensor (other floating dtypes are first rounded to float32).

    Returns:
        uint8 tensor of ``x``'s shape; ``.view(torch.float8_e4m3fn)`` reinterprets it.
    """
    bits = x.to(torch.float32).resolve_neg().contiguous().view(torch.int32)
    sign = (bits >> 24) & 0x80  # bit 31 to bit 7 (the shift's fill bits are masked off)
    mag = bits & _FLOAT32_ABS_MASK
    biased = mag >> 23

    # Round to nearest even by adding just under half a step plus the kept part's lowest bit:
    # the sum carries into the kept bits exactly when the dropped bits exceed half a step, or
    # equal it with an odd kept part. Everything stays in int32 (half the memory traffic of
    # int64 in eager code); no sum below can overflow.
    #
    # |x| >= 2**-6 (biased >= 121), E4M3 normal: keep the top 3 fraction bits, round the
    # other 20, and rebias the exponent from 127 to 7 (subtract 120 << 3 from the 12-bit
    # exponent|fraction field). A carry out of the fraction bumps the exponent, which is
    # exactly the rounded-up value. Magnitudes are capped at 512 first: everything from 464
    # up saturates to 448 anyway, and the cap keeps the sum inside int32.
    capped = mag.clamp_max(0x44000000)
    normal = ((capped + (0x7FFFF + ((capped >> 20) & 1))) >> 20) - (120 << 3)

    # |x| < 2**-6: E4M3 subnormal, code = |x| / 2**-9 rounded to nearest even (0..8; 8 is
    # the smallest normal 2**-6, whose code is also 8). |x| = significand * 2**(e - 150) with
    # e = max(biased, 1), so the code is significand >> (141 - e), rounded; shifts of 25 or
    # more leave less than half a step (significand < 2**24), i.e. code 0.
    significand = (mag & 0x7FFFFF) | (biased.clamp_max(1) << 23)
    shift = (141 - biased.clamp_min(1)).clamp(21, 25)
    step = torch.ones_like(shift) << shift
    subnormal = (significand + ((step >> 1) - 1) + ((significand >> shift) & 1)) >> shift

    code = torch.where(biased >= 121, normal, subnormal).clamp_max(E4M3_MAX_CODE) | sign
    code = torch.where(mag > _FLOAT32_EXPONENT_MASK, E4M3_NAN_CODE, code)
    return code.to(torch.uint8)


def e4m3_bits_to_float32(bits: torch.Tensor) -> torch.Tensor:
    """E4M3 (fn) bytes -> their exact float32 values, from the bit pattern.

    The values of ``bits.view(torch.float8_e4m3fn).to(torch.float32)``, without a float8
    conversion for Inductor to compile: it folds float8 -> float32 -> float64 into one
    float8 -> float64 conversion, which Triton 3.6 (PyTorch 2.11's) cannot lower for sm_90
    ("Unsupported conversion from f8E4M3FN to f64"). NaN (0x7F, 0xFF) gives the pattern
    PyTorch's CPU cast gives, 0x7FF00000 with the byte's sign.

    Args:
        bits: uint8 tensor of E4M3 bytes (a float8 tensor must be viewed as uint8 first: its
            values, not its bytes, would be converted here).
    """
    if bits.dtype != torch.uint8:
        raise TypeError(
            f"e4m3_bits_to_float32: bits must be uint8 E4M3 bytes; got dtype {bits.dtype}"
        )
    # Looked up in the 256 values rather than computed per element: about three times
    # faster in eager code on a CPU, and the same bits (the table is this arithmetic).
    table = _e4m3_code_words(torch.arange(256, dtype=torch.int32, device=bits.device))
    return table[bits.to(torch.int64)].view(torch.float32)


def _e4m3_code_words(b: torch.Tensor) -> torch.Tensor:
    """int32 E4M3 codes (0..255) -> the int32 bit patterns of their float32 values."""
    unsigned = b & 0x7F  # exponent (4 bits, bias 7) | mantissa (3 bits)
    # Normal (exponent >= 1): shifted into float32's fields, the exponent rebiased from 7 to
    # 127. Subnormal: m * 2**-9, a normal float32 (or zero), exact on every device.
    normal = (unsigned << 20) + (120 << 23)
    subnormal = (unsigned.to(torch.float32) * 2.0**-9).view(torch.int32)
    word = torch.where(unsigned < 8, subnormal, normal)
    word = torch.where(unsigned == E4M3_NAN_CODE, 0x7FF00000, word)
    return word | (b >> 7) * _FLOAT32_SIGN_BIT


def float32_to_le_bytes(x: torch.Tensor) -> torch.Tensor:
    """float32 ``[...]`` -> uint8 ``[..., 4]``, least significant byte first."""
    return int32_to_le_bytes(x.to(torch.float32).resolve_neg().contiguous().view(torch.int32))


def le_bytes_to_float32(b: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 4]`` (least significant byte first) -> float32 ``[...]``."""
    return le_bytes_to_int32(b).view(torch.float32)


def int32_to_le_bytes(x: torch.Tensor) -> torch.Tensor:
    """int32 ``[...]`` -> uint8 ``[..., 4]``, byte k = bits [8k, 8k+8)."""
    shifts = _byte_shifts(torch.int32, x.device)
    return ((x.to(torch.int32).unsqueeze(-1) >> shifts) & 0xFF).to(torch.uint8)


def le_bytes_to_int32(b: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 4]`` -> int32 ``[...]`` (two's complement wrap of the 32-bit word)."""
    shifts = _byte_shifts(torch.int64, b.device)
    word = (b.to(torch.int64) << shifts).sum(-1)
    word = torch.where(word >= 2**31, word - 2**32, word)
    return word.to(torch.int32).contiguous()


_SAME_WIDTH_INT = {torch.float64: torch.int64, torch.float32: torch.int32}


def sign_bit(x: torch.Tensor) -> torch.Tensor:
    """Whether the IEEE sign bit of float32 or float64 ``x`` is set (True for -0.0), as bool.

    Read from the bit pattern, not with ``torch.signbit``: Inductor's Triton code computes
    ``signbit`` of a float64 as ``x < 0``, which is False for -0.0 (PyTorch 2.13's CUDA code
    generation; it made compiled ``quantize_mxfp4`` lose the sign of negative zeros).
    """
    if x.dtype not in _SAME_WIDTH_INT:
        raise TypeError(f"sign_bit takes float32 or float64; got {x.dtype}")
    return x.resolve_neg().contiguous().view(_SAME_WIDTH_INT[x.dtype]) < 0


def magnitude(x: torch.Tensor) -> torch.Tensor:
    """``|x|`` of float32 or float64 ``x``, by clearing the IEEE sign bit.

    Defensive, not a fix: Inductor's Triton ``abs`` compiles to a non-flushing ``abs.f32``
    (PTX read for sm_90, Triton 3.6 and 3.9); the bit form cannot be flushed by any backend.
    """
    if x.dtype not in _SAME_WIDTH_INT:
        raise TypeError(f"magnitude takes float32 or float64; got {x.dtype}")
    integer = _SAME_WIDTH_INT[x.dtype]
    return (x.resolve_neg().contiguous().view(integer) & torch.iinfo(integer).max).view(x.dtype)


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """Round already-scaled values to E2M1 nibble codes (uint8 in [0, 15]).

    Round to nearest, ties to the even code, magnitudes above 6 saturate to 6. Only exact
    comparisons with the midpoints are used, so every device gives the same codes. The sign
    bit (bit 3) is copied from the input's sign bit, so a small negative value that rounds
    to zero becomes negative zero (0x8). NaN gives code 0 (its sign bit is not preserved
    alike by all backends). ``v`` is float32 or float64.
    """
    mag = magnitude(v)
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for threshold in _STRICT_THRESHOLDS:
        code += (mag > threshold).to(torch.uint8)
    for threshold in _INCLUSIVE_THRESHOLDS:
        code += (mag >= threshold).to(torch.uint8)
    negative = sign_bit(v) & ~torch.isnan(v)
    return code | (negative.to(torch.uint8) << 3)


def e2m1_decode(code: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """E2M1 nibble codes (uint8, low 4 bits used) -> their exact values in ``dtype``."""
    # The 16 values are computed on code's device (no host-to-device copy), then looked up:
    # about five times faster in eager code on a CPU than the arithmetic per element.
    table = _e2m1_values(torch.arange(16, dtype=torch.int32, device=code.device), dtype)
    return table[(code & 0xF).to(torch.int64)]


def _e2m1_values(code: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int32 E2M1 codes (0..15) -> their exact values in ``dtype``."""
    # Twice the magnitude is an integer: codes 0, 1 -> 0, 1; code c >= 2 -> (2 + c % 2) << (c // 2 - 1)
    # (2, 3, 4, 6, 8, 12).
    c = code & 0x7
    twice = torch.where(c < 2, c, (2 + (c & 1)) << ((c >> 1) - 1).clamp_min(0))
    unsigned = twice.to(torch.float32) * 0.5
    # The sign goes onto the bit pattern, not through a negation: Triton 3.6 (PyTorch 2.11's)
    # compiles ``-x`` as ``0 - x``, so Inductor's code for ``-unsigned`` decoded 0x8 as +0.0.
    sign = ((code & 0x8) != 0).to(torch.int32) * _FLOAT32_SIGN_BIT
    return (unsigned.view(torch.int32) | sign).view(torch.float32).to(dtype)


def pack_nibbles(code: torch.Tensor) -> torch.Tensor:
    """uint8 codes ``[..., 2n]`` -> bytes ``[..., n]``: element 2j low nibble, 2j+1 high."""
    return code[..., 0::2] | (code[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """bytes ``[..., n]`` -> uint8 codes ``[..., 2n]`` (low nibble first)."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)
