"""Roundings the CPU/CUDA parity rests on, pinned to hand-computed bytes and exact references.

The references here use Python integers and ``fractions.Fraction`` only: the float32 and
E4M3 roundings are written out (nearest, ties to even) so they share nothing with the
library's bit manipulation or with PyTorch's casts.
"""

from __future__ import annotations

import itertools
import struct
from fractions import Fraction

import flashinfer_layouts as fl
import pytest
import torch
from flashinfer_layouts._bits import float32_to_e4m3_bits

# --- independent references -----------------------------------------------------------------


def round_half_even(q: Fraction) -> int:
    """Nearest integer to a non-negative fraction, ties to the even integer."""
    n, rest = divmod(q.numerator, q.denominator)
    twice = 2 * rest
    if twice > q.denominator or (twice == q.denominator and n % 2 == 1):
        n += 1
    return n


def round_to_float32(q: Fraction) -> float:
    """The float32 nearest to ``q`` (ties to even), subnormals included, as a Python float."""
    if q == 0:
        return 0.0
    sign, q = (-1.0 if q < 0 else 1.0), abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1  # now 2**e <= q < 2**(e + 1)
    quantum = Fraction(2) ** (max(e, -126) - 23)  # 24-bit significand; fixed step below 2**-126
    return sign * float(round_half_even(q / quantum) * quantum)


def float32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def e4m3_fraction(byte: int) -> Fraction:
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0:
        return Fraction(mantissa, 8) * Fraction(1, 2**6)
    return (1 + Fraction(mantissa, 8)) * Fraction(2) ** (exponent - 7)


E4M3_FINITE = [(byte, e4m3_fraction(byte)) for byte in range(0x7F)]  # 0x00 .. 0x7E (448)


def e4m3_nearest(q: Fraction, negative: bool) -> int:
    """E4M3 byte nearest to ``q`` (ties to the even byte), saturating at 448."""
    mag = abs(q)
    best = min(E4M3_FINITE, key=lambda bv: (abs(bv[1] - mag), bv[0] & 1))[0]
    return best | (0x80 if negative else 0)


def test_references_agree_with_known_values():
    # the references are checked against facts, so they cannot agree with a broken library
    assert round_to_float32(Fraction(1, 3)) == float.fromhex("0x1.555556p-2")
    assert round_to_float32(Fraction(1, 2**150)) == 0.0  # tie between 0 and 2**-149 -> 0
    assert round_to_float32(Fraction(3, 2**150)) == 2.0**-148  # tie 1 | 2 (x 2**-149) -> 2
    assert float32_bits(round_to_float32(Fraction(1, 448))) == 0x3B124925
    assert e4m3_nearest(Fraction(1), False) == 0x38
    assert e4m3_nearest(Fraction(17, 16), True) == 0xB8  # tie 1.0 | 1.125 -> even 1.0
    assert e4m3_nearest(Fraction(1000), False) == 0x7E


def codes_of(packed: torch.Tensor) -> list[int]:
    return torch.stack((packed & 0xF, packed >> 4), -1).flatten().tolist()


# --- FP8 (E4M3) -----------------------------------------------------------------------------

# (value, byte) at scale 1; every value is exact in float32.
E4M3_CASES = [
    (448.0, 0x7E),
    (0.0, 0x00),
    (-0.0, 0x80),  # negative zero keeps its sign
    (1.0625, 0x38),  # 1.0 (000) | 1.125 (001): tie -> 000
    (1.0625 + 2.0**-23, 0x39),  # one float32 ulp above the midpoint rounds up
    (1.1875, 0x3A),  # 1.125 (001) | 1.25 (010): tie -> 010
    (1.1875 - 2.0**-23, 0x39),  # one ulp below rounds down
    (248.0, 0x78),  # 240 (0x77) | 256 (0x78): tie carries into the next binade
    (432.0, 0x7E),  # 416 (0x7D) | 448 (0x7E): tie -> 0x7E
    (2.0**-10, 0x00),  # subnormal: 0 | 2**-9 tie -> 0
    (-(2.0**-10), 0x80),  # ... and negative zero for a negative input
    (3 * 2.0**-10, 0x02),  # 2**-9 (0x01) | 2**-8 (0x02): tie -> 0x02
    (5 * 2.0**-10, 0x02),  # 2**-8 (0x02) | 3 * 2**-9 (0x03): tie -> 0x02
    (15 * 2.0**-10, 0x08),  # 7 * 2**-9 (0x07) | 2**-6 (0x08, smallest normal): tie -> 0x08
    (2.0**-6 + 2.0**-10, 0x08),  # 2**-6 | 2**-6 + 2**-9: tie -> 0x08 (normal side)
    (2.0**-140, 0x00),  # float32 subnormal-range inputs round to zero
    (-(2.0**-149), 0x80),
    (2.0**-10 + 2.0**-30, 0x01),  # just above the first subnormal midpoint
]


