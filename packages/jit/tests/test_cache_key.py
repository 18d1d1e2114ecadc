"""The cache key changes exactly when something that decides the cubin changes."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
from pathlib import Path

import flashinfer_jit
import pytest
from flashinfer_jit import KernelSpec, compile_kernel, toolchain
from flashinfer_jit.cache import compute_key
from flashinfer_jit.compiler import base_options, program_options_kwargs
from flashinfer_jit.selftest import CLUSTER_NEIGHBOURS, TMA_LOAD_TILE
from flashinfer_jit.toolchain import PACKAGE_INCLUDE_DIR

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


def test_the_toolchain_changes_the_key(project, monkeypatch):
    proj, inc = project
    before = _key(_spec(proj, inc))
    newer = tuple(
        (name, version + ".1" if name == "nvrtc" else version)
        for name, version in toolchain.toolchain_fingerprint()
    )
    monkeypatch.setattr(toolchain, "toolchain_fingerprint", lambda: newer)
    assert _key(_spec(proj, inc)) != before


def test_the_package_version_changes_the_key(project, monkeypatch):
    proj, inc = project
    before = _key(_spec(proj, inc))
    monkeypatch.setattr(flashinfer_jit, "__version__", flashinfer_jit.__version__ + ".post1")
    assert _key(_spec(proj, inc)) != before


def test_the_compiler_wrappers_text_is_in_the_key(project, monkeypatch):
    from flashinfer_jit import cache

    proj, inc = project
    wrapper = Path(flashinfer_jit.__file__).with_name("compiler.py").read_bytes()
    material = compute_key(_spec(proj, inc), "sm_90a", base_options()).material
    assert material["compiler_wrapper"] == hashlib.sha256(wrapper).hexdigest()
    before = _key(_spec(proj, inc))
    monkeypatch.setattr(cache, "compiler_wrapper_digest", lambda: "0" * 64)
    assert _key(_spec(proj, inc)) != before


def test_a_bytecode_only_install_keys_the_loaded_compiler_code(project, monkeypatch):
    """A stripped image that ships only .pyc files still compiles: the key falls back to the
    code object of the loaded compiler module."""
    from flashinfer_jit import cache

    proj, inc = project
    real_read_bytes = Path.read_bytes

    def no_compiler_source(self):
        if self.name == "compiler.py":
            raise FileNotFoundError(self)
        return real_read_bytes(self)

    with_source = cache.compiler_wrapper_digest()
    monkeypatch.setattr(Path, "read_bytes", no_compiler_source)
    cache.compiler_wrapper_digest.cache_clear()
    try:
        bytecode_only = cache.compiler_wrapper_digest()
        assert len(bytecode_only) == 64 and bytecode_only != with_source
        _key(_spec(proj, inc))  # no FileNotFoundError
    finally:
        cache.compiler_wrapper_digest.cache_clear()


def test_the_base_options_change_the_key(project):
    proj, inc = project
    spec = _spec(proj, inc)
    before = compute_key(spec, "sm_90a", base_options()).digest
    assert compute_key(spec, "sm_90a", (*base_options(), "-extra")).digest != before
    assert compute_key(spec, "sm_90a", base_options()[:-1]).digest != before


def test_the_name_expressions_change_the_key(project):
    proj, inc = project
    one = _spec(proj, inc, name="f<1>", name_expressions=["f<1>"])
    two = _spec(proj, inc, name="f<1>", name_expressions=["f<1>", "f<2>"])
    other = _spec(proj, inc, name="f<2>", name_expressions=["f<2>"])
    assert len({_key(one), _key(two), _key(other)}) == 3


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_lineinfo_from_the_environment_changes_the_key_and_the_options(project, monkeypatch, value):
    proj, inc = project
    spec = _spec(proj, inc)
    monkeypatch.delenv("FLASHINFER_JIT_LINEINFO", raising=False)
    before = _key(spec)
    assert "lineinfo" not in program_options_kwargs(spec, "sm_90a")
    monkeypatch.setenv("FLASHINFER_JIT_LINEINFO", value)
    assert "-lineinfo" in base_options()
    assert _key(spec) != before
    assert program_options_kwargs(spec, "sm_90a")["lineinfo"] is True


@pytest.mark.parametrize("value", ["", "0", "false", " ", "False", "no", "off", "OFF"])
def test_lineinfo_switched_off_keeps_the_key(project, monkeypatch, value):
    proj, inc = project
    monkeypatch.delenv("FLASHINFER_JIT_LINEINFO", raising=False)
    before = _key(_spec(proj, inc))
    monkeypatch.setenv("FLASHINFER_JIT_LINEINFO", value)
    assert _key(_spec(proj, inc)) == before


# Include resolution: the header hashed is the one the preprocessor reads.


def test_a_quoted_include_of_a_sibling_in_a_nested_folder_is_hashed(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "k.cu").write_text(
        '#include "sub/a.cuh"\nextern "C" __global__ void k(int* o) { o[0] = SIB; }\n'
    )
    (tmp_path / "sub" / "a.cuh").write_text('#pragma once\n#include "sib.cuh"\n')
    (tmp_path / "sub" / "sib.cuh").write_text("#define SIB 1\n")
    spec = KernelSpec.make(name="k", source=tmp_path / "k.cu")
    files = compute_key(spec, "sm_90a", base_options()).files
    assert [f.path for f in files] == [
        tmp_path / "k.cu",
        tmp_path / "sub" / "a.cuh",
        tmp_path / "sub" / "sib.cuh",
    ]
    before = _key(spec)
    (tmp_path / "sub" / "sib.cuh").write_text("#define SIB 2\n")
    assert _key(spec) != before


# Spellings of an include line that NVRTC's preprocessor reads as one (comments, line
# continuations, any horizontal whitespace, the %: digraph, include_next).
INCLUDE_SPELLINGS = {
    "plain": b'#include "v.h"\n',
    "form feed": b'\x0c#include "v.h"\n',
    "vertical tab": b'\x0b# include "v.h"\n',
    "comment before": b'/* c */ #include "v.h"\n',
    "comment inside": b'#/* c */include "v.h"\n',
    "comment over lines": b'/* a\n b */ #include "v.h"\n',
    "continuation after #": b'#\\\ninclude "v.h"\n',
    "continuation before the name": b'#include \\\n"v.h"\n',
    "digraph": b'%:include "v.h"\n',
    "include_next": b'#include_next "v.h"\n',
    "crlf": b'struct before_t {};\r\n#include "v.h"\r\n',
}
INCLUDE_KERNEL = (
    b'static_assert(V == 1, "v.h read");\nextern "C" __global__ void k(int* o) { o[0] = V; }\n'
)


def _assert_keyed(spec: KernelSpec, files: list[Path]) -> None:
    """The key hashes exactly `files` (the last defines V), and editing the last changes it."""
    assert [f.path for f in compute_key(spec, "sm_90a", base_options()).files] == files
    before = _key(spec)
    files[-1].write_text("#define V 1 // edited\n")
    assert _key(spec) != before


@pytest.mark.parametrize("spelling", INCLUDE_SPELLINGS)
def test_every_spelling_of_an_include_is_followed(tmp_path, spelling):
    """A header the preprocessor reads must be in the key whatever the include line's
    spelling, or editing it would serve the old cubin."""
    (tmp_path / "k.cu").write_bytes(INCLUDE_SPELLINGS[spelling] + INCLUDE_KERNEL)
    (tmp_path / "v.h").write_text("#define V 1\n")
    spec = KernelSpec.make(name="k", source=tmp_path / "k.cu")
    _assert_keyed(spec, [tmp_path / "k.cu", tmp_path / "v.h"])


# Under --std=c++14 (or older) the preprocessor reads the trigraphs ??= as # and ??/ as \.
TRIGRAPH_SPELLINGS = {
    "??= for #": b'??=include "v.h"\n',
    "??/ splicing a line": b'#inc??/\nlude "v.h"\n',
}


@pytest.mark.parametrize("spelling", TRIGRAPH_SPELLINGS)
def test_a_trigraph_include_is_followed_and_read_by_nvrtc(tmp_path, spelling):
    (tmp_path / "k.cu").write_bytes(TRIGRAPH_SPELLINGS[spelling] + INCLUDE_KERNEL)
    (tmp_path / "v.h").write_text("#define V 1\n")
    spec = KernelSpec.make(name="k", source=tmp_path / "k.cu", options=("--std=c++14",))
    assert compile_kernel(spec, "sm_90a", cache_dir=tmp_path / "cache").cubin
    _assert_keyed(spec, [tmp_path / "k.cu", tmp_path / "v.h"])


def test_a_header_name_that_is_not_utf8_is_followed(tmp_path):
    # The main source must be UTF-8 text; a header need not be, nor the names it includes.
    name = b"v\xff.h"
    (tmp_path / "k.cu").write_bytes(b'#include "mid.h"\n' + INCLUDE_KERNEL)
    (tmp_path / "mid.h").write_bytes(b'#include "' + name + b'"\n')
    header = tmp_path / os.fsdecode(name)
    header.write_text("#define V 1\n")
    spec = KernelSpec.make(name="k", source=tmp_path / "k.cu")
    assert compile_kernel(spec, "sm_90a", cache_dir=tmp_path / "cache").cubin
    _assert_keyed(spec, [tmp_path / "k.cu", tmp_path / "mid.h", header])


@pytest.mark.parametrize("spelling", INCLUDE_SPELLINGS)
def test_nvrtc_reads_each_spelling_as_an_include(tmp_path, spelling):
    """The premise of the test above: the kernel's static_assert needs v.h."""
    (tmp_path / "k.cu").write_bytes(INCLUDE_SPELLINGS[spelling] + INCLUDE_KERNEL)
    (tmp_path / "v.h").write_text("#define V 1\n")
    spec = KernelSpec.make(name="k", source=tmp_path / "k.cu")
    assert compile_kernel(spec, "sm_90a", cache_dir=tmp_path / "cache").cubin


