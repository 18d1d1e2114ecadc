"""Packed bytes against a reference written from the spec text, for random shapes and data.

The reference builders below follow the byte layouts of the attn_scores API spec, sentence
by sentence, with Python ints, ``struct`` and loops; they share nothing with the package. The
data are random (seeded) over the shapes the kernels take: block sizes 32, 64 and 128,
head_dim a multiple of 32, and the UE8M0 extremes (bytes 0 and 254) and all-zero groups
drawn on purpose.
"""

from __future__ import annotations

import math
import random
import struct

import flashinfer_layouts as fl
import pytest
import torch

SEEDS = range(6)
BLOCK_SIZES = (32, 64, 128)
HEAD_DIMS = (32, 64, 96, 128, 192, 256)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

# --- the spec's layouts, as written ---------------------------------------------------------


def fp8_block_ref(value_bytes: list[list[int]], scale_bits: list[int]) -> bytes:
    """FP8 ``kv_fused`` block: "bytes [0, block_size*head_dim): the FP8 values, token-major
    (token i at offset i*head_dim); bytes [block_size*head_dim, end): block_size little-endian
    float32 per-token scales (token i's scale at block_size*head_dim + 4*i)"."""
    region1 = bytes(byte for token in value_bytes for byte in token)
    region2 = b"".join(struct.pack("<I", bits) for bits in scale_bits)
    return region1 + region2