def test_fp8_e4m3_ties_and_subnormals_hand_built():
    x = torch.tensor([[v for v, _ in E4M3_CASES]], dtype=torch.float32)
    values, scales = fl.quantize_fp8_per_token(x)  # amax 448 -> pow2 scale 1
    assert scales.tolist() == [1.0]
    assert values.view(torch.uint8).flatten().tolist() == [b for _, b in E4M3_CASES]
    # the independent reference agrees with the hand-written bytes
    assert [e4m3_nearest(Fraction(v), str(v).startswith("-")) for v, _ in E4M3_CASES] == [
        b for _, b in E4M3_CASES
    ]


def test_fp8_e4m3_encoder_at_every_midpoint_and_its_float32_neighbours():
    # Each E4M3 value, each midpoint between neighbours (and above 448), and the float32
    # values up to 3 ulps either side of them, both signs: every rounding boundary the
    # integer encoder has, including the subnormal steps and the saturation at 464.
    points = [v for _, v in E4M3_FINITE] + [Fraction(464), Fraction(480), Fraction(2**20)]
    anchors = set(points)
    anchors.update((a + b) / 2 for a, b in itertools.pairwise(points))
    words = set()
    for anchor in anchors:
        word = float32_bits(float(anchor))  # every anchor is exact in float32
        words.update(w for w in range(word - 3, word + 4) if 0 <= w < 0x7F800000)
    words = sorted(words)
    magnitudes = torch.tensor(words, dtype=torch.int64).to(torch.int32).view(torch.float32)
    for negative in (False, True):
        x = -magnitudes if negative else magnitudes
        got = float32_to_e4m3_bits(x).tolist()
        for word, byte in zip(words, got, strict=True):
            value = struct.unpack("<f", struct.pack("<I", word))[0]
            assert byte == e4m3_nearest(Fraction(value), negative), (hex(word), negative)


@pytest.mark.parametrize(
    ("amax", "scale"),
    [
        (1.0, 2.0**-8),  # 2**0 / 448 = 2**-8.81 -> 2**-8
        (2.0**-3, 2.0**-11),
        (2.0**20, 2.0**12),
        (448.0 * 2.0**-10, 2.0**-10),  # exactly 448 * 2**k -> 2**k
        (448.0 * 2.0**-10 * (1 + 2.0**-23), 2.0**-9),  # one ulp above -> 2**(k + 1)
        (1.75 * 2.0**5, 2.0**-3),  # fraction exactly 0.75: 56 = 448 / 8
    ],
)
def test_fp8_pow2_scale_at_powers_of_two(amax, scale):
    x = torch.tensor([[-amax, amax / 2, 0.0]], dtype=torch.float32)
    values, scales = fl.quantize_fp8_per_token(x)
    assert scales.item() == scale
    # amax / scale is a power of two or 448 times one: exact in E4M3
    expected = [e4m3_nearest(Fraction(v) / Fraction(scale), v < 0) for v in (-amax, amax / 2)]
    assert values.view(torch.uint8).flatten().tolist()[:2] == expected


def test_fp8_amax_mode_is_the_correctly_rounded_quotient():
    gen = torch.Generator().manual_seed(61)
    magnitude = 10.0 ** (torch.rand(24, 1, generator=gen) * 8 - 4)
    x = torch.randn(24, 16, generator=gen) * magnitude
    values, scales = fl.quantize_fp8_per_token(x, scale_mode="amax")
    amax = x.abs().amax(-1)
    expected_scales = [round_to_float32(Fraction(a) / 448) for a in amax.tolist()]
    assert [float32_bits(s) for s in scales.tolist()] == [float32_bits(s) for s in expected_scales]
    # the data include rows where a float32 multiply by fl32(1/448) (CUDA's way to divide by a
    # Python number) is one ulp off, so this test tells the two apart
    by_reciprocal = amax * (torch.tensor(1.0) / torch.tensor(448.0))
    assert (by_reciprocal != torch.tensor(expected_scales)).any()
    for row in range(x.shape[0]):
        s = Fraction(scales[row].item())
        expected = [
            e4m3_nearest(Fraction(round_to_float32(Fraction(v) / s)), v < 0)
            for v in x[row].tolist()
        ]
        assert values[row].view(torch.uint8).tolist() == expected


