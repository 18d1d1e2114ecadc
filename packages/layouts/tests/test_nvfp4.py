"""NVFP4: block-scale rule, global-scale convention, 128x4 swizzle offsets, error bounds."""

from __future__ import annotations

import math
import struct

import flashinfer_layouts as fl
import pytest
import torch

GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def e4m3_table() -> torch.Tensor:
    """Independent decode of all 256 E4M3 (fn) bytes; NaN for 0x7F / 0xFF."""
    out = []
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 7
        if e == 15 and m == 7:
            out.append(math.nan)
        elif e == 0:
            out.append(sign * m / 8 * 2.0**-6)
        else:
            out.append(sign * (1 + m / 8) * 2.0 ** (e - 7))
    return torch.tensor(out, dtype=torch.float64)


E4M3 = e4m3_table()


def nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack((packed & 0xF, packed >> 4), -1).flatten(-2).long()


def decode_codes(code: torch.Tensor) -> torch.Tensor:
    value = GRID[code % 8]
    return torch.where(code >= 8, -value, value)


def test_hand_built_row_global_scale_one():
    row = [6.0, -6.0, 3.0, 1.5, 0.5, 0.0, 4.0, 2.0, -1.0, -0.5, 1.0, -3.0, -4.0, -1.5, -2.0, 0.0]
    a_fp4, a_sf = fl.nvfp4_quantize(torch.tensor([row]), 1.0, swizzled=False)
    assert a_sf.tolist() == [[0x38]]  # e4m3(6 / 6 * 1) = 1.0
    assert a_fp4.tolist() == [[0xF7, 0x35, 0x01, 0x46, 0x9A, 0xD2, 0xBE, 0x0C]]


def test_block_scale_rounds_ties_to_even_and_values_saturate():
    # block 0: amax 6.375 -> 6.375 / 6 = 1.0625, a tie between e4m3 1.0 and 1.125 -> 1.0;
    #          6.375 / 1.0 then saturates to 6 (code 7).
    # block 1: amax 6.75 -> 1.125 (0x39) exactly; 6.75 / 1.125 = 6.
    # block 2: global scale 2 doubles the encoded scale: amax 3 -> 3 / 6 * 2 = 1.0 (0x38).
    a = torch.zeros(2, 16)
    a[0, 0] = 6.375
    a[1, 0] = -6.75
    a_fp4, a_sf = fl.nvfp4_quantize(a, 1.0, swizzled=False)
    assert a_sf.flatten().tolist() == [0x38, 0x39]
    assert (a_fp4[:, 0] & 0xF).tolist() == [0x7, 0xF]
    a_fp4, a_sf = fl.nvfp4_quantize(torch.tensor([[3.0] + [0.0] * 15]), 2.0, swizzled=False)
    assert a_sf.tolist() == [[0x38]] and a_fp4[0, 0].item() == 0x07  # 3 * 2 / 1 = 6


# (row, col, offset) for a [300, 6] scale matrix (padded to [384, 8]):
# ((r//128)*(8/4) + c//4)*512 + (r%32)*16 + ((r%128)//32)*4 + c%4, worked by hand.
HAND_OFFSETS = [
    (0, 0, 0),
    (1, 0, 16),
    (31, 3, 31 * 16 + 3),  # 499
    (32, 0, 4),
    (100, 2, 78),  # 4*16 + 3*4 + 2
    (5, 5, 593),  # tile 1: 512 + 5*16 + 1
    (130, 1, 1057),  # tile 2: 1024 + 2*16 + 1
    (200, 4, 1672),  # tile 3: 1536 + 8*16 + 2*4
    (299, 5, 2741),  # tile 5: 2560 + 11*16 + 1*4 + 1
]


