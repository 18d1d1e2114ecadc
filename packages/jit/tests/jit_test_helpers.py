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


def compile_from_threads(source: str, cache_dir: str, threads: int, results) -> None:
    """In a fresh interpreter (nothing of cuda.core imported yet), compile `threads` different
    specs of the same kernel at once from as many threads; put one outcome per thread."""
    import threading

    from flashinfer_jit import KernelSpec, compile_kernel

    start = threading.Barrier(threads)
    outcomes = []

    def compile_one(value: int) -> None:
        spec = KernelSpec.make("add_value", Path(source), {"VALUE": value})
        start.wait(timeout=120)
        try:
            compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
            outcomes.append("ok")
        except Exception as exc:  # reported to the parent, which fails the test
            outcomes.append(repr(exc))

    workers = [threading.Thread(target=compile_one, args=(v,)) for v in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    results.put(outcomes)