def test_fp8_rows_below_the_floor_and_of_zeros():
    x = torch.tensor(
        [[2.0**-140, -(2.0**-149), 0.0, -0.0], [0.0, -0.0, 0.0, 0.0]], dtype=torch.float32
    )
    floor = Fraction(torch.tensor(1e-4, dtype=torch.float32).item())
    values, scales = fl.quantize_fp8_per_token(x)
    # floor 1e-4 = 1.6384 * 2**-14 (fraction <= 0.75) -> 2**(-14 - 8)
    assert scales.tolist() == [2.0**-22, 2.0**-22]
    assert values.view(torch.uint8).tolist() == [[0x00, 0x80, 0x00, 0x80], [0x00, 0x80, 0x00, 0x00]]
    values, scales = fl.quantize_fp8_per_token(x, scale_mode="amax")
    assert scales.tolist() == [round_to_float32(floor / 448)] * 2
    assert values.view(torch.uint8).tolist() == [[0x00, 0x80, 0x00, 0x80], [0x00, 0x80, 0x00, 0x00]]


def test_fp8_non_finite_rows_get_the_same_bytes_in_both_modes():
    x = torch.tensor([[1.0, float("inf"), -2.0], [1.0, float("nan"), -2.0], [3.0, -1.0, 0.5]])
    for mode in ("pow2", "amax"):
        values, scales = fl.quantize_fp8_per_token(x, scale_mode=mode)
        assert scales[0].item() == float("inf")
        assert float32_bits(scales[1].item()) == 0x7FC00000  # canonical quiet NaN
        # finite / inf = +-0; inf / inf and anything / NaN = NaN, stored as 0x7F
        assert values[:2].view(torch.uint8).tolist() == [[0x00, 0x7F, 0x80], [0x7F, 0x7F, 0x7F]]
    assert fl.quantize_fp8_per_token(x)[1][2].item() == 2.0**-7  # the finite row is untouched


# --- MXFP4 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("amax", "byte"),
    [
        (1.0, 125),  # 2**0 / 6: smallest s = 2**-2 (1 / 0.25 = 4 <= 6; 1 / 0.125 = 8 > 6)
        (4.0, 127),  # 4 / 1 = 4 <= 6, 4 / 0.5 = 8 > 6
        (2.0**-100, 25),  # 2**-100 -> 2**-102
        (6.0 * 2.0**-120, 7),  # exactly 6 * 2**k -> 127 + k
        (1.5 * 2.0**-126, 0),  # float32 smallest normal range: byte clamps to 0
        (2.0**-140, 0),  # float32 subnormal
        (2.0**-1074, 0),  # float64 subnormal
    ],
)
def test_mxfp4_scale_byte_at_powers_of_two_and_subnormals(amax, byte):
    assert fl.ue8m0_scale_bytes(torch.tensor([amax, -amax], dtype=torch.float64)).tolist() == [
        byte,
        byte,
    ]


def test_mxfp4_zero_negative_zero_and_subnormal_groups():
    x = torch.zeros(3, 32, dtype=torch.float32)
    x[1] = -0.0
    x[2, 0], x[2, 1], x[2, 2] = 2.0**-140, -(2.0**-149), 6 * 2.0**-140
    packed, scales = fl.quantize_mxfp4(x)
    assert scales.flatten().tolist() == [0, 0, 0]  # amax 0 / below 6 * 2**-127 -> byte 0
    assert packed[0].tolist() == [0x00] * 16
    assert packed[1].tolist() == [0x88] * 16  # every nibble is negative zero
    # scale 2**-127: 2**-140 * 2**127 = 2**-13 and 6 * 2**-13 both round to 0; sign copied
    assert packed[2].tolist() == [0x80, 0x00] + [0x00] * 14


