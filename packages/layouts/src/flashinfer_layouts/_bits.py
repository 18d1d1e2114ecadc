"""Bit-level primitives: exact powers of two, little-endian byte views, E2M1 codes, nibbles.

Byte orders are built with shifts rather than ``Tensor.view(torch.uint8)`` so the layouts
are little-endian by construction, whatever the host byte order.
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0

# Magnitudes of the eight non-negative E2M1 codes (sign is bit 3 of the nibble).
_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

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


def exp2_float64(exponent: torch.Tensor) -> torch.Tensor:
    """Exact ``2.0 ** exponent`` as float64 for integer exponents in [-1022, 1023]."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def float32_to_le_bytes(x: torch.Tensor) -> torch.Tensor:
    """float32 ``[...]`` -> uint8 ``[..., 4]``, least significant byte first."""
    bits = x.to(torch.float32).contiguous().view(torch.int32)
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int32, device=x.device)
    return ((bits.unsqueeze(-1) >> shifts) & 0xFF).to(torch.uint8)


def le_bytes_to_float32(b: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 4]`` (least significant byte first) -> float32 ``[...]``."""
    return le_bytes_to_int32(b).view(torch.float32)


def int32_to_le_bytes(x: torch.Tensor) -> torch.Tensor:
    """int32 ``[...]`` -> uint8 ``[..., 4]``, byte k = bits [8k, 8k+8)."""
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int32, device=x.device)
    return ((x.to(torch.int32).unsqueeze(-1) >> shifts) & 0xFF).to(torch.uint8)


def le_bytes_to_int32(b: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 4]`` -> int32 ``[...]`` (two's complement wrap of the 32-bit word)."""
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int64, device=b.device)
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
    magnitudes = torch.tensor(_E2M1_MAGNITUDES, dtype=dtype, device=code.device)
    value = magnitudes[(code & 0x7).long()]
    return torch.where((code & 0x8) != 0, -value, value)


def pack_nibbles(code: torch.Tensor) -> torch.Tensor:
    """uint8 codes ``[..., 2n]`` -> bytes ``[..., n]``: element 2j low nibble, 2j+1 high."""
    return code[..., 0::2] | (code[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """bytes ``[..., n]`` -> uint8 codes ``[..., 2n]`` (low nibble first)."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)
