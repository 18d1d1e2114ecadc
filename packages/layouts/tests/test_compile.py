"""The writers and quantisers trace under torch.compile(fullgraph=True) on CPU tensors.

Their checks of tensor contents (slot ranges, a tensor global scale's value) read data, which
a trace does not have; they are skipped while dynamo traces, and the compiled call writes the
same bytes as the eager one.
"""

from __future__ import annotations

import flashinfer_layouts as fl
import pytest
import torch


@pytest.mark.parametrize("writer", ["write_fp8_kv_cache", "write_mxfp4_kv_cache"])
def test_kv_cache_writers_compile_and_write_the_eager_bytes(writer):
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(6, 64, 32, generator=gen)
    if writer == "write_fp8_kv_cache":
        pool = fl.pack_fp8_kv_cache(*fl.quantize_fp8_per_token(k))
    else:
        pool = fl.quantize_mxfp4_kv_cache(k)
    new_k = torch.randn(4, 32, generator=gen)
    slots = torch.tensor([5, -1, 70, 200], dtype=torch.int64)
    write = getattr(fl, writer)
    eager, compiled = pool.clone(), pool.clone()
    write(eager, new_k, slots)
    torch._dynamo.reset()
    torch.compile(write, fullgraph=True)(compiled, new_k, slots)
    assert torch.equal(compiled, eager)
    assert not torch.equal(eager, pool)  # the call wrote something


def test_nvfp4_quantize_with_a_tensor_global_scale_compiles():
    x = torch.randn(200, 64, generator=torch.Generator().manual_seed(1))

    def quantize(x):
        return fl.nvfp4_quantize(x, fl.nvfp4_global_scale(x))

    eager = quantize(x)
    torch._dynamo.reset()
    compiled = torch.compile(quantize, fullgraph=True)(x)
    for got, want in zip(compiled, eager, strict=True):
        assert torch.equal(got, want)