def test_mxfp4_nan_and_inf_groups():
    x = torch.ones(2, 32, dtype=torch.float32)
    x[0, 0], x[1, 1] = float("nan"), float("-inf")
    packed, scales = fl.quantize_mxfp4(x)
    assert scales.flatten().tolist() == [254, 254]
    # NaN -> nibble 0; 1 * 2**-127 rounds to 0; -inf saturates to -6 (0xF)
    assert codes_of(packed[0])[:2] == [0x0, 0x0]
    assert codes_of(packed[1])[:2] == [0x0, 0xF]


# --- NVFP4 -----------------------------------------------------------------------------------


def test_nvfp4_block_scale_ties_subnormals_and_zero_blocks():
    blocks = torch.zeros(5, 16, dtype=torch.float32)
    # amax 18 * 2**-10: / 6 = 3 * 2**-10, the e4m3 tie 2**-9 | 2**-8 -> 2**-8 (0x02); the
    # values are then x * 256: 4.5 is the E2M1 tie 4 | 6 -> 4 (code 6), 2**-10 * 256 = 0.25
    # is the tie 0 | 0.5 -> 0.
    blocks[0, 0], blocks[0, 1], blocks[0, 2] = 18 * 2.0**-10, -(2.0**-10), 2 * 2.0**-10
    # amax 6 * 2**-10: / 6 = 2**-10, the tie 0 | 2**-9 -> scale 0, every nibble 0 (sign kept)
    blocks[1, 0], blocks[1, 1] = 6 * 2.0**-10, -(2.0**-12)
    blocks[2] = -0.0  # negative-zero block: scale 0, nibbles 8
    # zero block (row 3) stays all zero; row 4 saturates: 6000 / 6 = 1000 -> 448 (0x7E)
    blocks[4, 0] = 6000.0
    packed, sf = fl.nvfp4_quantize(blocks, 1.0, swizzled=False)
    assert sf.flatten().tolist() == [0x02, 0x00, 0x00, 0x00, 0x7E]
    assert codes_of(packed[0])[:3] == [0x6, 0x8, 0x1]  # 2 * 2**-10 * 256 = 0.5 -> code 1
    assert codes_of(packed[1])[:2] == [0x0, 0x8]
    assert codes_of(packed[2]) == [0x8] * 16
    assert codes_of(packed[3]) == [0x0] * 16
    # 6000 * (1 / 448) = 13.39 -> saturates to 6
    assert codes_of(packed[4])[:2] == [0x7, 0x0]


def test_nvfp4_global_scale_is_the_correctly_rounded_quotient():
    gen = torch.Generator().manual_seed(62)
    tensors = [torch.randn(8, 16, generator=gen) * 10.0 ** (i - 4) for i in range(12)]
    got = [fl.nvfp4_global_scale(t).item() for t in tensors]
    amaxes = [Fraction(t.abs().amax().item()) for t in tensors]
    expected = [round_to_float32(2688 / a) for a in amaxes]
    assert [float32_bits(g) for g in got] == [float32_bits(e) for e in expected]
    # ``2688 / amax`` in PyTorch is amax.reciprocal() * 2688, two roundings: off by an ulp for
    # some of these, so the test separates the two
    two_roundings = [(t.abs().amax().reciprocal() * 2688).item() for t in tensors]
    assert two_roundings != expected


E2M1_GRID = [Fraction(v) for v in ("0", "0.5", "1", "1.5", "2", "3", "4", "6")]


def e2m1_nearest(q: Fraction, negative: bool) -> int:
    """E2M1 nibble nearest to ``q`` (ties to the even code), saturating at 6."""
    mag = abs(q)
    code = min(range(8), key=lambda c: (abs(E2M1_GRID[c] - mag), c & 1))
    return code | (0x8 if negative else 0)


def test_nvfp4_scales_and_values_match_exact_reference():
    gen = torch.Generator().manual_seed(63)
    a = torch.randn(16, 64, generator=gen) * 10.0 ** (torch.rand(16, 1, generator=gen) * 4 - 2)
    g = Fraction(7)
    packed, sf = fl.nvfp4_quantize(a, 7.0, swizzled=False)
    codes = torch.stack((packed & 0xF, packed >> 4), -1).flatten(-2)
    blocks = a.reshape(16, 4, 16).tolist()
    for r in range(16):
        for c in range(4):
            # fl32(fl32(amax / 6) * g) -> e4m3; values fl32(x * fl32(g / scale)) -> e2m1
            amax = max(abs(Fraction(v)) for v in blocks[r][c])
            target = round_to_float32(Fraction(round_to_float32(amax / 6)) * g)
            assert sf[r, c].item() == e4m3_nearest(Fraction(target), False)
            encode = Fraction(round_to_float32(g / e4m3_fraction(sf[r, c].item())))
            expected = [
                e2m1_nearest(Fraction(round_to_float32(Fraction(v) * encode)), v < 0)
                for v in blocks[r][c]
            ]
            assert codes[r, 16 * c : 16 * c + 16].tolist() == expected


