"""`python -m flashinfer_jit compile-check` and `inspect` (NVRTC only, no GPU)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from flashinfer_jit.cli import main
from flashinfer_jit.registry import discover_registered_specs

GOOD = """\
#include <cuda/std/cstdint>
extern "C" __global__ void good_kernel(float* out, int32_t n) {
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = SCALE * i;
}
"""
BROKEN = 'extern "C" __global__ void broken_kernel(float* out) { out[0] = missing_symbol_q; }\n'
# 64 live floats per thread under a 32-register cap must spill.
SPILLING = """\
extern "C" __global__ void spilling_kernel(float* out, const float* in) {
  float v[64];
  #pragma unroll
  for (int i = 0; i < 64; ++i) v[i] = in[threadIdx.x + i * 128];
  float s = 0.f;
  #pragma unroll
  for (int i = 0; i < 64; ++i) s += v[i] * v[63 - i];
  out[threadIdx.x] = s;
}
"""


@pytest.fixture
def spec_module(tmp_path, monkeypatch):
    """A throw-away module `jit_cli_specs` (not an installed package) with spec lists."""
    (tmp_path / "good.cu").write_text(GOOD)
    (tmp_path / "broken.cu").write_text(BROKEN)
    (tmp_path / "spilling.cu").write_text(SPILLING)
    (tmp_path / "jit_cli_specs.py").write_text(
        textwrap.dedent(
            """
            from pathlib import Path
            from flashinfer_jit import KernelSpec

            HERE = Path(__file__).parent

            def good():
                return [KernelSpec.make("good_kernel", HERE / "good.cu", {"SCALE": s})
                        for s in (1, 2, 3)]

            def broken():
                return good() + [KernelSpec.make("broken_kernel", HERE / "broken.cu")]

            def spilling():
                return [KernelSpec.make("spilling_kernel", HERE / "spilling.cu",
                                        options=["--maxrregcount=32"])]

            def empty():
                return []
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _check(target: str, cache_dir, *extra: str) -> list[str]:
    return [
        "compile-check",
        "--specs",
        target,
        "--no-progress",
        "--cache-dir",
        str(cache_dir),
        *extra,
    ]


def test_compile_check_passes_on_good_kernels(spec_module, cache_dir, capsys):
    assert main(_check("jit_cli_specs:good", cache_dir, "-j", "2")) == 0
    out = capsys.readouterr().out
    assert "3 configuration(s)" in out and "compile-check passed" in out
    # Second run: everything from the cache.
    assert main(_check("jit_cli_specs:good", cache_dir, "-j", "1")) == 0
    assert "3 cached, 0 compiled" in capsys.readouterr().out


def test_compile_check_fails_on_a_compile_error(spec_module, cache_dir, capsys):
    assert main(_check("jit_cli_specs:broken", cache_dir, "-j", "1")) == 1
    out = capsys.readouterr().out
    assert "FAILED broken_kernel" in out
    assert "missing_symbol_q" in out  # the NVRTC log is shown
    assert "compile-check FAILED" in out


def test_compile_check_fails_on_spills(spec_module, cache_dir, capsys):
    assert main(_check("jit_cli_specs:spilling", cache_dir)) == 1
    out = capsys.readouterr().out
    assert "SPILLS spilling_kernel" in out
    assert "compile-check FAILED" in out


def test_compile_check_reports_a_broken_target(spec_module, cache_dir, capsys):
    assert main(_check("jit_cli_specs:no_such_function", cache_dir)) == 1
    assert "AttributeError" in capsys.readouterr().out


def test_compile_check_with_nothing_registered_exits_zero(cache_dir, capsys):
    group = "flashinfer_jit.tests.no_such_group"
    assert main(["compile-check", "--group", group, "--cache-dir", str(cache_dir)]) == 0
    assert "nothing to compile" in capsys.readouterr().out


def test_compile_check_with_an_empty_spec_list_exits_zero(spec_module, cache_dir, capsys):
    assert main(_check("jit_cli_specs:empty", cache_dir)) == 0
    assert "nothing to compile" in capsys.readouterr().out


def test_the_package_registers_its_self_test_kernels():
    sources = discover_registered_specs()
    mine = [s for s in sources if "flashinfer_jit.selftest" in s.name]
    assert len(mine) == 1 and mine[0].error is None
    assert {s.name for s in mine[0].specs} >= {"scale_add", "tma_load_tile", "cluster_neighbours"}


def test_inspect_a_cu_file(spec_module, cache_dir, capsys):
    path = spec_module / "good.cu"
    assert main(["inspect", str(path), "-D", "SCALE=2", "--cache-dir", str(cache_dir)]) == 0
    out = capsys.readouterr().out
    assert "== good_kernel[SCALE=2]" in out
    assert "registers:" in out
    assert "spills:               0 bytes stores, 0 bytes loads" in out
    assert "local memory (stack): 0 bytes per thread" in out
    assert "shared memory:        0 bytes static" in out


def test_inspect_shows_spills_and_sass_or_why_not(spec_module, cache_dir, capsys):
    code = main(["inspect", "jit_cli_specs:spilling", "--sass", "--cache-dir", str(cache_dir)])
    assert code == 0
    out = capsys.readouterr().out
    assert "(SPILLS)" in out
    assert "SASS" in out  # either the listing or the reason it is missing
    if "SASS (" in out:
        assert "spilling_kernel" in out.split("SASS (", 1)[1]


def test_module_entry_point_runs(cache_dir):
    result = subprocess.run(
        [sys.executable, "-m", "flashinfer_jit", "cache-info", "--cache-dir", str(cache_dir)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert f"cache root: {cache_dir}" in result.stdout
