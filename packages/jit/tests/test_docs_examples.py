"""The Python examples of docs/jit.md, checked against this package.

Compiling needs no GPU, so the CPU test runs the launcher example for real and compiles its
kernel with NVRTC; the blocks that launch, encode a TMA descriptor or load kernels on a device
run in the `gpu` test. Several examples are fragments that name objects the page leaves to
the reader (`kernel`, `grid`, `args`, `my_kernel_specs`, ...): the GPU test defines exactly
those names in the namespace before the block that uses them, and nothing else.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import re
from pathlib import Path

import flashinfer_jit as jit
import pytest
import torch

# tests/ -> jit/ -> packages/ -> repository root (.parent never fails, unlike parents[3])
DOC = Path(__file__).resolve().parent.parent.parent.parent / "docs" / "jit.md"

pytestmark = pytest.mark.skipif(not DOC.exists(), reason="docs/jit.md is not in this checkout")

# Block indices of docs/jit.md's ```python fences.
LAUNCHER, TEMPLATE, LAUNCH_SIGNATURE, PREPARED_LAUNCH, TENSOR_MAP, PRECOMPILE = range(6)


def _blocks(language: str, expected: int) -> list[str]:
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    # An exact count: a renamed fence or a new example must not silently go untested.
    assert len(blocks) == expected, f"docs/jit.md: {len(blocks)} {language} blocks, not {expected}"
    return blocks


def _run(index: int, block: str, namespace: dict[str, object]) -> str:
    """Exec python block `index` in `namespace`; return what it printed."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(block, f"{DOC.name}[python block {index}]", "exec"), namespace)
    except Exception as error:  # pragma: no cover - the message is the point
        raise AssertionError(f"docs/jit.md python block {index} failed: {error!r}") from error
    return printed.getvalue()


def _launcher_namespace(folder: Path) -> dict[str, object]:
    """Run the launcher example as a module beside the page's `scale.cu` (its first cpp block).

    The launcher finds its source with `Path(__file__).with_name("scale.cu")`, so the namespace
    gets a `__file__` in `folder`, where the cpp block is written as scale.cu.
    """
    scale_cu = _blocks("cpp", 2)[0]
    assert scale_cu.startswith("// scale.cu, shipped next to the launcher")
    (folder / "scale.cu").write_text(scale_cu)
    ns: dict[str, object] = {"__file__": str(folder / "launcher.py"), "__name__": "launcher"}
    _run(LAUNCHER, _blocks("python", 6)[LAUNCHER], ns)
    return ns


def test_jit_guide_examples_without_a_gpu(tmp_path):
    blocks = _blocks("python", 6)
    ns = _launcher_namespace(tmp_path)

    # The launcher's spec compiles for sm_90a with no device ("compiling needs no GPU").
    spec = ns["_spec"](256)
    assert spec is ns["_spec"](256)  # functools.cache: each configuration built once
    assert spec.source == tmp_path / "scale.cu" and dict(spec.defines) == {"BLOCK": 256}
    compiled = jit.compile_kernel(spec, "sm_90a")
    assert compiled.entry_name == "scale_kernel" and compiled.cubin[:4] == b"\x7fELF"
    assert compiled.resources.spill_store_bytes == 0

    # Templates: the spec is built (the page's scale.cu holds no tile_kernel to compile).
    _run(TEMPLATE, blocks[TEMPLATE], ns)
    assert ns["spec"].name == "tile_kernel<128, true>"
    assert ns["spec"].name_expressions == ("tile_kernel<128, true>",)

    # `kernel.launch(grid, block, *args, shared_mem=0, ...)` is a signature, not a call to run:
    # its positional names and keyword defaults must be Kernel.launch's.
    call = ast.parse(blocks[LAUNCH_SIGNATURE]).body[0].value
    assert isinstance(call, ast.Call) and ast.unparse(call.func) == "kernel.launch"
    params = list(inspect.signature(jit.Kernel.launch).parameters.values())[1:]  # not self
    positional = [
        ("*" if p.kind is p.VAR_POSITIONAL else "") + p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    assert [ast.unparse(arg) for arg in call.args] == positional
    keywords = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}
    assert {k.arg: ast.literal_eval(k.value) for k in call.keywords} == keywords