def nibbles_ref(codes: list[int]) -> list[int]:
    """Spec: "byte j ... holds element 2j in the LOW nibble and element 2j+1 in the HIGH
    nibble"."""
    return [codes[2 * j] | (codes[2 * j + 1] << 4) for j in range(len(codes) // 2)]


def q_sf_ref(scale_bytes: list[int]) -> int:
    """Spec: "Byte k of each int32 (k-th least significant, little-endian) is the UE8M0 scale
    ... of elements [k*sf_vec_size, (k+1)*sf_vec_size)"; returned as a signed int32."""
    (word,) = struct.unpack("<i", bytes(scale_bytes))
    return word


def mxfp4_block_ref(codes: list[list[int]], scales: list[list[int]], interleaved: bool) -> bytes:
    """MXFP4 ``kv_fused`` block: packed values token-major, then head_dim/32 scale bytes per
    token, token-major, or interleaved: "slot k holds the scale factor of token
    (k % 4) * (block_size // 4) + k // 4"."""
    block_size = len(codes)
    region1 = [byte for token in codes for byte in nibbles_ref(token)]
    if interleaved:
        token_of_slot = [(k % 4) * (block_size // 4) + k // 4 for k in range(block_size)]
    else:
        token_of_slot = list(range(block_size))
    region2 = [byte for k in range(block_size) for byte in scales[token_of_slot[k]]]
    return bytes(region1 + region2)


def e2m1_times_scale(code: int, scale_byte: int) -> float:
    """Exact value of nibble ``code`` under UE8M0 byte ``scale_byte`` (2 ** (byte - 127))."""
    value = math.ldexp(E2M1[code & 7], scale_byte - 127)
    return -value if code & 8 else value


# --- random data ----------------------------------------------------------------------------


def random_group(rng: random.Random) -> tuple[list[int], int]:
    """32 E2M1 codes and the scale byte that quantising their values must give back.

    One group in six is all (signed) zeros, scale byte 0; otherwise one element is +-6, which
    pins the scale to the drawn byte. Bytes 0 and 254, the extremes the quantiser produces,
    are drawn far more often than the rest.
    """
    if rng.random() < 1 / 6:
        return [rng.choice((0, 8)) for _ in range(32)], 0
    codes = [rng.randrange(16) for _ in range(32)]
    codes[rng.randrange(32)] = rng.choice((7, 15))
    return codes, rng.choice((0, 254, rng.randrange(255)))


def random_rows(rng: random.Random, rows: int, head_dim: int):
    """``rows`` rows of codes, scale bytes and their exact float64 values."""
    codes, scales, values = [], [], []
    for _ in range(rows):
        row_codes, row_scales = [], []
        for _ in range(head_dim // 32):
            group, byte = random_group(rng)
            row_codes += group
            row_scales.append(byte)
        codes.append(row_codes)
        scales.append(row_scales)
        values.append([e2m1_times_scale(c, row_scales[i // 32]) for i, c in enumerate(row_codes)])
    return codes, scales, values


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values and equal signs (so -0.0 and 0.0 differ)."""
    return torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b))


# --- FP8 kv_fused ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_fp8_kv_fused_matches_spec_bytes(seed):
    rng = random.Random(seed)
    nb, bs, d = rng.randint(1, 3), rng.choice(BLOCK_SIZES), rng.choice(HEAD_DIMS)
    value_bytes = [[[rng.randrange(256) for _ in range(d)] for _ in range(bs)] for _ in range(nb)]
    # any float32 bit pattern: NaN payloads, infinities, subnormals and -0.0 travel unchanged
    scale_bits = [[rng.getrandbits(32) for _ in range(bs)] for _ in range(nb)]
    values = torch.tensor(value_bytes, dtype=torch.uint8).view(torch.float8_e4m3fn)
    signed = [[b - (1 << 32) if b >= 1 << 31 else b for b in block] for block in scale_bits]
    scales = torch.tensor(signed, dtype=torch.int32).view(torch.float32)
    expected = [fp8_block_ref(value_bytes[b], scale_bits[b]) for b in range(nb)]

    kv = fl.pack_fp8_kv_cache(values, scales)
    assert kv.shape == (nb, bs, 1, d + 4) and kv.dtype == torch.uint8
    assert [bytes(kv[b].flatten().tolist()) for b in range(nb)] == expected

    spec_pool = torch.tensor([list(block) for block in expected], dtype=torch.uint8)
    values2, scales2 = fl.unpack_fp8_kv_cache(spec_pool.view(nb, bs, 1, d + 4))
    assert torch.equal(values2.view(torch.uint8), values.view(torch.uint8))
    assert torch.equal(scales2.view(torch.int32), scales.view(torch.int32))


# --- MXFP4 q / q_sf -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_mxfp4_q_and_q_sf_match_spec_bytes(seed):
    rng = random.Random(100 + seed)
    batch, next_n, heads = rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 8)
    codes, scales, values = random_rows(rng, batch * next_n * heads, 128)
    lead = (batch, next_n, heads)
    x = torch.tensor(values, dtype=torch.float64).view(*lead, 128)
    q_ref = torch.tensor([nibbles_ref(row) for row in codes], dtype=torch.uint8).view(*lead, 64)
    q_sf_ref_t = torch.tensor([q_sf_ref(row) for row in scales], dtype=torch.int32).view(lead)
    scale_bytes = torch.tensor(scales, dtype=torch.uint8).view(*lead, 4)

    q, q_sf = fl.quantize_mxfp4_q(x)  # exact: every value is representable
    assert torch.equal(q, q_ref) and torch.equal(q_sf, q_sf_ref_t)
    q2, q_sf2 = fl.pack_mxfp4_q(q_ref, scale_bytes)
    assert torch.equal(q2, q_ref) and torch.equal(q_sf2, q_sf_ref_t)
    packed, unpacked_scales = fl.unpack_mxfp4_q(q_ref, q_sf_ref_t)
    assert torch.equal(packed, q_ref) and torch.equal(unpacked_scales, scale_bytes)
    assert same_bits(fl.dequantize_mxfp4_q(q_ref, q_sf_ref_t, dtype=torch.float64), x)


# --- MXFP4 kv_fused -------------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_mxfp4_kv_fused_matches_spec_bytes(seed, interleaved):
    rng = random.Random(200 + seed)
    nb = rng.randint(1, 3)
    bs = 128 if interleaved else rng.choice(BLOCK_SIZES)
    d = rng.choice(HEAD_DIMS)
    codes, scales, values = random_rows(rng, nb * bs, d)
    blocks = [
        mxfp4_block_ref(codes[b * bs : (b + 1) * bs], scales[b * bs : (b + 1) * bs], interleaved)
        for b in range(nb)
    ]
    width = d // 2 + d // 32
    expected = torch.tensor([list(block) for block in blocks], dtype=torch.uint8)
    expected = expected.view(nb, bs, 1, width)
    x = torch.tensor(values, dtype=torch.float64).view(nb, bs, d)
    packed = torch.tensor([nibbles_ref(row) for row in codes], dtype=torch.uint8)
    packed = packed.view(nb, bs, d // 2)
    scale_bytes = torch.tensor(scales, dtype=torch.uint8).view(nb, bs, d // 32)

    assert torch.equal(fl.quantize_mxfp4_kv_cache(x, interleaved=interleaved), expected)
    assert torch.equal(
        fl.pack_mxfp4_kv_cache(packed, scale_bytes, interleaved=interleaved), expected
    )
    packed2, scales2 = fl.unpack_mxfp4_kv_cache(expected, interleaved=interleaved)
    assert torch.equal(packed2, packed) and torch.equal(scales2, scale_bytes)
    assert fl.mxfp4_kv_cache_head_dim(expected) == d
    deq = fl.dequantize_mxfp4_kv_cache(expected, interleaved=interleaved, dtype=torch.float64)
    assert same_bits(deq, x)


# --- UE8M0 extremes and non-finite inputs ---------------------------------------------------


@pytest.mark.parametrize("byte", [0, 254])
def test_ue8m0_extreme_scale_bytes(byte):
    # Every nibble in one 32-element group; the +-6 elements pin the scale byte. Documented:
    # byte b means 2 ** (b - 127) for every b, dequantisation is exact in float64 and then
    # cast to the requested dtype (so byte 254 overflows float32 where |e2m1| >= 2, and byte
    # 0 underflows float16).
    codes = list(range(16)) * 2
    x = torch.tensor([[e2m1_times_scale(c, byte) for c in codes]], dtype=torch.float64)
    packed, scales = fl.quantize_mxfp4(x)
    assert scales.tolist() == [[byte]]
    assert packed.tolist() == [nibbles_ref(codes)]
    assert same_bits(fl.dequantize_mxfp4(packed, scales, dtype=torch.float64), x)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert same_bits(fl.dequantize_mxfp4(packed, scales, dtype=dtype), x.to(dtype))
    if byte == 0:
        # float32 inputs reach byte 0 too: 2**-128 is a float32 subnormal, not flushed
        packed32, scales32 = fl.quantize_mxfp4(x.to(torch.float32))
        assert torch.equal(packed32, packed) and torch.equal(scales32, scales)


def test_negative_nan_and_infinities_follow_the_documented_rules():
    nan_bits = 0x7FC00000
    negative_nan = -torch.tensor(float("nan"))
    assert torch.signbit(negative_nan)  # the case float("nan") alone does not reach

    # FP8: a row holding NaN gets the canonical NaN scale and all-NaN values, stored as 0x7F
    # whatever the NaN's sign; float16 / bfloat16 NaN alike.
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        row = torch.tensor([[1.0, 0.0, -2.0, 0.5]], dtype=dtype)
        row[0, 1] = negative_nan
        for mode in ("pow2", "amax"):
            values, scales = fl.quantize_fp8_per_token(row, scale_mode=mode)
            assert values.view(torch.uint8).tolist() == [[0x7F] * 4]
            assert scales.view(torch.int32).item() == nan_bits

    # MXFP4: a group holding NaN or infinity gets byte 254; NaN elements nibble 0 (sign
    # dropped), infinities saturate to +-6, finite elements / 2**127 round to (signed) zero.
    x = torch.ones(3, 32)
    x[:, 1] = -1.0
    x[0, 0], x[1, 0], x[2, 0] = negative_nan, float("inf"), float("-inf")
    packed, scales = fl.quantize_mxfp4(x)
    assert scales.flatten().tolist() == [254, 254, 254]
    assert [row[:2] for row in packed.tolist()] == [[0x80, 0x00], [0x87, 0x00], [0x8F, 0x00]]
    # q_sf carries the 254 in the byte of that group
    q = torch.ones(1, 1, 1, 128)
    q[0, 0, 0, 70] = negative_nan  # group 2
    _, q_sf = fl.quantize_mxfp4_q(q)
    assert q_sf.item() == q_sf_ref([125, 125, 254, 125])
