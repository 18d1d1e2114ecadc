"""Compiling with NVRTC (no GPU needed) and the disk cache around it."""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import pytest
from flashinfer_jit import KernelCompileError, KernelSpec, compile_kernel
from flashinfer_jit.cache import (
    CUBIN_FILE,
    MANIFEST_FILE,
    STALE_TMP_AGE_S,
    entry_dir,
    read_entry,
    schema_root,
)

KERNEL = """\
#include <cuda/std/cstdint>
extern "C" __global__ void add_value(int32_t* out, int32_t n) {
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] += VALUE;
}
"""

ELF_MAGIC = b"\x7fELF"


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "add_value.cu"
    path.write_text(KERNEL)
    return path


def test_compile_then_hit_the_cache(source, cache_dir):
    spec = KernelSpec.make("add_value", source, {"VALUE": 3})
    first = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert first.cubin[:4] == ELF_MAGIC
    assert not first.from_cache
    assert first.entry_name == "add_value"
    assert first.resources.is_entry and first.resources.registers > 0
    assert first.cache_path == entry_dir(cache_dir, first.key)

    manifest = json.loads((first.cache_path / MANIFEST_FILE).read_text())
    assert manifest["key"] == first.key
    assert manifest["cubin_size"] == len(first.cubin)
    assert manifest["spec"]["defines"] == [["VALUE", 3]]
    assert manifest["arch"] == "sm_90a"

    again = compile_kernel(
        KernelSpec.make("add_value", source, {"VALUE": 3}), "sm_90a", cache_dir=cache_dir
    )
    assert again.from_cache
    assert again.cubin == first.cubin
    assert again.functions == first.functions


def test_compile_error_carries_the_nvrtc_log(tmp_path, cache_dir):
    broken = tmp_path / "broken.cu"
    broken.write_text(
        'extern "C" __global__ void broken_kernel(float* out) { out[0] = not_declared_xyz; }\n'
    )
    spec = KernelSpec.make("broken_kernel", broken, {"TILE": 64})
    with pytest.raises(KernelCompileError) as info:
        compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    message = str(info.value)
    assert "not_declared_xyz" in message  # from NVRTC's log
    assert "is undefined" in message
    assert "broken_kernel" in message
    assert "TILE=64" in message
    assert "sm_90a" in message
    assert str(broken) in message
    assert info.value.log and "not_declared_xyz" in info.value.log
    assert not any(schema_root(cache_dir).glob("??/*"))  # nothing published


def test_missing_entry_point_names_the_ones_found(tmp_path, cache_dir):
    path = tmp_path / "mangled.cu"
    path.write_text("__global__ void not_extern_c(float* out) { out[0] = 1.f; }\n")
    with pytest.raises(ValueError, match=r"entry points found: \['_Z12not_extern_cPf'\]"):
        compile_kernel(KernelSpec.make("not_extern_c", path), "sm_90a", cache_dir=cache_dir)


def test_template_name_expression(tmp_path, cache_dir):
    path = tmp_path / "tmpl.cu"
    path.write_text("template <int N> __global__ void fill(int* out) { out[threadIdx.x] = N; }\n")
    spec = KernelSpec.make("fill<9>", path, name_expressions=["fill<9>"])
    compiled = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert compiled.entry_name == "_Z4fillILi9EEvPi"
    cached = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert cached.from_cache and cached.entry_name == "_Z4fillILi9EEvPi"


@pytest.mark.parametrize(
    ("option", "fragment"),
    [
        ("--bogus-flag", "unsupported NVRTC option"),
        ("-DX=1", "KernelSpec.defines"),
        ("--maxrregcount=lots", "bad value"),
    ],
)
def test_unsupported_options_are_rejected(source, cache_dir, option, fragment):
    spec = KernelSpec.make("add_value", source, {"VALUE": 1}, options=[option])
    with pytest.raises(ValueError, match=fragment):
        compile_kernel(spec, "sm_90a", cache_dir=cache_dir)


def test_malformed_arch_is_rejected(source, cache_dir):
    with pytest.raises(ValueError, match="sm_90a"):
        compile_kernel(
            KernelSpec.make("add_value", source, {"VALUE": 1}), "90", cache_dir=cache_dir
        )