def test_swizzle_offsets_hand_computed():
    rows, cols = 300, 6
    sf = ((torch.arange(rows * cols) % 255) + 1).to(torch.uint8).reshape(rows, cols)
    swz = fl.swizzle_128x4(sf)
    assert swz.shape == (384, 8) == fl.swizzled_128x4_shape(rows, cols)
    flat = swz.flatten()
    for r, c, offset in HAND_OFFSETS:
        assert flat[offset] == sf[r, c], (r, c, offset)
        assert fl.swizzle_128x4_offset(r, c, cols) == offset
    assert int((flat != 0).sum()) == rows * cols  # padding bytes are zero
    assert torch.equal(fl.unswizzle_128x4(swz, rows, cols), sf)
    assert torch.equal(fl.unswizzle_128x4(flat, rows, cols), sf)
    # every scale lands where the formula says (tensor form of the offset function)
    r = torch.arange(rows).unsqueeze(1)
    c = torch.arange(cols)
    offsets = ((r // 128) * 2 + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    assert torch.equal(flat[offsets], sf)


def test_swizzled_output_equals_swizzled_linear_output():
    gen = torch.Generator().manual_seed(21)
    a = torch.randn(130, 80, generator=gen)
    g = fl.nvfp4_global_scale(a)
    fp4_s, sf_s = fl.nvfp4_quantize(a, g)
    fp4_l, sf_l = fl.nvfp4_quantize(a, g, swizzled=False)
    assert torch.equal(fp4_s, fp4_l)
    assert sf_l.shape == (130, 5) and sf_s.shape == (256, 8)
    assert torch.equal(sf_s, fl.swizzle_128x4(sf_l))
    assert torch.equal(
        fl.nvfp4_dequantize(fp4_s, sf_s, g), fl.nvfp4_dequantize(fp4_l, sf_l, g, swizzled=False)
    )
    assert torch.equal(
        fl.nvfp4_dequantize(fp4_s, sf_s.flatten(), g, m=130, k=80),
        fl.nvfp4_dequantize(fp4_s, sf_s, g),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_error_bound_and_scale_rule(dtype):
    gen = torch.Generator().manual_seed(22)
    magnitude = 10.0 ** (torch.rand(64, 8, 1, generator=gen) * 2 - 1)
    a = (torch.randn(64, 8, 16, generator=gen) * magnitude).reshape(64, 128).to(dtype)
    g = fl.nvfp4_global_scale(a)
    assert g.item() == pytest.approx(448 * 6 / a.float().abs().max().item(), rel=1e-6)
    a_fp4, a_sf = fl.nvfp4_quantize(a, g, swizzled=False)
    scale = E4M3[a_sf.long()]
    # the stored scale is the nearest finite e4m3 to amax / 6 * g
    target = a.double().reshape(64, 8, 16).abs().amax(-1) / 6 * g.double()
    finite = E4M3[~torch.isnan(E4M3)]
    nearest = (target.unsqueeze(-1) - finite).abs().min(-1).values
    assert torch.allclose((scale - target).abs(), nearest, rtol=0, atol=1e-12)
    assert (scale >= 2.0**-6).all()  # normal scales for this data: the bound below holds
    # |error| <= max(0.25, |v|/4) * scale / g + 2**-22 |x| with v = x * g / scale (half the
    # E2M1 step, saturation above 6 included since the e4m3 scale is at most 2**-4 below
    # amax/6*g; the second term for the float32 roundings, as the docstring states)
    deq = fl.nvfp4_dequantize(a_fp4, a_sf, g, swizzled=False, dtype=torch.float64)
    step = (scale / g.double()).repeat_interleave(16, dim=-1)
    v = a.double().abs() / step
    bound = torch.maximum(torch.full_like(v, 0.25), v / 4) * step + 2.0**-22 * a.double().abs()
    assert ((deq - a.double()).abs() <= bound).all()


def test_scaled_value_rounded_onto_an_e2m1_midpoint():
    # Block scale 1.625 (the block's amax is 1.625 * 6 / g), g = float32(0.37). The second
    # element's v = x * g / 1.625 is 0.2500000069 exactly, just past the E2M1 midpoint 0.25
    # between codes 0 and 1; x * float32(g / 1.625) rounds to 0.25 itself, which goes to the
    # even code 0. The error |x| then exceeds max(0.25, |v|/4) * scale / g by about 3e-8,
    # within the 2**-22 |x| (2.6e-7) the docstring adds.
    g = torch.tensor(0.37)
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1] = 1.625 * 6 / 0.37, 1.0979729890823364
    packed, scales = fl.nvfp4_quantize(x, g, swizzled=False)
    assert float(scales.view(torch.float8_e4m3fn).float()[0, 0]) == 1.625
    v = float(x[0, 1]) * float(g) / 1.625
    assert v > 0.25 and int(packed[0, 0]) >> 4 == 0
    back = fl.nvfp4_dequantize(packed, scales, g, swizzled=False, dtype=torch.float64)
    error = abs(float(back[0, 1]) - float(x[0, 1]))
    half_step_bound = max(0.25, v / 4) * 1.625 / float(g)
    assert half_step_bound < error <= half_step_bound + 2.0**-22 * float(x[0, 1])


def test_representable_values_round_trip_exactly():
    gen = torch.Generator().manual_seed(23)
    codes = torch.randint(0, 16, (40, 64), generator=gen)
    codes[:, ::16] = 7  # each block holds +6, so amax / 6 * g is its scale exactly
    scale_bytes = torch.randint(0x20, 0x70, (40, 4), generator=gen)
    g = 4.0
    x = decode_codes(codes) * E4M3[scale_bytes].repeat_interleave(16, dim=-1) / g
    a_fp4, a_sf = fl.nvfp4_quantize(x.float(), torch.tensor([g]), swizzled=False)
    assert torch.equal(a_sf.long(), scale_bytes)
    assert torch.equal(nibbles(a_fp4), codes)
    assert torch.equal(fl.nvfp4_dequantize(a_fp4, a_sf, g, swizzled=False, dtype=torch.float64), x)


# 7 + 2**-9 is a float32 but not a float16 (12 significant bits; float16 rounds it to 7): a
# division in float16 would round the global scale first.
@pytest.mark.parametrize("global_sf", [7.0, 7.0 + 2.0**-9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dequantize_is_the_float32_quotient_then_cast(dtype, global_sf):
    """e2m1 * e4m3_scale / a_global_sf, the quotient rounded once to float32, then to dtype."""
    gen = torch.Generator().manual_seed(25)
    a_fp4 = torch.randint(0, 256, (8, 32), generator=gen, dtype=torch.uint8)
    a_sf = torch.randint(0, 0x7F, (8, 4), generator=gen, dtype=torch.uint8)  # finite e4m3
    # the product is exact in float64; the float64 quotient of two float32-exact numbers,
    # rounded to float32, is the correctly rounded float32 quotient (53 >= 2 * 24 + 2)
    exact = decode_codes(nibbles(a_fp4)) * E4M3[a_sf.long()].repeat_interleave(16, dim=-1)
    expected = (exact / global_sf).float().to(dtype)
    got = fl.nvfp4_dequantize(a_fp4, a_sf, global_sf, swizzled=False, dtype=dtype)
    assert got.dtype == dtype
    assert torch.equal(got, expected)


@pytest.mark.parametrize("global_sf", [0.37, 7.0 + 2.0**-9, 3.0e-30])
def test_float64_dequantize_is_the_product_with_the_reciprocal(global_sf):
    """float64 output: the exact e2m1 * e4m3_scale times the correctly rounded float64
    reciprocal of the (float32) global scale, within one float64 ulp of the quotient."""
    gen = torch.Generator().manual_seed(26)
    a_fp4 = torch.randint(0, 256, (64, 64), generator=gen, dtype=torch.uint8)
    a_sf = torch.randint(0, 0x7F, (64, 8), generator=gen, dtype=torch.uint8)
    exact = decode_codes(nibbles(a_fp4)) * E4M3[a_sf.long()].repeat_interleave(16, dim=-1)
    g32 = struct.unpack("<f", struct.pack("<f", global_sf))[0]  # the float32 global scale
    got = fl.nvfp4_dequantize(a_fp4, a_sf, global_sf, swizzled=False, dtype=torch.float64)
    assert torch.equal(got, exact * (1.0 / g32))
    quotient = exact / g32
    assert ((got - quotient).abs() <= torch.finfo(torch.float64).eps * quotient.abs()).all()
    assert (got != quotient).any()  # the two forms differ here: the test tells them apart


def test_zero_matrix_and_tensor_global_scale():
    a = torch.zeros(3, 32)
    g = fl.nvfp4_global_scale(a)
    assert g.item() == 1.0
    a_fp4, a_sf = fl.nvfp4_quantize(a, g)
    assert (a_fp4 == 0).all() and (a_sf == 0).all()
    assert (fl.nvfp4_dequantize(a_fp4, a_sf, g) == 0).all()
    gen = torch.Generator().manual_seed(24)
    b = torch.randn(5, 32, generator=gen)
    as_float = fl.nvfp4_quantize(b, 123.5)
    as_tensor = fl.nvfp4_quantize(b, torch.tensor(123.5, dtype=torch.float64))
    assert all(torch.equal(x, y) for x, y in zip(as_float, as_tensor))


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: fl.nvfp4_quantize(torch.ones(4), 1.0), ValueError, "a must be 2-D"),
        (lambda: fl.nvfp4_quantize(torch.ones(4, 24), 1.0), ValueError, "multiple of 16"),
        (
            lambda: fl.nvfp4_quantize(torch.ones(4, 32, dtype=torch.int32), 1.0),
            TypeError,
            "a must have dtype",
        ),
        (
            lambda: fl.nvfp4_quantize(torch.ones(4, 32), 0.0),
            ValueError,
            "a_global_sf must be finite and positive as a float32",
        ),
        # Finite and positive as Python floats, but not once rounded to float32.
        (lambda: fl.nvfp4_quantize(torch.ones(4, 32), 1e39), ValueError, "is inf in float32"),
        (lambda: fl.nvfp4_quantize(torch.ones(4, 32), 1e-50), ValueError, "is 0.0 in float32"),
        (
            lambda: fl.nvfp4_quantize(torch.ones(4, 32), torch.tensor(1e39, dtype=torch.float64)),
            ValueError,
            "is inf in float32",
        ),
        (
            lambda: fl.nvfp4_dequantize(
                torch.zeros(4, 8, dtype=torch.uint8),
                torch.zeros(4, 1, dtype=torch.uint8),
                1.0,
                k="16",
                swizzled=False,
            ),
            TypeError,
            "k must be an int",
        ),
        (
            lambda: fl.nvfp4_dequantize(
                torch.zeros(4, 8, dtype=torch.uint8),
                torch.zeros(4, 1, dtype=torch.uint8),
                1.0,
                m=True,
                swizzled=False,
            ),
            TypeError,
            "m must be an int",
        ),
        (lambda: fl.nvfp4_quantize(torch.ones(4, 32), float("inf")), ValueError, "a_global_sf"),
        (
            lambda: fl.nvfp4_quantize(torch.ones(4, 32), torch.ones(2)),
            ValueError,
            "a_global_sf must hold exactly one",
        ),
        (
            lambda: fl.nvfp4_quantize(torch.ones(4, 32), torch.ones(1, dtype=torch.int32)),
            TypeError,
            "a_global_sf must be a floating",
        ),
        (
            lambda: fl.nvfp4_quantize(torch.ones(4, 32), torch.tensor(-1.0)),
            ValueError,
            "a_global_sf must be finite and positive",
        ),
        (
            lambda: fl.nvfp4_quantize(torch.ones(4, 32), "1"),
            TypeError,
            "a_global_sf must be a float",
        ),
        (
            lambda: fl.nvfp4_quantize(torch.ones(4, 32), 1.0, sf_vec_size=8),
            ValueError,
            "sf_vec_size must be one of",
        ),
        (
            lambda: fl.nvfp4_quantize(torch.ones(4, 32), 1.0, swizzled="yes"),
            TypeError,
            "swizzled must be a bool",
        ),
        (
            lambda: fl.nvfp4_dequantize(
                torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8), 1.0
            ),
            ValueError,
            "a_sf must have shape",
        ),
        (
            lambda: fl.nvfp4_dequantize(
                torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(100, dtype=torch.uint8), 1.0
            ),
            ValueError,
            r"a_sf \(flat swizzled\) must hold",
        ),
        (
            lambda: fl.nvfp4_dequantize(
                torch.zeros(4, 8, dtype=torch.uint8),
                torch.zeros(4, 2, dtype=torch.uint8),
                1.0,
                swizzled=False,
                m=5,
            ),
            ValueError,
            "m must equal",
        ),
        (
            lambda: fl.nvfp4_dequantize(
                torch.zeros(4, 8, dtype=torch.uint8),
                torch.zeros(4, 1, dtype=torch.uint8),
                1.0,
                swizzled=False,
                k=32,
            ),
            ValueError,
            r"^k must equal 2 \* a_fp4.shape\[1\] \(16\); got 32$",
        ),
        (
            lambda: fl.nvfp4_dequantize(
                torch.zeros(4, 8, dtype=torch.uint8),
                torch.zeros(4, 2, dtype=torch.uint8),
                1.0,
                swizzled=False,
            ),
            ValueError,
            r"a_sf must have shape \(4, 1\)",
        ),
        (
            lambda: fl.nvfp4_dequantize(
                torch.zeros(4, 8, dtype=torch.int8), torch.zeros(4, 2, dtype=torch.uint8), 1.0
            ),
            TypeError,
            "a_fp4 must have dtype",
        ),
        (lambda: fl.swizzle_128x4(torch.zeros(4, dtype=torch.uint8)), ValueError, "sf must be 2-D"),
        (lambda: fl.swizzle_128x4(torch.zeros(4, 4)), TypeError, "sf must have dtype"),
        (
            lambda: fl.unswizzle_128x4(torch.zeros(128, 4, dtype=torch.uint8), 129, 4),
            ValueError,
            "sf_swizzled must have shape",
        ),
    ],
)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("sf_vec_size", [16, 32])
def test_empty_matrix_quantizes_and_dequantizes_to_empty(sf_vec_size):
    n_sf = 64 // sf_vec_size
    a_fp4, a_sf = fl.nvfp4_quantize(torch.zeros(0, 64), 1.0, sf_vec_size=sf_vec_size)
    assert a_fp4.shape == (0, 32) and a_fp4.dtype == torch.uint8
    assert a_sf.shape == (0, 4) and a_sf.dtype == torch.uint8  # 0 rows; cols padded to 4
    a_fp4_l, a_sf_l = fl.nvfp4_quantize(
        torch.zeros(0, 64), 1.0, sf_vec_size=sf_vec_size, swizzled=False
    )
    assert a_fp4_l.shape == (0, 32) and a_sf_l.shape == (0, n_sf) and a_sf_l.dtype == torch.uint8
    for sf, swizzled in ((a_sf, True), (a_sf_l, False)):
        out = fl.nvfp4_dequantize(
            a_fp4, sf, 1.0, sf_vec_size=sf_vec_size, swizzled=swizzled, dtype=torch.float16
        )
        assert out.shape == (0, 64) and out.dtype == torch.float16


