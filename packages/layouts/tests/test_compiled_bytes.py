"""Compiled (Inductor) quantisers, dequantisers and writers against the eager bytes, on the
rounding-edge rows of `conftest.tricky_rows`.

Inductor generates its own code for the functions' arithmetic (C++ on the CPU, Triton on
CUDA), so a division that is not correctly rounded, a contraction into an FMA or a reordered
sum would change a byte at a rounding edge. Some cases cast their input to bfloat16 inside
the compiled function, which Inductor by default keeps in float32 (layouts.md, "Under
torch.compile"), so the tests ask it to round as eager does: what is compared is the
functions' own code.
"""

from __future__ import annotations

import pytest
import torch
from layouts_bytes import on_cpu, same

CASES = [
    "mxfp4",
    "mxfp4_sf16",
    "mxfp4_dequant",
    "nvfp4_global",
    "nvfp4",
    "nvfp4_own_global",
    "nvfp4_subnormal",
    "nvfp4_sf32_dequant",
    "write_fp8_pow2",
    "write_fp8_amax",
    "write_mxfp4",
    *(
        f"fp8_{m}_{d}"
        for m in ("pow2", "amax")
        for d in ("torch.float32", "torch.bfloat16", "torch.float64")
    ),
    "fp8_pow2_dequant",
    "fp8_amax_dequant",
    "fp8_amax_dequant_f64",
    "nvfp4_dequant_f64",
    "mxfp4_dequant_f64",
    "msa_pages_f64",
]

# On the H200 (PyTorch 2.11, Triton 3.6, 2026-12-04, docs/assets/bench/session89-h200-2026-12-04/
# layouts-compile/) seven cases failed here. Their causes, each found on a CPU machine by
# generating Inductor's CUDA code (tools/inductor_cuda_code.py) and removed from the
# functions: Inductor's Triton ``signbit`` of a float64 is ``x < 0`` (the MXFP4 quantisers
# lost -0.0); Triton 3.6 negates a float as ``0 - x`` (a decoded E2M1 -0.0 became +0.0); and
# it cannot lower a float8 -> float64 conversion, which Inductor makes of float8 -> float32
# -> float64 (the FP8 round trip failed to compile). ``nvfp4_subnormal`` (float32
# subnormals under a huge global scale) was added since, as a flush-to-zero probe.
# `test_compile_hazards.py` keeps all but the first out on any machine. Re-run on the H200
# on 2026-12-05 (PyTorch 2.11, Triton 3.6): all 19 CUDA cases then listed matched. The four
# float64-output cases came after that run (the reciprocal rewrite of a float64 division by
# a constant, found with Inductor's CPU lowering made to take its CUDA path).


def params(device: str):
    for name in CASES:
        marks = [pytest.mark.gpu] if device == "cuda" else []
        yield pytest.param(device, name, marks=marks, id=f"{device}-{name}")


def test_the_case_list_is_the_fixtures(tricky_cases):
    assert sorted(CASES) == sorted(tricky_cases)


@pytest.mark.parametrize(("device", "name"), [*params("cpu"), *params("cuda")])
def test_compiled_bytes_equal_eager_bytes(tricky_cases, device, name):
    case = tricky_cases[name]

    def run():
        return case(lambda a: a.to(device))

    eager = on_cpu(run())
    torch._dynamo.reset()
    with torch._inductor.config.patch(emulate_precision_casts=True):
        compiled = on_cpu(torch.compile(run, fullgraph=True)())
    assert same(eager, compiled), first_difference(eager, compiled)


def first_difference(eager, compiled) -> str:
    """Where the compiled bytes first leave the eager ones, for the failure message."""
    pairs = list(zip(eager, compiled)) if isinstance(eager, tuple) else [(eager, compiled)]
    for index, (e, c) in enumerate(pairs):
        if e.dtype != c.dtype or e.shape != c.shape:
            return f"output {index}: {c.dtype} {tuple(c.shape)}, eager {e.dtype} {tuple(e.shape)}"
        e_bytes, c_bytes = e.reshape(-1).view(torch.uint8), c.reshape(-1).view(torch.uint8)
        differ = (e_bytes != c_bytes).nonzero().flatten()
        if differ.numel():
            at = differ[:8].tolist()
            return (
                f"output {index} ({e.dtype}): {differ.numel()} bytes differ, first at {at}: "
                f"eager {e_bytes[at].tolist()}, compiled {c_bytes[at].tolist()}"
            )
    return "same bytes"