def test_nvfp4_block_scale_divides_by_6_before_multiplying_by_the_global_scale():
    """fl32(fl32(amax / 6) * g), in that order: here the other order lands on an e4m3 tie."""
    # amax = 0x1.a92492p+4 (26.5714283). amax / 6 -> fl32 0x1.1b6db6p+2 (4.42857122);
    # x 7 = 30.99999857 -> fl32 0x1.effffep+4 (30.999998), below the e4m3 midpoint 31 of
    # 30 (0x5F) and 32 (0x60) -> 0x5F = 95. fl32(amax * 7) = 186 would give 186 / 6 = 31,
    # the tie, and the even byte 0x60 = 96.
    amax = float.fromhex("0x1.a92492p+4")
    target = round_to_float32(Fraction(round_to_float32(Fraction(amax) / 6)) * 7)
    assert target == float.fromhex("0x1.effffep+4")
    assert e4m3_nearest(Fraction(target), False) == 0x5F
    block = torch.zeros(1, 16)
    block[0, 3], block[0, 9] = amax, -1.0
    _, sf = fl.nvfp4_quantize(block, 7.0, swizzled=False)
    assert sf.tolist() == [[0x5F]]


# float64 values: zeros, subnormals, normals and infinities of both signs.
SIGN_CASES = [0.0, -0.0, 5e-324, -5e-324, 2.0**-1060, -(2.0**-140), 1.5, -1.5, 1e300, -1e300]
SIGN_CASES += [float("inf"), float("-inf")]
# (dtype, same-width int dtype, quiet NaN bit pattern with the sign bit set, without it)
NAN_PATTERNS = [
    (torch.float64, torch.int64, -(2**63) + 0x7FF8 * 2**48, 0x7FF8 * 2**48),
    (torch.float32, torch.int32, -(2**31) + 0x7FC00000, 0x7FC00000),
]


@pytest.mark.parametrize(("dtype", "int_dtype", "negative_nan", "positive_nan"), NAN_PATTERNS)
def test_sign_bit_reads_the_ieee_sign_bit(dtype, int_dtype, negative_nan, positive_nan):
    from flashinfer_layouts._bits import sign_bit

    x = torch.tensor(SIGN_CASES, dtype=torch.float64).to(dtype)
    # The reference: the top bit of each value's float64 pattern, read by struct (float32
    # values widen to float64 exactly, sign included).
    expected = [struct.pack("<d", v)[7] >= 0x80 for v in x.tolist()]
    assert sign_bit(x).tolist() == expected
    assert expected[:2] == [False, True]  # +0.0 and -0.0 are told apart
    nans = torch.tensor([negative_nan, positive_nan], dtype=int_dtype).view(dtype)
    assert sign_bit(nans).tolist() == [True, False]


def test_sign_bit_refuses_16_bit_floats():
    from flashinfer_layouts._bits import sign_bit

    with pytest.raises(TypeError, match=r"float32 or float64; got torch\.float16"):
        sign_bit(torch.zeros(2, dtype=torch.float16))


def test_the_e2m1_encoder_does_not_use_torch_signbit(monkeypatch):
    """Compiled for CUDA, torch.signbit of a float64 is ``x < 0`` (false for -0.0); the GPU
    test of compiled bytes would catch it, this one does on any machine."""

    def refuse(*args, **kwargs):
        raise AssertionError("torch.signbit called")

    monkeypatch.setattr(torch, "signbit", refuse)
    x = torch.tensor([[-0.0, 0.0, -1e-30, 1.0] * 8])
    packed, _ = fl.quantize_mxfp4(x)
    # scale 2**-2 (amax 1): byte 0 = -0.0 (0x8) | +0.0 << 4; byte 1 = -1e-30 rounded to -0
    # (0x8) | 1.0 / 2**-2 = 4 (code 6) << 4
    assert packed[0, :2].tolist() == [0x08, 0x68]
    fl.nvfp4_quantize(x, 1.0)