@pytest.mark.parametrize(
    "text",
    [
        b'__device__ const char s[] = R"(\n/*\n)";\n#include "v.h"\n/* c */\n',
        b"__device__ constexpr int f(int, const char*) { return 0; }\n"
        b'__device__ constexpr int a = f(1\'000, "it\'s /*");\n#include "v.h"\n/* c */\n',
        b"#include <sub//v.h>\n",
        b'#if 0\n#error don\'t\n#endif\n#include "v.h"\n',
        b'__device__ const char s[] = R"(\nx /*\n)";\n/* c */ #include "v.h"\n',
        b'__device__ const char s[] = u8R"d(\n/*)d";\n#inc\\\nlude "v.h"\n',
        b"__device__ constexpr int f(int, const char*) { return 0; }\n"
        b'__device__ constexpr int a = f(1\'000, "it\'s /*");\n/* c */ #include "v.h"\n',
        b'/* c *\\\n/ #include "v.h"\n',
        b'%\\\n:include "v.h"\n',
        b'#\rinclude "v.h"\n',
        b"#define M 1'/*'\n/* c */ #include \"v.h\"\n/* */\n",
        b'#if 0\ndon\'t " /*\n#endif\n/* d */ #include "v.h"\n',
        b"/* c */ #include <sub//v.h>\n",
    ],
    ids=[
        "raw string",
        "digit separator",
        "slashes in the name",
        "apostrophe in #error",
        "raw string, then a comment before the include",
        "prefixed raw string, then a split include",
        "digit separator, then a comment before the include",
        "a continuation splitting the */ before the directive",
        "a continuation splitting %:",
        "a lone carriage return, a space to NVRTC",
        "a quote after a number, then a comment before the include",
        "an unterminated quote in #if 0, then a comment before the include",
        "slashes in the name after a comment",
    ],
)
def test_code_the_comment_scan_misreads_still_has_its_includes_followed(tmp_path, text):
    """Code where a naive comment scan sees a comment (a `/*` in a raw string or after a digit
    separator) or cuts a name (`<sub//v.h>`): the include is followed all the same, whether
    only the scan of the text as written can see it or only the scan without comments (found
    by three reviews: each served a stale cubin at some point of this change)."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "k.cu").write_bytes(text + INCLUDE_KERNEL)
    header = tmp_path / ("sub" if b"sub//" in text else "") / "v.h"
    header.write_text("#define V 1\n")
    spec = KernelSpec.make(name="k", source=tmp_path / "k.cu")
    assert compile_kernel(spec, "sm_90a", cache_dir=tmp_path / "cache").cubin  # NVRTC reads it
    assert header in [f.path for f in compute_key(spec, "sm_90a", base_options()).files]


@pytest.mark.parametrize("name", ["v.h ", " v.h"])
def test_a_header_name_is_taken_as_written(tmp_path, name):
    """Spaces inside the quotes are part of the name (NVRTC opens `v.h `, not `v.h`)."""
    (tmp_path / "k.cu").write_bytes(f'#include "{name}"\n'.encode() + INCLUDE_KERNEL)
    (tmp_path / name).write_text("#define V 1\n")
    spec = KernelSpec.make(name="k", source=tmp_path / "k.cu")
    assert compile_kernel(spec, "sm_90a", cache_dir=tmp_path / "cache").cubin
    assert tmp_path / name in [f.path for f in compute_key(spec, "sm_90a", base_options()).files]


def test_include_next_hashes_the_header_it_reaches(tmp_path):
    """A wrapper header that includes the next one of its name: NVRTC reads the one further
    down the search path, which must be in the key too."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "v.h").write_text("#include_next <v.h>\n")
    (second / "v.h").write_text("#define V 1\n")
    (tmp_path / "k.cu").write_bytes(b"#include <v.h>\n" + INCLUDE_KERNEL)
    spec = KernelSpec.make(name="k", source=tmp_path / "k.cu", include_dirs=[first, second])
    assert compile_kernel(spec, "sm_90a", cache_dir=tmp_path / "cache").cubin
    before = _key(spec)
    (second / "v.h").write_text("#define V 1 // edited\n")
    assert _key(spec) != before


