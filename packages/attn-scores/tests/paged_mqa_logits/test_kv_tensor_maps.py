"""The KV descriptors the launchers build, checked against the layouts by hand (no GPU).

`make_tensor_map` is replaced by a recorder: what matters here is which dims, strides, box
and swizzle each kernel asks for, and that a pool's descriptor is built once and cached.
"""

from __future__ import annotations

from collections import OrderedDict

import flashinfer_jit
import pytest
import torch
from flashinfer_attn_scores.paged_mqa_logits import fp4_sm90, fp8_sm90


@pytest.fixture
def built(monkeypatch):
    calls = []
    monkeypatch.setattr(
        flashinfer_jit, "make_tensor_map", lambda *a, **k: calls.append(k) or object()
    )
    monkeypatch.setattr(fp8_sm90, "_tensor_maps", OrderedDict())
    return calls


def fp8(block_size, head_dim, num_heads=8):
    return fp8_sm90.fp8_config(
        block_size, head_dim, num_heads, 1, torch.float32, torch.float32, torch.float32
    )


def test_fp8_descriptors_follow_the_two_region_block(built):
    pool = torch.zeros(10, 32, 1, 132, dtype=torch.uint8)
    first = fp8_sm90._kv_tensor_map(pool, fp8(32, 128))
    assert fp8_sm90._kv_tensor_map(pool, fp8(32, 128)) is first  # cached
    other = torch.zeros(7, 128, 1, 100, dtype=torch.uint8)
    fp8_sm90._kv_tensor_map(other, fp8(128, 96))
    assert built == [
        # values: head_dim bytes per token, blocks of 32 * (128 + 4) bytes, 128-byte swizzle
        dict(global_dims=(128, 32, 10), global_strides_bytes=(128, 4224), box_dims=(128, 32, 1),
             swizzle="128B"),
        # head_dim 96: 32-byte rows, a 64-token box out of a 128-token block
        dict(global_dims=(96, 128, 7), global_strides_bytes=(96, 12800), box_dims=(32, 64, 1),
             swizzle="32B"),
    ]  # fmt: skip


def test_fp4_descriptor_is_the_packed_value_region_unswizzled(built):
    pool = torch.zeros(9, 128, 1, 68, dtype=torch.uint8)
    fp4_sm90._kv_tensor_map(pool)
    assert built == [
        dict(global_dims=(64, 128, 9), global_strides_bytes=(64, 128 * 68), box_dims=(64, 64, 1),
             swizzle="none"),
    ]  # fmt: skip


def test_fp8_and_fp4_pools_at_one_address_do_not_share_a_descriptor(built):
    fp8_pool = torch.zeros(4, 64, 1, 68, dtype=torch.uint8)  # fp8 head_dim 64: 64 + 4 bytes
    fp8_sm90._kv_tensor_map(fp8_pool, fp8(64, 64))
    fp4_sm90._kv_tensor_map(fp8_pool)  # same bytes viewed as an fp4 pool
    assert [call["swizzle"] for call in built] == ["64B", "none"]


def layer_of(pool: torch.Tensor, layers: int, layer: int) -> torch.Tensor:
    """Layer `layer` of a cache holding `layers` pools interleaved block by block."""
    num_blocks, block_bytes = pool.shape[0], pool[0].numel()
    cache = torch.zeros(num_blocks, layers, block_bytes, dtype=torch.uint8)
    return cache[:, layer].view(pool.shape)


def test_a_wider_block_pitch_is_the_descriptor_stride_and_the_kernel_argument(built):
    contiguous = torch.zeros(6, 64, 1, 132, dtype=torch.uint8)
    pitched = layer_of(contiguous, layers=3, layer=1)
    assert fp8_sm90.kv_block_stride(pitched) == 3 * 64 * 132
    fp8_sm90._kv_tensor_map(pitched, fp8(64, 128))
    fp4_pool = layer_of(torch.zeros(5, 32, 1, 68, dtype=torch.uint8), layers=2, layer=1)
    fp4_sm90._kv_tensor_map(fp4_pool)
    assert [call["global_strides_bytes"] for call in built] == [
        (128, 3 * 64 * 132),
        (64, 2 * 32 * 68),
    ]


def test_the_pitch_of_a_one_block_pool_is_its_block(built):
    one_block = torch.zeros(4, 32, 1, 132, dtype=torch.uint8)[::4]  # stride(0) of 4 blocks
    assert one_block.shape[0] == 1
    assert fp8_sm90.kv_block_stride(one_block) == 32 * 132


def test_pitch_is_part_of_the_cache_key(built):
    storage = torch.zeros(8, 32, 1, 132, dtype=torch.uint8)
    fp8_sm90._kv_tensor_map(storage[:4], fp8(32, 128))
    fp8_sm90._kv_tensor_map(storage[::2], fp8(32, 128))  # same address and shape, pitch x2
    assert [call["global_strides_bytes"][1] for call in built] == [32 * 132, 2 * 32 * 132]


def test_an_unaligned_pool_address_is_refused(built):
    flat = torch.zeros(4 * 32 * 132 + 16, dtype=torch.uint8)
    misaligned = flat[8 : 8 + 4 * 32 * 132].view(4, 32, 1, 132)
    with pytest.raises(ValueError, match=r"kv_fused must start at a 16-byte aligned address"):
        fp8_sm90._kv_tensor_map(misaligned, fp8(32, 128))
    assert built == []


def test_more_pools_than_the_bound_keep_the_most_recent_descriptors(built, monkeypatch):
    """Least recently used out: with more pools than the table holds, the pools in use stay
    cached (clearing the whole table would rebuild every map once the layers outnumbered it)."""
    monkeypatch.setattr(fp8_sm90, "_TENSOR_MAPS_LIMIT", 3)
    pools = [torch.zeros(2, 32, 1, 132, dtype=torch.uint8) for _ in range(4)]
    config = fp8(32, 128)
    maps = [fp8_sm90._kv_tensor_map(pool, config) for pool in pools[:3]]
    assert fp8_sm90._kv_tensor_map(pools[0], config) is maps[0]  # now the most recent
    fp8_sm90._kv_tensor_map(pools[3], config)  # drops pools[1], the least recently used
    assert len(built) == 4
    assert fp8_sm90._kv_tensor_map(pools[0], config) is maps[0]
    assert fp8_sm90._kv_tensor_map(pools[2], config) is maps[2]
    fp8_sm90._kv_tensor_map(pools[1], config)
    assert len(built) == 5 and len(fp8_sm90._tensor_maps) == 3
