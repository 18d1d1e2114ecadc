"""Compiling with NVRTC (no GPU needed) and the disk cache around it."""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import pytest
from flashinfer_jit import KernelCompileError, KernelSpec, compile_kernel, lookup_kernel
from flashinfer_jit.cache import (
    CUBIN_FILE,
    MANIFEST_FILE,
    STALE_TMP_AGE_S,
    entry_dir,
    read_entry,
    schema_root,
)
from flashinfer_jit.compiler import program_options_kwargs

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


GUARDED_KERNEL = """
#if ENABLE
extern "C" __global__ void guarded(float* out) { out[0] = 1.f; }
#endif
"""


@pytest.mark.parametrize("other_kernel", [False, True])
def test_a_kernel_its_defines_switch_off_is_refused_and_not_cached(
    tmp_path, cache_dir, caplog, other_kernel
):
    """A cubin without the kernel's code (here inside a false #if; also a template named
    without name_expressions) is refused at once: it used to be published, then read back as
    damaged and recompiled on every call, after four report retries that turned the retries
    off for the whole process."""
    import flashinfer_jit.compiler as compiler

    path = tmp_path / "guarded.cu"
    other = 'extern "C" __global__ void other(float* out) { out[0] = 2.f; }\n'
    path.write_text(GUARDED_KERNEL + (other if other_kernel else ""))
    found = r"\['other'\]" if other_kernel else "none"
    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        with pytest.raises(ValueError, match=rf"'guarded' .* entry points found: {found}\. .*#if"):
            compile_kernel(KernelSpec.make("guarded", path), "sm_90a", cache_dir=cache_dir)
    assert not any(schema_root(cache_dir).glob("??/*"))  # nothing published
    assert compiler._report_retries_help  # no report retries were spent on it
    assert "no ptxas resource report" not in caplog.text
    compiled = compile_kernel(
        KernelSpec.make("guarded", path, {"ENABLE": 1}), "sm_90a", cache_dir=cache_dir
    )
    assert compiled.resources.is_entry and not compiled.from_cache


def test_a_template_without_name_expressions_is_refused(tmp_path, cache_dir):
    path = tmp_path / "template.cu"
    path.write_text("template <int N> __global__ void fill(float* out) { out[0] = N; }\n")
    with pytest.raises(ValueError, match=r"entry points found: none.*name_expressions"):
        compile_kernel(KernelSpec.make("fill<4>", path), "sm_90a", cache_dir=cache_dir)
    assert not any(schema_root(cache_dir).glob("??/*"))


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
        # Out-of-range integers: NVRTC 13 aborts or crashes the process on some of them.
        ("--split-compile=2147483648", r"--split-compile expects an integer in \[0, 256\]"),
        ("--split-compile=10000000", r"--split-compile expects an integer in \[0, 256\]"),
        ("--split-compile=-1", r"--split-compile expects an integer in \[0, 256\]"),
        ("--maxrregcount=-5", r"--maxrregcount expects an integer in \[1, 255\]"),
        ("-maxrregcount=256", r"-maxrregcount expects an integer in \[1, 255\]"),
    ],
)
def test_unsupported_options_are_rejected(source, cache_dir, option, fragment):
    spec = KernelSpec.make("add_value", source, {"VALUE": 1}, options=[option])
    with pytest.raises(ValueError, match=fragment):
        compile_kernel(spec, "sm_90a", cache_dir=cache_dir)


@pytest.mark.parametrize("option", ["-Xptxas=", "--ptxas-options=", "-Xptxas= \t"])
def test_an_empty_ptxas_option_is_rejected_before_nvrtc_sees_it(source, option):
    """NVRTC 13 aborts the process (std::out_of_range) on an empty ptxas option value."""
    spec = KernelSpec.make("add_value", source, {"VALUE": 1}, options=[option])
    with pytest.raises(ValueError, match=r"bad value in .*expects ptxas options"):
        program_options_kwargs(spec, "sm_90a")