def test_an_include_in_a_line_comment_is_not_followed(tmp_path):
    """Nothing NVRTC does not read: an include commented out with `//`, or words of one
    inside string literals. (One inside a block comment is hashed: a spurious hash only
    costs a recompile.)"""
    (tmp_path / "k.cu").write_bytes(
        b'// #include "v.h"\nconst char* s = "#include \\"v.h\\"";\n#include "w.h"\n'
    )
    (tmp_path / "v.h").write_text("#define V 1\n")
    (tmp_path / "w.h").write_text("#define W 1\n")
    spec = KernelSpec.make(name="k", source=tmp_path / "k.cu")
    names = [f.include_name for f in compute_key(spec, "sm_90a", base_options()).files]
    assert names == ["<main>", "w.h"]


# Each header defines WHICH differently; the kernel's static_asserts fail to compile unless
# NVRTC read the header this test expects, so the expectation is checked against NVRTC.
PRECEDENCE_MAIN = """\
#include "sub/a.cuh"
#include <both.cuh>
#include <shadow.cuh>
#include "flashinfer_jit/hopper.cuh"
static_assert(QUOTED == 1, "quoted include: the including file's folder comes first");
static_assert(BOTH == 1, "the source folder comes before include_dirs");
static_assert(SHADOW == 1, "include_dirs are searched in order");
static_assert(HOPPER_SHADOW == 1, "include_dirs come before the package's include folder");
extern "C" __global__ void k(int* o) { o[0] = QUOTED + BOTH + SHADOW; }
"""


