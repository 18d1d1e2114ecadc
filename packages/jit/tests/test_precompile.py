"""precompile(): parallel compiles into the cache, with a summary."""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import time
from pathlib import Path

import pytest
from flashinfer_jit import KernelSpec, compile_kernel, lookup_kernel
from flashinfer_jit.compiler import check_arch
from flashinfer_jit.precompile import PrecompileError, precompile

# The module; `flashinfer_jit.precompile` as an attribute is the function of that name.
precompile_module = importlib.import_module("flashinfer_jit.precompile")

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
    assert summary.failures == [] and summary.spills == [] and summary.not_stored == []
    assert all(r.stored for r in summary.results)
    assert [r.spec for r in summary.results] == specs
    for spec in specs:
        assert compile_kernel(spec, "sm_90a", cache_dir=cache_dir).from_cache
    again = precompile(specs, arch="sm_90a", progress=False, cache_dir=cache_dir)
    assert (again.compiled, again.cached) == (0, 3)
    assert "3 cached, 0 compiled, 0 failed" in str(again)


@pytest.mark.parametrize("max_workers", [1, 2])
def test_entry_points_of_one_cubin_count_as_compiled_in_an_empty_cache(cache_dir, max_workers):
    """Two entry points of one source share a cache key: the first compile writes the entry
    that the second then finds. Until 2026-12-07 one job reported that second spec "cached",
    so compile-check said "1 cached" of a cache it had just created."""
    from flashinfer_jit.selftest import EMPTY, REVERSE_CHUNKS

    summary = precompile(
        [EMPTY, REVERSE_CHUNKS],
        arch="sm_90a",
        max_workers=max_workers,
        progress=False,
        cache_dir=cache_dir,
    )
    assert (summary.compiled, summary.cached) == (2, 0), str(summary)
    assert all(r.stored for r in summary.results)
    again = precompile([EMPTY, REVERSE_CHUNKS], arch="sm_90a", progress=False, cache_dir=cache_dir)
    assert (again.compiled, again.cached) == (0, 2)


def test_a_damaged_entry_is_recompiled_with_one_warning(source, cache_dir, caplog):
    """The lookup pass leaves a damaged entry to the compile, whose own read warns; until
    2026-12-06 both warned, so `compile-check` printed every damaged entry twice."""
    spec = KernelSpec.make("fill", source, {"VALUE": 7})
    good = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
    (good.cache_path / "kernel.cubin").write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        summary = precompile(
            [spec], arch="sm_90a", max_workers=1, progress=False, cache_dir=cache_dir
        )
    assert (summary.compiled, summary.cached) == (1, 0) and summary.results[0].stored
    assert caplog.text.count("damaged cache entry") == 1
    assert compile_kernel(spec, "sm_90a", cache_dir=cache_dir).cubin == good.cubin
    # The public lookup still says why it missed.
    (good.cache_path / "kernel.cubin").write_bytes(b"garbage")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flashinfer_jit"):
        assert lookup_kernel(spec, "sm_90a", cache_dir=cache_dir) is None
    assert caplog.text.count("damaged cache entry") == 1


@pytest.mark.parametrize("max_workers", [1, 2])
def test_configurations_the_cache_could_not_store_are_reported(source, tmp_path, max_workers):
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where the cache root should be")
    specs = [KernelSpec.make("fill", source, {"VALUE": v}) for v in range(2)]
    summary = precompile(
        specs, arch="sm_90a", max_workers=max_workers, progress=False, cache_dir=blocker
    )
    assert summary.compiled == 2 and summary.failures == []
    assert [r.spec for r in summary.not_stored] == specs
    assert all(r.ok and not r.stored for r in summary.results)
    assert "2 compiled, 2 not stored (the cache could not be written), 0 failed" in str(summary)


@pytest.mark.skipif(not os.path.exists("/etc/passwd"), reason="the ~user rule reads passwd")
def test_a_cache_dir_under_an_unknown_home_compiles_without_the_cache(source):
    """As for such a FLASHINFER_JIT_CACHE_DIR: compiled, not stored, no traceback."""
    specs = [KernelSpec.make("fill", source, {"VALUE": v}) for v in range(2)]
    summary = precompile(
        specs, arch="sm_90a", max_workers=1, progress=False, cache_dir="~no-such-user-here/c"
    )
    assert summary.compiled == 2 and summary.failures == []
    assert [r.spec for r in summary.not_stored] == specs


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


def test_a_dying_worker_fails_only_the_spec_it_was_compiling(source, cache_dir, monkeypatch):
    tests = str(Path(__file__).parent)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setattr(precompile_module, "WORKER_MODULE", "dying_compile_worker")
    dying = [KernelSpec.make("fill", source, {"VALUE": v}, label=f"die {v}") for v in (1, 2)]
    fine = [KernelSpec.make("fill", source, {"VALUE": v}) for v in (3, 4, 5)]
    summary = precompile(
        dying + fine,
        arch="sm_90a",
        max_workers=2,
        progress=False,
        cache_dir=cache_dir,
        raise_on_error=False,
    )
    assert [r.spec for r in summary.failures] == dying
    for failure in summary.failures:
        assert failure.error == "compile worker died (exit code 86) compiling it"
    assert summary.compiled == 3
    for spec in fine:
        assert compile_kernel(spec, "sm_90a", cache_dir=cache_dir).from_cache