def test_a_source_path_that_is_not_utf8_is_named(tmp_path):
    folder = tmp_path / os.fsdecode(b"bad\xffdir")
    folder.mkdir()
    (folder / "k.cu").write_text('extern "C" __global__ void k(int* o) { o[0] = 1; }\n')
    spec = KernelSpec.make("k", folder / "k.cu")
    with pytest.raises(ValueError, match=r"kernel 'k': NVRTC takes file and folder names as UTF-8"):
        compile_kernel(spec, "sm_90a", cache_dir=tmp_path / "cache")


def test_a_bad_boolean_option_value_is_named_once(source):
    spec = KernelSpec.make("add_value", source, {"VALUE": 1}, options=["--fmad=maybe"])
    with pytest.raises(ValueError) as info:
        program_options_kwargs(spec, "sm_90a")
    assert str(info.value) == (
        "KernelSpec.options: bad value in '--fmad=maybe': --fmad expects true/false, got 'maybe'"
    )


@pytest.mark.parametrize("option", ["-Xptxas=-O3", "--ptxas-options=--warn-on-spills"])
def test_a_user_ptxas_option_keeps_the_resource_report(source, cache_dir, option):
    spec = KernelSpec.make("add_value", source, {"VALUE": 4}, options=[option])
    assert program_options_kwargs(spec, "sm_90a")["ptxas_options"] == ["-v", option.split("=")[1]]
    compiled = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert compiled.resources.is_entry and compiled.resources.registers > 0
    manifest = json.loads((compiled.cache_path / MANIFEST_FILE).read_text())
    assert manifest["functions"]["add_value"]["registers"] == compiled.resources.registers


@pytest.mark.parametrize(
    ("option", "field", "value"),
    [
        ("--fmad=false", "fma", False),
        ("-fmad=true", "fma", True),
        ("--ftz=true", "ftz", True),
        ("--prec-div=false", "prec_div", False),
        ("--prec-sqrt=0", "prec_sqrt", False),
        ("--maxrregcount=64", "max_register_count", 64),
        ("--diag-suppress=177,550", "diag_suppress", [177, 550]),
        ("--use_fast_math", "use_fast_math", True),
        ("-G", "debug", True),
    ],
)
def test_each_option_sets_its_own_program_option(source, option, field, value):
    spec = KernelSpec.make("add_value", source, {"VALUE": 1}, options=[option])
    kwargs = program_options_kwargs(spec, "sm_90a")
    default = program_options_kwargs(KernelSpec.make("add_value", source, {"VALUE": 1}), "sm_90a")
    assert kwargs[field] == value
    assert {k: v for k, v in kwargs.items() if k != field} == default


def test_malformed_arch_is_rejected(source, cache_dir):
    with pytest.raises(ValueError, match="sm_90a"):
        compile_kernel(
            KernelSpec.make("add_value", source, {"VALUE": 1}), "90", cache_dir=cache_dir
        )


def test_an_arch_with_a_trailing_newline_is_rejected_and_caches_nothing(source, cache_dir):
    spec = KernelSpec.make("add_value", source, {"VALUE": 1})
    with pytest.raises(ValueError, match=r"got 'sm_90a\\n'"):
        compile_kernel(spec, "sm_90a\n", cache_dir=cache_dir)
    with pytest.raises(ValueError, match="arch"):
        lookup_kernel(spec, "sm_90a\n", cache_dir=cache_dir)
    assert not schema_root(cache_dir).exists()


@pytest.mark.parametrize("function", [compile_kernel, lookup_kernel])
def test_spec_must_be_a_kernel_spec(function, cache_dir):
    with pytest.raises(TypeError, match="spec: expected a KernelSpec, got NoneType"):
        function(None, "sm_90a", cache_dir=cache_dir)


