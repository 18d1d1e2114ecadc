"""The rounding-edge rows and the cases run on them, shared by the layouts tests (through
conftest's fixtures) and by ``tools/inductor_cuda_code.py``."""

from __future__ import annotations

import flashinfer_layouts as fl
import torch


def tricky_rows() -> torch.Tensor:
    """``[8, 128]`` float32 rows built to hit every rounding edge of the quantisers.

    0: E4M3 midpoints (normal, subnormal, binade carry, 448 boundary) with row max 448;
    1: signed zeros; 2: float32 subnormals (below the fp8 amax floor); 3: a +inf;
    4: a NaN; 5: E2M1 midpoints with every 16/32-element group's max at 6; 6: exact powers
    of two and 448 * 2**k; 7: random over 12 decades.
    """
    gen = torch.Generator().manual_seed(71)
    rows = torch.randn(8, 128, generator=gen)
    rows[0, :16] = torch.tensor(
        [
            *(448.0, 1.0625, 1.1875, 248.0, 432.0, 2.0**-10, -(2.0**-10), 3 * 2.0**-10),
            *(5 * 2.0**-10, 15 * 2.0**-10, 2.0**-6 + 2.0**-10, -1.0625, 272.0, -248.0, 0.0, -0.0),
        ]
    )
    rows[1] = torch.where(torch.rand(128, generator=gen) < 0.5, -0.0, 0.0)
    tiny = torch.randint(-(2**20), 2**20, (128,), generator=gen).to(torch.float32)
    rows[2] = tiny * 2.0**-149  # exact: |tiny| < 2**23, so these are float32 subnormals
    rows[3, 7] = float("inf")
    rows[4, 9] = float("nan")
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    rows[5] = torch.cat((ties, -ties)).repeat(8)
    exponents = torch.randint(-20, 20, (128,), generator=gen).to(torch.float32)
    signs = torch.where(torch.rand(128, generator=gen) < 0.5, -1.0, 1.0)
    rows[6] = signs * torch.pow(2.0, exponents) * torch.where(exponents > 0, 448.0, 1.0)
    rows[7] = rows[7] * 10.0 ** (torch.rand(128, generator=gen) * 12 - 6)
    return rows


def tricky_cases(tricky_rows: torch.Tensor) -> dict:
    """Every quantiser and dequantiser on `tricky_rows`, as ``name -> case(to_device)``.

    ``to_device`` moves an input tensor (identity for CPU, ``.cuda()`` for the GPU); each case
    returns a tensor or a tuple of tensors whose bytes must not depend on the device.
    """
    x = tricky_rows
    finite = torch.nan_to_num(x, nan=0.0, posinf=0.0)
    slots = torch.tensor([3, -1, 200, 17, 5, 6, 7, 130])
    page = finite.repeat(16, 1).reshape(1, 1, 128, 128)  # one MSA page of one KV head

    def write_fp8(t, mode):
        pool = t(torch.zeros(4, 64, 1, 132, dtype=torch.uint8))
        fl.write_fp8_kv_cache(pool, t(x), t(slots), scale_mode=mode)
        return pool

    def write_mxfp4(t):
        pool = t(torch.zeros(4, 128, 1, 68, dtype=torch.uint8))
        fl.write_mxfp4_kv_cache(pool, t(x), t(slots), interleaved=True)
        return pool

    cases = {
        "mxfp4": lambda t: fl.quantize_mxfp4(t(x)),
        "mxfp4_sf16": lambda t: fl.quantize_mxfp4(t(x), sf_vec_size=16),
        "mxfp4_dequant": lambda t: fl.dequantize_mxfp4(
            *fl.quantize_mxfp4(t(finite)), dtype=torch.bfloat16
        ),
        "nvfp4_global": lambda t: (fl.nvfp4_global_scale(t(x)), fl.nvfp4_global_scale(t(finite))),
        "nvfp4": lambda t: fl.nvfp4_quantize(t(x), 7.0, swizzled=False),
        "nvfp4_own_global": lambda t: fl.nvfp4_quantize(
            t(finite), fl.nvfp4_global_scale(t(finite))
        ),
        # Row 2 alone: float32 subnormals, whose NVFP4 scales are nonzero only under a global
        # scale near float32's largest (its own is 3.4e38).
        "nvfp4_subnormal": lambda t: (
            fl.nvfp4_global_scale(t(x[2:3])),
            *fl.nvfp4_quantize(t(x[2:3]), 2.0**126, swizzled=False),
        ),
        "nvfp4_sf32_dequant": lambda t: fl.nvfp4_dequantize(
            *fl.nvfp4_quantize(t(finite), 0.37, sf_vec_size=32),
            0.37,
            sf_vec_size=32,
            dtype=torch.float16,
        ),
        # float64 outputs: the product with a Python-number global scale's reciprocal, which
        # a division by it would only give on CUDA when compiled.
        "nvfp4_dequant_f64": lambda t: fl.nvfp4_dequantize(
            *fl.nvfp4_quantize(t(finite), 0.37), 0.37, dtype=torch.float64
        ),
        "mxfp4_dequant_f64": lambda t: fl.dequantize_mxfp4(
            *fl.quantize_mxfp4(t(finite)), dtype=torch.float64
        ),
        "msa_pages_f64": lambda t: fl.unpack_nvfp4_msa_pages(
            fl.pack_nvfp4_msa_pages(t(page), t(page.flip(-1)), 0.37, 2.7),
            1,
            0.37,
            2.7,
            dtype=torch.float64,
        ),
        "write_fp8_pow2": lambda t: write_fp8(t, "pow2"),
        "write_fp8_amax": lambda t: write_fp8(t, "amax"),
        "write_mxfp4": write_mxfp4,
    }
    for mode in ("pow2", "amax"):
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            # The input is cast before any trace: under torch.compile the case compares the
            # quantiser's own code on a bfloat16 input. (Cast inside the compiled function,
            # PyTorch 2.11's CPU Inductor skipped the bfloat16 rounding even with
            # emulate_precision_casts: 3-4 bytes differed, 2026-12-05 on the H100 host.)
            cast = x.to(dtype)
            cases[f"fp8_{mode}_{dtype}"] = lambda t, m=mode, xd=cast: fl.quantize_fp8_per_token(
                t(xd), scale_mode=m
            )
        cases[f"fp8_{mode}_dequant"] = lambda t, m=mode: fl.dequantize_fp8_kv_cache(
            fl.pack_fp8_kv_cache(
                *fl.quantize_fp8_per_token(t(finite.reshape(2, 4, 128)), scale_mode=m)
            )
        )
    cases["fp8_amax_dequant_f64"] = lambda t: fl.dequantize_fp8_kv_cache(
        fl.pack_fp8_kv_cache(
            *fl.quantize_fp8_per_token(t(finite.reshape(2, 4, 128)), scale_mode="amax")
        ),
        dtype=torch.float64,
    )
    return cases