def test_empty_columns_quantize_and_dequantize_to_empty():
    a_fp4, a_sf = fl.nvfp4_quantize(torch.zeros(5, 0), 2.0)
    assert a_fp4.shape == (5, 0) and a_sf.shape == (128, 0)  # rows padded to 128
    _, a_sf_l = fl.nvfp4_quantize(torch.zeros(5, 0), 2.0, swizzled=False)
    assert a_sf_l.shape == (5, 0)
    out = fl.nvfp4_dequantize(a_fp4, a_sf, 2.0, dtype=torch.float64)
    assert out.shape == (5, 0) and out.dtype == torch.float64


def test_swizzle_offset_of_tensors_matches_ints():
    rows = torch.tensor([r for r, _, _ in HAND_OFFSETS], dtype=torch.int32)
    cols = torch.tensor([c for _, c, _ in HAND_OFFSETS])
    got = fl.swizzle_128x4_offset(rows, cols, 6)
    assert got.tolist() == [offset for _, _, offset in HAND_OFFSETS]
    grid = fl.swizzle_128x4_offset(torch.arange(300).unsqueeze(1), torch.arange(6), 6)
    assert grid.shape == (300, 6) and len(set(grid.flatten().tolist())) == 300 * 6
    empty = fl.swizzle_128x4_offset(torch.zeros(0, dtype=torch.int64), 0, 6)
    assert empty.shape == (0,)