def _precedence_project(root: Path) -> tuple[KernelSpec, dict[str, Path]]:
    proj, first, second = root / "proj", root / "first", root / "second"
    (proj / "sub").mkdir(parents=True)
    (first / "flashinfer_jit").mkdir(parents=True)
    second.mkdir()
    (proj / "k.cu").write_text(PRECEDENCE_MAIN)
    (proj / "sub" / "a.cuh").write_text('#pragma once\n#include "h.cuh"\n')
    headers = {
        "picked_quoted": proj / "sub" / "h.cuh",
        "skipped_quoted": proj / "h.cuh",
        "picked_both": proj / "both.cuh",
        "skipped_both": first / "both.cuh",
        "picked_shadow": first / "shadow.cuh",
        "skipped_shadow": second / "shadow.cuh",
        "picked_hopper": first / "flashinfer_jit" / "hopper.cuh",
    }
    values = {"quoted": "QUOTED", "both": "BOTH", "shadow": "SHADOW", "hopper": "HOPPER_SHADOW"}
    for role, path in headers.items():
        macro = values[role.split("_")[1]]
        path.write_text(f"#pragma once\n#define {macro} {1 if role.startswith('picked') else 2}\n")
    spec = KernelSpec.make(name="k", source=proj / "k.cu", include_dirs=[first, second])
    return spec, headers


def test_the_header_hashed_is_the_one_the_preprocessor_picks(tmp_path, cache_dir):
    spec, headers = _precedence_project(tmp_path)
    compile_kernel(spec, "sm_90a", cache_dir=cache_dir)  # the static_asserts hold
    hashed = {f.path for f in compute_key(spec, "sm_90a", base_options()).files}
    assert PACKAGE_INCLUDE_DIR / "flashinfer_jit" / "hopper.cuh" not in hashed
    for role, path in headers.items():
        assert (path in hashed) == role.startswith("picked"), role
        before = _key(spec)
        path.write_text(path.read_text() + "// edited\n")
        assert (_key(spec) != before) == role.startswith("picked"), role


@pytest.mark.parametrize("spec", [TMA_LOAD_TILE, CLUSTER_NEIGHBOURS], ids=lambda s: s.name)
def test_a_selftest_kernel_hashes_the_packages_own_header(spec):
    files = compute_key(spec, "sm_90a", base_options()).files
    hopper = PACKAGE_INCLUDE_DIR / "flashinfer_jit" / "hopper.cuh"
    assert [(f.include_name, f.path) for f in files if f.path == hopper] == [
        ("flashinfer_jit/hopper.cuh", hopper)
    ]


