"""tools/with_nvrtc.py: the NVRTC of a given folder is the one a process compiles with (CPU)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "with_nvrtc.py"

# Compiles a kernel into an empty cache (so NVRTC runs), then lists the NVRTC libraries mapped
# in this process.
PROBE = """
import sys
from pathlib import Path
from flashinfer_jit.compiler import compile_kernel
from flashinfer_jit.selftest import SCALE_ADD
assert not compile_kernel(SCALE_ADD, "sm_90a", cache_dir=sys.argv[1]).from_cache
maps = Path("/proc/self/maps").read_text().splitlines()
print("\\n".join(sorted({line.split()[-1] for line in maps if "libnvrtc" in line})))
"""


# Runs PROBE in a child process the way precompile starts its compile workers (this process's
# environment), and prints what the child mapped.
CHILD_PROBE = f"""
import subprocess, sys
subprocess.run([sys.executable, "-c", {PROBE!r}, sys.argv[1]], check=True)
"""


def _installed_nvrtc_folder() -> Path | None:
    for entry in map(Path, sys.path):
        folder = entry / "nvidia" / "cu13" / "lib"
        if (folder / "libnvrtc.so.13").is_file():
            return folder
    return None


def _copy_installed_nvrtc(folder: Path) -> None:
    """Copy the installed wheel's NVRTC libraries into `folder` (skip the test without one)."""
    installed = _installed_nvrtc_folder()
    if installed is None:
        pytest.skip("no nvidia-cuda-nvrtc wheel on sys.path")
    for library in [installed / "libnvrtc.so.13", *installed.glob("libnvrtc-builtins.so*")]:
        shutil.copy(library, folder / library.name)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
@pytest.mark.parametrize("probe_text", [PROBE, CHILD_PROBE], ids=["this_process", "a_child"])
def test_the_given_folders_nvrtc_is_the_one_loaded(tmp_path, probe_text):
    # A copy at another path: the mapped files tell it apart from the wheel's own.
    _copy_installed_nvrtc(tmp_path)
    probe = tmp_path / "probe.py"
    probe.write_text(probe_text)
    done = subprocess.run(
        [sys.executable, str(TOOL), str(tmp_path), str(probe), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        check=True,
    )
    mapped = done.stdout.split()
    assert mapped and all(Path(path).parent == tmp_path for path in mapped), done.stdout
    assert f"from {tmp_path}" in done.stderr


@pytest.mark.parametrize(
    ("subfolder", "with_nvrtc", "message"),
    [
        ("empty", False, "needs libnvrtc.so.13"),
        ("with space", True, "cannot go into LD_PRELOAD"),  # LD_PRELOAD's separator
    ],
)
def test_a_folder_it_cannot_use_is_refused(tmp_path, subfolder, with_nvrtc, message):
    folder = tmp_path / subfolder
    folder.mkdir()
    if with_nvrtc:
        _copy_installed_nvrtc(folder)
    done = subprocess.run(
        [sys.executable, str(TOOL), str(folder), "-m", "json.tool"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert message in done.stderr
