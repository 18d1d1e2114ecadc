"""Bit-level primitives: exact powers of two, little-endian byte views, E2M1 codes, nibbles.

Byte orders are built with shifts rather than ``Tensor.view(torch.uint8)`` so the layouts
are little-endian by construction, whatever the host byte order.
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


def _byte_shifts(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # Built with arange, not torch.tensor([...]): no host-to-device copy, so the write path
    # stays capturable in a CUDA graph.
    return torch.arange(0, 32, 8, dtype=dtype, device=device)


def exp2_float64(exponent: torch.Tensor) -> torch.Tensor:
    """Exact ``2.0 ** exponent`` as float64 for integer exponents in [-1022, 1023]."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def float32_to_le_bytes(x: torch.Tensor) -> torch.Tensor:
    """float32 ``[...]`` -> uint8 ``[..., 4]``, least significant byte first."""
    return int32_to_le_bytes(x.to(torch.float32).contiguous().view(torch.int32))


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


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """Round already-scaled values to E2M1 nibble codes (uint8 in [0, 15]).

    Round to nearest, ties to the even code, magnitudes above 6 saturate to 6. The sign
    bit (bit 3) is copied from the input's sign bit, so a small negative value that rounds
    to zero becomes negative zero (0x8). NaN inputs give an unspecified code.
    """
    mag = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for threshold in _STRICT_THRESHOLDS:
        code += (mag > threshold).to(torch.uint8)
    for threshold in _INCLUSIVE_THRESHOLDS:
        code += (mag >= threshold).to(torch.uint8)
    return code | (torch.signbit(v).to(torch.uint8) << 3)


def e2m1_decode(code: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """E2M1 nibble codes (uint8, low 4 bits used) -> their exact values in ``dtype``."""
    # Twice the magnitude is an integer: codes 0, 1 -> 0, 1; code c >= 2 -> (2 + c % 2) << (c // 2 - 1)
    # (2, 3, 4, 6, 8, 12). Computed, not looked up, to avoid a host-to-device table copy.
    c = (code & 0x7).to(torch.int32)
    twice = torch.where(c < 2, c, (2 + (c & 1)) << ((c >> 1) - 1).clamp_min(0))
    value = twice.to(dtype) * 0.5
    return torch.where((code & 0x8) != 0, -value, value)


def pack_nibbles(code: torch.Tensor) -> torch.Tensor:
    """uint8 codes ``[..., 2n]`` -> bytes ``[..., n]``: element 2j low nibble, 2j+1 high."""
    return code[..., 0::2] | (code[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """bytes ``[..., n]`` -> uint8 codes ``[..., 2n]`` (low nibble first)."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)
