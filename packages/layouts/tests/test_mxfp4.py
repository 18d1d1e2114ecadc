"""MXFP4: nibble order, UE8M0 rule, q_sf byte order, kv_fused regions and interleaved order."""

from __future__ import annotations

import flashinfer_layouts as fl
import pytest
import torch

# Independent reference: the E2M1 grid and a brute-force nearest search with ties to even.
GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def nearest_code(v: torch.Tensor) -> torch.Tensor:
    """E2M1 code (0..15) of scaled values by exhaustive search; ties go to the even code."""
    dist = (v.abs().unsqueeze(-1) - GRID).abs()
    best = dist.min(dim=-1, keepdim=True).values
    candidates = dist == best
    even = candidates & (torch.arange(8) % 2 == 0)
    code = torch.where(
        even.any(-1), even.to(torch.int64).argmax(-1), candidates.to(torch.int64).argmax(-1)
    )
    return code + 8 * torch.signbit(v).to(torch.int64)


def decode_codes(code: torch.Tensor) -> torch.Tensor:
    value = GRID[code % 8]
    return torch.where(code >= 8, -value, value)


def test_nibble_order_and_codes_hand_built():
    # One 32-element group whose amax is 6 -> scale byte 127 (2**0).
    row = [
        0.0,
        0.5,
        1.0,
        1.5,
        2.0,
        3.0,
        4.0,
        6.0,
        -0.5,
        -1.0,
        -1.5,
        -2.0,
        -3.0,
        -4.0,
        -6.0,
        0.0,
    ] + [0.0] * 16
    packed, scales = fl.quantize_mxfp4(torch.tensor([row]))
    assert scales.tolist() == [[127]]
    # byte j = element 2j (low nibble) | element 2j+1 (high nibble); sign = bit 3
    expected = [0x10, 0x32, 0x54, 0x76, 0xA9, 0xCB, 0xED, 0x0F] + [0x00] * 8
    assert packed.tolist() == [expected]


@pytest.mark.parametrize(
    ("amax", "byte"),
    [
        (6.0, 127),  # 6 / 2**0 = 6
        (6.0001, 128),
        (3.0, 126),
        (0.75, 124),  # 0.75 / 2**-3 = 6
        (7.0, 128),
        (12.0, 128),
        (12.5, 129),
        (1e-30, 25),  # 1e-30 / 6 = 2**-102.2 -> 2**-102
        (0.0, 0),
    ],
)
def test_ue8m0_scale_rule(amax, byte):
    x = torch.zeros(1, 32, dtype=torch.float64)
    x[0, 3] = -amax
    _, scales = fl.quantize_mxfp4(x)
    assert scales.item() == byte
    assert fl.ue8m0_scale_bytes(torch.tensor([amax], dtype=torch.float64)).item() == byte


def test_ties_to_even_and_negative_zero():
    # scale 1 (group amax 6); midpoints between grid neighbours go to the even code
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -5.0, -0.1, 6.0]
    codes = [0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x8, 0xA, 0xE, 0x8, 0x7]
    row = torch.tensor(ties + [0.0] * (32 - len(ties)))
    packed, scales = fl.quantize_mxfp4(row)
    assert scales.tolist() == [127]
    got = torch.stack((packed & 0xF, packed >> 4), -1).flatten()[: len(ties)]
    assert got.tolist() == codes


def test_saturation_when_scale_byte_clamps():
    # 1e300 needs 2**995: the byte clamps at 254 (2**127) and the value saturates to 6.
    x = torch.zeros(32, dtype=torch.float64)
    x[0], x[1] = 1e300, -1e300
    packed, scales = fl.quantize_mxfp4(x)
    assert scales.tolist() == [254]
    assert packed[0].item() == 0xF7  # +6 low, -6 high


