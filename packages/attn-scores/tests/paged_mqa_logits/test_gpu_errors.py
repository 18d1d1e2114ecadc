"""The always-on argument checks hold on CUDA tensors too (SM90 GPU).

The same table of cases as test_errors.py, with every tensor of the case and of the
overrides moved to the GPU. Cases about mixing devices or naming the CPU device are left to
the CPU tests (their messages name the devices).
"""

from __future__ import annotations

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import make_fp4_case, make_fp8_case
from test_errors import FP4_ERRORS, FP8_ERRORS

pytestmark = pytest.mark.gpu


def _on_gpu(value, device="cuda"):
    """The same view on the GPU: strides and offset kept (`to()` would make a strided or
    expanded view contiguous, and the layout checks would no longer see it)."""
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
        return value
    elements = value.untyped_storage().nbytes() // value.element_size()
    whole = torch.empty(0, dtype=value.dtype).set_(value.untyped_storage(), 0, (elements,), (1,))
    return whole.to(device, copy=True).as_strided(
        value.shape, value.stride(), value.storage_offset()
    )


def _device_independent(table):
    return {name: case for name, case in table.items() if "device" not in name}


def _call(op, case, overrides, names):
    kwargs = {name: _on_gpu(getattr(case, name)) for name in names}
    moved = type(case)(**{k: _on_gpu(v) for k, v in case.__dict__.items()})
    kwargs.update({k: _on_gpu(v) for k, v in (overrides(moved) if overrides else {}).items()})
    return op(**kwargs)


FP8_NAMES = ("q", "kv_fused", "weights", "block_tables", "seq_lens", "max_seq_len")
FP4_NAMES = ("q", "q_sf", "kv_fused", "weights", "block_tables", "seq_lens", "max_seq_len")
FP8_GPU = _device_independent(FP8_ERRORS)
FP4_GPU = _device_independent(FP4_ERRORS)


@pytest.mark.parametrize(("overrides", "error", "match"), FP8_GPU.values(), ids=FP8_GPU.keys())
def test_fp8_argument_errors_on_cuda(overrides, error, match):
    case = make_fp8_case([40, 10], next_n=2, num_heads=8, head_dim=32, max_seq_len=64, seed=0)
    with pytest.raises(error, match=match):
        _call(fa.fp8_paged_mqa_logits, case, overrides, FP8_NAMES)


@pytest.mark.parametrize(("overrides", "error", "match"), FP4_GPU.values(), ids=FP4_GPU.keys())
def test_fp4_argument_errors_on_cuda(overrides, error, match):
    case = make_fp4_case([40, 10], next_n=2, max_seq_len=64, seed=0)
    with pytest.raises(error, match=match):
        _call(fa.fp4_paged_mqa_logits, case, overrides, FP4_NAMES)


def test_the_cases_still_succeed_on_cuda_without_overrides():
    fp8 = make_fp8_case([40, 10], next_n=2, num_heads=8, head_dim=32, max_seq_len=64, seed=0)
    fp4 = make_fp4_case([40, 10], next_n=2, max_seq_len=64, seed=0)
    assert _call(fa.fp8_paged_mqa_logits, fp8, None, FP8_NAMES).shape == (4, 64)
    assert _call(fa.fp4_paged_mqa_logits, fp4, None, FP4_NAMES).shape == (4, 64)


def _misaligned(kv_fused: torch.Tensor, by_bytes: int) -> torch.Tensor:
    """The same pool on the GPU, starting `by_bytes` past a 16-byte aligned address."""
    flat = torch.zeros(kv_fused.numel() + 16, dtype=torch.uint8, device="cuda")
    view = flat[by_bytes : by_bytes + kv_fused.numel()].view(kv_fused.shape)
    view.copy_(kv_fused)
    return view


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_a_pool_at_an_unaligned_address_is_refused_on_cuda(variant):
    """TMA needs a 16-byte aligned pool; the CPU reference does not, so this is CUDA-only."""
    if variant == "fp8":
        case = make_fp8_case([40, 10], next_n=2, num_heads=8, head_dim=32, max_seq_len=64, seed=0)
        op, names = fa.fp8_paged_mqa_logits, FP8_NAMES
    else:
        case = make_fp4_case([40, 10], next_n=2, max_seq_len=64, seed=0)
        op, names = fa.fp4_paged_mqa_logits, FP4_NAMES
    kv_fused = _misaligned(_on_gpu(case.kv_fused), 8)
    assert kv_fused.data_ptr() % 16 == 8
    with pytest.raises(ValueError, match=r"kv_fused must start at a 16-byte aligned address"):
        _call(op, case, lambda c: {"kv_fused": kv_fused}, names)