def test_swizzle_offset_past_int32_from_int32_indices():
    # A scale buffer past 2 GiB: int32 indices give the int64 offset the int formula gives.
    row, col, num_cols = 2_000_000, 9_999, 10_000
    expected = fl.swizzle_128x4_offset(row, col, num_cols)
    assert expected > 2**31
    got = fl.swizzle_128x4_offset(
        torch.tensor([row], dtype=torch.int32), torch.tensor([col], dtype=torch.int32), num_cols
    )
    assert got.dtype == torch.int64 and got.tolist() == [expected]


@pytest.mark.parametrize(
    ("row", "col", "num_cols", "exc", "match"),
    [
        (-1, 0, 3, ValueError, r"^row must be >= 0; got -1$"),
        (0, -1, 3, ValueError, r"^col must be in \[0, 3\); got -1$"),
        # column 4 of a 3-column buffer would alias scale (128, 0) at byte 512
        (0, 4, 3, ValueError, r"^col must be in \[0, 3\); got 4$"),
        (0, 3, 3, ValueError, r"^col must be in \[0, 3\); got 3$"),
        (0, 0, 0, ValueError, r"^num_cols must be positive; got 0$"),
        (1.5, 0, 3, TypeError, r"^row must be an int or an int32 / int64 tensor; got float$"),
        (float("nan"), 0, 3, TypeError, r"^row must be an int or an int32 / int64 tensor"),
        (True, 0, 3, TypeError, r"^row must be an int or an int32 / int64 tensor; got bool$"),
        (None, 0, 3, TypeError, r"^row must be an int or an int32 / int64 tensor; got NoneType$"),
        (0, "1", 3, TypeError, r"^col must be an int or an int32 / int64 tensor; got str$"),
        (0, 0, 3.0, TypeError, r"^num_cols must be an int; got float$"),
        (0, 0, True, TypeError, r"^num_cols must be an int; got bool$"),
        (torch.tensor([0, -2]), 0, 3, ValueError, r"^row must be >= 0; got -2$"),
        (0, torch.tensor([[0], [5]]), 3, ValueError, r"^col must be in \[0, 3\); got 5$"),
        (torch.tensor([1.0]), 0, 3, TypeError, r"^row must have dtype torch.int32 or torch.int64"),
        # uint8 row * 16 would wrap around
        (torch.tensor([31], dtype=torch.uint8), 0, 3, TypeError, r"^row must have dtype"),
        (torch.tensor([True]), 0, 3, TypeError, r"^row must have dtype"),
        (
            torch.tensor([0, 1]),
            torch.tensor([0, 1, 2]),
            3,
            ValueError,
            r"^row and col must broadcast together; got shapes \(2,\) and \(3,\)$",
        ),
    ],
)
def test_swizzle_offset_argument_errors(row, col, num_cols, exc, match):
    with pytest.raises(exc, match=match):
        fl.swizzle_128x4_offset(row, col, num_cols)