def test_a_cache_dir_argument_expands_a_leading_tilde(monkeypatch, tmp_path):
    from flashinfer_jit.cache import cache_root

    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root("~/kernels") == tmp_path / "kernels"


def _no_home(monkeypatch):
    """An arbitrary container uid: HOME unset and no passwd entry."""
    import pwd

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.delenv("FLASHINFER_JIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)


@pytest.mark.skipif(sys.platform != "linux", reason="the XDG and passwd rules are Linux's")
def test_without_a_home_folder_the_default_cache_dir_names_the_variable(monkeypatch):
    from flashinfer_jit.cache import NoCacheFolderError, default_cache_dir

    _no_home(monkeypatch)
    with pytest.raises(NoCacheFolderError, match="set FLASHINFER_JIT_CACHE_DIR"):
        default_cache_dir()
    monkeypatch.setenv("FLASHINFER_JIT_CACHE_DIR", "/srv/kernels")
    assert default_cache_dir() == Path("/srv/kernels")


@pytest.mark.skipif(sys.platform != "linux", reason="the XDG and passwd rules are Linux's")
def test_without_a_home_folder_kernels_compile_without_the_cache(project, monkeypatch, caplog):
    from flashinfer_jit import compiler

    proj, inc = project
    _no_home(monkeypatch)
    monkeypatch.setattr(compiler, "_warned_no_cache_folder", False)
    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        compiled = compile_kernel(_spec(proj, inc), "sm_90a")
        assert flashinfer_jit.lookup_kernel(_spec(proj, inc), "sm_90a") is None
    assert compiled.cubin[:4] == b"\x7fELF" and compiled.cache_path is None
    assert "compiling without the disk cache" in caplog.text
    assert "FLASHINFER_JIT_CACHE_DIR" in caplog.text


@pytest.mark.skipif(sys.platform != "linux", reason="the XDG and passwd rules are Linux's")
def test_a_cache_folder_under_an_unknown_home_compiles_without_the_cache(
    project, monkeypatch, caplog
):
    from flashinfer_jit import compiler
    from flashinfer_jit.cache import NoCacheFolderError, cache_root

    proj, inc = project
    with pytest.raises(NoCacheFolderError, match="'~no-such-user-here/c'"):
        cache_root("~no-such-user-here/c")
    monkeypatch.setenv("FLASHINFER_JIT_CACHE_DIR", "~no-such-user-here/c")
    monkeypatch.setattr(compiler, "_warned_no_cache_folder", False)
    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        compiled = compile_kernel(_spec(proj, inc), "sm_90a")
    assert compiled.cubin[:4] == b"\x7fELF" and compiled.cache_path is None
    assert "compiling without the disk cache" in caplog.text


@pytest.mark.skipif(sys.platform != "linux", reason="the XDG and passwd rules are Linux's")
@pytest.mark.parametrize("xdg", ["relcache", "", None])
def test_a_relative_or_empty_xdg_cache_home_is_ignored(monkeypatch, tmp_path, xdg):
    from flashinfer_jit.cache import default_cache_dir

    monkeypatch.delenv("FLASHINFER_JIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert default_cache_dir() == tmp_path / ".cache" / "flashinfer-hopper" / "jit"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "flashinfer-hopper" / "jit"


def test_a_relative_cache_dir_is_used_as_given_against_the_working_directory(monkeypatch, tmp_path):
    """Unlike a relative XDG_CACHE_HOME (ignored, as XDG asks), the project's own variable and
    argument are used as given (docs/jit.md says so): each compile reads them against its
    working directory."""
    from flashinfer_jit.cache import cache_root, default_cache_dir

    monkeypatch.setenv("FLASHINFER_JIT_CACHE_DIR", "rel/cache")
    assert default_cache_dir() == Path("rel/cache") and not default_cache_dir().is_absolute()
    assert cache_root(None) == Path("rel/cache")
    assert cache_root("other") == Path("other")
    monkeypatch.chdir(tmp_path)
    assert cache_root(None).resolve() == tmp_path / "rel" / "cache"


@pytest.mark.skipif(sys.platform != "linux", reason="the XDG and passwd rules are Linux's")
@pytest.mark.parametrize("home", ["", "relative/home"])
def test_an_empty_or_relative_home_falls_back_to_the_passwd_entry(monkeypatch, tmp_path, home):
    import pwd

    from flashinfer_jit.cache import default_cache_dir

    entry = pwd.struct_passwd(("u", "x", 1, 1, "", str(tmp_path), "/bin/sh"))
    monkeypatch.delenv("FLASHINFER_JIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", home)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: entry)
    assert default_cache_dir() == tmp_path / ".cache" / "flashinfer-hopper" / "jit"