def test_an_empty_ptxas_option_fails_its_spec_not_the_worker(source, cache_dir):
    crashing = KernelSpec.make("fill", source, {"VALUE": 1}, options=["-Xptxas="])
    fine = [KernelSpec.make("fill", source, {"VALUE": v}) for v in (2, 3)]
    summary = precompile(
        [crashing, *fine],
        arch="sm_90a",
        max_workers=2,
        progress=False,
        cache_dir=cache_dir,
        raise_on_error=False,
    )
    assert [r.spec for r in summary.failures] == [crashing]
    assert "-Xptxas expects ptxas options" in summary.failures[0].error
    assert summary.compiled == 2


@pytest.mark.parametrize("max_workers", [1, 2])
def test_a_folder_as_source_fails_its_spec_only(source, tmp_path, cache_dir, max_workers):
    folder = KernelSpec("fill", tmp_path)
    fine = KernelSpec.make("fill", source, {"VALUE": 1})
    summary = precompile(
        [folder, fine],
        arch="sm_90a",
        max_workers=max_workers,
        progress=False,
        cache_dir=cache_dir,
        raise_on_error=False,
    )
    assert summary.compiled == 1
    assert [r.error for r in summary.failures] == [
        f"kernel source for 'fill' is a folder, not a .cu file: {tmp_path}"
    ]


def test_precompile_error_survives_pickling(tmp_path, cache_dir):
    summary = precompile(
        [KernelSpec.make("fill", tmp_path / "missing.cu")],
        arch="sm_90a",
        progress=False,
        cache_dir=cache_dir,
        raise_on_error=False,
    )
    error = PrecompileError(summary)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is PrecompileError
    assert str(again) == str(error) and again.summary == summary


@pytest.mark.parametrize(
    ("arguments", "error", "fragment"),
    [
        ({"specs": "one spec"}, TypeError, "specs: expected an iterable of KernelSpec"),
        ({"specs": None}, TypeError, "specs: expected an iterable of KernelSpec"),
        ({"specs": [["nested"]]}, TypeError, "specs: expected KernelSpec items, got list"),
        ({"max_workers": "2"}, TypeError, "max_workers: expected a positive int"),
        ({"max_workers": 1.5}, TypeError, "max_workers: expected a positive int"),
        ({"max_workers": True}, TypeError, "max_workers: expected a positive int"),
        ({"cache_dir": 5}, TypeError, "cache_dir: expected None, a str or a pathlib.Path"),
        ({"cache_dir": ""}, ValueError, "cache_dir: expected a folder"),
        ({"arch": "sm_9"}, ValueError, "arch: expected a full SM target such as 'sm_90a'"),
        ({"arch": "sm_90f"}, ValueError, "arch: expected a full SM target such as 'sm_90a'"),
        ({"arch": "sm_89a"}, ValueError, "an 'a' suffix from sm_90 on, 'f' from sm_100 on"),
        ({"arch": 90}, TypeError, "arch: expected a str such as 'sm_90a', got int"),
    ],
)
def test_bad_arguments_are_rejected_before_any_work(
    source, tmp_path, monkeypatch, arguments, error, fragment
):
    monkeypatch.chdir(tmp_path)  # where cache_dir=5 or "" would have written
    spec = KernelSpec.make("fill", source, {"VALUE": 1})
    arguments = {"specs": [spec], "cache_dir": tmp_path / "cache", **arguments}
    if arguments["specs"] == "one spec":
        arguments["specs"] = spec
    with pytest.raises(error, match=fragment):
        precompile(**{"arch": "sm_90a", "progress": False, **arguments})
    assert sorted(p.name for p in tmp_path.iterdir()) == [source.name]


def test_a_malformed_arch_with_no_specs_is_still_an_error(cache_dir):
    with pytest.raises(ValueError, match="arch: expected a full SM target"):
        precompile([], arch="garbage", cache_dir=cache_dir, progress=False)


@pytest.mark.parametrize("progress", [True, False])
def test_the_progress_bar_counts_the_configurations_on_stderr(source, cache_dir, capsys, progress):
    # The acceptance asks for a progress bar: tqdm's on stderr, one step per configuration.
    specs = [KernelSpec.make("fill", source, {"VALUE": v}) for v in range(3)]
    precompile(specs, arch="sm_90a", max_workers=1, progress=progress, cache_dir=cache_dir)
    captured = capsys.readouterr()
    assert captured.out == ""
    if progress:
        assert "3/3" in captured.err
    else:
        assert captured.err == ""


def test_an_interrupt_stops_the_compiles_it_has_not_reached(source, cache_dir):
    # Ctrl-C while waiting (here: raised by the first result's callback) must stop the pool:
    # no further spec compiled, no worker left running (found by a review: every spec was
    # still compiled in the background).
    specs = [KernelSpec.make("fill", source, {"VALUE": v}) for v in range(8)]
    started = []

    def interrupt(index, result):
        started.append(index)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        precompile_module._run_pool(list(enumerate(specs)), "sm_90a", str(cache_dir), 1, interrupt)
    time.sleep(3)  # ample for a pool still running to compile more of the eight
    cached = [lookup_kernel(spec, "sm_90a", cache_dir=cache_dir) is not None for spec in specs]
    assert started == [0] and cached[0] and sum(cached) <= 2, cached


@pytest.mark.parametrize(
    "arch", ["sm_80", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_100f", "sm_120a"]
)
def test_every_target_form_nvrtc_names_is_accepted(arch):
    check_arch(arch)  # no error
