"""Without NVRTC: a `RuntimeError` naming the wheel to install, and one error line from the CLI."""

from __future__ import annotations

import pytest
from flashinfer_jit import toolchain
from flashinfer_jit.cli import main


class _LibNotFound(RuntimeError):
    """Stands in for cuda.pathfinder's DynamicLibNotFoundError (a RuntimeError subclass)."""


@pytest.fixture
def no_nvrtc(monkeypatch):
    """Make every NVRTC call fail as it does when no libnvrtc.so.13 can be found."""
    from cuda.bindings import nvrtc

    def missing():
        raise _LibNotFound(
            'Failure finding "libnvrtc.so.13": No such file: libnvrtc.so.13\n'
            '  listdir("/site-packages/nvidia/cu13/lib"):\n    libcudart.so.13'
        )

    toolchain.nvrtc_version.cache_clear()
    toolchain.toolchain_fingerprint.cache_clear()
    monkeypatch.setattr(nvrtc, "nvrtcVersion", missing)
    yield
    monkeypatch.undo()
    toolchain.nvrtc_version.cache_clear()
    toolchain.toolchain_fingerprint.cache_clear()


def test_nvrtc_that_cannot_be_loaded_names_the_wheel(no_nvrtc):
    with pytest.raises(RuntimeError, match=r"install the nvidia-cuda-nvrtc wheel") as info:
        toolchain.nvrtc_version()
    message = str(info.value)
    assert '_LibNotFound: Failure finding "libnvrtc.so.13"' in message
    assert "listdir" not in message  # only the first line of the loader's report
    assert isinstance(info.value.__cause__, _LibNotFound)


@pytest.mark.parametrize("command", ["compile-check", "inspect"])
def test_cli_without_nvrtc_is_one_error_and_status_1(no_nvrtc, cache_dir, capsys, command):
    target = "flashinfer_jit.selftest:kernel_specs"
    if command == "compile-check":
        argv = ["compile-check", "--specs", target, "--no-progress"]
    else:
        argv = ["inspect", target]
    assert main([*argv, "--cache-dir", str(cache_dir)]) == 1
    captured = capsys.readouterr()
    assert f"{command}: cannot compile: NVRTC could not be loaded" in captured.err
    assert "nvidia-cuda-nvrtc" in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not list(cache_dir.iterdir())  # nothing was compiled or written
