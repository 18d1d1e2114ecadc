"""Argument errors no other CPU test reaches: spec fields, option spellings, unreadable
sources, TMA arguments, a driver that cannot load, registry targets and usage errors."""

from __future__ import annotations

import errno
import os
import re
import textwrap

import numpy as np
import pytest
import torch
from flashinfer_jit import (
    KernelSpec,
    TensorMap,
    compile_kernel,
    device_arch,
    device_info,
    make_tensor_map,
    max_shared_memory_per_block_optin,
    sm_count,
    tensor_map_for,
)
from flashinfer_jit import device as device_module
from flashinfer_jit.cli import main
from flashinfer_jit.registry import load_target

KERNEL = 'extern "C" __global__ void add_one(float* x) { x[threadIdx.x] += 1.0f; }\n'
SPEC_MODULE = "jit_error_path_specs"


class BytesPathLike(os.PathLike):
    """A path-like object whose `__fspath__` gives bytes (as `os.scandir(b"...")` entries do)."""

    def __fspath__(self) -> bytes:
        return b"/x/k.cu"


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "add_one.cu"
    path.write_text(KERNEL)
    return path


@pytest.fixture
def spec_module(tmp_path, monkeypatch, source):
    """A throw-away module whose attributes produce things that are not KernelSpecs."""
    (tmp_path / f"{SPEC_MODULE}.py").write_text(
        textwrap.dedent(
            f"""
            from flashinfer_jit import KernelSpec

            GOOD = KernelSpec.make("add_one", {str(source)!r})
            INTS = [1, 2]
            GOOD_THEN_NONE = [GOOD, None]

            def strings():
                return (name for name in ("add_one",))
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.fixture
def no_driver_call(monkeypatch):
    """The checks must refuse before the driver is asked to encode anything."""
    monkeypatch.setattr(device_module, "driver", lambda: pytest.fail("reached the driver"))


# KernelSpec fields


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"source": BytesPathLike()}, r"^KernelSpec\.source: expected a pathlib\.Path or str, "),
        (
            {"include_dirs": [BytesPathLike()]},
            r"^KernelSpec\.include_dirs: expected a pathlib\.Path or str, ",
        ),
    ],
    ids=["source", "include_dirs"],
)
def test_a_path_like_that_gives_bytes_is_a_type_error(fields, fragment):
    arguments = {"name": "k", "source": "/x/k.cu", **fields}
    with pytest.raises(TypeError, match=fragment + "got bytes$"):
        KernelSpec.make(**arguments)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"options": [1]}, r"^KernelSpec\.options: expected str items, got int \(1\)$"),
        (
            {"options": ["-lineinfo", b"--use_fast_math"]},
            r"^KernelSpec\.options: expected str items, got bytes \(b'--use_fast_math'\)$",
        ),
        (
            {"name_expressions": [None]},
            r"^KernelSpec\.name_expressions: expected str items, got NoneType \(None\)$",
        ),
    ],
    ids=["options_int", "options_bytes", "name_expressions_none"],
)
def test_option_and_name_expression_items_must_be_str(fields, fragment):
    with pytest.raises(TypeError, match=fragment):
        KernelSpec.make("k", "/x/k.cu", **fields)


# Compiling


@pytest.mark.parametrize("option", ["-I/usr/include", "-I", "--include-path=/usr/include"])
def test_an_include_folder_in_options_is_refused_for_include_dirs(source, cache_dir, option):
    spec = KernelSpec.make("add_one", source, options=[option])
    with pytest.raises(
        ValueError,
        match=rf"^KernelSpec\.options: pass folders through KernelSpec\.include_dirs, "
        rf"not {re.escape(repr(option))}$",
    ):
        compile_kernel(spec, "sm_90a", cache_dir=cache_dir)


@pytest.mark.parametrize("links", [1, 2], ids=["self_loop", "two_link_cycle"])
def test_a_source_that_is_a_symlink_loop_is_an_os_error_naming_the_kernel(
    tmp_path, cache_dir, links
):
    first = tmp_path / "loop.cu"
    if links == 1:
        first.symlink_to(first)
    else:
        second = tmp_path / "other.cu"
        first.symlink_to(second)
        second.symlink_to(first)
    spec = KernelSpec.make("add_one", first)
    with pytest.raises(
        OSError,
        match=rf"kernel source for 'add_one' cannot be read: {re.escape(str(first))} \(",
    ) as info:
        compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    assert info.value.errno == errno.ELOOP


# TMA descriptors


@pytest.mark.parametrize("size", [0, 10, 127, 129])
def test_a_tensor_map_needs_128_descriptor_bytes(size):
    with pytest.raises(
        ValueError, match=rf"^TensorMap: expected 128 descriptor bytes, got {size}$"
    ):
        TensorMap(b"x" * size, torch.float16, (64,), (64,), "none")


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (
            lambda: tensor_map_for(torch.zeros(64, 64), 64),
            r"^box_shape: expected a sequence of ints, got int$",
        ),
        (
            lambda: make_tensor_map(0x1000, torch.float16, 64, [], [64]),
            r"^global_dims: expected a sequence of ints, got int$",
        ),
        (
            lambda: make_tensor_map(0x1000, torch.float16, [64, 64], 128, [64, 8]),
            r"^global_strides_bytes: expected a sequence of ints, got int$",
        ),
        (
            lambda: make_tensor_map(0x1000, torch.float16, [64], [], "64"),
            r"^box_dims: expected a sequence of ints, got str$",
        ),
        (
            lambda: make_tensor_map(0x1000, torch.float16, [64], [], [64], element_strides={1}),
            r"^element_strides: expected a sequence of ints, got set$",
        ),
    ],
    ids=["box_shape", "global_dims", "global_strides_bytes", "box_dims", "element_strides"],
)
def test_a_size_list_that_is_no_sequence_is_a_type_error_naming_it(no_driver_call, call, fragment):
    with pytest.raises(TypeError, match=fragment):
        call()


@pytest.mark.parametrize(
    ("box", "element_strides", "shown"),
    [
        ([64], None, r"box_dims=\(64,\), element_strides=\(1, 1\)"),
        ([64, 8, 1], None, r"box_dims=\(64, 8, 1\), element_strides=\(1, 1\)"),
        ([64, 8], [1], r"box_dims=\(64, 8\), element_strides=\(1,\)"),
    ],
    ids=["box_rank_1", "box_rank_3", "element_strides_rank_1"],
)
def test_box_and_element_strides_need_the_rank_of_global_dims(
    no_driver_call, box, element_strides, shown
):
    with pytest.raises(
        ValueError,
        match=rf"^box_dims and element_strides need 2 entries like global_dims; got {shown}$",
    ):
        make_tensor_map(
            0x1000, torch.float16, [64, 64], [128], box, element_strides=element_strides
        )


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64, torch.float8_e4m3fnuz], ids=str)
def test_a_dtype_without_a_tma_data_type_is_a_value_error_listing_the_supported(
    no_driver_call, dtype
):
    with pytest.raises(
        ValueError,
        match=rf"^dtype: {re.escape(str(dtype))} has no TMA data type; supported: \[.*'float16'",
    ):
        make_tensor_map(0x1000, dtype, [64], [], [64])


@pytest.mark.parametrize("address", [0x1000, np.int64(0x1000)], ids=["int", "numpy_int64"])
def test_an_address_without_a_dtype_is_a_value_error(no_driver_call, address):
    with pytest.raises(ValueError, match=r"^dtype: required when tensor_or_ptr is an address$"):
        make_tensor_map(address, None, [64], [], [64])


# The driver


class _LibcudaNotFound(RuntimeError):
    """Stands in for cuda.pathfinder's DynamicLibNotFoundError (a RuntimeError)."""


@pytest.mark.parametrize(
    "query", [device_info, sm_count, device_arch, max_shared_memory_per_block_optin]
)
def test_a_driver_that_cannot_load_is_a_runtime_error_saying_compiling_works(monkeypatch, query):
    from cuda.bindings import driver as drv

    def cu_init(flags):
        raise _LibcudaNotFound('"cuda" is an NVIDIA driver library and cannot be found.')

    monkeypatch.setattr(drv, "cuInit", cu_init)
    monkeypatch.setattr(device_module, "_driver_module", None)
    # Uncached here, so that an earlier query on a machine with a GPU cannot answer it.
    monkeypatch.setattr(device_module, "_device_info", device_module._device_info.__wrapped__)
    with pytest.raises(
        RuntimeError,
        match=r'^cannot load the NVIDIA driver \(libcuda\): "cuda" is an NVIDIA driver library '
        r"and cannot be found\. Kernels need an NVIDIA GPU and driver; compiling .* works "
        r"without one\.$",
    ):
        query(0)


# Registry targets


@pytest.mark.parametrize(
    ("attribute", "shown"),
    [("INTS", "int"), ("GOOD_THEN_NONE", "NoneType"), ("strings", "str")],
)
def test_a_target_yielding_other_items_is_a_type_error_naming_it(spec_module, attribute, shown):
    target = f"{SPEC_MODULE}:{attribute}"
    with pytest.raises(
        TypeError, match=rf"^{re.escape(target)}: expected KernelSpec items, got {shown}$"
    ):
        load_target(target)


@pytest.mark.parametrize("target", ["nocolon", f"{SPEC_MODULE}:", ":GOOD", ""])
def test_a_target_without_module_and_attribute_is_a_value_error(target):
    with pytest.raises(
        ValueError,
        match=rf"^target: expected 'package\.module:callable', got {re.escape(repr(target))}$",
    ):
        load_target(target)


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("nocolon", "ValueError: target: expected 'package.module:callable', got 'nocolon'"),
        (
            f"{SPEC_MODULE}:INTS",
            f"TypeError: {SPEC_MODULE}:INTS: expected KernelSpec items, got int",
        ),
    ],
    ids=["no_colon", "not_specs"],
)
def test_compile_check_reports_a_target_it_cannot_load(
    spec_module, cache_dir, capsys, target, fragment
):
    status = main(["compile-check", "--specs", target, "--cache-dir", str(cache_dir)])
    assert status == 1
    out = capsys.readouterr().out
    assert f"FAILED to load kernel registrations from {target}:" in out
    assert fragment in out
    assert "compile-check FAILED" in out