def test_an_infinite_element_saturates_its_block_scale_at_448_and_itself_at_6():
    """scale = e4m3(min(amax / 6 * gsf, 448)): an infinite amax gives 448 (byte 0x7E, not the
    E4M3 NaN 0x7F), and the infinity itself rounds to E2M1's largest magnitude with its sign."""
    a = torch.zeros(2, 32)
    a[0, 3], a[0, 0] = float("inf"), 300.0  # 300 / 448 = 0.67: nearest E2M1 value 0.5 (code 1)
    a[1, 20] = -float("inf")
    values, scales = fl.nvfp4_quantize(a, 1.0, swizzled=False)
    assert scales.tolist() == [[0x7E, 0], [0, 0x7E]]
    assert values[0, :2].tolist() == [0x01, 0x70]  # element 0 low nibble, element 3 high
    assert values[1, 10].item() == 0x0F  # element 20, low nibble: -6
    assert int(values.count_nonzero()) == 3


def test_a_numpy_float32_global_scale_is_accepted():
    np = pytest.importorskip("numpy")
    a = torch.randn(4, 32, generator=torch.Generator().manual_seed(3))
    expected = fl.nvfp4_quantize(a, 2.5)
    got = fl.nvfp4_quantize(a, np.float32(2.5))
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_global_scale_of_tiny_or_infinite_inputs_is_a_scale_quantize_accepts():
    tiny = torch.full((1, 16), 1e-36)
    assert float(fl.nvfp4_global_scale(tiny)) == torch.finfo(torch.float32).max
    fl.nvfp4_quantize(tiny, fl.nvfp4_global_scale(tiny))  # accepted
    with_inf = torch.ones(1, 16)
    with_inf[0, 3] = float("inf")
    assert float(fl.nvfp4_global_scale(with_inf)) == 1.0