@pytest.mark.parametrize(
    ("cache_dir", "error", "fragment"),
    [
        ("", ValueError, "cache_dir: expected a folder, got an empty str"),
        (5, TypeError, "got int"),
        ("cache\x00dir", ValueError, "cache_dir: the path contains a NUL byte"),
    ],
)
def test_cache_dir_must_be_a_non_empty_path(
    source, tmp_path, monkeypatch, cache_dir, error, fragment
):
    monkeypatch.chdir(tmp_path)  # where "" or 5 would have put a cache
    spec = KernelSpec.make("add_value", source, {"VALUE": 1})
    for function in (compile_kernel, lookup_kernel):
        with pytest.raises(error, match=fragment):
            function(spec, "sm_90a", cache_dir=cache_dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == [source.name]


def test_a_folder_as_source_is_an_error_naming_the_spec_and_the_path(tmp_path, cache_dir):
    spec = KernelSpec("folder_kernel", tmp_path)
    with pytest.raises(IsADirectoryError) as info:
        compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert str(info.value) == (
        f"kernel source for 'folder_kernel' is a folder, not a .cu file: {tmp_path}"
    )


def _edit_manifest(entry: Path, edit) -> None:
    """Change manifest fields; the key, cubin size and SHA-256 stay intact."""
    manifest = json.loads((entry / MANIFEST_FILE).read_text())
    edit(manifest)
    (entry / MANIFEST_FILE).write_text(json.dumps(manifest))


def _replace_by_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "stray").write_text("x")


