"""FP8 per-token cache: byte layout pinned by hand-built blocks, quantisation rules and bounds."""

from __future__ import annotations

import math
import struct

import flashinfer_layouts as fl
import pytest
import torch


def e4m3_value(byte: int) -> float:
    """Independent E4M3 (fn) decoder: 1 sign, 4 exponent (bias 7), 3 mantissa bits."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * mantissa / 8 * 2.0**-6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def e4m3_values(values: torch.Tensor) -> torch.Tensor:
    table = torch.tensor([e4m3_value(b) for b in range(256)], dtype=torch.float64)
    return table[values.view(torch.uint8).long()]


def test_pack_hand_built_block_bytes():
    # e4m3 bytes: 1.0=0x38, 2.0=0x40, -1.0=0xB8, 0.5=0x30, 448=0x7E, 1.5=0x3C, -2.0=0xC0, 3.0=0x44
    value_bytes = torch.tensor(
        [[[0x38, 0x40, 0xB8, 0x30], [0x7E, 0x3C, 0xC0, 0x44]]], dtype=torch.uint8
    )
    values = value_bytes.view(torch.float8_e4m3fn)
    scales = torch.tensor([[1.0, 0.5]])  # 0x3F800000, 0x3F000000
    kv = fl.pack_fp8_kv_cache(values, scales)
    assert kv.shape == (1, 2, 1, 8) and kv.dtype == torch.uint8
    region1 = [0x38, 0x40, 0xB8, 0x30, 0x7E, 0x3C, 0xC0, 0x44]  # tok0 values, tok1 values
    region2 = [0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x3F]  # s0 = 1.0, s1 = 0.5 (LE fp32)
    assert kv.flatten().tolist() == region1 + region2


def test_pack_region_offsets_block32_dim128():
    gen = torch.Generator().manual_seed(1)
    nb, bs, d = 3, 32, 128
    value_bytes = torch.randint(0, 0x7E, (nb, bs, d), generator=gen, dtype=torch.uint8)
    scales = torch.rand(nb, bs, generator=gen) * 3 + 0.01
    kv = fl.pack_fp8_kv_cache(value_bytes.view(torch.float8_e4m3fn), scales)
    assert kv.shape == (nb, bs, 1, d + 4)
    flat = kv.reshape(nb, -1)
    for b in (0, 2):
        for i in (0, 1, 17, 31):
            for j in (0, 5, 127):
                assert flat[b, i * d + j] == value_bytes[b, i, j]
            le = struct.pack("<f", scales[b, i].item())
            assert bytes(flat[b, bs * d + 4 * i : bs * d + 4 * i + 4].tolist()) == le
    # Not 132-byte per-token rows: bytes 128..131 are token 1's first values, not token 0's scale.
    assert torch.equal(flat[:, d : d + 4], value_bytes[:, 1, :4])


def test_pack_matches_spec_cat_recipe():
    gen = torch.Generator().manual_seed(2)
    nb, bs, d = 4, 64, 64
    values = torch.randn(nb, bs, d, generator=gen).to(torch.float8_e4m3fn)
    scales = torch.rand(nb, bs, generator=gen)
    recipe = torch.cat(
        [values.view(torch.uint8).flatten(1), scales.view(torch.uint8).flatten(1)], dim=1
    ).view(nb, bs, 1, d + 4)
    assert torch.equal(fl.pack_fp8_kv_cache(values, scales), recipe)


def test_unpack_inverts_pack_and_handles_block_slices():
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(6, 32, 96, generator=gen).to(torch.float8_e4m3fn)
    scales = torch.rand(6, 32, generator=gen)
    kv = fl.pack_fp8_kv_cache(values, scales)
    v2, s2 = fl.unpack_fp8_kv_cache(kv[1::2])
    assert torch.equal(v2.view(torch.uint8), values[1::2].view(torch.uint8))
    assert torch.equal(s2, scales[1::2])
    # the outputs are copies: writing them leaves kv_fused alone
    before = kv.clone()
    v2.view(torch.uint8).fill_(0)
    assert torch.equal(kv, before)


def test_quantize_pow2_hand_example():
    x = torch.tensor([[1.0, -3.0, 0.5, 2.0]])
    values, scales = fl.quantize_fp8_per_token(x)
    # amax 3: 3/448 = 2**-7.22 -> scale 2**-7; x / scale = 128, -384, 64, 256, all exact in e4m3
    assert scales.tolist() == [2.0**-7]
    assert values.view(torch.uint8).flatten().tolist() == [0x70, 0xFC, 0x68, 0x78]


@pytest.mark.parametrize(
    ("amax", "scale"),
    [
        (448.0, 1.0),
        (56.0, 2.0**-3),  # 448 * 2**-3 exactly
        (449.0, 2.0),
        (float(torch.nextafter(torch.tensor(448.0), torch.tensor(1e9))), 2.0),
        (1.0, 2.0**-8),  # 1/448 = 2**-8.8 -> 2**-8
        (0.0, 2.0**-22),  # floor 1e-4: 1e-4/448 = 2**-22.09 -> 2**-22
    ],
)
def test_quantize_pow2_scale_is_smallest_power_of_two(amax, scale):
    x = torch.tensor([[amax, -amax / 3, 0.0]])
    values, scales = fl.quantize_fp8_per_token(x)
    assert scales.item() == scale
    assert torch.isfinite(e4m3_values(values)).all()
    assert amax / scale <= 448.0


def test_quantize_zero_rows_are_finite_zero():
    x = torch.zeros(2, 3, 64)
    for mode in ("pow2", "amax"):
        values, scales = fl.quantize_fp8_per_token(x, scale_mode=mode)
        assert (values.view(torch.uint8) == 0).all()
        assert torch.isfinite(scales).all() and (scales > 0).all()


def test_quantize_amax_mode_maps_row_max_to_448():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(50, 128, generator=gen) * 7
    values, scales = fl.quantize_fp8_per_token(x, scale_mode="amax")
    assert torch.equal(scales, x.abs().amax(-1) / 448)
    top = values.view(torch.uint8).gather(1, x.abs().argmax(-1, keepdim=True)).flatten()
    assert set(top.tolist()) <= {0x7E, 0xFE}  # +-448, never NaN (0x7F / 0xFF)


def test_quantize_rounds_ties_to_even():
    # scale 1 (row max 448). e4m3 step on [1, 2) is 1/8: 1.0625 lies between 1.0 (mantissa 000)
    # and 1.125 (001) -> 1.0; 1.1875 between 1.125 (001) and 1.25 (010) -> 1.25.
    # On [256, 448] the step is 32: 272 between 256 (000) and 288 (001) -> 256.
    x = torch.tensor([[448.0, 1.0625, 1.1875, -1.0625, 272.0]])
    values, scales = fl.quantize_fp8_per_token(x)
    assert scales.item() == 1.0
    assert values.view(torch.uint8).flatten().tolist() == [0x7E, 0x38, 0x3A, 0xB8, 0x78]


@pytest.mark.parametrize("mode", ["pow2", "amax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_error_bound(mode, dtype):
    # E4M3 keeps 3 mantissa bits: rounding error <= 2**-4 * |v| for |v| >= 2**-6 (normal),
    # and <= 2**-10 (half the subnormal step 2**-9) below, in units of the row scale. So
    # |values * scale - x| <= max(2**-4 |x|, 2**-10 scale), plus 2**-22 |x| in "amax" mode
    # for the float32 rounding of x / scale (the docstring's statement, with no other slack).
    gen = torch.Generator().manual_seed(5)
    magnitude = 10.0 ** (torch.rand(64, 1, generator=gen) * 8 - 4)
    x = (torch.randn(64, 256, generator=gen) * magnitude).to(dtype)
    values, scales = fl.quantize_fp8_per_token(x, scale_mode=mode)
    deq = e4m3_values(values) * scales.double().unsqueeze(-1)
    xd = x.double()
    bound = torch.maximum(2.0**-4 * xd.abs(), 2.0**-10 * scales.double().unsqueeze(-1))
    if mode == "amax":
        bound = bound + 2.0**-22 * xd.abs()
    assert ((deq - xd).abs() <= bound).all()


def test_amax_mode_quotient_rounded_onto_a_midpoint():
    # x / scale is 4.5000001 * 2**-9 exactly, just past the midpoint between the E4M3
    # subnormals 4 * 2**-9 and 5 * 2**-9; its float32 rounding is the midpoint itself, which
    # rounds to even (code 4). The error then exceeds max(2**-4 |x|, 2**-10 scale) by about
    # 3e-11, within the 2**-22 |x| (2.6e-10) the docstring adds for "amax" mode.
    row = torch.tensor([[54.5906867980957, 0.0010709842899814248]])
    values, scales = fl.quantize_fp8_per_token(row, scale_mode="amax")
    x, scale = row[0, 1].double(), scales[0].double()
    assert x / scale > 4.5 * 2.0**-9  # past the midpoint in exact arithmetic
    assert int(values.view(torch.uint8)[0, 1]) == 4  # rounded down from it
    error = (e4m3_values(values)[0, 1] * scale - x).abs()
    pow2_bound = max(2.0**-4 * x, 2.0**-10 * scale)
    assert pow2_bound < error <= pow2_bound + 2.0**-22 * x
    # The float32 reconstruction the docstring names stays within the same bound.
    float32_error = (values.float()[0, 1] * scales[0] - row[0, 1]).double().abs()
    assert float32_error <= pow2_bound + 2.0**-22 * x


def test_float64_input_rounded_onto_a_midpoint_in_pow2_mode():
    # float64 input is rounded to float32 first: 2**-18 + 2**-44 becomes 2**-18, which over the
    # pow2 scale 2**-8 is 2**-10, the midpoint between the E4M3 codes 0 and 2**-9; it rounds to
    # even (0). The error exceeds max(2**-4 |x|, 2**-10 scale) by 2**-44, within 2**-22 |x|.
    x = torch.tensor([[1.0, 2.0**-18 + 2.0**-44]], dtype=torch.float64)
    values, scales = fl.quantize_fp8_per_token(x, scale_mode="pow2")
    assert scales[0].item() == 2.0**-8 and int(values.view(torch.uint8)[0, 1]) == 0
    error = (e4m3_values(values)[0, 1] * scales[0].double() - x[0, 1]).abs()
    bound = max(2.0**-4 * x[0, 1], 2.0**-10 * scales[0].double())
    assert bound < error <= bound + 2.0**-22 * x[0, 1]


def test_representable_rows_round_trip_exactly():
    gen = torch.Generator().manual_seed(6)
    value_bytes = torch.randint(0, 0x7E, (8, 32, 64), generator=gen, dtype=torch.uint8)
    value_bytes |= torch.randint(0, 2, value_bytes.shape, generator=gen, dtype=torch.uint8) << 7
    value_bytes[:, :, 0] = 0x7E  # +448 pins the pow2 scale
    exps = torch.randint(-10, 10, (8, 32), generator=gen).double()
    scales = torch.pow(2.0, exps).float()
    x = e4m3_values(value_bytes.view(torch.float8_e4m3fn)).float() * scales.unsqueeze(-1)
    values, got_scales = fl.quantize_fp8_per_token(x)
    assert torch.equal(got_scales, scales)
    # e4m3 -0.0 (0x80) and +0.0 both decode to 0; compare the decoded values
    assert torch.equal(e4m3_values(values), e4m3_values(value_bytes.view(torch.float8_e4m3fn)))
    kv = fl.pack_fp8_kv_cache(values, got_scales)
    assert torch.equal(fl.dequantize_fp8_kv_cache(kv, dtype=torch.float64), x.double())


def test_dequantize_dtypes():
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 32, 128, generator=gen)
    kv = fl.pack_fp8_kv_cache(*fl.quantize_fp8_per_token(x))
    ref = fl.dequantize_fp8_kv_cache(kv, dtype=torch.float64)
    assert fl.dequantize_fp8_kv_cache(kv).dtype == torch.float32
    out16 = fl.dequantize_fp8_kv_cache(kv, dtype=torch.bfloat16)
    assert out16.dtype == torch.bfloat16
    assert torch.allclose(out16.double(), ref, rtol=2**-8, atol=0)
    assert fl.fp8_kv_cache_head_dim(kv) == 128


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_rounds_the_float32_product_once_then_casts(dtype):
    """values * scale is rounded to float32, then to ``dtype``: with amax-mode (not power of
    two) scales, multiplying in ``dtype`` would round the scale first and differ."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(2, 32, 64, generator=gen) * 10.0 ** (
        torch.rand(2, 32, 1, generator=gen) * 4 - 2
    )
    values, scales = fl.quantize_fp8_per_token(x, scale_mode="amax")
    assert (torch.frexp(scales).mantissa != 0.5).any()  # not all powers of two
    # e4m3 (4 significant bits) x float32 (24) is exact in float64; .float() is the one rounding
    exact = e4m3_values(values) * scales.double().unsqueeze(-1)
    expected = exact.float().to(dtype)
    got = fl.dequantize_fp8_kv_cache(fl.pack_fp8_kv_cache(values, scales), dtype=dtype)
    assert got.dtype == dtype
    assert torch.equal(got, expected)


