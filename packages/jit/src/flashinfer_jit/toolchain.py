"""Where the compiler and its headers come from, and their versions (part of every cache key).

Nothing here initialises CUDA; `cuda.*` modules are imported on first use so that
`import flashinfer_jit` stays cheap.
"""

from __future__ import annotations

import functools
from pathlib import Path

#: Helper headers shipped with this package (`#include "flashinfer_jit/hopper.cuh"`).
PACKAGE_INCLUDE_DIR = Path(__file__).resolve().parent / "include"

# Distributions whose contents decide what a given source compiles to. Their versions stand
# in for hashing the thousands of CUDA/CCCL headers a kernel may pull in.
_TOOLCHAIN_DISTRIBUTIONS = (
    "nvidia-cuda-nvrtc",
    "nvidia-cuda-runtime",
    "nvidia-cuda-cccl",
    "cuda-core",
)


@functools.cache
def cuda_header_dirs() -> tuple[Path, ...]:
    """Return the CUDA runtime and CCCL include directories found by `cuda.pathfinder`.

    Returns:
        `(cudart_include, cccl_include)`, from the `nvidia-cuda-runtime` and
        `nvidia-cuda-cccl` wheels (or a CUDA toolkit that `cuda.pathfinder` finds).

    Raises:
        RuntimeError: One of the two header sets cannot be found.
    """
    import cuda.pathfinder

    dirs = []
    for libname, wheel in (("cudart", "nvidia-cuda-runtime"), ("cccl", "nvidia-cuda-cccl")):
        found = cuda.pathfinder.find_nvidia_header_directory(libname)
        if found is None:
            raise RuntimeError(
                f"CUDA headers for {libname!r} not found; install the {wheel} wheel "
                f"(pip install '{wheel}>=13,<14') or set CUDA_HOME to a CUDA 13 toolkit"
            )
        dirs.append(Path(found))
    return tuple(dirs)


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """Return the version of the NVRTC library that compiles kernels.

    Returns:
        `(major, minor)`, for example `(13, 0)`.

    Raises:
        RuntimeError: NVRTC cannot be loaded; the message names the wheel to install.
    """
    from cuda.bindings import nvrtc

    try:
        result, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # cuda.pathfinder's DynamicLibNotFoundError and kin
        first_line = (str(exc).splitlines() or [""])[0]
        raise RuntimeError(
            "NVRTC could not be loaded; install the nvidia-cuda-nvrtc wheel "
            "(pip install 'nvidia-cuda-nvrtc>=13,<14') or set CUDA_HOME to a CUDA 13 toolkit "
            f"({type(exc).__name__}: {first_line})"
        ) from exc
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtcVersion failed: {result!r}")
    return int(major), int(minor)


@functools.cache
def nvrtc_supported_archs() -> tuple[int, ...] | None:
    """The SM numbers this NVRTC compiles for (`90` for sm_90/sm_90a), or None when NVRTC
    cannot say (it is missing or too old to be asked); callers then let the compile decide."""
    from cuda.bindings import nvrtc

    try:
        result, archs = nvrtc.nvrtcGetSupportedArchs()
    except Exception:  # NVRTC missing: the compile names the wheel to install
        return None
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return None
    return tuple(int(a) for a in archs)


@functools.cache
def toolchain_fingerprint() -> tuple[tuple[str, str], ...]:
    """Versions that identify the compiler and the system headers, for the cache key.

    Returns:
        Sorted `(name, version)` pairs: the NVRTC library version and the versions of the
        wheels that provide NVRTC, the CUDA runtime headers, the CCCL headers and
        `cuda.core`. Where a wheel is not installed (a conda or toolkit setup), its header
        directory path stands in for its version.
    """
    import importlib.metadata

    items = {"nvrtc": "{}.{}".format(*nvrtc_version())}
    header_dirs = dict(zip(("nvidia-cuda-runtime", "nvidia-cuda-cccl"), cuda_header_dirs()))
    for dist in _TOOLCHAIN_DISTRIBUTIONS:
        try:
            items[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            items[dist] = f"not-a-wheel:{header_dirs.get(dist, '')}"
    return tuple(sorted(items.items()))
