"""tools/inductor_cuda_code.py: the parts that need neither Triton nor Inductor's code
generation. A case replayed from its recorded inputs is the case, and a kernel's source keeps
its body once Inductor's decorator is stripped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "layouts" / "tests"))
import inductor_cuda_code as tool
import tricky_inputs

CASES = list(tricky_inputs.tricky_cases(tricky_inputs.tricky_rows()))


def raw_bytes(out) -> list[bytes]:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist()) for t in outs]


@pytest.mark.parametrize("name", CASES)
def test_a_replayed_case_gives_the_cases_bytes(name):
    fn, inputs = tool.case_inputs(name)
    case = tricky_inputs.tricky_cases(tricky_inputs.tricky_rows())[name]
    assert all(isinstance(t, torch.Tensor) for t in inputs) and inputs
    assert raw_bytes(fn(*[t.clone() for t in inputs])) == raw_bytes(case(lambda t: t))


def test_a_replayed_case_computes_on_its_arguments():
    fn, (finite,) = tool.case_inputs("mxfp4_dequant")
    (out,) = fn(finite)
    (negated,) = fn(-finite)  # MXFP4 is sign-symmetric: the round trip negates exactly
    assert raw_bytes(negated) == raw_bytes(-out) != raw_bytes(out)


KERNEL_MODULE = """
triton_poi_fused_0 = async_compile.triton('triton_poi_fused_0', \'\'\'
import triton
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 512},
    triton_meta={'signature': {'in_ptr0': '*fp32', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused_0(in_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
\'\'\', device_str='cuda')
"""


def test_kernel_sources_and_plain_jit():
    ((name, source),) = tool.kernel_sources(KERNEL_MODULE)
    assert name == "triton_poi_fused_0"
    assert "'signature': {'in_ptr0': '*fp32'" in source  # kept for the ptx step
    plain = tool.plain_jit(source)
    assert "triton_heuristics" not in plain and "set_driver_to_gpu" not in plain
    assert "@triton.jit\ndef triton_poi_fused_0(in_ptr0, xnumel, XBLOCK" in plain
    assert "xoffset = tl.program_id(0) * XBLOCK" in plain


def test_one_program_blocks_cover_every_dimension():
    # A 2-D pointwise kernel (ynumel, xnumel) and a persistent reduction whose R0_BLOCK is
    # fixed in its body (not a parameter).
    pointwise = ["in_ptr0", "out_ptr0", "ynumel", "xnumel", "YBLOCK", "XBLOCK"]
    assert tool.one_program_blocks(pointwise, (None, None, 32, 100)) == {
        "YBLOCK": 32,
        "XBLOCK": 128,
    }
    reduction = ["in_ptr0", "out_ptr0", "xnumel", "r0_numel", "XBLOCK"]
    assert tool.one_program_blocks(reduction, (None, None, 8, 128)) == {"XBLOCK": 8}