def test_float64_dequantisation_is_the_exact_product():
    """e4m3 values (4 significant bits) times float32 scales (24) fit float64's 53: the float64
    result is the exact product, which a float32 product on the way would round."""
    values = torch.tensor([[[1.125, -3.25, 448.0, 2.0**-9]]]).to(torch.float8_e4m3fn)
    scales = torch.tensor([[1.0 + 2.0**-23]])
    got = fl.dequantize_fp8_kv_cache(fl.pack_fp8_kv_cache(values, scales), dtype=torch.float64)
    exact = torch.tensor([[[1.125, -3.25, 448.0, 2.0**-9]]], dtype=torch.float64) * (1.0 + 2.0**-23)
    assert torch.equal(got, exact)
    assert not torch.equal(got, exact.float().double())  # a float32 detour would differ


@pytest.mark.parametrize("mode", ["pow2", "amax"])
def test_float64_input_is_rounded_to_float32_first(mode):
    """A float64 row quantises exactly as the same row rounded to float32 does."""
    v = float.fromhex("0x1.32746a701fb09p+6")  # 76.61368727868..., not a float32
    x = torch.tensor([[v, -1.5, 0.1, 3.0], [-v, 1 / 3, 2.0**-20, 7.0]], dtype=torch.float64)
    # the input tells the two apart: amax / 448 rounds differently from fl32(amax) / 448
    amax = torch.tensor(v, dtype=torch.float64)
    assert (amax / 448).float() != (amax.float().double() / 448).float()
    values, scales = fl.quantize_fp8_per_token(x, scale_mode=mode)
    ref_values, ref_scales = fl.quantize_fp8_per_token(x.float(), scale_mode=mode)
    assert torch.equal(scales, ref_scales)
    assert torch.equal(values.view(torch.uint8), ref_values.view(torch.uint8))


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: fl.quantize_fp8_per_token([1.0]), TypeError, "x must be a torch.Tensor"),
        (
            lambda: fl.quantize_fp8_per_token(torch.ones(3, dtype=torch.int32)),
            TypeError,
            "x must have dtype",
        ),
        (lambda: fl.quantize_fp8_per_token(torch.ones(())), ValueError, "x must have at least 1"),
        (lambda: fl.quantize_fp8_per_token(torch.ones(2, 0)), ValueError, "non-empty last"),
        (
            lambda: fl.quantize_fp8_per_token(torch.ones(2, 4), scale_mode="ue8m0"),
            ValueError,
            "scale_mode",
        ),
        (
            lambda: fl.pack_fp8_kv_cache(torch.ones(1, 2, 4), torch.ones(1, 2)),
            TypeError,
            "values must have dtype",
        ),
        (
            lambda: fl.pack_fp8_kv_cache(torch.ones(2, 4).to(torch.float8_e4m3fn), torch.ones(2)),
            ValueError,
            "values must be 3-D",
        ),
        (
            lambda: fl.pack_fp8_kv_cache(
                torch.ones(1, 2, 4).to(torch.float8_e4m3fn), torch.ones(1, 3)
            ),
            ValueError,
            r"scales must have shape \(1, 2\)",
        ),
        (
            lambda: fl.pack_fp8_kv_cache(
                torch.ones(1, 2, 4).to(torch.float8_e4m3fn), torch.ones(1, 2, dtype=torch.float64)
            ),
            TypeError,
            "scales must have dtype",
        ),
        (
            lambda: fl.unpack_fp8_kv_cache(torch.zeros(1, 2, 1, 8, dtype=torch.int8)),
            TypeError,
            "kv_fused must have dtype",
        ),
        (
            lambda: fl.unpack_fp8_kv_cache(torch.zeros(2, 1, 8, dtype=torch.uint8)),
            ValueError,
            "kv_fused must be 4-D",
        ),
        (
            lambda: fl.unpack_fp8_kv_cache(torch.zeros(1, 2, 2, 8, dtype=torch.uint8)),
            ValueError,
            r"kv_fused.shape\[2\]",
        ),
        (
            lambda: fl.unpack_fp8_kv_cache(torch.zeros(1, 2, 1, 4, dtype=torch.uint8)),
            ValueError,
            r"kv_fused.shape\[3\]",
        ),
        (
            lambda: fl.dequantize_fp8_kv_cache(
                torch.zeros(1, 2, 1, 8, dtype=torch.uint8), dtype=torch.int32
            ),
            TypeError,
            "dtype must be",
        ),
    ],
)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