# Usage errors of `python -m flashinfer_jit inspect`


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (["inspect", "{dir}/add_one.cu", "-D", "=3"], "-D expects NAME or NAME=VALUE, got '=3'"),
        (["inspect", "{dir}/add_one.cu", "-D", "="], "-D expects NAME or NAME=VALUE, got '='"),
        (["inspect", "{dir}/missing.cu"], "target: no such file: {dir}/missing.cu"),
        (["inspect", "{dir}/missing.cuh"], "target: no such file: {dir}/missing.cuh"),
        (["inspect", "{dir}/folder.cu"], "target: is a folder, not a file: {dir}/folder.cu"),
        (
            ["inspect", "{dir}/no_extern_c.cu"],
            '{dir}/no_extern_c.cu: no extern "C" __global__ kernel found; pass --kernel NAME',
        ),
        (
            ["inspect", "{dir}/commented_out.cu"],
            '{dir}/commented_out.cu: no extern "C" __global__ kernel found; pass --kernel NAME',
        ),
        (
            ["inspect", "-D", "X=1", f"{SPEC_MODULE}:GOOD"],
            "-D/-I/--option apply only to a .cu path target",
        ),
        (
            ["inspect", "-I", "{dir}", f"{SPEC_MODULE}:GOOD"],
            "-D/-I/--option apply only to a .cu path target",
        ),
        (
            ["inspect", "--option=-lineinfo", f"{SPEC_MODULE}:GOOD"],
            "-D/-I/--option apply only to a .cu path target",
        ),
    ],
    ids=[
        "define_without_name",
        "define_only_equals",
        "missing_cu",
        "missing_cuh",
        "folder_named_cu",
        "no_extern_c_kernel",
        "kernel_commented_out",
        "define_for_module_target",
        "include_for_module_target",
        "option_for_module_target",
    ],
)
def test_a_malformed_inspect_command_line_is_one_error_line_and_status_2(
    spec_module, capsys, arguments, fragment
):
    (spec_module / "no_extern_c.cu").write_text("__global__ void k(float* x) {}\n")
    (spec_module / "folder.cu").mkdir()
    (spec_module / "commented_out.cu").write_text(
        '// extern "C" __global__ void k(float* x) {}\n'
        '/* extern "C" __global__ void j(float* x) {} */\n'
    )
    with pytest.raises(SystemExit) as info:
        main([a.format(dir=spec_module) for a in arguments])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert fragment.format(dir=spec_module) in err.splitlines()[-1]
    assert "Traceback" not in err
