"""`python -m flashinfer_jit compile-check` and `inspect` (NVRTC only, no GPU)."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys
import textwrap
from pathlib import Path

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

            def raises():
                raise RuntimeError("registry exploded")

            def with_a_folder():
                return good() + [KernelSpec("good_kernel", HERE, label="folder")]

            NOT_SPECS = 5
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


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(
    not _installed("flashinfer-jit"),
    reason="flashinfer-jit is imported from its source folder, not installed: entry points "
    "come from an installed distribution's metadata",
)
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


def test_compile_check_fails_when_the_cache_cannot_be_written(spec_module, tmp_path, capsys):
    """A cache built to be shipped must not pass the check empty."""
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where the cache root should be")
    assert main(_check("jit_cli_specs:good", blocker, "-j", "1")) == 1
    out = capsys.readouterr().out
    assert "NOT STORED" in out and "the kernel cache could not be written" in out
    assert "3 compiled, 3 not stored (the cache could not be written)" in out
    assert "compile-check FAILED" in out


def test_cache_info_expands_a_leading_tilde(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["cache-info", "--cache-dir", "~/kernels"]) == 0
    assert f"cache root: {tmp_path / 'kernels'}" in capsys.readouterr().out


def test_cache_info_on_a_file_is_an_error(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a cache")
    assert main(["cache-info", "--cache-dir", str(blocker)]) == 1
    assert f"the cache root {blocker} is not a folder" in capsys.readouterr().err


def test_cache_info_on_an_unreadable_cache_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    shard = tmp_path / "c" / "v1" / "ab"
    shard.mkdir(parents=True)
    real_iterdir = Path.iterdir

    def deny(self):
        if self == shard:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", deny)
    assert main(["cache-info", "--cache-dir", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"cache-info: cannot read the cache at {tmp_path / 'c'}: ")
    assert "Permission denied" in err and err.count("\n") == 1


@pytest.mark.parametrize("kind", ["a_file", "a_dangling_link"])
def test_cache_info_on_a_schema_folder_that_is_none_is_an_error(tmp_path, capsys, kind):
    schema = tmp_path / "c" / "v1"
    schema.parent.mkdir()
    if kind == "a_file":
        schema.write_text("not a folder")
    else:
        schema.symlink_to(tmp_path / "nowhere")
    assert main(["cache-info", "--cache-dir", str(tmp_path / "c")]) == 1
    assert f"the cache's schema folder {schema} is not a folder" in capsys.readouterr().err


def test_cache_info_counts_entries_and_bytes(tmp_path, capsys):
    schema = tmp_path / "c" / "v1"
    for shard, entry, size in (("ab", "ab1", 10), ("ab", "ab2", 5), ("cd", "cd3", 1)):
        folder = schema / shard / entry
        folder.mkdir(parents=True)
        (folder / "kernel.cubin").write_bytes(b"x" * size * 100_000)
        (folder / "manifest.json").write_text("{}")
    (schema / "tmp").mkdir()  # not a shard
    assert main(["cache-info", "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "entries:    3 (1.6 MB)" in out and "on disk" not in out

    # Not entries: an empty folder, one without a manifest, one in the wrong shard; and an
    # unfinished publication in tmp/. Counted on disk, not as entries.
    (schema / "ab" / "ab_empty").mkdir()
    (schema / "ab" / "ab_nomanifest").mkdir()
    (schema / "ab" / "ab_nomanifest" / "kernel.cubin").write_bytes(b"y" * 1000)
    (schema / "cd" / "ef_wrongshard").mkdir()
    (schema / "cd" / "ef_wrongshard" / "manifest.json").write_text("{}")
    (schema / "tmp" / "part").write_bytes(b"z" * 300_000)
    assert main(["cache-info", "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "entries:    3 (1.6 MB)" in out
    assert "on disk:    1.9 MB in all, 0.3 MB outside the entries" in out


def test_cache_info_shows_a_small_cache_in_kilobytes(tmp_path, capsys):
    folder = tmp_path / "c" / "v1" / "ab" / "ab1"
    folder.mkdir(parents=True)
    (folder / "kernel.cubin").write_bytes(b"x" * 41_592)
    (folder / "manifest.json").write_text("{}")
    assert main(["cache-info", "--cache-dir", str(tmp_path / "c")]) == 0
    assert "entries:    1 (41.6 kB)" in capsys.readouterr().out


def test_compile_check_reports_a_folder_source_as_one_failed_spec(spec_module, cache_dir, capsys):
    assert main(_check("jit_cli_specs:with_a_folder", cache_dir, "-j", "2")) == 1
    out = capsys.readouterr().out
    assert "FAILED folder (" in out and "kernel source for 'folder' is a folder, not a .cu" in out
    assert "3 compiled, 1 failed" in out


def test_an_empty_ptxas_option_fails_the_spec_not_the_process(spec_module, cache_dir):
    """NVRTC aborts the process on `-Xptxas=`; the option is refused before it gets there."""
    command = ["inspect", str(spec_module / "good.cu"), "-D", "SCALE=1", "--option=-Xptxas="]
    result = subprocess.run(
        [sys.executable, "-m", "flashinfer_jit", *command, "--cache-dir", str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert "bad value in '-Xptxas=': -Xptxas expects ptxas options" in result.stdout


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (["inspect", "{dir}/good.cu", "-D", "1BAD=4"], "macro name must be a C identifier"),
        (["inspect", "{dir}/good.cu", "--kernel", ""], "argument --kernel: expected a non-empty"),
        (["inspect", "{dir}/good.cu", "--cache-dir", ""], "argument --cache-dir: expected a non"),
        (["inspect", "{dir}"], "is a folder; expected a .cu file or 'package.module:callable'"),
        (["inspect", "jit_cli_specs"], "expected a .cu file or 'package.module:callable', got"),
        (["inspect", "no_such_module_zz:f"], "ModuleNotFoundError: No module named"),
        (["inspect", "jit_cli_specs:nope"], "AttributeError: module 'jit_cli_specs' has no"),
        (["inspect", "jit_cli_specs:NOT_SPECS"], "TypeError: jit_cli_specs:NOT_SPECS: expected"),
        (["compile-check", "-j", "0"], "argument -j/--jobs: expected a positive int, got '0'"),
        (["compile-check", "--arch", "sm_9x"], "argument --arch: arch: expected a full SM target"),
        (["inspect", "{dir}/good.cu", "--arch", "sm_9"], "argument --arch: arch: expected a full"),
        (["compile-check", "--arch", "sm_99a"], "'sm_99a' is not a target of this NVRTC"),
        (["compile-check", "--arch", "sm_90f"], "argument --arch: arch: expected a full SM"),
        (["compile-check", "--arch", "sm_89a"], "an 'a' suffix from sm_90 on"),
        (["inspect", "{dir}/good.cu", "--arch", "sm_80a"], "an 'a' suffix from sm_90 on"),
        (["compile-check", "--arch", "sm_090a"], "argument --arch: arch: expected a full SM"),
        (["inspect", "jit_cli_specs:raises"], "RuntimeError: registry exploded"),
        (
            ["inspect", "{dir}/good.cu", "-D", "SCALE=2", "-D", "SCALE=3"],
            "-D SCALE given twice with different values: 2 and 3",
        ),
    ],
)
def test_a_malformed_command_line_is_one_error_line_and_status_2(
    spec_module, capsys, arguments, fragment
):
    with pytest.raises(SystemExit) as info:
        main([a.format(dir=spec_module) for a in arguments])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err.splitlines()[-1]
    assert "Traceback" not in err


def test_inspect_finds_a_kernel_whose_launch_bounds_follow_void(tmp_path, cache_dir, capsys):
    """The project's kernels write `extern "C" __global__ void __launch_bounds__(...) name`."""
    path = tmp_path / "bounded.cu"
    path.write_text(
        "__host__ __device__ constexpr int threads() { return 64; }\n"
        'extern "C" __global__ void __launch_bounds__(threads(), 1) bounded_kernel(float* x) {\n'
        "  x[threadIdx.x] = 1.f;\n"
        "}\n"
    )
    assert main(["inspect", str(path), "--cache-dir", str(cache_dir)]) == 0
    assert "kernel bounded_kernel  <- entry point" in capsys.readouterr().out