@pytest.mark.parametrize(
    "damage",
    [
        "truncate_cubin",
        "flip_cubin_byte",
        "garbage_manifest",
        "manifest_fields",
        "missing_cubin",
        "file_instead_of_folder",
    ],
)
def test_damaged_entry_is_detected_recompiled_and_replaced(source, cache_dir, caplog, damage):
    spec = KernelSpec.make("add_value", source, {"VALUE": 5})
    good = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    cubin_path = good.cache_path / CUBIN_FILE
    if damage == "truncate_cubin":
        cubin_path.write_bytes(good.cubin[: len(good.cubin) // 2])
    elif damage == "flip_cubin_byte":
        data = bytearray(good.cubin)
        data[len(data) // 2] ^= 0xFF
        cubin_path.write_bytes(bytes(data))
    elif damage == "garbage_manifest":
        (good.cache_path / MANIFEST_FILE).write_text("{not json")
    elif damage == "manifest_fields":  # valid JSON, key, size and SHA intact; a field is not
        manifest = json.loads((good.cache_path / MANIFEST_FILE).read_text())
        manifest["functions"] = {"add_value": "garbage"}
        (good.cache_path / MANIFEST_FILE).write_text(json.dumps(manifest))
    elif damage == "file_instead_of_folder":
        shutil.rmtree(good.cache_path)
        good.cache_path.write_text("a file where the entry's folder should be")
    else:
        cubin_path.unlink()

    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        again = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert not again.from_cache  # recompiled, not served damaged
    assert again.cubin == good.cubin
    assert "damaged cache entry" in caplog.text
    repaired = read_entry(cache_dir, good.key)
    assert repaired is not None and repaired.cubin == good.cubin
    assert compile_kernel(spec, "sm_90a", cache_dir=cache_dir).from_cache


def test_unwritable_cache_still_compiles(source, tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache root should be")
    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        compiled = compile_kernel(
            KernelSpec.make("add_value", source, {"VALUE": 2}), "sm_90a", cache_dir=blocker
        )
    assert compiled.cubin[:4] == ELF_MAGIC and compiled.cache_path is None
    assert "cannot write the kernel cache" in caplog.text


def test_four_processes_compiling_at_once_leave_one_valid_entry(source, cache_dir, monkeypatch):
    # Spawned children get the parent's sys.path, so they can import the helper module.
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    import jit_test_helpers

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(4)
    results = context.Queue()
    processes = [
        context.Process(
            target=jit_test_helpers.compile_when_released,
            args=(str(source), str(cache_dir), barrier, results),
        )
        for _ in range(4)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert all(p.exitcode == 0 for p in processes)
    assert [o[0] for o in outcomes] == ["ok"] * 4, outcomes
    assert len({o[1] for o in outcomes}) == 1  # everyone got the same cubin
    entries = [p for p in schema_root(cache_dir).glob("??/*") if p.is_dir()]
    assert len(entries) == 1
    entry = read_entry(cache_dir, entries[0].name)
    assert entry is not None
    assert hashlib.sha256(entry.cubin).hexdigest() == outcomes[0][1]
    assert sorted(p.name for p in entries[0].iterdir()) == [CUBIN_FILE, MANIFEST_FILE]
    assert list((schema_root(cache_dir) / "tmp").iterdir()) == []  # no stray temp folders


def test_first_compiles_from_several_threads_at_once(source, cache_dir, monkeypatch):
    # The first import of cuda.core is not thread-safe (cuda-core 1.2: a second thread can
    # see its half-initialised cu13 module and fail with "cannot import name 'Program'"), so
    # several threads compiling before anything imported it failed in 2 of 3 fresh processes.
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    import jit_test_helpers

    context = multiprocessing.get_context("spawn")
    for attempt in range(3):
        results = context.Queue()
        process = context.Process(
            target=jit_test_helpers.compile_from_threads,
            args=(str(source), str(cache_dir / str(attempt)), 4, results),
        )
        process.start()
        outcomes = results.get(timeout=300)
        process.join(timeout=60)
        assert outcomes == ["ok"] * 4, outcomes


def test_publishing_sweeps_what_killed_processes_left(source, cache_dir):
    """Temp folders and moved-aside entries a day old are abandoned; younger ones may be a
    publication in progress in another process and stay."""
    tmp_parent = schema_root(cache_dir) / "tmp"
    tmp_parent.mkdir(parents=True)
    abandoned, recent = tmp_parent / "0123456789abcdef.dead", tmp_parent / "fedcba9876543210.live"
    for folder in (abandoned, recent):
        folder.mkdir()
        (folder / CUBIN_FILE).write_bytes(b"partial")
    stray_file = tmp_parent / "corrupt.0123456789abcdef.file"
    stray_file.write_text("a moved-aside entry that was a file")
    day_old = time.time() - STALE_TMP_AGE_S - 60
    for path in (abandoned / CUBIN_FILE, abandoned, stray_file):
        os.utime(path, (day_old, day_old))
    compile_kernel(
        KernelSpec.make("add_value", source, {"VALUE": 9}), "sm_90a", cache_dir=cache_dir
    )
    assert sorted(p.name for p in tmp_parent.iterdir()) == [recent.name]
