"""precompile(): parallel compiles into the cache, with a summary."""

from __future__ import annotations

import pytest
from flashinfer_jit import KernelSpec, compile_kernel
from flashinfer_jit.precompile import PrecompileError, precompile

KERNEL = """\
extern "C" __global__ void fill(float* out) { out[threadIdx.x] = VALUE; }
"""


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "fill.cu"
    path.write_text(KERNEL)
    return path


def test_precompile_in_worker_processes_then_everything_is_cached(source, cache_dir):
    specs = [KernelSpec.make("fill", source, {"VALUE": v}) for v in range(3)]
    summary = precompile(
        specs + specs[:1], arch="sm_90a", max_workers=2, progress=False, cache_dir=cache_dir
    )
    assert (summary.total, summary.compiled, summary.cached) == (3, 3, 0)
    assert summary.failures == [] and summary.spills == []
    assert [r.spec for r in summary.results] == specs
    for spec in specs:
        assert compile_kernel(spec, "sm_90a", cache_dir=cache_dir).from_cache
    again = precompile(specs, arch="sm_90a", progress=False, cache_dir=cache_dir)
    assert (again.compiled, again.cached) == (0, 3)
    assert "3 cached, 0 compiled, 0 failed" in str(again)


def test_failures_are_collected_then_raised(source, tmp_path, cache_dir):
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void fill(float* out) { out[0] = nope_zz; }\n')
    specs = [
        KernelSpec.make("fill", source, {"VALUE": 1}),
        KernelSpec.make("fill", broken),
        KernelSpec.make("fill", tmp_path / "missing.cu"),
    ]
    summary = precompile(
        specs,
        arch="sm_90a",
        max_workers=1,
        progress=False,
        cache_dir=cache_dir,
        raise_on_error=False,
    )
    assert summary.compiled == 1 and len(summary.failures) == 2
    assert "nope_zz" in summary.failures[0].error
    assert "not found" in summary.failures[1].error
    with pytest.raises(PrecompileError, match="nope_zz") as info:
        precompile(specs, arch="sm_90a", max_workers=1, progress=False, cache_dir=cache_dir)
    assert info.value.summary.cached == 1


def test_max_workers_must_be_positive(source, cache_dir):
    with pytest.raises(ValueError, match="max_workers"):
        precompile(
            [KernelSpec.make("fill", source, {"VALUE": 1})],
            arch="sm_90a",
            max_workers=0,
            cache_dir=cache_dir,
        )