def test_matches_bruteforce_reference_and_error_bound():
    gen = torch.Generator().manual_seed(11)
    magnitude = 10.0 ** (torch.rand(40, 4, 1, generator=gen) * 10 - 5)
    x = (torch.randn(40, 4, 32, generator=gen) * magnitude).reshape(40, 128)
    packed, scales = fl.quantize_mxfp4(x)
    s = torch.pow(2.0, scales.double() - 127).repeat_interleave(32, dim=-1)
    ref_codes = nearest_code(x.double() / s)
    codes = torch.stack((packed & 0xF, packed >> 4), -1).flatten(-2).long()
    assert torch.equal(codes, ref_codes)
    deq = fl.dequantize_mxfp4(packed, scales, dtype=torch.float64)
    assert torch.equal(deq, decode_codes(ref_codes) * s)
    # half the E2M1 step at |x|/s: 0.25 below 2, 0.5 on [2, 4], 1 on [4, 6] -> <= max(.25, |v|/4)
    bound = torch.maximum(torch.full_like(s, 0.25), x.double().abs() / (4 * s)) * s
    assert ((deq - x.double()).abs() <= bound).all()
    # and the scale is the smallest power of two with amax / s <= 6
    amax = x.double().reshape(40, 4, 32).abs().amax(-1)
    group_s = torch.pow(2.0, scales.double() - 127)
    assert (amax / group_s <= 6).all() and (amax / group_s > 3).all()


def test_representable_values_round_trip_exactly():
    gen = torch.Generator().manual_seed(12)
    codes = torch.randint(0, 16, (5, 3, 256), generator=gen)
    codes[..., ::32] = 7  # every group holds +6, pinning its scale
    scale_bytes = torch.randint(100, 150, (5, 3, 8), generator=gen)
    s = torch.pow(2.0, scale_bytes.double() - 127).repeat_interleave(32, dim=-1)
    x = (decode_codes(codes) * s).float()
    packed, scales = fl.quantize_mxfp4(x)
    assert torch.equal(scales.long(), scale_bytes)
    assert torch.equal(fl.dequantize_mxfp4(packed, scales), x)
    # sf_vec_size 16 groups: halves of the same data
    packed16, scales16 = fl.quantize_mxfp4(x, sf_vec_size=16)
    assert torch.equal(fl.dequantize_mxfp4(packed16, scales16, sf_vec_size=16), x)


def test_q_sf_byte_order():
    # groups k = 0..3 with amax 6 * 2**k -> scale bytes 0x7F, 0x80, 0x81, 0x82 -> int32 0x8281807F
    q = torch.zeros(1, 1, 2, 128)
    for k in range(4):
        q[0, 0, 0, 32 * k + 1] = 6.0 * 2**k
    q[0, 0, 1, 0] = 6.0 * 2**-2  # head 1: group 0 byte 0x7D, others 0 -> 0x0000007D
    q_packed, q_sf = fl.quantize_mxfp4_q(q)
    assert q_sf.dtype == torch.int32 and q_sf.shape == (1, 1, 2)
    assert q_sf[0, 0, 0].item() == 0x8281807F - (1 << 32)
    assert q_sf[0, 0, 1].item() == 0x7D
    assert q_packed.shape == (1, 1, 2, 64)
    assert q_packed[0, 0, 0, 0].item() == 0x70  # element 1 (high nibble) = +6 -> code 7
    # equals the uint8 [..., 4] tensor viewed as int32 (little-endian host)
    _, scales = fl.quantize_mxfp4(q)
    assert torch.equal(q_sf, scales.contiguous().view(torch.int32).squeeze(-1))


def test_q_pack_unpack_dequantize():
    gen = torch.Generator().manual_seed(13)
    q = torch.randn(2, 3, 64, 128, generator=gen)
    packed, scales = fl.quantize_mxfp4(q)
    q_packed, q_sf = fl.pack_mxfp4_q(packed, scales)
    q_packed2, q_sf2 = fl.quantize_mxfp4_q(q)
    assert torch.equal(q_packed, q_packed2) and torch.equal(q_sf, q_sf2)
    p2, s2 = fl.unpack_mxfp4_q(q_packed, q_sf)
    assert torch.equal(p2, packed) and torch.equal(s2, scales)
    assert torch.equal(fl.dequantize_mxfp4_q(q_packed, q_sf), fl.dequantize_mxfp4(packed, scales))


