"""The layouts functions under torch.compile with dynamic shapes and under torch.export with a
dynamic dimension: they trace, give the eager bytes at every size, and keep their errors.

Each case calls one compiled function at several sizes, so the second and later calls run the
symbolic-shape graph (a size-specialised first graph would hide a wrong dynamic one).
"""

from __future__ import annotations

import flashinfer_layouts as fl
import pytest
import torch
from layouts_bytes import on_cpu, same
from tricky_inputs import tricky_rows

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]


def rows(count: int, device: str, width: int = 128) -> torch.Tensor:
    """``count`` finite rounding-edge rows of ``width`` elements: `tricky_rows` cycled, each
    copy scaled by its own power of two (exact), so no two rows of a 128-row tile repeat."""
    source = torch.nan_to_num(tricky_rows(), nan=0.0, posinf=0.0)[:, :width]
    index = torch.arange(count)
    factor = torch.pow(2.0, (index // source.shape[0]) % 17 - 8).unsqueeze(1)
    return (source[index % source.shape[0]] * factor).contiguous().to(device)


def compiled_matches_eager(fn, inputs_per_size) -> None:
    """``fn`` compiled with dynamic shapes gives its eager bytes for every input tuple.

    The public function itself is compiled, not a wrapper: which graphs dynamo builds
    depends on it (the swizzle miscompile below showed only when ``nvfp4_quantize`` itself
    was compiled).
    """
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    for inputs in inputs_per_size:
        eager = on_cpu(fn(*inputs))
        got = on_cpu(compiled(*inputs))
        assert same(eager, got), f"sizes {[tuple(t.shape) for t in inputs if hasattr(t, 'shape')]}"


@pytest.mark.parametrize("device", DEVICES)
def test_swizzled_scales_past_one_row_tile(device):
    # Row counts on both sides of 128: one, two and three 128-row tiles of scales. Before
    # the gather in swizzle_128x4, Inductor copied rows 0-127 into every row tile of
    # nvfp4_quantize's scales here (swizzle_128x4 compiled alone was right).
    sizes = (13, 200, 300)
    scale = torch.tensor(7.0, device=device)
    compiled_matches_eager(fl.nvfp4_quantize, [(rows(m, device), scale) for m in sizes])
    compiled_matches_eager(
        fl.swizzle_128x4,
        [(torch.randint(1, 256, (m, 6), dtype=torch.uint8).to(device),) for m in sizes],
    )


@pytest.mark.parametrize("device", DEVICES)
def test_python_float_global_scales(device):
    # Under dynamic=True a float argument is symbolic: the scale check must not read it back.
    quantized = [(rows(m, device), scale) for m, scale in ((8, 7.0), (24, 0.37))]
    compiled_matches_eager(fl.nvfp4_quantize, quantized)
    compiled_matches_eager(
        fl.nvfp4_dequantize,
        [(*fl.nvfp4_quantize(a, scale), scale) for a, scale in quantized],
    )


@pytest.mark.parametrize("device", DEVICES)
def test_msa_pages(device):
    # num_kv_heads, an int argument, is symbolic under dynamic=True.
    def kv(num_pages: int, heads: int):
        k = rows(num_pages * heads * 128, device).reshape(num_pages, heads, 128, 128)
        return k, k.flip(-1), 2.0, 0.5

    inputs = [kv(1, 2), kv(2, 3), kv(3, 2)]
    compiled_matches_eager(fl.pack_nvfp4_msa_pages, inputs)
    pages = [(fl.pack_nvfp4_msa_pages(*args), args[0].shape[1]) for args in inputs]
    compiled_matches_eager(fl.msa_page_views, pages)
    compiled_matches_eager(fl.unpack_nvfp4_msa_pages, [(*p, 2.0, 0.5) for p in pages])


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
def test_swizzle_exports_with_a_dynamic_row_count(strict):
    class Swizzle(torch.nn.Module):
        def forward(self, sf):
            return fl.swizzle_128x4(sf)

    example = torch.randint(0, 256, (200, 6), dtype=torch.uint8)
    dims = ({0: torch.export.Dim("m", min=2)},)
    program = torch.export.export(Swizzle(), (example,), dynamic_shapes=dims, strict=strict)
    for m in (8, 129, 300):
        sf = torch.randint(0, 256, (m, 6), dtype=torch.uint8)
        assert same(fl.swizzle_128x4(sf), program.module()(sf)), m


def test_a_nan_global_scale_is_refused_under_dynamic_compile():
    torch._dynamo.reset()
    compiled = torch.compile(fl.nvfp4_quantize, dynamic=True)
    with pytest.raises(ValueError, match="a_global_sf must be finite and positive"):
        compiled(rows(4, "cpu"), float("nan"))


@pytest.mark.parametrize(("m", "c"), [(0, 3), (1, 1), (127, 4), (129, 5), (300, 6), (513, 13)])
def test_both_swizzle_forms_agree(m, c):
    from flashinfer_layouts.nvfp4 import _swizzle_by_gather, _swizzle_by_permute

    raw = torch.randint(
        0, 256, (m, c), dtype=torch.uint8, generator=torch.Generator().manual_seed(m)
    )
    assert torch.equal(_swizzle_by_gather(raw), _swizzle_by_permute(raw))


def test_offset_broadcast_error_survives_compile():
    row, col = torch.zeros(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)
    torch._dynamo.reset()
    compiled = torch.compile(fl.swizzle_128x4_offset)
    with pytest.raises(ValueError, match=r"row and col must broadcast together; got shapes"):
        compiled(row, col, 4)