def test_small_elements_are_not_saturated_when_the_encode_factor_overflows_float32():
    """global scale / block scale beyond float32's range: each element's code must still be
    e2m1(x * global / scale), computed here in float64 independently of the package."""
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1] = 1e-38, 1e-40
    global_sf = fl.nvfp4_global_scale(x)  # about 2.7e38
    packed, scales = fl.nvfp4_quantize(x, global_sf, swizzled=False)
    scale = float(scales.view(torch.float8_e4m3fn).float()[0, 0])
    assert scale >= 2**-6 and float(global_sf) / scale > torch.finfo(torch.float32).max
    v = [float(x[0, i]) * float(global_sf) / scale for i in (0, 1)]  # about 6.1 and 0.061
    codes = [int(packed[0, 0]) & 0xF, int(packed[0, 0]) >> 4]
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    for value, code in zip(v, codes):
        nearest = min(range(8), key=lambda c: abs(grid[c] - min(value, 6.0)))
        assert code == nearest, (value, code)
    back = fl.nvfp4_dequantize(packed, scales, global_sf, swizzled=False, dtype=torch.float64)
    bound = [max(0.25, abs(value) / 4) * scale / float(global_sf) for value in v]
    for i in (0, 1):
        assert abs(float(back[0, i]) - float(x[0, i])) <= bound[i]


def float32_rounds_finite_positive(number: float) -> bool:
    """The reference: struct's float32 packing (round to nearest even; raises past the range)."""
    try:
        return 0.0 < struct.unpack("<f", struct.pack("<f", number))[0] < math.inf
    except OverflowError:
        return False


# Each float32 rounding edge of a global scale, and its float64 neighbours on both sides.
_EDGES = [2.0**-150, (2 - 2.0**-24) * 2.0**127, 2.0**-149, (2 - 2.0**-23) * 2.0**127]


@pytest.mark.parametrize(
    "number",
    [math.nextafter(e, d) for e in _EDGES for d in (0.0, math.inf)] + _EDGES,
)
def test_global_scale_is_checked_after_float32_rounding(number):
    a = torch.ones(2, 16)
    if float32_rounds_finite_positive(number):
        fl.nvfp4_quantize(a, number)
        fl.nvfp4_quantize(a, torch.tensor(number, dtype=torch.float64))
    else:
        with pytest.raises(ValueError, match="finite and positive as a float32"):
            fl.nvfp4_quantize(a, number)
        with pytest.raises(ValueError, match="finite and positive as a float32"):
            fl.nvfp4_quantize(a, torch.tensor(number, dtype=torch.float64))
