"""The cache key changes exactly when something that decides the cubin changes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from flashinfer_jit import KernelSpec, compile_kernel
from flashinfer_jit.cache import compute_key
from flashinfer_jit.compiler import base_options

MAIN = """\
#include "a.cuh"
#include <cuda/std/cstdint>
#include <c.cuh>
extern "C" __global__ void k(int32_t* out) { out[0] = A_VALUE + B_VALUE + C_VALUE + X; }
"""


def _write_project(root: Path) -> tuple[Path, Path]:
    project = root / "proj"
    (project / "nested").mkdir(parents=True)
    (project / "main.cu").write_text(MAIN)
    (project / "a.cuh").write_text('#pragma once\n#include "nested/b.cuh"\n#define A_VALUE 1\n')
    (project / "nested" / "b.cuh").write_text("#pragma once\n#define B_VALUE 2\n")
    (project / "unrelated.cuh").write_text("#define UNUSED 0\n")
    include = root / "inc"
    include.mkdir()
    (include / "c.cuh").write_text("#pragma once\n#define C_VALUE 3\n")
    return project, include


@pytest.fixture
def project(tmp_path):
    return _write_project(tmp_path)


def _spec(project: Path, include: Path, **overrides) -> KernelSpec:
    fields = {
        "name": "k",
        "source": project / "main.cu",
        "defines": {"X": 4},
        "include_dirs": [include],
        "options": ["--use_fast_math"],
    }
    fields.update(overrides)
    return KernelSpec.make(**fields)


def _key(spec: KernelSpec, arch: str = "sm_90a") -> str:
    return compute_key(spec, arch, base_options()).digest


def test_same_inputs_give_the_same_key_for_distinct_spec_objects(project):
    proj, inc = project
    first, second = _spec(proj, inc), _spec(proj, inc)
    assert first is not second
    assert _key(first) == _key(second)
    assert len(_key(first)) == 64


def test_every_project_file_is_hashed_and_nothing_else(project):
    proj, inc = project
    files = compute_key(_spec(proj, inc), "sm_90a", base_options()).files
    assert [f.include_name for f in files] == ["<main>", "a.cuh", "nested/b.cuh", "c.cuh"]


@pytest.mark.parametrize(
    "relative",
    ["proj/main.cu", "proj/a.cuh", "proj/nested/b.cuh", "inc/c.cuh"],
)
def test_editing_the_source_or_any_included_header_changes_the_key(project, tmp_path, relative):
    proj, inc = project
    before = _key(_spec(proj, inc))
    path = tmp_path / relative
    path.write_text(path.read_text() + "// edited\n")
    assert _key(_spec(proj, inc)) != before


def test_rewriting_identical_content_keeps_the_key(project):
    proj, inc = project
    before = _key(_spec(proj, inc))
    header = proj / "nested" / "b.cuh"
    header.write_text(header.read_text())  # new mtime, same bytes
    assert _key(_spec(proj, inc)) == before


def test_a_file_that_is_not_included_does_not_matter(project):
    proj, inc = project
    before = _key(_spec(proj, inc))
    (proj / "unrelated.cuh").write_text("#define UNUSED 1\n")
    assert _key(_spec(proj, inc)) == before


def test_a_define_change_changes_the_key(project):
    proj, inc = project
    assert _key(_spec(proj, inc)) != _key(_spec(proj, inc, defines={"X": 5}))
    assert _key(_spec(proj, inc)) != _key(_spec(proj, inc, defines={"X": 4, "Y": 0}))


def test_an_option_change_changes_the_key(project):
    proj, inc = project
    assert _key(_spec(proj, inc)) != _key(_spec(proj, inc, options=[]))
    assert _key(_spec(proj, inc)) != _key(_spec(proj, inc, options=["--maxrregcount=64"]))


def test_the_arch_changes_the_key(project):
    proj, inc = project
    spec = _spec(proj, inc)
    keys = {_key(spec, arch) for arch in ("sm_90a", "sm_90", "sm_100a")}
    assert len(keys) == 3


def test_label_and_location_do_not_change_the_key(project, tmp_path):
    proj, inc = project
    before = _key(_spec(proj, inc))
    assert _key(_spec(proj, inc, label="renamed")) == before
    # The same files in another folder (another machine, another venv) share entries.
    moved = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "proj", moved / "proj")
    shutil.copytree(tmp_path / "inc", moved / "inc")
    assert _key(_spec(moved / "proj", moved / "inc")) == before


def test_a_nested_header_edit_triggers_a_recompile(project, cache_dir):
    proj, inc = project
    spec = _spec(proj, inc, options=[])
    first = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert not first.from_cache
    assert compile_kernel(spec, "sm_90a", cache_dir=cache_dir).from_cache
    (proj / "nested" / "b.cuh").write_text("#pragma once\n#define B_VALUE 20\n")
    rebuilt = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert not rebuilt.from_cache
    assert rebuilt.key != first.key
    assert rebuilt.cubin != first.cubin  # the constant 20 is in the code


def test_a_symlinked_source_hashes_the_headers_nvrtc_reads(tmp_path):
    """NVRTC searches a quoted include in the folder of the source as named, so through a
    symlink it reads the link folder's header: that one must be in the key."""
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.mkdir()
    (real / "k.cu").write_text(
        '#include "h.cuh"\nextern "C" __global__ void k(int* o) { o[0] = H; }\n'
    )
    (real / "h.cuh").write_text("#define H 1\n")
    (link / "h.cuh").write_text("#define H 2\n")
    (link / "k.cu").symlink_to(real / "k.cu")
    spec = KernelSpec.make(name="k", source=link / "k.cu")
    before = _key(spec)
    files = compute_key(spec, "sm_90a", base_options()).files
    assert [f.path for f in files] == [link / "k.cu", link / "h.cuh"]
    (link / "h.cuh").write_text("#define H 3\n")
    assert _key(spec) != before
    (real / "h.cuh").write_text("#define H 4\n")  # not read by NVRTC through the link
    assert _key(KernelSpec.make(name="k", source=link / "k.cu")) == _key(spec)


def test_a_source_that_is_not_utf8_is_named(tmp_path):
    source = tmp_path / "bad.cu"
    source.write_bytes(b"\xff\xfe not text")
    with pytest.raises(ValueError, match=r"kernel source for .* is not UTF-8 text: .*bad\.cu"):
        compute_key(KernelSpec.make(name="k", source=source), "sm_90a", base_options())