# The TMA example launches a kernel the page only sketches (its second cpp block elides the
# parameters): one with the parameters that the example's launch passes. Block b loads the 64 x 64
# bf16 tile at row 64 * b with the example's descriptor and copies it, as it lies in the 128B
# swizzled shared memory, to `out[b * 4096:]`.
TMA_EXAMPLE_KERNEL = """\
#include "flashinfer_jit/hopper.cuh"

extern "C" __global__ void copy_tiles(const __grid_constant__ flashinfer_jit::TensorMap tile_map,
                                      unsigned short* __restrict__ out, int rows) {
  extern __shared__ unsigned char dynamic_smem[];
  __shared__ alignas(8) unsigned long long barrier;
  // The 128B swizzle needs a 1024-byte aligned destination.
  unsigned short* tile = reinterpret_cast<unsigned short*>(
      (reinterpret_cast<unsigned long long>(dynamic_smem) + 1023) & ~1023ull);
  const int row = blockIdx.x * 64;
  if (row >= rows) return;
  if (threadIdx.x == 0) {
    flashinfer_jit::mbarrier_init(&barrier, 1);
    flashinfer_jit::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    flashinfer_jit::mbarrier_arrive_expect_tx(&barrier, 64 * 64 * 2);
    flashinfer_jit::tma_load_2d(tile, &tile_map, &barrier, 0, row);
  }
  flashinfer_jit::mbarrier_wait_parity(&barrier, 0);
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) out[blockIdx.x * 64 * 64 + i] = tile[i];
}
"""


def _swizzle_128b(tiles: torch.Tensor) -> torch.Tensor:
    """`[n, 64, 64]` 2-byte tiles as TMA's 128B swizzle stores them: in row r, 16-byte chunk j
    of the 128-byte row goes to chunk j ^ (r % 8)."""
    r = torch.arange(64, device=tiles.device).view(64, 1)
    c = torch.arange(64, device=tiles.device).view(1, 64)
    destination = (r * 64 + (((c // 8) ^ (r % 8)) * 8) + c % 8).flatten()
    swizzled = torch.empty_like(tiles.flatten(1))
    swizzled[:, destination] = tiles.flatten(1)
    return swizzled


@pytest.mark.gpu
def test_jit_guide_examples_on_gpu(tmp_path):
    blocks = _blocks("python", 6)
    ns = _launcher_namespace(tmp_path)
    gen = torch.Generator(device="cuda").manual_seed(0)

    # The launcher: compile for the device, load, launch.
    n = 1000
    x = torch.randn(n, device="cuda", generator=gen)
    out = torch.full_like(x, float("nan"))
    ns["scale"](out, x, 2.5)
    torch.cuda.synchronize()
    assert torch.equal(out, x * 2.5)

    _run(TEMPLATE, blocks[TEMPLATE], ns)

    # A launch that repeats, with the launcher's kernel. The stream is idle first: this kernel
    # has no griddepcontrol.wait, which a PDL launch after pending work would need.
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    ns["kernel"] = jit.load_kernel(ns["_spec"](256), x.device)
    ns.update(grid=(n + 255) // 256, block=256, smem=0, args=(out, x, jit.f32(3.0), jit.i32(n)))
    _run(PREPARED_LAUNCH, blocks[PREPARED_LAUNCH], ns)
    torch.cuda.synchronize()
    assert torch.equal(out, x * 3.0)

    # TMA descriptors: "64 rows x 64 columns" of the [4096, 512] bf16 source, 128B swizzled.
    (tmp_path / "copy_tiles.cu").write_text(TMA_EXAMPLE_KERNEL)
    rows = 4096
    tiles_out = torch.zeros(rows * 64, device="cuda", dtype=torch.bfloat16)
    ns["kernel"] = jit.load_kernel(jit.KernelSpec.make("copy_tiles", tmp_path / "copy_tiles.cu"))
    ns.update(grid=rows // 64, out=tiles_out, rows=rows, smem_bytes=64 * 64 * 2 + 1024)
    _run(TENSOR_MAP, blocks[TENSOR_MAP], ns)
    torch.cuda.synchronize()
    assert ns["source"].shape == (rows, 512) and ns["source"].dtype == torch.bfloat16
    expected = _swizzle_128b(ns["source"][:, :64].reshape(rows // 64, 64, 64))
    assert torch.equal(tiles_out.view(rows // 64, 64 * 64), expected)

    # Pre-warming at start-up, with the launcher's configurations as `my_kernel_specs()`.
    ns["my_kernel_specs"] = lambda: [ns["_spec"](128), ns["_spec"](256)]
    printed = _run(PRECOMPILE, blocks[PRECOMPILE], ns)
    # "N kernel configuration(s) for sm_90a: a cached, b compiled, 0 failed, ..."
    stated = re.search(r"print\(summary\)  # \"(.*)\"", blocks[PRECOMPILE]).group(1)
    assert stated == "N kernel configuration(s) for sm_90a: a cached, b compiled, 0 failed, ..."
    found = re.fullmatch(
        r"2 kernel configuration\(s\) for sm_90a: (\d) cached, (\d) compiled, 0 failed, .*\n",
        printed,
    )
    assert found and int(found[1]) + int(found[2]) == 2, printed