def _replace_by_symlink_loop(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    path.symlink_to(path)


def _set_function_field(key: str, value) -> object:
    return lambda m: m["functions"]["add_value"].__setitem__(key, value)


DAMAGE = {
    "truncate_cubin": lambda e, cubin: (e / CUBIN_FILE).write_bytes(cubin[: len(cubin) // 2]),
    "flip_cubin_byte": lambda e, cubin: (e / CUBIN_FILE).write_bytes(
        cubin[:100] + bytes([cubin[100] ^ 0xFF]) + cubin[101:]
    ),
    "garbage_manifest": lambda e, cubin: (e / MANIFEST_FILE).write_text("{not json"),
    "deeply_nested_manifest": lambda e, cubin: (e / MANIFEST_FILE).write_text(
        "[" * 100_000 + "]" * 100_000
    ),
    "missing_cubin": lambda e, cubin: (e / CUBIN_FILE).unlink(),
    "file_instead_of_folder": lambda e, cubin: (
        shutil.rmtree(e),
        e.write_text("a file where the entry's folder should be"),
    ),
    "manifest_is_a_folder": lambda e, cubin: _replace_by_folder(e / MANIFEST_FILE),
    "cubin_is_a_folder": lambda e, cubin: _replace_by_folder(e / CUBIN_FILE),
    "manifest_symlink_loop": lambda e, cubin: _replace_by_symlink_loop(e / MANIFEST_FILE),
    "entry_symlink_loop": lambda e, cubin: _replace_by_symlink_loop(e),
    "functions_not_dicts": lambda e, cubin: _edit_manifest(
        e, lambda m: m.__setitem__("functions", {"add_value": "garbage"})
    ),
    "functions_empty": lambda e, cubin: _edit_manifest(e, lambda m: m.__setitem__("functions", {})),
    "entry_missing_from_functions": lambda e, cubin: _edit_manifest(
        e, lambda m: m["functions"].pop("add_value")
    ),
    "entry_is_not_an_entry_point": lambda e, cubin: _edit_manifest(
        e, _set_function_field("is_entry", False)
    ),
    "registers_a_str": lambda e, cubin: _edit_manifest(e, _set_function_field("registers", "abc")),
    "spill_stores_a_str": lambda e, cubin: _edit_manifest(
        e, _set_function_field("spill_store_bytes", "5")
    ),
    "spill_stores_null": lambda e, cubin: _edit_manifest(
        e, _set_function_field("spill_store_bytes", None)
    ),
    "log_a_dict": lambda e, cubin: _edit_manifest(e, lambda m: m.__setitem__("log", {"a": 1})),
    "compile_seconds_a_str": lambda e, cubin: _edit_manifest(
        e, lambda m: m.__setitem__("compile_seconds", "abc")
    ),
    # Cubin size and SHA-256 still match: only the key says the manifest is another entry's.
    "manifest_names_another_key": lambda e, cubin: _edit_manifest(
        e, lambda m: m.__setitem__("key", hashlib.sha256(m["key"].encode()).hexdigest())
    ),
}


# Damage to the ptxas report's functions; some cuda-core/NVRTC versions return no report.
NEEDS_A_REPORT = {
    "functions_empty",
    "entry_missing_from_functions",
    "entry_is_not_an_entry_point",
    "registers_a_str",
    "spill_stores_a_str",
    "spill_stores_null",
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_entry_is_detected_recompiled_and_replaced(source, cache_dir, caplog, damage):
    spec = KernelSpec.make("add_value", source, {"VALUE": 5})
    good = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    if damage in NEEDS_A_REPORT and not good.functions:
        pytest.skip("this NVRTC/cuda-core returned no ptxas report: no functions to damage")
    DAMAGE[damage](good.cache_path, good.cubin)

    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        assert lookup_kernel(spec, "sm_90a", cache_dir=cache_dir) is None
        again = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert not again.from_cache  # recompiled, not served damaged
    assert again.cubin == good.cubin
    assert "damaged cache entry" in caplog.text
    assert "cannot" not in caplog.text  # neither "cannot read" nor "cannot write" the cache
    repaired = read_entry(cache_dir, good.key)
    assert repaired is not None and repaired.cubin == good.cubin
    cached = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert cached.from_cache and cached.functions == again.functions


def _without_a_report(manifest: dict) -> None:
    """What a toolchain that returns no NVRTC log writes."""
    manifest["functions"], manifest["log"] = {}, ""


@pytest.mark.parametrize("report", [True, False], ids=["with_report", "without_report"])
def test_a_damaged_lowered_name_is_recompiled(tmp_path, cache_dir, caplog, report):
    path = tmp_path / "tmpl.cu"
    path.write_text("template <int N> __global__ void fill(int* out) { out[threadIdx.x] = N; }\n")
    spec = KernelSpec.make("fill<9>", path, name_expressions=["fill<9>"])
    good = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)

    def damage(manifest: dict) -> None:
        manifest["lowered_names"] = {"fill<9>": "nope"}
        if not report:
            _without_a_report(manifest)

    _edit_manifest(good.cache_path, damage)
    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        again = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert not again.from_cache and again.entry_name == good.entry_name
    assert "damaged cache entry" in caplog.text
    assert compile_kernel(spec, "sm_90a", cache_dir=cache_dir).from_cache


def test_an_entry_without_a_ptxas_report_is_served(source, cache_dir, caplog):
    spec = KernelSpec.make("add_value", source, {"VALUE": 5})
    good = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    _edit_manifest(good.cache_path, _without_a_report)
    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        cached = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert cached.from_cache and cached.functions == {} and cached.entry_name == "add_value"
    assert caplog.text == ""


def test_a_name_that_is_not_an_entry_point_of_a_shared_entry_is_an_error(source, cache_dir):
    """extern "C" kernels of one source and specialisation share an entry: asking it for a
    name it lacks is the caller's mistake, not damage, and the entry stays."""
    good = compile_kernel(
        KernelSpec.make("add_value", source, {"VALUE": 5}), "sm_90a", cache_dir=cache_dir
    )
    other = KernelSpec.make("no_such_kernel", source, {"VALUE": 5})
    for function in (lookup_kernel, compile_kernel):
        with pytest.raises(ValueError, match=r"entry points found: \['add_value'\]"):
            function(other, "sm_90a", cache_dir=cache_dir)
    assert (
        read_entry(cache_dir, good.key).manifest["created_unix"]
        == json.loads((good.cache_path / MANIFEST_FILE).read_text())["created_unix"]
    )


WITH_CONSTANTS = """\
__constant__ float table_q[100];
extern "C" __global__ void read_table(float* out) { out[threadIdx.x] = table_q[threadIdx.x]; }
"""


@pytest.mark.parametrize("name", ["table_q", "info"])
def test_a_name_the_cubin_holds_as_data_is_not_an_entry_point_and_the_entry_stays(
    tmp_path, cache_dir, caplog, name
):
    """A `__constant__` variable's name, or a section name's tail (`.nv.info`), is in the
    cubin's strings but has no code: asking for it is the caller's mistake, not damage (found
    by a review: the entry was discarded and lookup_kernel returned None)."""
    source = tmp_path / "constants.cu"
    source.write_text(WITH_CONSTANTS)
    good = compile_kernel(KernelSpec.make("read_table", source), "sm_90a", cache_dir=cache_dir)
    created = read_entry(cache_dir, good.key).manifest["created_unix"]
    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        for function in (lookup_kernel, compile_kernel):
            with pytest.raises(ValueError, match=r"entry points found: \['read_table'\]"):
                function(KernelSpec.make(name, source), "sm_90a", cache_dir=cache_dir)
    assert caplog.text == ""
    assert read_entry(cache_dir, good.key).manifest["created_unix"] == created


TWO_KERNELS = """\
extern "C" __global__ void first_kernel(int* out) { out[threadIdx.x] = VALUE; }
extern "C" __global__ void second_kernel(int* out) { out[threadIdx.x] = 2 * VALUE; }
"""


def test_a_shared_entry_whose_report_lost_a_kernel_is_recompiled(tmp_path, cache_dir, caplog):
    """The second extern "C" kernel of a shared entry is in the cubin: a report without it
    is damage (recompiled and replaced), not a missing entry point."""
    path = tmp_path / "two.cu"
    path.write_text(TWO_KERNELS)
    first = KernelSpec.make("first_kernel", path, {"VALUE": 4})
    second = KernelSpec.make("second_kernel", path, {"VALUE": 4})
    good = compile_kernel(first, "sm_90a", cache_dir=cache_dir)
    if not good.functions:
        pytest.skip("this NVRTC/cuda-core returned no ptxas report: no functions to damage")
    assert compile_kernel(second, "sm_90a", cache_dir=cache_dir).from_cache
    _edit_manifest(good.cache_path, lambda m: m["functions"].pop("second_kernel"))

    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        assert lookup_kernel(second, "sm_90a", cache_dir=cache_dir) is None
        again = compile_kernel(second, "sm_90a", cache_dir=cache_dir)
    assert not again.from_cache and again.cubin == good.cubin
    assert "is in the cubin but not in the manifest's functions" in caplog.text
    for spec in (first, second):
        assert compile_kernel(spec, "sm_90a", cache_dir=cache_dir).from_cache


def test_an_entry_published_while_it_is_read_is_a_hit_not_damage(source, tmp_path, caplog):
    """Another process renames the entry into place between this reader's failed manifest
    read and its check that the folder exists."""
    spec = KernelSpec.make("add_value", source, {"VALUE": 6})
    elsewhere = compile_kernel(spec, "sm_90a", cache_dir=tmp_path / "elsewhere")
    root = tmp_path / "racing"
    cache_module = importlib.import_module("flashinfer_jit.cache")
    read_file = cache_module._read_entry_file

    def read_then_lose_the_race(folder: Path, name: str) -> bytes:
        try:
            return read_file(folder, name)
        finally:
            if not folder.exists():
                manifest = json.loads((elsewhere.cache_path / MANIFEST_FILE).read_text())
                cache_module.publish_entry(root, elsewhere.key, elsewhere.cubin, manifest)

    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(cache_module, "_read_entry_file", read_then_lose_the_race)
            hit = lookup_kernel(spec, "sm_90a", cache_dir=root)
    assert hit is not None and hit.from_cache and hit.cubin == elsewhere.cubin
    assert caplog.text == ""


def test_a_header_edited_during_the_compile_is_not_cached(tmp_path, cache_dir, caplog):
    """NVRTC reads headers after they were hashed: a cubin that may be of the edited text
    must not be published under the key of the original one."""
    header = tmp_path / "value.cuh"
    header.write_text("#define VALUE 1\n")
    path = tmp_path / "uses_header.cu"
    path.write_text('#include "value.cuh"\n' + KERNEL)
    spec = KernelSpec.make("add_value", path)
    compiler_module = importlib.import_module("flashinfer_jit.compiler")
    nvrtc_compile = compiler_module._nvrtc_compile

    def edit_while_compiling(*args, **kwargs):
        header.write_text("#define VALUE 2\n")
        return nvrtc_compile(*args, **kwargs)

    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(compiler_module, "_nvrtc_compile", edit_while_compiling)
            compiled = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert compiled.cache_path is None
    assert "changed while it compiled; not cached" in caplog.text
    assert read_entry(cache_dir, compiled.key) is None
    header.write_text("#define VALUE 1\n")
    assert lookup_kernel(spec, "sm_90a", cache_dir=cache_dir) is None


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


@pytest.mark.parametrize("blocker", ["file", "symlink_loop"])
def test_a_non_folder_at_the_shard_path_is_moved_aside(source, cache_dir, caplog, blocker):
    """The entry's parent (the key's first two hex digits) blocked by a file or a looping
    symlink: the next compile moves it aside and publishes, instead of failing every time."""
    spec = KernelSpec.make("add_value", source, {"VALUE": 6})
    good = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    shard = good.cache_path.parent
    shutil.rmtree(shard)
    if blocker == "file":
        shard.write_text("a file where the shard folder should be")
    else:
        shard.symlink_to(shard)
    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        again = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert not again.from_cache and again.cubin == good.cubin
    assert "cannot write" not in caplog.text  # (reading through the loop may warn)
    assert shard.is_dir() and read_entry(cache_dir, good.key) is not None
    assert compile_kernel(spec, "sm_90a", cache_dir=cache_dir).from_cache


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_an_entry_is_readable_by_other_users_as_the_umask_allows(source, cache_dir, umask):
    """A cache built by one user (a Dockerfile's root, a CI job) and served by another: the
    entry folder follows the umask like the files in it (`tempfile.mkdtemp` made it 0700)."""
    previous = os.umask(umask)
    try:
        compiled = compile_kernel(
            KernelSpec.make("add_value", source, {"VALUE": 12}), "sm_90a", cache_dir=cache_dir
        )
    finally:
        os.umask(previous)
    for path in (compiled.cache_path, compiled.cache_path.parent):
        assert path.stat().st_mode & 0o777 == 0o777 & ~umask, path


@pytest.mark.parametrize(
    "damage", ["functions_not_dicts", "log_a_dict", "compile_seconds_a_str", "cubin_truncated"]
)
def test_damaged_fields_that_cannot_be_moved_aside_are_not_reported_stored(
    source, cache_dir, caplog, monkeypatch, damage
):
    """A damaged entry that cannot be moved aside (its shard folder is not ours to write): the
    compile is used, but `cache_path` is None, so `precompile` counts it not stored and
    compile-check fails. Damage the cubin's size and checksum do not show (the compiler's own
    manifest fields) included: publishing must not keep such an entry as another process's."""
    from flashinfer_jit import cache as cache_module
    from flashinfer_jit import compiler as compiler_module

    spec = KernelSpec.make("add_value", source, {"VALUE": 16})
    good = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    if damage == "cubin_truncated":
        (good.cache_path / CUBIN_FILE).write_bytes(b"truncated")
    else:
        DAMAGE[damage](good.cache_path, good.cubin)
    for module in (cache_module, compiler_module):
        monkeypatch.setattr(module, "discard_entry", lambda root, digest: None)
    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        again = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert again.cubin == good.cubin and not again.from_cache
    assert again.cache_path is None
    assert "could not be replaced" in caplog.text


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
@pytest.mark.parametrize("name", [CUBIN_FILE, MANIFEST_FILE])
def test_a_fifo_in_an_entry_is_damage_not_a_hang(source, cache_dir, caplog, name):
    """A read of a FIFO never returns (nor one of /dev/zero ends): only regular files are read."""
    spec = KernelSpec.make("add_value", source, {"VALUE": 17})
    good = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    (good.cache_path / name).unlink()
    os.mkfifo(good.cache_path / name)
    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        again = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert again.cubin == good.cubin and not again.from_cache
    assert "not a regular file" in caplog.text
    assert compile_kernel(spec, "sm_90a", cache_dir=cache_dir).from_cache  # replaced


def test_a_source_removed_while_it_compiles_is_used_and_not_cached(source, cache_dir, caplog):
    """An upgrade that deletes the sources under a live process: the finished compile is
    used, not cached, and no FileNotFoundError escapes the rehash."""
    spec = KernelSpec.make("add_value", source, {"VALUE": 14})
    compiler_module = importlib.import_module("flashinfer_jit.compiler")
    nvrtc_compile = compiler_module._nvrtc_compile

    def remove_while_compiling(*args, **kwargs):
        result = nvrtc_compile(*args, **kwargs)
        source.unlink()
        return result

    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(compiler_module, "_nvrtc_compile", remove_while_compiling)
            compiled = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert compiled.cubin[:4] == ELF_MAGIC and compiled.cache_path is None
    assert "changed while it compiled; not cached" in caplog.text


def test_a_compile_served_without_a_ptxas_report_is_retried_under_new_options(source, tmp_path):
    """With a CUDA driver, NVRTC serves a repeated compile of the same PTX and ptxas options
    from an in-process cache with an empty log (an H100 host, NVRTC 13.0, 2026-12-06), which
    left registers and spills unrecorded and `inspect` without its report. Emulated here: a
    compile whose ptxas options were seen before returns no log; the retry must use options
    not seen before and record the report."""
    spec = KernelSpec.make("add_value", source, {"VALUE": 15})
    compiler_module = importlib.import_module("flashinfer_jit.compiler")
    nvrtc_compile = compiler_module._nvrtc_compile
    seen: list[int] = []

    def cached_after_first(spec, arch, source_text, repeat_verbose=0):
        cubin, log, lowered = nvrtc_compile(spec, arch, source_text, repeat_verbose)
        first = repeat_verbose not in seen
        seen.append(repeat_verbose)
        return cubin, (log if first else ""), lowered

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiler_module, "_nvrtc_compile", cached_after_first)
        patch.setattr(compiler_module, "_report_retries_help", True)
        first = compile_kernel(spec, "sm_90a", cache_dir=tmp_path / "a")
        assert seen == [0] and "add_value" in first.functions
        second = compile_kernel(spec, "sm_90a", cache_dir=tmp_path / "b")
    assert seen[:2] == [0, 0] and len(seen) == 3 and seen[2] > 0
    assert second.functions == first.functions
    assert second.cubin[:4] == ELF_MAGIC


def test_an_nvrtc_that_never_reports_is_retried_once_per_process(source, tmp_path, caplog):
    """Where no retry brings a ptxas report (an NVRTC that returns no log for a clean
    compile), later compiles do not pay for retries, and a warning says what is lost."""
    compiler_module = importlib.import_module("flashinfer_jit.compiler")
    nvrtc_compile = compiler_module._nvrtc_compile
    calls: list[int] = []

    def never_reports(spec, arch, source_text, repeat_verbose=0):
        calls.append(repeat_verbose)
        cubin, _, lowered = nvrtc_compile(spec, arch, source_text, repeat_verbose)
        return cubin, "", lowered

    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(compiler_module, "_nvrtc_compile", never_reports)
            patch.setattr(compiler_module, "_report_retries_help", True)
            first = compile_kernel(
                KernelSpec.make("add_value", source, {"VALUE": 16}),
                "sm_90a",
                cache_dir=tmp_path / "a",
            )
            assert len(calls) == 1 + compiler_module._REPORT_TRIES
            second = compile_kernel(
                KernelSpec.make("add_value", source, {"VALUE": 17}),
                "sm_90a",
                cache_dir=tmp_path / "b",
            )
    assert len(calls) == 2 + compiler_module._REPORT_TRIES
    assert first.functions == {} and second.functions == {}
    assert second.cubin[:4] == ELF_MAGIC
    assert caplog.text.count("no ptxas resource report") == 1


def test_a_manifest_without_the_lowered_name_is_blamed_not_nvrtc(tmp_path, cache_dir, caplog):
    path = tmp_path / "tmpl.cu"
    path.write_text("template <int N> __global__ void fill(int* out) { out[threadIdx.x] = N; }\n")
    spec = KernelSpec.make("fill<9>", path, name_expressions=["fill<9>"])
    good = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    _edit_manifest(good.cache_path, lambda manifest: manifest.update(lowered_names={}))
    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        again = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert not again.from_cache and again.entry_name == good.entry_name
    assert "the manifest gave no lowered name for 'fill<9>'" in caplog.text
    assert "NVRTC" not in caplog.text