def test_inspect_skips_a_commented_out_kernel(tmp_path, cache_dir, capsys):
    path = tmp_path / "moved.cu"
    path.write_text(
        '// extern "C" __global__ void old_kernel(float* x) {}\n'
        '/* extern "C" __global__ void older_kernel(float* x) {} */\n'
        'extern "C" __global__ void new_kernel(float* x) { x[0] = 1.f; }\n'
    )
    assert main(["inspect", str(path), "--cache-dir", str(cache_dir)]) == 0
    assert "kernel new_kernel  <- entry point" in capsys.readouterr().out


def test_a_define_that_is_not_a_canonical_decimal_is_passed_as_written(tmp_path, cache_dir, capsys):
    """010 is octal 8 to the compiler; reading it as the int 10 would change the kernel."""
    path = tmp_path / "octal.cu"
    path.write_text(
        'static_assert(X == 8, "X must arrive as written");\n'
        'extern "C" __global__ void octal_kernel(int* x) { x[0] = X; }\n'
    )
    assert main(["inspect", str(path), "-D", "X=010", "--cache-dir", str(cache_dir)]) == 0
    assert "== octal_kernel[X=010]" in capsys.readouterr().out


@pytest.mark.skipif(sys.platform != "linux", reason="the XDG and passwd rules are Linux's")
def test_cache_info_without_a_cache_root_exits_1_naming_the_variable(monkeypatch, capsys):
    import pwd

    def no_entry(uid):
        raise KeyError(uid)

    monkeypatch.delenv("FLASHINFER_JIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    assert main(["cache-info"]) == 1
    assert "set FLASHINFER_JIT_CACHE_DIR" in capsys.readouterr().err


def test_inspect_names_an_unreadable_source(tmp_path, monkeypatch, capsys):
    path = tmp_path / "kernel.cu"
    path.write_text('extern "C" __global__ void k(float* o) { o[0] = 1.f; }\n')

    def refuse(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(path)])
    assert exit_info.value.code == 2
    assert f"target: cannot read {path}: Permission denied" in capsys.readouterr().err


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_inspect_into_a_closed_pipe_stops_without_a_traceback(cache_dir, unbuffered):
    """`inspect ... | head -1` where the reader has left: the pipe's read end is closed before
    the command starts, so every write (line-wise unbuffered, or the one flush of a buffered
    stdout) finds no reader."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    command = [
        sys.executable,
        "-m",
        "flashinfer_jit",
        "inspect",
        "flashinfer_jit.selftest:kernel_specs",
        "--cache-dir",
        str(cache_dir),
    ]
    try:
        done = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, env=env)
    finally:
        os.close(write_end)
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr
    assert "Exception ignored" not in stderr


def test_an_interrupted_compile_check_is_one_line_and_status_130(
    spec_module, cache_dir, capsys, monkeypatch
):
    import tqdm.auto

    # The module, not the function of the same name that the package exports.
    precompile_module = importlib.import_module("flashinfer_jit.precompile")

    bars, closed = [], []

    class RecordingBar(tqdm.auto.tqdm):
        # Kept alive in `bars`, so only precompile, not the collector's __del__, can close it.
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

        def close(self):
            closed.append(True)
            super().close()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tqdm.auto, "tqdm", RecordingBar)
    monkeypatch.setattr(precompile_module, "compile_one", interrupted)
    assert main(_check("jit_cli_specs:good", cache_dir, "-j", "1")) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "interrupted"
    assert "Traceback" not in err
    assert closed, "the progress bar was left open"


def test_compile_check_counts_a_target_given_twice_once(spec_module, cache_dir, capsys):
    target = "jit_cli_specs:good"
    arguments = _check(target, cache_dir, "-j", "1")
    assert main([*arguments, "--specs", target]) == 0
    out = capsys.readouterr().out
    assert "compile-check: 3 configuration(s) from 2 source(s)" in out


def test_cache_info_counts_only_real_entries_and_leaves_out_unreadable_tmp(
    tmp_path, capsys, monkeypatch
):
    schema = tmp_path / "c" / "v1"
    real = schema / "ab" / "ab1"
    real.mkdir(parents=True)
    (real / "kernel.cubin").write_bytes(b"x" * 5000)
    (real / "manifest.json").write_text("{}")
    (schema / "a" / "a").mkdir(parents=True)  # a one-character shard: no key folder
    (schema / "a" / "a" / "manifest.json").write_text("{}")
    (schema / "ab" / "ab_link").symlink_to(real)  # the cache publishes no links
    (schema / "tmp" / "half-written").mkdir(parents=True)
    locked = schema / "tmp" / "half-written"
    original = Path.iterdir

    def iterdir(self):
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return original(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    assert main(["cache-info", "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "entries:    1 (5.0 kB)" in out
    assert "(1 unreadable folder(s) not counted)" in out
