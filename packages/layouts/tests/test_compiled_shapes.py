"""The layouts functions under torch.compile with dynamic shapes and under torch.export with a
dynamic dimension: they trace, give the eager bytes at every size, and keep their errors.

Each case calls one compiled function at several sizes, so the second and later calls run the
symbolic-shape graph (a size-specialised first graph would hide a wrong dynamic one).
"""

from __future__ import annotations

import re

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


def _u8(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.uint8)


def _slots(count: int) -> torch.Tensor:
    return torch.zeros(count, dtype=torch.int64)


# Refused calls whose messages print sizes, and the sizes each message must show. Under
# dynamic=True the sizes are symbols while dynamo traces: a shape printed as it is read
# "(s93, s58, s97)" before `_checks.plain`, and some numbers could not be formatted at all.
SIZED_ERRORS = [
    (fl.unpack_fp8_kv_cache, lambda: (_u8(5, 64, 132),), "got 3-D shape (5, 64, 132)"),
    (fl.dequantize_fp8_kv_cache, lambda: (_u8(5, 64, 1, 4),), "got 4 (shape (5, 64, 1, 4))"),
    (
        fl.write_fp8_kv_cache,
        lambda: (_u8(5, 64, 1, 264)[..., :132], torch.randn(3, 128), _slots(3)),
        "got strides (16896, 264, 264, 1) for shape (5, 64, 1, 132)",
    ),
    (
        fl.write_fp8_kv_cache,
        lambda: (_u8(1, 64, 1, 132).expand(5, 64, 1, 132), torch.randn(3, 128), _slots(3)),
        ">= the 8448 elements of one block; got strides (0, 132, 132, 1)",
    ),
    (
        fl.write_fp8_kv_cache,
        lambda: (_u8(5, 64, 1, 132), torch.randn(3, 64), _slots(3)),
        "must be 128; got 64 (shape (3, 64))",
    ),
    (
        fl.write_fp8_kv_cache,
        lambda: (_u8(5, 64, 1, 132), torch.randn(3, 128), _slots(4)),
        "must be 3; got 4 (shape (4,))",
    ),
    (
        fl.pack_fp8_kv_cache,
        lambda: (torch.zeros(5, 64, 1, 128).to(torch.float8_e4m3fn), torch.zeros(5, 64)),
        "got 4-D shape (5, 64, 1, 128)",
    ),
    (fl.dequantize_mxfp4_kv_cache, lambda: (_u8(5, 64, 1, 67),), "got 67"),
    (
        lambda kv: fl.dequantize_mxfp4_kv_cache(kv, interleaved=True),
        lambda: (_u8(5, 64, 1, 68),),
        "got block_size 64",
    ),
    (fl.quantize_mxfp4, lambda: (torch.randn(5, 48),), "multiple of 32 (sf_vec_size); got 48"),
    (
        lambda x: fl.quantize_mxfp4(x, sf_vec_size=96),
        lambda: (torch.randn(5, 64),),
        "head_dim (64); got 96",
    ),
    (
        fl.unpack_mxfp4_q,
        lambda: (_u8(5, 1, 64, 65), torch.zeros(5, 1, 64, dtype=torch.int32)),
        "got 65 (shape (5, 1, 64, 65))",
    ),
    (
        fl.unpack_mxfp4_q,
        lambda: (_u8(5, 1, 64, 64), torch.zeros(5, 2, 64, dtype=torch.int32)),
        "q_sf must have shape (5, 1, 64) [batch_size, next_n, num_heads]; got (5, 2, 64)",
    ),
    (
        lambda a, s: fl.nvfp4_dequantize(a, s, 1.0),
        lambda: (_u8(5, 16), _u8(5, 3)),
        "a_sf must have shape (128, 4) [padded_rows, padded_scale_cols]; got (5, 3)",
    ),
    (
        lambda a, s: fl.nvfp4_dequantize(a, s, 1.0, swizzled=False),
        lambda: (_u8(5, 16), _u8(5, 3)),
        "a_sf must have shape (5, 2) [M, K/sf_vec_size] (linear); got (5, 3)",
    ),
    (
        lambda a, s: fl.nvfp4_dequantize(a, s, 1.0),
        lambda: (_u8(5, 16), _u8(7)),
        "must hold 128 * 4 = 512 elements; got 7",
    ),
    (
        lambda a, s: fl.nvfp4_dequantize(a, s, 1.0),
        lambda: (_u8(5, 16), _u8(2, 128, 4)),
        "(128, 4); got shape (2, 128, 4)",
    ),
    (
        lambda a, s: fl.nvfp4_dequantize(a, s, 1.0, m=7),
        lambda: (_u8(5, 16), _u8(128, 4)),
        "m must equal a_fp4.shape[0] (5); got 7",
    ),
    (
        lambda pages: fl.msa_page_views(pages, 2),
        lambda: (_u8(3, 100),),
        "(page bytes for num_kv_heads=2) must be 36864; got 100 (shape (3, 100))",
    ),
]


@pytest.mark.parametrize(
    ("call", "make_args", "sizes"),
    SIZED_ERRORS,
    ids=[sizes[:40] for _, _, sizes in SIZED_ERRORS],
)
def test_refused_sizes_print_as_numbers_under_compile(call, make_args, sizes):
    """The error of a fullgraph compile carries the eager message word for word, sizes
    included, with static and with dynamic shapes."""
    with pytest.raises(ValueError) as eager:
        call(*make_args())
    message = str(eager.value)
    assert sizes in message
    for dynamic in (False, True):
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported) as compiled:
            torch.compile(call, fullgraph=True, dynamic=dynamic)(*make_args())
        assert message in str(compiled.value), f"dynamic={dynamic}"


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_shape_read_from_data_keeps_the_message(dynamic):
    """A pool made inside the compiled function from nonzero() has a row count with no
    value while dynamo traces; the message prints it as ``?`` instead of being lost."""

    def unpack(x):
        return fl.unpack_fp8_kv_cache(x.nonzero().to(torch.uint8))

    x = torch.tensor([0, 3, 0, 4, 5])
    with pytest.raises(ValueError, match=re.escape("got 2-D shape (3, 1)")):
        unpack(x)
    torch._dynamo.reset()
    with (
        torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True),
        pytest.raises(torch._dynamo.exc.Unsupported, match=re.escape("got 2-D shape (?, 1)")),
    ):
        torch.compile(unpack, fullgraph=True, dynamic=dynamic)(x)
