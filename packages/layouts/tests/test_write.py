"""Serving write path: written slots hold what pack produces, every other byte is untouched."""

from __future__ import annotations

import struct

import flashinfer_layouts as fl
import pytest
import torch


def random_pool(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)


def fp8_expected(pool, k, slots, scale_mode="pow2"):
    """Independent placement: bytes written one row at a time at the spec's offsets."""
    expected = pool.clone()
    nb, bs, _, width = pool.shape
    d = width - 4
    flat = expected.view(nb, bs * width)
    values, scales = fl.quantize_fp8_per_token(k, scale_mode=scale_mode)
    for i, slot in enumerate(slots):
        if slot < 0:
            continue
        block, tok = divmod(slot, bs)
        flat[block, tok * d : (tok + 1) * d] = values[i].view(torch.uint8)
        le = torch.tensor(list(struct.pack("<f", scales[i].item())), dtype=torch.uint8)
        flat[block, bs * d + 4 * tok : bs * d + 4 * tok + 4] = le
    return expected


def mxfp4_expected(pool, k, slots, interleaved):
    expected = pool.clone()
    nb, bs, _, width = pool.shape
    d = width * 32 // 17
    flat = expected.view(nb, bs * width)
    packed, scales = fl.quantize_mxfp4(k)
    for i, slot in enumerate(slots):
        if slot < 0:
            continue
        block, tok = divmod(slot, bs)
        flat[block, tok * d // 2 : (tok + 1) * d // 2] = packed[i]
        k_slot = 4 * (tok % (bs // 4)) + tok // (bs // 4) if interleaved else tok
        n_sf = d // 32
        start = bs * d // 2 + n_sf * k_slot
        flat[block, start : start + n_sf] = scales[i]
    return expected


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("scale_mode", ["pow2", "amax"])
def test_fp8_write_touches_only_written_slots(slot_dtype, scale_mode):
    gen = torch.Generator().manual_seed(41)
    pool = random_pool(gen, 5, 32, 1, 132)
    k = torch.randn(6, 128, generator=gen) * 3
    slots = [37, -1, 0, 159, 64, -1]
    expected = fp8_expected(pool, k, slots, scale_mode)
    fl.write_fp8_kv_cache(pool, k, torch.tensor(slots, dtype=slot_dtype), scale_mode=scale_mode)
    assert torch.equal(pool, expected)


def test_fp8_write_every_slot_equals_pack():
    gen = torch.Generator().manual_seed(42)
    nb, bs, d = 3, 64, 64
    k = torch.randn(nb * bs, d, generator=gen)
    perm = torch.randperm(nb * bs, generator=gen)
    pool = random_pool(gen, nb, bs, 1, d + 4)
    fl.write_fp8_kv_cache(pool, k[perm], perm)
    values, scales = fl.quantize_fp8_per_token(k.view(nb, bs, d))
    assert torch.equal(pool, fl.pack_fp8_kv_cache(values, scales))


@pytest.mark.parametrize("interleaved", [False, True])
def test_mxfp4_write_touches_only_written_slots(interleaved):
    gen = torch.Generator().manual_seed(43)
    pool = random_pool(gen, 3, 128, 1, 68)
    k = torch.randn(7, 128, generator=gen)
    slots = [1, 130, -1, 383, 32, 97, 256]
    expected = mxfp4_expected(pool, k, slots, interleaved)
    fl.write_mxfp4_kv_cache(pool, k, torch.tensor(slots), interleaved=interleaved)
    assert torch.equal(pool, expected)


@pytest.mark.parametrize("interleaved", [False, True])
def test_mxfp4_write_every_slot_equals_pack(interleaved):
    gen = torch.Generator().manual_seed(44)
    nb, bs, d = 2, 128, 64
    k = torch.randn(nb * bs, d, generator=gen)
    perm = torch.randperm(nb * bs, generator=gen)
    pool = random_pool(gen, nb, bs, 1, d // 2 + d // 32)
    fl.write_mxfp4_kv_cache(pool, k[perm], perm.to(torch.int32), interleaved=interleaved)
    assert torch.equal(pool, fl.quantize_mxfp4_kv_cache(k.view(nb, bs, d), interleaved=interleaved))


def test_all_skipped_and_empty_writes_change_nothing():
    gen = torch.Generator().manual_seed(45)
    pool = random_pool(gen, 2, 32, 1, 132)
    before = pool.clone()
    fl.write_fp8_kv_cache(pool, torch.randn(3, 128, generator=gen), torch.tensor([-1, -1, -1]))
    fl.write_fp8_kv_cache(pool, torch.randn(0, 128), torch.zeros(0, dtype=torch.int64))
    assert torch.equal(pool, before)
    pool4 = random_pool(gen, 2, 32, 1, 68)
    before4 = pool4.clone()
    fl.write_mxfp4_kv_cache(pool4, torch.randn(2, 128, generator=gen), torch.tensor([-1, -1]))
    assert torch.equal(pool4, before4)


@pytest.mark.parametrize(
    ("write", "width"), [(fl.write_fp8_kv_cache, 132), (fl.write_mxfp4_kv_cache, 68)]
)
def test_skipped_rows_into_a_pool_without_blocks_are_a_no_op(write, width):
    # Every row skipped (-1) is a no-op, also for a pool with no slot to rewrite (0 blocks):
    # not an IndexError from the all-skipped path that rewrites slot 0's bytes.
    pool = torch.zeros(0, 32, 1, width, dtype=torch.uint8)
    write(pool, torch.randn(2, 128), torch.tensor([-1, -1]))


def test_write_into_strided_view_of_a_larger_pool():
    gen = torch.Generator().manual_seed(46)
    big = random_pool(gen, 6, 32, 1, 132)
    before = big.clone()
    view = big[1::2]  # blocks 1, 3, 5 of the big buffer
    k = torch.randn(2, 128, generator=gen)
    fl.write_fp8_kv_cache(view, k, torch.tensor([33, 70]))  # view block 1 tok 1, block 2 tok 6
    expected = before.clone()
    expected[1::2] = fp8_expected(before[1::2].contiguous(), k, [33, 70])
    assert torch.equal(big, expected)


def test_duplicate_rows_with_skips_are_deterministic():
    # skipped rows are redirected onto a written row with that row's bytes: the result must
    # equal writing only the non-skipped rows
    gen = torch.Generator().manual_seed(47)
    pool = random_pool(gen, 2, 32, 1, 132)
    k = torch.randn(5, 128, generator=gen)
    slots = [-1, -1, 10, -1, 50]
    expected = fp8_expected(pool, k, slots)
    fl.write_fp8_kv_cache(pool, k, torch.tensor(slots))
    assert torch.equal(pool, expected)


POOL8 = torch.zeros(2, 32, 1, 132, dtype=torch.uint8)
POOL4 = torch.zeros(2, 64, 1, 68, dtype=torch.uint8)


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (
            lambda: fl.write_fp8_kv_cache(POOL8, torch.ones(1, 128), torch.tensor([64])),
            ValueError,
            r"slot_mapping entries must be -1 \(skip\) or in \[0, 64\).*got 64",
        ),
        (
            lambda: fl.write_fp8_kv_cache(POOL8, torch.ones(1, 128), torch.tensor([-2])),
            ValueError,
            "got -2",
        ),
        # Two bad entries: the lowest one below -1 is reported, else the highest past the pool.
        (
            lambda: fl.write_fp8_kv_cache(POOL8, torch.ones(2, 128), torch.tensor([-5, 3])),
            ValueError,
            "got -5$",
        ),
        (
            lambda: fl.write_fp8_kv_cache(POOL8, torch.ones(2, 128), torch.tensor([-2, -5])),
            ValueError,
            "got -5$",
        ),
        (
            lambda: fl.write_fp8_kv_cache(POOL8, torch.ones(2, 128), torch.tensor([64, -5])),
            ValueError,
            "got -5$",
        ),
        (
            lambda: fl.write_fp8_kv_cache(POOL8, torch.ones(3, 128), torch.tensor([70, -1, 64])),
            ValueError,
            "got 70$",
        ),
        (
            lambda: fl.write_mxfp4_kv_cache(POOL4, torch.ones(2, 128), torch.tensor([5, -3])),
            ValueError,
            r"\[0, 128\).*got -3$",
        ),
        (
            lambda: fl.write_fp8_kv_cache(POOL8, torch.ones(2, 128), torch.tensor([1])),
            ValueError,
            r"slot_mapping.shape\[0\]",
        ),
        (
            lambda: fl.write_fp8_kv_cache(POOL8, torch.ones(1, 64), torch.tensor([1])),
            ValueError,
            r"k.shape\[1\]",
        ),
        (
            lambda: fl.write_fp8_kv_cache(POOL8, torch.ones(128), torch.tensor([1])),
            ValueError,
            "k must be 2-D",
        ),
        (
            lambda: fl.write_fp8_kv_cache(POOL8, torch.ones(1, 128), torch.tensor([1.0])),
            TypeError,
            "slot_mapping must have dtype",
        ),
        (
            lambda: fl.write_fp8_kv_cache(POOL8, torch.ones(1, 128), torch.tensor([[1]])),
            ValueError,
            "slot_mapping must be 1-D",
        ),
        (
            lambda: fl.write_fp8_kv_cache(
                POOL8.to(torch.int8), torch.ones(1, 128), torch.tensor([1])
            ),
            TypeError,
            "kv_fused must have dtype",
        ),
        (
            lambda: fl.write_fp8_kv_cache(
                POOL8, torch.ones(1, 128, dtype=torch.int32), torch.tensor([1])
            ),
            TypeError,
            "k must have dtype",
        ),
        (
            lambda: fl.write_fp8_kv_cache(
                POOL8, torch.ones(1, 128), torch.tensor([1]), scale_mode="x"
            ),
            ValueError,
            "scale_mode",
        ),
        (
            lambda: fl.write_mxfp4_kv_cache(POOL4, torch.ones(1, 128), torch.tensor([128])),
            ValueError,
            r"\[0, 128\)",
        ),
        (
            lambda: fl.write_mxfp4_kv_cache(
                POOL4, torch.ones(1, 128), torch.tensor([1]), interleaved=True
            ),
            ValueError,
            "block_size == 128",
        ),
        (
            lambda: fl.write_mxfp4_kv_cache(POOL8, torch.ones(1, 128), torch.tensor([1])),
            ValueError,
            r"17 \* head_dim / 32",
        ),
    ],
)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


WRITERS = [
    pytest.param(fl.write_fp8_kv_cache, 132, id="fp8"),
    pytest.param(fl.write_mxfp4_kv_cache, 68, id="mxfp4"),
]


def expanded_blocks(num_blocks: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's storage seen as ``num_blocks`` (stride(0) 0): ``(pool, its storage)``."""
    storage = torch.zeros(1, 32, 1, width, dtype=torch.uint8)
    return storage.expand(num_blocks, 32, 1, width), storage


def blocks_overlapping_by_one_byte(num_blocks: int, width: int) -> tuple[torch.Tensor, ...]:
    """Contiguous blocks ``32 * width - 1`` bytes apart: each block's last byte is the next
    block's first."""
    block_bytes = 32 * width
    storage = torch.zeros((num_blocks - 1) * (block_bytes - 1) + block_bytes, dtype=torch.uint8)
    pool = storage.as_strided((num_blocks, 32, 1, width), (block_bytes - 1, width, width, 1))
    return pool, storage


OVERLAPPING_POOLS = [
    pytest.param(lambda width: expanded_blocks(3, width), id="expanded-3-blocks"),
    # two blocks: the smallest pool whose stride(0) is used
    pytest.param(lambda width: expanded_blocks(2, width), id="expanded-2-blocks"),
    pytest.param(lambda width: blocks_overlapping_by_one_byte(3, width), id="one-byte-3-blocks"),
    pytest.param(lambda width: blocks_overlapping_by_one_byte(2, width), id="one-byte-2-blocks"),
]


@pytest.mark.parametrize("make_pool", OVERLAPPING_POOLS)
@pytest.mark.parametrize(("write", "width"), WRITERS)
def test_overlapping_blocks_are_refused(write, width, make_pool):
    # Writing block 1 would overwrite (part of) block 0.
    pool, storage = make_pool(width)
    assert 0 <= pool.stride(0) < 32 * width
    with pytest.raises(ValueError, match=r"^kv_fused blocks must not overlap: stride\(0\)"):
        write(pool, torch.randn(2, 128), torch.tensor([0, 32], dtype=torch.int32))
    assert int(storage.count_nonzero()) == 0


EXPECTED = {
    fl.write_fp8_kv_cache: fp8_expected,
    fl.write_mxfp4_kv_cache: lambda pool, k, slots: mxfp4_expected(pool, k, slots, False),
}


@pytest.mark.parametrize(("write", "width"), WRITERS)
def test_blocks_exactly_one_block_apart_are_accepted(write, width):
    # stride(0) == a block's bytes, the boundary of the overlap check, in a view of a larger
    # buffer (a storage offset, bytes on both sides that must stay as they are).
    gen = torch.Generator().manual_seed(50)
    block_bytes, pad = 32 * width, 7
    storage = random_pool(gen, 3 * block_bytes + 2 * pad)
    before = storage.clone()
    pool = storage.as_strided((3, 32, 1, width), (block_bytes, width, width, 1), pad)
    k = torch.randn(3, 128, generator=gen)
    slots = [0, 31, 95]  # the pool's first and last token, and block 0's last
    write(pool, k, torch.tensor(slots))
    expected = before.clone()
    expected[pad : pad + 3 * block_bytes] = EXPECTED[write](
        before[pad : pad + 3 * block_bytes].view(3, 32, 1, width), k, slots
    ).flatten()
    assert torch.equal(storage, expected)
    assert not torch.equal(storage, before)


@pytest.mark.parametrize(("write", "width"), WRITERS)
def test_inference_pool_is_refused_outside_inference_mode_and_written_inside(write, width):
    # PyTorch refuses the scatter into an inference tensor outside inference mode with an
    # error that names no argument; the writer refuses first and names kv_fused. Inside
    # inference mode the same pool takes the same bytes as an ordinary one.
    gen = torch.Generator().manual_seed(51)
    before = random_pool(gen, 3, 32, 1, width)
    with torch.inference_mode():
        pool = before.clone()
    k = torch.randn(3, 128, generator=gen)
    slots = [0, 33, 95]
    with pytest.raises(
        RuntimeError, match=r"^kv_fused is an inference tensor .* outside inference mode"
    ):
        write(pool, k, torch.tensor(slots))
    assert torch.equal(pool, before)
    with torch.inference_mode():
        write(pool, k, torch.tensor(slots))
    assert torch.equal(pool, EXPECTED[write](before, k, slots))


def token_expanded(num_tokens: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks of ``num_tokens`` rows that are all one row (stride(1) 0), blocks far enough
    apart (``num_tokens * width`` bytes) not to overlap: only the contiguity check refuses
    it."""
    storage = torch.zeros(3 * num_tokens * width, dtype=torch.uint8)
    pool = storage.as_strided((3, num_tokens, 1, width), (num_tokens * width, 0, width, 1))
    return pool, storage


@pytest.mark.parametrize("num_tokens", [32, 2])  # 2: the smallest dimension whose stride is used
@pytest.mark.parametrize(("write", "width"), WRITERS)
def test_token_expanded_pool_is_refused(write, width, num_tokens):
    pool = torch.zeros(3, 1, 1, width, dtype=torch.uint8).expand(3, num_tokens, 1, width)
    with pytest.raises(ValueError, match=r"^kv_fused must store each block .* contiguously"):
        write(pool, torch.randn(2, 128), torch.tensor([0, 1]))
    assert int(pool.count_nonzero()) == 0
    pool, storage = token_expanded(num_tokens, width)
    with pytest.raises(ValueError, match=r"^kv_fused must store each block .* contiguously"):
        write(pool, torch.randn(2, 128), torch.tensor([0, 1]))
    assert int(storage.count_nonzero()) == 0


@pytest.mark.parametrize(("write", "width"), WRITERS)
def test_every_other_token_view_is_refused(write, width):
    big = torch.zeros(2, 64, 1, width, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"^kv_fused must store each block"):
        write(big[:, ::2], torch.randn(1, 128), torch.tensor([3]))
    assert int(big.count_nonzero()) == 0


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_write_into_one_layer_of_a_layer_interleaved_cache(fmt):
    gen = torch.Generator().manual_seed(48)
    num_blocks, num_layers, layer, block_size = 4, 3, 1, 32
    width = 132 if fmt == "fp8" else 68
    cache = random_pool(gen, num_blocks, num_layers, block_size, 1, width)
    before = cache.clone()
    pool = cache[:, layer]  # blocks contiguous, pitch num_layers blocks wide
    assert pool.stride(0) == num_layers * block_size * width
    k = torch.randn(3, 128, generator=gen)
    slots = [5, -1, 100]
    if fmt == "fp8":
        fl.write_fp8_kv_cache(pool, k, torch.tensor(slots))
        written = fp8_expected(before[:, layer].contiguous(), k, slots)
    else:
        fl.write_mxfp4_kv_cache(pool, k, torch.tensor(slots))
        written = mxfp4_expected(before[:, layer].contiguous(), k, slots, interleaved=False)
    expected = before.clone()
    expected[:, layer] = written
    assert torch.equal(cache, expected)  # the other layers are untouched
    assert not torch.equal(written, before[:, layer])


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_skipped_first_row_does_not_hide_a_later_write_to_slot_zero(fmt):
    """Slots [-1, 0, -1]: row 1 lands in slot 0 even though row 0 (the skipped rows' default
    redirect target) is skipped; every other byte keeps its value."""
    gen = torch.Generator().manual_seed(49)
    k = torch.randn(3, 128, generator=gen) * 5
    if fmt == "fp8":
        pool = random_pool(gen, 2, 32, 1, 132)
        # amax 448 -> scale 1.0 in both modes; e4m3 448, 1, -2, 0.5 = 0x7E, 0x38, 0xC0, 0x30
        k[1] = torch.tensor([448.0, 1.0, -2.0, 0.5]).repeat(32)
        values, scale = [0x7E, 0x38, 0xC0, 0x30] * 32, [0x00, 0x00, 0x80, 0x3F]  # LE fp32 1.0
        scale_at = 32 * 128  # block_size * head_dim + 4 * token 0
        write = fl.write_fp8_kv_cache
    else:
        pool = random_pool(gen, 2, 128, 1, 68)
        # each 32-group has amax 6 -> UE8M0 scale 2**0 (byte 127); 6 -> code 7, -1 -> code 0xA,
        # element 2j in the low nibble: byte 0xA7
        k[1] = torch.tensor([6.0, -1.0]).repeat(64)
        values, scale = [0xA7] * 64, [127] * 4
        scale_at = 128 * 64  # block_size * head_dim / 2 + 4 * scale slot 0 (also interleaved)
        write = fl.write_mxfp4_kv_cache
    expected = pool.clone()
    flat = expected.view(2, -1)
    flat[0, : len(values)] = torch.tensor(values, dtype=torch.uint8)
    flat[0, scale_at : scale_at + 4] = torch.tensor(scale, dtype=torch.uint8)
    write(pool, k, torch.tensor([-1, 0, -1]))
    assert torch.equal(pool, expected)
