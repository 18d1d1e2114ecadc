"""Negated views (`is_neg()`: the `.imag` of a `conj()` view, whose memory holds the negated
values) quantise to the same bytes as their resolved copies: the bit-level helpers read
memory through `Tensor.view`, which torch refuses on such a view (a RuntimeError naming no
argument, before the helpers resolved it)."""

from __future__ import annotations

import flashinfer_layouts as fl
import pytest
import torch


def _negated_view(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A contiguous negated view (a strided one is copied by `.contiguous()`, which resolves
    it). Public PyTorch gives one as the `.imag` of a one-element `conj()`; this uses the
    private `torch._neg_view` for larger shapes, which has the same memory semantics."""
    generator = torch.Generator().manual_seed(seed)
    memory = torch.randn(shape, generator=generator) * 3
    view = torch._neg_view(memory)  # memory holds x, the view reads -x
    assert view.is_neg() and view.is_contiguous() and view.dtype == torch.float32
    return view


def test_the_public_one_element_negated_view_quantises():
    view = torch.tensor([[3.0 + 2.0j]]).conj().imag
    assert view.is_neg() and view.is_contiguous()
    _same(fl.quantize_fp8_per_token(view), fl.quantize_fp8_per_token(view.resolve_neg()))


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.is_floating_point() and a.element_size() == 1:  # fp8: compare the bytes
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        assert torch.equal(a, b)
    else:
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)


@pytest.mark.parametrize(
    ("name", "call", "shape"),
    [
        ("quantize_fp8_per_token", lambda x: fl.quantize_fp8_per_token(x), (5, 64)),
        ("quantize_mxfp4", lambda x: fl.quantize_mxfp4(x), (5, 64)),
        ("quantize_mxfp4_q", lambda x: fl.quantize_mxfp4_q(x), (2, 1, 64, 128)),
        ("quantize_mxfp4_kv_cache", lambda x: fl.quantize_mxfp4_kv_cache(x), (2, 32, 128)),
        ("nvfp4_global_scale", lambda x: fl.nvfp4_global_scale(x), (5, 64)),
        (
            "nvfp4_quantize",
            lambda x: fl.nvfp4_quantize(x, fl.nvfp4_global_scale(x.resolve_neg())),
            (128, 64),
        ),
    ],
)
def test_a_negated_view_quantises_like_its_resolved_copy(name, call, shape):
    view = _negated_view(shape, seed=len(name))
    _same(call(view), call(view.resolve_neg()))


@pytest.mark.parametrize(
    "helper",
    [
        "float32_fields",
        "float64_fields",
        "float32_to_e4m3_bits",
        "float32_to_le_bytes",
        "sign_bit",
        "magnitude",
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_bit_helper_reads_a_negated_view_as_its_values(helper, dtype):
    from flashinfer_layouts import _bits

    memory = torch.tensor([1.5, -2.0, 0.0, -0.0, 448.0, 3.0e-3], dtype=dtype)
    view = torch._neg_view(memory)
    assert view.is_neg() and view.is_contiguous()
    function = getattr(_bits, helper)
    _same(function(view), function(view.resolve_neg()))
