"""Every kernel configuration of this package, for `python -m flashinfer_jit compile-check`.

Registered as the `flashinfer_jit.kernels` entry point in `pyproject.toml`.
"""

from __future__ import annotations

from . import fp4_sm90, fp8_sm90


def all_kernel_specs():
    """The FP8 and MXFP4 configurations CI compiles for sm_90a."""
    return fp8_sm90.all_kernel_specs() + fp4_sm90.all_kernel_specs()
