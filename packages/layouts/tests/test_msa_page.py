"""Packed NVFP4 MSA page: region offsets, per-byte placement, V scale swizzle, views."""

from __future__ import annotations

import math

import flashinfer_layouts as fl
import pytest
import torch

GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def e4m3_value(b: int) -> float:
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 0xF, b & 7
    if e == 15 and m == 7:
        return math.nan
    return sign * (m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


E4M3 = torch.tensor([e4m3_value(b) for b in range(256)], dtype=torch.float64)


def representable(gen: torch.Generator, pages: int, heads: int, global_sf: float):
    """Random K/V exactly representable in NVFP4 with known codes and scale bytes."""
    codes = torch.randint(0, 16, (pages, heads, 128, 128), generator=gen)
    codes[..., ::16] = 7  # each 16-block holds +6: its e4m3 scale is amax / 6 * global_sf
    scale_bytes = torch.randint(0x28, 0x68, (pages, heads, 128, 8), generator=gen)
    values = torch.where(codes >= 8, -GRID[codes % 8], GRID[codes % 8])
    x = values * E4M3[scale_bytes].repeat_interleave(16, dim=-1) / global_sf
    return x.float(), codes, scale_bytes


def test_region_offsets():
    assert tuple(fl.msa_page_offsets(4)) == (0, 32768, 36864, 69632, 73728)
    assert tuple(fl.msa_page_offsets(1)) == (0, 8192, 9216, 17408, 18432)
    assert tuple(fl.msa_page_offsets(8)) == (0, 65536, 73728, 139264, 147456)
    offsets = fl.msa_page_offsets(4)
    assert offsets.k_scale == 32768 and offsets.v_data == 36864
    assert offsets.v_scale == 69632 and offsets.page_bytes == 73728


def test_pack_places_every_byte():
    gen = torch.Generator().manual_seed(31)
    num_pages, heads = 2, 4
    k, k_codes, k_sf = representable(gen, num_pages, heads, 2.0)
    v, v_codes, v_sf = representable(gen, num_pages, heads, 0.5)
    pages = fl.pack_nvfp4_msa_pages(k, v, 2.0, 0.5)
    assert pages.shape == (num_pages, 73728) and pages.dtype == torch.uint8

    p = torch.arange(num_pages).view(-1, 1, 1, 1)
    h = torch.arange(heads).view(1, -1, 1, 1)
    t = torch.arange(128).view(1, 1, -1, 1)
    j = torch.arange(64).view(1, 1, 1, -1)
    s = torch.arange(8).view(1, 1, 1, -1)

    def data_bytes(codes):
        return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)

    # K data: [head][token][64 bytes] from byte 0
    assert torch.equal(pages[p, h * 8192 + t * 64 + j], data_bytes(k_codes))
    # K scales: linear [head][token][8] from byte 32768
    assert torch.equal(pages[p, 32768 + h * 1024 + t * 8 + s], k_sf.to(torch.uint8))
    # V data: same layout from byte 36864
    assert torch.equal(pages[p, 36864 + h * 8192 + t * 64 + j], data_bytes(v_codes))
    # V scales: per head tile from byte 69632, token t scale s at 32*(t//4) + 4*s + t%4
    v_off = 69632 + h * 1024 + 32 * (t // 4) + 4 * s + t % 4
    assert torch.equal(pages[p, v_off], v_sf.to(torch.uint8))


def test_v_scale_swizzle_hand_offsets():
    # tile byte of (token, scale): 32*(t//4) + 4*s + t%4
    hand = [((0, 0), 0), ((1, 0), 1), ((3, 0), 3), ((0, 1), 4), ((4, 0), 32), ((5, 7), 61)]
    hand += [((127, 7), 1023), ((6, 2), 42)]
    scales = torch.arange(1024).reshape(128, 8)  # value = linear index 8t + s
    raw = fl.swizzle_msa_v_scales((scales % 251).to(torch.uint8)).flatten()
    for (t, s), offset in hand:
        assert raw[offset] == (8 * t + s) % 251, (t, s)
    assert torch.equal(fl.unswizzle_msa_v_scales(raw.view(128, 8)), (scales % 251).to(torch.uint8))


def test_views_are_zero_copy_strided_regions():
    gen = torch.Generator().manual_seed(32)
    k, _, k_sf = representable(gen, 3, 4, 1.0)
    v, _, v_sf = representable(gen, 3, 4, 1.0)
    pages = fl.pack_nvfp4_msa_pages(k, v, 1.0, 1.0)
    k_data, k_scale, v_data, v_scale = fl.msa_page_views(pages, 4)
    base = pages.data_ptr()
    starts = [x.data_ptr() - base for x in (k_data, k_scale, v_data, v_scale)]
    assert starts == [0, 32768, 36864, 69632]
    assert k_data.shape == v_data.shape == (3, 4, 128, 64)
    assert k_scale.shape == v_scale.shape == (3, 4, 128, 8)
    assert k_data.stride() == (73728, 8192, 64, 1) and k_scale.stride() == (73728, 1024, 8, 1)
    assert torch.equal(k_scale, k_sf.to(torch.uint8))
    # raw v_scale[p, h, i, j] holds token 4*(i//4) + j%4, scale index 2*(i%4) + j//4
    i = torch.arange(128).view(-1, 1)
    j = torch.arange(8).view(1, -1)
    assert torch.equal(
        v_scale, v_sf[:, :, 4 * (i // 4) + j % 4, 2 * (i % 4) + j // 4].to(torch.uint8)
    )
    assert torch.equal(fl.unswizzle_msa_v_scales(v_scale), v_sf.to(torch.uint8))
    assert torch.equal(fl.dequantize_msa_v_scales(v_scale), E4M3[v_sf].float())
    # a write through the page is visible in the view (shared storage)
    pages[1, 32768 + 1024 + 8 * 5 + 3] = 0x11
    assert k_scale[1, 1, 5, 3] == 0x11
    # e4m3 scale views, and views of a row slice of the pool
    _, k_scale8, _, _ = fl.msa_page_views(pages[1:], 4, scale_dtype=torch.float8_e4m3fn)
    assert k_scale8.dtype == torch.float8_e4m3fn
    assert k_scale8.data_ptr() == base + 73728 + 32768


def test_unpack_exact_for_representable_and_bounded_for_random():
    gen = torch.Generator().manual_seed(33)
    k, _, _ = representable(gen, 2, 2, 4.0)
    v, _, _ = representable(gen, 2, 2, 0.25)
    pages = fl.pack_nvfp4_msa_pages(k, v, 4.0, torch.tensor(0.25))
    k2, v2 = fl.unpack_nvfp4_msa_pages(pages, 2, 4.0, 0.25, dtype=torch.float64)
    assert torch.equal(k2, k.double()) and torch.equal(v2, v.double())

    k = torch.randn(2, 2, 128, 128, generator=gen)
    v = torch.randn(2, 2, 128, 128, generator=gen) * 30
    gk, gv = fl.nvfp4_global_scale(k), fl.nvfp4_global_scale(v)
    pages = fl.pack_nvfp4_msa_pages(k, v, gk, gv)
    k2, v2 = fl.unpack_nvfp4_msa_pages(pages, 2, gk, gv, dtype=torch.float64)
    k_data, k_scale, v_data, v_scale = fl.msa_page_views(pages, 2)
    k_block_scale = E4M3[k_scale.long()]
    v_block_scale = fl.dequantize_msa_v_scales(v_scale).double()
    for x, x2, scale, g in ((k, k2, k_block_scale, gk), (v, v2, v_block_scale, gv)):
        # half the E2M1 step at |x| / step, as for nvfp4_quantize
        step = (scale / g.double()).repeat_interleave(16, dim=-1)
        bound = torch.maximum(torch.full_like(step, 0.25), x.double().abs() / (4 * step)) * step
        assert ((x2 - x.double()).abs() <= bound * (1 + 1e-6)).all()
    # K rows are exactly what nvfp4_quantize produces for the same rows (linear scales)
    ref_fp4, ref_sf = fl.nvfp4_quantize(k[1, 0], gk, swizzled=False)
    assert torch.equal(k_data[1, 0], ref_fp4) and torch.equal(k_scale[1, 0], ref_sf)
    ref_fp4, ref_sf = fl.nvfp4_quantize(v[0, 1], gv, swizzled=False)
    assert torch.equal(v_data[0, 1], ref_fp4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_unpack_is_the_float32_quotient_then_cast(dtype):
    """k = e2m1 * e4m3_scale / global_sf rounded once to float32, then to ``dtype``; global
    scales 7 and 7 + 2**-9 (not a float16) tell it from a reciprocal or float16 division."""
    gen = torch.Generator().manual_seed(34)
    gk, gv = 7.0, 7.0 + 2.0**-9
    k, k_codes, k_bytes = representable(gen, 1, 2, gk)
    v, v_codes, v_bytes = representable(gen, 1, 2, gv)
    pages = fl.pack_nvfp4_msa_pages(k, v, gk, gv)
    k2, v2 = fl.unpack_nvfp4_msa_pages(pages, 2, gk, gv, dtype=dtype)
    for got, codes, scale_bytes, g in ((k2, k_codes, k_bytes, gk), (v2, v_codes, v_bytes, gv)):
        values = torch.where(codes >= 8, -GRID[codes % 8], GRID[codes % 8])
        exact = values * E4M3[scale_bytes].repeat_interleave(16, dim=-1)  # exact in float64
        assert got.dtype == dtype
        assert torch.equal(got, (exact / g).float().to(dtype))


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (
            lambda: fl.pack_nvfp4_msa_pages(
                torch.ones(1, 4, 128, 64), torch.ones(1, 4, 128, 64), 1.0, 1.0
            ),
            ValueError,
            r"k.shape\[3\]",
        ),
        (
            lambda: fl.pack_nvfp4_msa_pages(
                torch.ones(1, 4, 64, 128), torch.ones(1, 4, 64, 128), 1.0, 1.0
            ),
            ValueError,
            r"k.shape\[2\]",
        ),
        (
            lambda: fl.pack_nvfp4_msa_pages(
                torch.ones(1, 4, 128, 128), torch.ones(1, 2, 128, 128), 1.0, 1.0
            ),
            ValueError,
            "v must have shape",
        ),
        (
            lambda: fl.pack_nvfp4_msa_pages(
                torch.ones(4, 128, 128), torch.ones(4, 128, 128), 1.0, 1.0
            ),
            ValueError,
            "k must be 4-D",
        ),
        (
            lambda: fl.pack_nvfp4_msa_pages(
                torch.ones(1, 1, 128, 128), torch.ones(1, 1, 128, 128, dtype=torch.int32), 1.0, 1.0
            ),
            TypeError,
            "v must have dtype",
        ),
        (
            lambda: fl.pack_nvfp4_msa_pages(
                torch.ones(1, 1, 128, 128), torch.ones(1, 1, 128, 128), 1.0, -2.0
            ),
            ValueError,
            "v_global_sf",
        ),
        (
            lambda: fl.msa_page_views(torch.zeros(2, 73728, dtype=torch.uint8), 2),
            ValueError,
            r"pages.shape\[1\]",
        ),
        (
            lambda: fl.msa_page_views(torch.zeros(2, 18432, dtype=torch.uint8), 0),
            ValueError,
            "num_kv_heads must be positive",
        ),
        (
            lambda: fl.msa_page_views(torch.zeros(18432, 2, dtype=torch.uint8).t(), 1),
            ValueError,
            "stride",
        ),
        (
            lambda: fl.msa_page_views(
                torch.zeros(2, 18432, dtype=torch.uint8), 1, scale_dtype=torch.float16
            ),
            TypeError,
            "scale_dtype",
        ),
        (
            lambda: fl.msa_page_views(torch.zeros(2, 18432, dtype=torch.int8), 1),
            TypeError,
            "pages must have dtype",
        ),
        (
            lambda: fl.unpack_nvfp4_msa_pages(torch.zeros(18432, dtype=torch.uint8), 1, 1.0, 1.0),
            ValueError,
            "pages must be 2-D",
        ),
        (
            lambda: fl.unswizzle_msa_v_scales(torch.zeros(64, 8, dtype=torch.uint8)),
            ValueError,
            r"must end in \(128, 8\)",
        ),
        # the message names this function's own argument, not the helper's ("raw")
        (
            lambda: fl.dequantize_msa_v_scales(torch.zeros(64, 8, dtype=torch.uint8)),
            ValueError,
            r"^v_scale must end in \(128, 8\)",
        ),
        (
            lambda: fl.dequantize_msa_v_scales(torch.zeros(128, 8)),
            TypeError,
            r"^v_scale must have dtype",
        ),
    ],
)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("num_kv_heads", [1, 4])
def test_zero_pages_pack_and_unpack_to_empty(num_kv_heads):
    k = torch.zeros(0, num_kv_heads, 128, 128)
    pages = fl.pack_nvfp4_msa_pages(k, k.clone(), 1.0, 1.0)
    assert pages.shape == (0, 18432 * num_kv_heads) and pages.dtype == torch.uint8
    k_hat, v_hat = fl.unpack_nvfp4_msa_pages(pages, num_kv_heads, 1.0, 1.0, dtype=torch.bfloat16)
    for t in (k_hat, v_hat):
        assert t.shape == (0, num_kv_heads, 128, 128) and t.dtype == torch.bfloat16
    k_data, k_scale, v_data, v_scale = fl.msa_page_views(pages, num_kv_heads)
    assert k_data.shape == v_data.shape == (0, num_kv_heads, 128, 64)
    assert k_scale.shape == v_scale.shape == (0, num_kv_heads, 128, 8)
