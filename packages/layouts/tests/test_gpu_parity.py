"""CUDA tensors give the same bytes as CPU tensors; the write path captures in a CUDA graph."""

from __future__ import annotations

import flashinfer_layouts as fl
import pytest
import torch
from layouts_bytes import same

pytestmark = pytest.mark.gpu


def test_quantisers_and_packers_match_cpu_bitwise():
    gen = torch.Generator().manual_seed(51)
    x = torch.randn(4, 64, 128, generator=gen) * 10.0 ** (
        torch.rand(4, 64, 1, generator=gen) * 6 - 3
    )
    q = torch.randn(2, 3, 64, 128, generator=gen)
    k = torch.randn(2, 4, 128, 128, generator=gen)
    v = torch.randn(2, 4, 128, 128, generator=gen)
    cases = [
        lambda t: fl.quantize_fp8_per_token(t(x)),
        lambda t: fl.quantize_fp8_per_token(t(x), scale_mode="amax"),
        lambda t: fl.pack_fp8_kv_cache(*fl.quantize_fp8_per_token(t(x))),
        lambda t: fl.dequantize_fp8_kv_cache(
            fl.pack_fp8_kv_cache(*fl.quantize_fp8_per_token(t(x)))
        ),
        lambda t: fl.quantize_mxfp4(t(x)),
        lambda t: fl.dequantize_mxfp4(*fl.quantize_mxfp4(t(x))),
        lambda t: fl.quantize_mxfp4_q(t(q)),
        lambda t: fl.dequantize_mxfp4_q(*fl.quantize_mxfp4_q(t(q))),
        lambda t: fl.quantize_mxfp4_kv_cache(
            t(x[:, :, :128].reshape(2, 128, 128)), interleaved=True
        ),
        lambda t: fl.unpack_mxfp4_kv_cache(
            fl.quantize_mxfp4_kv_cache(t(x)[:2].reshape(1, 128, 128)), interleaved=True
        ),
        lambda t: fl.nvfp4_quantize(t(x).reshape(-1, 128), fl.nvfp4_global_scale(t(x))),
        lambda t: fl.nvfp4_quantize(t(x).reshape(-1, 128), 7.0, swizzled=False),
        lambda t: fl.nvfp4_dequantize(*fl.nvfp4_quantize(t(x).reshape(-1, 128), 7.0), 7.0),
        lambda t: fl.pack_nvfp4_msa_pages(t(k), t(v), 30.0, torch.tensor(40.0)),
        lambda t: fl.unpack_nvfp4_msa_pages(
            fl.pack_nvfp4_msa_pages(t(k), t(v), 30.0, 40.0), 4, 30.0, 40.0
        ),
    ]
    for i, case in enumerate(cases):
        assert same(case(lambda a: a), case(lambda a: a.cuda())), f"case {i}"


def test_tricky_inputs_match_cpu_bitwise(tricky_cases):
    # midpoints, subnormals, signed zeros, inf/NaN rows, exact powers of two, several dtypes
    mismatched = [
        name
        for name, case in tricky_cases.items()
        if not same(case(lambda a: a), case(lambda a: a.cuda()))
    ]
    assert mismatched == []


def test_views_on_cuda_share_storage():
    pages = torch.zeros(2, 73728, dtype=torch.uint8, device="cuda")
    k_data, k_scale, _, v_scale = fl.msa_page_views(pages, 4)
    assert v_scale.data_ptr() - pages.data_ptr() == 69632
    assert k_data.is_cuda and k_scale.stride() == (73728, 1024, 8, 1)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_write_matches_cpu_and_replays_in_a_cuda_graph(fmt):
    gen = torch.Generator().manual_seed(52)
    if fmt == "fp8":
        pool = torch.randint(0, 256, (4, 64, 1, 132), generator=gen, dtype=torch.uint8)
        write = fl.write_fp8_kv_cache
    else:
        pool = torch.randint(0, 256, (4, 128, 1, 68), generator=gen, dtype=torch.uint8)
        write = lambda kv, k, s: fl.write_mxfp4_kv_cache(kv, k, s, interleaved=True)  # noqa: E731
    k = torch.randn(5, 128, generator=gen)
    slots = torch.tensor([3, -1, 200, 17, -1])

    cpu_pool, gpu_pool = pool.clone(), pool.cuda()
    write(cpu_pool, k, slots)
    write(gpu_pool, k.cuda(), slots.cuda())
    assert torch.equal(cpu_pool, gpu_pool.cpu())

    # capture once, change the slot contents, replay: only the new slots change
    static_k, static_slots = k.cuda(), slots.cuda()
    graph_pool = pool.cuda()
    write(graph_pool, static_k, static_slots)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        write(graph_pool, static_k, static_slots)
    graph_pool.copy_(pool.cuda())
    new_slots = torch.tensor([-1, 9, 31, -1, 255])
    static_slots.copy_(new_slots)
    static_k.copy_(k * 2)
    graph.replay()
    expected = pool.clone()
    write(expected, k * 2, new_slots)
    assert torch.equal(graph_pool.cpu(), expected)


def test_device_mismatch_and_validate_mode(monkeypatch):
    pool = torch.zeros(2, 32, 1, 132, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="k must be on the same device as kv_fused"):
        fl.write_fp8_kv_cache(pool, torch.ones(1, 128), torch.tensor([1], device="cuda"))
    with pytest.raises(ValueError, match="scales must be on the same device as values"):
        fl.pack_fp8_kv_cache(
            torch.ones(1, 2, 4, device="cuda").to(torch.float8_e4m3fn), torch.ones(1, 2)
        )
    monkeypatch.setenv("FLASHINFER_VALIDATE_INPUTS", "1")
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        fl.write_fp8_kv_cache(
            pool, torch.ones(1, 128, device="cuda"), torch.tensor([64], device="cuda")
        )
