"""The KV descriptors the launchers build, checked against the layouts by hand (no GPU).

`make_tensor_map` is replaced by a recorder: what matters here is which dims, strides, box
and swizzle each kernel asks for, and that a pool's descriptor is built once and cached.
"""

from __future__ import annotations

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
    monkeypatch.setattr(fp8_sm90, "_tensor_maps", {})
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