def test_kv_fused_regions_token_order():
    gen = torch.Generator().manual_seed(14)
    nb, bs, d = 2, 32, 128
    packed = torch.randint(0, 256, (nb, bs, d // 2), generator=gen, dtype=torch.uint8)
    scales = torch.randint(0, 255, (nb, bs, d // 32), generator=gen, dtype=torch.uint8)
    kv = fl.pack_mxfp4_kv_cache(packed, scales)
    assert kv.shape == (nb, bs, 1, 68)
    flat = kv.reshape(nb, -1)
    for i in (0, 1, 31):
        assert torch.equal(flat[:, 64 * i : 64 * i + 64], packed[:, i])
        assert torch.equal(flat[:, 2048 + 4 * i : 2048 + 4 * i + 4], scales[:, i])
    assert fl.mxfp4_kv_cache_head_dim(kv) == 128
    p2, s2 = fl.unpack_mxfp4_kv_cache(kv)
    assert torch.equal(p2, packed) and torch.equal(s2, scales)


# Slot k of a 128-token block holds token (k % 4) * 32 + k // 4, written out by hand:
HAND_INTERLEAVED_128 = [r * 32 + g for g in range(32) for r in range(4)]


def test_interleaved_order_hand_listed():
    assert HAND_INTERLEAVED_128[:12] == [0, 32, 64, 96, 1, 33, 65, 97, 2, 34, 66, 98]
    assert HAND_INTERLEAVED_128[-4:] == [31, 63, 95, 127]
    token_of_slot = fl.mxfp4_interleaved_token_of_slot(128)
    assert token_of_slot.tolist() == HAND_INTERLEAVED_128
    slot_of_token = fl.mxfp4_interleaved_slot_of_token(128)
    assert slot_of_token[token_of_slot].tolist() == list(range(128))
    assert slot_of_token[[0, 1, 32, 33, 127]].tolist() == [0, 4, 1, 5, 127]


def test_kv_fused_interleaved_bytes():
    gen = torch.Generator().manual_seed(15)
    nb, bs, d = 2, 128, 128
    packed = torch.randint(0, 256, (nb, bs, d // 2), generator=gen, dtype=torch.uint8)
    token_ids = torch.arange(bs, dtype=torch.uint8)
    scales = torch.stack((token_ids, 255 - token_ids, token_ids ^ 0x55, token_ids // 3), -1)
    scales = scales.expand(nb, bs, 4).clone()
    scales[1] ^= 0x0F
    kv = fl.pack_mxfp4_kv_cache(packed, scales, interleaved=True)
    flat = kv.reshape(nb, -1)
    region = 128 * 64
    assert torch.equal(flat[:, :region], packed.reshape(nb, -1))  # values unaffected
    for k in (0, 1, 2, 3, 4, 5, 63, 64, 126, 127):
        token = (k % 4) * (bs // 4) + k // 4
        assert torch.equal(flat[:, region + 4 * k : region + 4 * k + 4], scales[:, token])
    p2, s2 = fl.unpack_mxfp4_kv_cache(kv, interleaved=True)
    assert torch.equal(p2, packed) and torch.equal(s2, scales)
    # read with the wrong order, the scales come back permuted
    assert not torch.equal(fl.unpack_mxfp4_kv_cache(kv)[1], scales)


def test_quantize_kv_cache_round_trip_both_orders():
    gen = torch.Generator().manual_seed(16)
    k = torch.randn(3, 128, 128, generator=gen)
    ref = fl.dequantize_mxfp4(*fl.quantize_mxfp4(k))
    for interleaved in (False, True):
        kv = fl.quantize_mxfp4_kv_cache(k, interleaved=interleaved)
        assert torch.equal(fl.dequantize_mxfp4_kv_cache(kv, interleaved=interleaved), ref)


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: fl.quantize_mxfp4(torch.ones(2, 48)), ValueError, "multiple of 32"),
        (lambda: fl.quantize_mxfp4(torch.ones(2, 32), sf_vec_size=3), ValueError, "multiple of 2"),
        (
            lambda: fl.quantize_mxfp4(torch.ones(2, 32, dtype=torch.int64)),
            TypeError,
            "x must have dtype",
        ),
        (
            lambda: fl.dequantize_mxfp4(
                torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8)
            ),
            ValueError,
            r"scales must have shape \(2, 1\)",
        ),
        (
            lambda: fl.dequantize_mxfp4(
                torch.zeros(2, 16, dtype=torch.int8), torch.zeros(2, 1, dtype=torch.uint8)
            ),
            TypeError,
            "packed must have dtype",
        ),
        (lambda: fl.quantize_mxfp4_q(torch.ones(1, 1, 4, 64)), ValueError, r"q.shape\[3\]"),
        (lambda: fl.quantize_mxfp4_q(torch.ones(1, 4, 128)), ValueError, "q must be 4-D"),
        (
            lambda: fl.pack_mxfp4_q(
                torch.zeros(1, 1, 4, 64, dtype=torch.uint8),
                torch.zeros(1, 1, 4, 2, dtype=torch.uint8),
            ),
            ValueError,
            "scales must have shape",
        ),
        (
            lambda: fl.dequantize_mxfp4_q(
                torch.zeros(1, 1, 4, 64, dtype=torch.uint8), torch.zeros(1, 1, 4, dtype=torch.int64)
            ),
            TypeError,
            "q_sf must have dtype",
        ),
        (
            lambda: fl.dequantize_mxfp4_q(
                torch.zeros(1, 1, 4, 64, dtype=torch.uint8), torch.zeros(1, 1, 3, dtype=torch.int32)
            ),
            ValueError,
            "q_sf must have shape",
        ),
        (
            lambda: fl.pack_mxfp4_kv_cache(
                torch.zeros(1, 64, 64, dtype=torch.uint8),
                torch.zeros(1, 64, 4, dtype=torch.uint8),
                interleaved=True,
            ),
            ValueError,
            "block_size == 128",
        ),
        (
            lambda: fl.pack_mxfp4_kv_cache(
                torch.zeros(1, 32, 64, dtype=torch.uint8), torch.zeros(1, 32, 3, dtype=torch.uint8)
            ),
            ValueError,
            "scales must have shape",
        ),
        (
            lambda: fl.pack_mxfp4_kv_cache(
                torch.zeros(1, 32, 24, dtype=torch.uint8), torch.zeros(1, 32, 1, dtype=torch.uint8)
            ),
            ValueError,
            "multiple of 32",
        ),
        (
            lambda: fl.unpack_mxfp4_kv_cache(torch.zeros(1, 32, 1, 66, dtype=torch.uint8)),
            ValueError,
            r"17 \* head_dim / 32",
        ),
        (
            lambda: fl.unpack_mxfp4_kv_cache(
                torch.zeros(1, 32, 1, 68, dtype=torch.uint8), interleaved=True
            ),
            ValueError,
            "block_size == 128",
        ),
        (
            lambda: fl.unpack_mxfp4_kv_cache(
                torch.zeros(1, 128, 1, 68, dtype=torch.uint8), interleaved=1
            ),
            TypeError,
            "interleaved must be a bool",
        ),
        (
            lambda: fl.dequantize_mxfp4_kv_cache(torch.zeros(1, 32, 68, dtype=torch.uint8)),
            ValueError,
            "kv_fused must be 4-D",
        ),
        (
            lambda: fl.quantize_mxfp4_kv_cache(torch.ones(1, 64, 128), interleaved=True),
            ValueError,
            "block_size == 128",
        ),
        (lambda: fl.mxfp4_interleaved_token_of_slot(64), ValueError, "block_size == 128"),
        # packed's last dimension is 24; the message must not call 48 "the last dimension"
        (
            lambda: fl.dequantize_mxfp4(
                torch.zeros(2, 24, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.uint8)
            ),
            ValueError,
            r"^packed: head_dim \(2 \* packed.shape\[-1\]\) must be a multiple of "
            r"32 \(sf_vec_size\); got 48$",
        ),
        (
            lambda: fl.mxfp4_interleaved_token_of_slot(128, device="gpu0"),
            ValueError,
            r"^device must be a valid device such as 'cpu' or 'cuda:0'; got 'gpu0' \(",
        ),
        (
            lambda: fl.mxfp4_interleaved_slot_of_token(128, device=[0]),
            TypeError,
            r"^device must be a torch.device, a device string or an int; got list$",
        ),
    ],
)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("block_size", [128.0, "128", True, None])
@pytest.mark.parametrize(
    "fn", [fl.mxfp4_interleaved_token_of_slot, fl.mxfp4_interleaved_slot_of_token]
)
def test_interleaved_maps_need_an_int_block_size(fn, block_size):
    with pytest.raises(
        TypeError, match=rf"block_size must be an int; got {type(block_size).__name__}"
    ):
        fn(block_size)


def test_quantize_kv_cache_names_k_for_an_empty_head_dim():
    with pytest.raises(ValueError, match=r"^k must have a non-empty last dimension"):
        fl.quantize_mxfp4_kv_cache(torch.zeros(1, 32, 0))


def test_non_builtin_type_names_are_qualified():
    np = pytest.importorskip("numpy")
    packed, scales = fl.quantize_mxfp4(torch.ones(1, 128, 32))
    with pytest.raises(TypeError, match=r"interleaved must be a bool; got numpy\.bool$"):
        fl.pack_mxfp4_kv_cache(packed, scales, interleaved=np.bool_(True))
    with pytest.raises(TypeError, match=r"block_size must be an int; got numpy\.float64$"):
        fl.mxfp4_interleaved_token_of_slot(np.float64(128.0))


def test_scale_byte_255_decodes_as_two_to_the_128():
    # Documented: OCP MX's NaN byte is read as exponent 128, as the SM90 kernel reads it.
    packed = torch.full((1, 16), 0x21, dtype=torch.uint8)  # nibbles 1 (0.5), 2 (1.0)
    scales = torch.full((1, 1), 255, dtype=torch.uint8)
    got = fl.dequantize_mxfp4(packed, scales, dtype=torch.float64)
    assert got[0, :2].tolist() == [2.0**127, 2.0**128]


@pytest.mark.parametrize("sf_vec_size", [16, 32])
@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 3)])
def test_empty_rows_quantize_and_dequantize_to_empty(lead, sf_vec_size):
    # The shapes the non-empty formula gives: [..., D/2] and [..., D/sf_vec_size] uint8.
    packed, scales = fl.quantize_mxfp4(torch.zeros(*lead, 128), sf_vec_size=sf_vec_size)
    assert packed.shape == (*lead, 64) and packed.dtype == torch.uint8
    assert scales.shape == (*lead, 128 // sf_vec_size) and scales.dtype == torch.uint8
    out = fl.dequantize_mxfp4(packed, scales, sf_vec_size=sf_vec_size, dtype=torch.bfloat16)
    assert out.shape == (*lead, 128) and out.dtype == torch.bfloat16


def test_dequantize_an_empty_head_dim_gives_empty_rows():
    packed, scales = torch.zeros(3, 0, dtype=torch.uint8), torch.zeros(3, 0, dtype=torch.uint8)
    out = fl.dequantize_mxfp4(packed, scales, dtype=torch.float64)
    assert out.shape == (3, 0) and out.dtype == torch.float64


@pytest.mark.parametrize("shape", [(0, 1, 64), (2, 0, 64), (2, 1, 0)])
def test_empty_q_round_trips_to_empty(shape):
    q_packed, q_sf = fl.quantize_mxfp4_q(torch.zeros(*shape, 128))
    assert q_packed.shape == (*shape, 64) and q_packed.dtype == torch.uint8
    assert q_sf.shape == shape and q_sf.dtype == torch.int32
    out = fl.dequantize_mxfp4_q(q_packed, q_sf, dtype=torch.float16)
    assert out.shape == (*shape, 128) and out.dtype == torch.float16


@pytest.mark.parametrize(
    ("nb", "bs", "interleaved"), [(0, 32, False), (0, 128, True), (2, 0, False)]
)
def test_empty_kv_cache_round_trips_to_empty(nb, bs, interleaved):
    kv = fl.quantize_mxfp4_kv_cache(torch.zeros(nb, bs, 128), interleaved=interleaved)
    assert kv.shape == (nb, bs, 1, 68) and kv.dtype == torch.uint8
    out = fl.dequantize_mxfp4_kv_cache(kv, interleaved=interleaved, dtype=torch.float64)
    assert out.shape == (nb, bs, 128) and out.dtype == torch.float64
    packed, scales = fl.unpack_mxfp4_kv_cache(kv, interleaved=interleaved)
    assert packed.shape == (nb, bs, 64) and scales.shape == (nb, bs, 4)


def test_dequantize_an_empty_pool_without_quantizing():
    out = fl.dequantize_mxfp4_kv_cache(torch.zeros(0, 32, 1, 68, dtype=torch.uint8))
    assert out.shape == (0, 32, 128) and out.dtype == torch.float32


@pytest.mark.parametrize("sf_vec_size", [2**40, 256, 130])
@pytest.mark.parametrize(
    ("call", "arg"),
    [
        (lambda s: fl.quantize_mxfp4(torch.ones(2, 128), sf_vec_size=s), "x"),
        (
            lambda s: fl.dequantize_mxfp4(
                torch.zeros(2, 64, dtype=torch.uint8),
                torch.zeros(2, 1, dtype=torch.uint8),
                sf_vec_size=s,
            ),
            "packed",
        ),
    ],
)
def test_sf_vec_size_larger_than_head_dim_is_blamed_on_sf_vec_size(call, arg, sf_vec_size):
    with pytest.raises(
        ValueError,
        match=rf"^sf_vec_size must be an even divisor of {arg}'s head_dim \(128\); "
        rf"got {sf_vec_size}$",
    ):
        call(sf_vec_size)


@pytest.mark.parametrize(
    ("sf_vec_size", "exc", "match"),
    [
        (0, ValueError, r"^sf_vec_size must be positive; got 0$"),
        (-32, ValueError, r"^sf_vec_size must be positive; got -32$"),
        (3, ValueError, r"^sf_vec_size must be even .*; got 3$"),
        (32.0, TypeError, r"^sf_vec_size must be an int; got float$"),
        (True, TypeError, r"^sf_vec_size must be an int; got bool$"),
        # both could be at fault: the message names the argument and sf_vec_size
        (
            12,
            ValueError,
            r"^x: the last dimension \(head_dim\) must be a multiple of 12 \(sf_vec_size\); "
            r"got 128$",
        ),
    ],
)
def test_sf_vec_size_is_checked_before_x(sf_vec_size, exc, match):
    with pytest.raises(exc, match=match):
        fl.quantize_mxfp4(torch.ones(2, 128), sf_vec_size=sf_vec_size)


def test_q_pack_and_unpack_return_copies_not_the_callers_tensor():
    """Their docstrings promise contiguous copies: writing into a result must leave the
    caller's tensor alone (a plain `.contiguous()` of a contiguous input is the input)."""
    packed = torch.randint(0, 256, (2, 1, 64, 64), dtype=torch.uint8)
    scales = torch.randint(100, 150, (2, 1, 64, 4), dtype=torch.uint8)
    q, q_sf = fl.pack_mxfp4_q(packed, scales)
    before = packed.clone()
    q.zero_()
    assert torch.equal(packed, before)
    q, q_sf = fl.pack_mxfp4_q(packed, scales)
    unpacked, _ = fl.unpack_mxfp4_q(q, q_sf)
    unpacked.zero_()
    assert torch.equal(q, before)
