"""Helpers that child processes of the flashinfer_jit tests import by module name."""

from __future__ import annotations

import hashlib
from pathlib import Path


def compile_when_released(source: str, cache_dir: str, barrier, results) -> None:
    """Wait for every sibling process, then compile the same kernel into `cache_dir`."""
    from flashinfer_jit import KernelSpec, compile_kernel
    from flashinfer_jit.toolchain import toolchain_fingerprint

    toolchain_fingerprint()  # load NVRTC before the barrier so compiles really overlap
    spec = KernelSpec.make("add_value", Path(source), {"VALUE": 7})
    barrier.wait(timeout=120)
    try:
        compiled = compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
        results.put(("ok", hashlib.sha256(compiled.cubin).hexdigest(), compiled.from_cache))
    except Exception as exc:  # reported to the parent, which fails the test
        results.put(("error", repr(exc), False))
