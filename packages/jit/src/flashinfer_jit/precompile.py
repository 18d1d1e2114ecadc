"""Compile many kernel configurations ahead of time, in parallel worker processes.

NVRTC releases the GIL, but concurrent compiles in one process serialise inside the library
(on a 2-core machine, two threads took at least as long as compiling back to back, two
processes ran in parallel), so parallelism comes from processes. Workers are plain `python -m flashinfer_jit._worker`
subprocesses fed over pipes, not `multiprocessing`: that neither re-imports the caller's
`__main__` (spawn) nor forks a process that has CUDA and threads running (fork).
"""

from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from .compiler import CompiledKernel, compile_kernel, lookup_kernel
from .errors import KernelCompileError
from .resources import FunctionResources
from .spec import KernelSpec


@dataclass(frozen=True)
class PrecompileResult:
    """Outcome for one configuration.

    Attributes:
        spec: The configuration.
        arch: Target arch.
        ok: True when a cubin is in the cache.
        from_cache: True when it was already cached.
        compile_seconds: NVRTC time (of the original compile for cache hits).
        functions: Per-function resources (empty on failure).
        error: The error message on failure, else None.
    """

    spec: KernelSpec
    arch: str
    ok: bool
    from_cache: bool = False
    compile_seconds: float = 0.0
    functions: dict[str, FunctionResources] = field(default_factory=dict)
    error: str | None = None

    @property
    def spilling_functions(self) -> list[FunctionResources]:
        """Functions of this cubin that spill registers."""
        return [f for f in self.functions.values() if f.spills]


@dataclass(frozen=True)
class PrecompileSummary:
    """What `precompile` did.

    Attributes:
        arch: Target arch.
        results: One result per distinct spec, in input order.
        seconds: Wall time.
    """

    arch: str
    results: tuple[PrecompileResult, ...]
    seconds: float

    @property
    def total(self) -> int:
        """Number of distinct configurations."""
        return len(self.results)

    @property
    def cached(self) -> int:
        """Configurations that were already in the cache."""
        return sum(r.ok and r.from_cache for r in self.results)

    @property
    def compiled(self) -> int:
        """Configurations compiled by this call."""
        return sum(r.ok and not r.from_cache for r in self.results)

    @property
    def failures(self) -> list[PrecompileResult]:
        """Configurations that failed to compile."""
        return [r for r in self.results if not r.ok]

    @property
    def spills(self) -> list[PrecompileResult]:
        """Compiled configurations with register spills."""
        return [r for r in self.results if r.ok and r.spilling_functions]

    def __str__(self) -> str:
        return (
            f"{self.total} kernel configuration(s) for {self.arch}: {self.cached} cached, "
            f"{self.compiled} compiled, {len(self.failures)} failed, "
            f"{len(self.spills)} spilling; {self.seconds:.1f} s"
        )


class PrecompileError(RuntimeError):
    """Some configurations failed to compile.

    Attributes:
        summary: The full summary, including the successful configurations.
    """

    def __init__(self, summary: PrecompileSummary) -> None:
        self.summary = summary
        lines = [f"{len(summary.failures)} of {summary.total} kernel configuration(s) failed:"]
        lines += [f"--- {r.spec.label}\n{r.error}" for r in summary.failures]
        super().__init__("\n".join(lines))


def _result_from(compiled: CompiledKernel) -> PrecompileResult:
    return PrecompileResult(
        spec=compiled.spec,
        arch=compiled.arch,
        ok=True,
        from_cache=compiled.from_cache,
        compile_seconds=compiled.compile_seconds,
        functions=compiled.functions,
    )


def compile_one(spec: KernelSpec, arch: str, cache_dir: str | Path | None) -> PrecompileResult:
    """Compile one spec, turning expected failures into a failed result.

    Args:
        spec: The configuration.
        arch: Target arch.
        cache_dir: Cache root (None for the default).

    Returns:
        The result; `error` holds the message for compile errors, bad options, missing
        sources or a missing entry point.
    """
    try:
        return _result_from(compile_kernel(spec, arch, cache_dir=cache_dir))
    except (KernelCompileError, ValueError, FileNotFoundError, UnicodeDecodeError) as exc:
        return PrecompileResult(spec=spec, arch=arch, ok=False, error=str(exc))


# ---- worker processes -----------------------------------------------------------------------

_FRAME = struct.Struct("<Q")


def write_frame(stream: BinaryIO, payload: Any) -> None:
    """Write one length-prefixed pickle to a pipe."""
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_FRAME.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: BinaryIO) -> Any:
    """Read one length-prefixed pickle from a pipe; raise EOFError at end of stream."""
    header = stream.read(_FRAME.size)
    if len(header) < _FRAME.size:
        raise EOFError
    (size,) = _FRAME.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def _worker_environment() -> dict[str, str]:
    env = dict(os.environ)
    # Make the worker import this very copy of flashinfer_jit (editable, vendored or installed).
    package_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    return env


def _run_pool(
    tasks: list[tuple[int, KernelSpec]],
    arch: str,
    cache_dir: str | None,
    workers: int,
    on_result: Any,
) -> None:
    todo: queue.Queue = queue.Queue()
    for task in tasks:
        todo.put(task)
    done: queue.Queue = queue.Queue()
    env = _worker_environment()

    def drive() -> None:
        process = subprocess.Popen(
            [sys.executable, "-m", "flashinfer_jit._worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        stdin: BinaryIO = process.stdin  # type: ignore[assignment]  # PIPE was requested
        stdout: BinaryIO = process.stdout  # type: ignore[assignment]
        try:
            while True:
                try:
                    index, spec = todo.get_nowait()
                except queue.Empty:
                    break
                try:
                    write_frame(stdin, (spec, arch, cache_dir))
                    result = read_frame(stdout)
                except (EOFError, OSError, pickle.UnpicklingError) as exc:
                    code = process.poll()
                    result = PrecompileResult(
                        spec=spec,
                        arch=arch,
                        ok=False,
                        error=f"compile worker died (exit code {code}): {exc!r}",
                    )
                    done.put((index, result))
                    break
                done.put((index, result))
        finally:
            with _suppress():
                stdin.close()
            with _suppress():
                process.wait(timeout=30)
            if process.poll() is None:
                process.kill()

    threads = [threading.Thread(target=drive, daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()
    received = 0
    while received < len(tasks):
        try:
            index, result = done.get(timeout=0.5)
        except queue.Empty:
            if not any(t.is_alive() for t in threads) and done.empty():
                break  # every worker died; leftovers are reported by the caller
            continue
        on_result(index, result)
        received += 1
    for thread in threads:
        thread.join(timeout=5)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


def precompile(
    specs: Iterable[KernelSpec],
    device: Any = None,
    *,
    arch: str | None = None,
    max_workers: int | None = None,
    progress: bool = True,
    cache_dir: str | Path | None = None,
    load: bool = False,
    raise_on_error: bool = True,
) -> PrecompileSummary:
    """Compile many kernel configurations into the disk cache, in parallel.

    Cached configurations are only checked; the others are compiled by worker processes.
    Run it at deployment or start-up so that no serving request compiles.

    Args:
        specs: The configurations (duplicates are compiled once).
        device: Device whose arch to compile for, when `arch` is not given: None (current
            PyTorch device), an index, a `torch.device` or `"cuda:N"`.
        arch: Target arch such as `"sm_90a"`; needs no GPU (CI, build machines).
        max_workers: Worker processes; default `os.cpu_count()`, capped by the number of
            configurations to compile. 1 compiles in this process.
        progress: Show a tqdm progress bar (on stderr).
        cache_dir: Cache root; defaults to `default_cache_dir()`.
        load: Also load every kernel on `device` (in-process table), so that even the
            first launch does no disk I/O.
        raise_on_error: Raise `PrecompileError` after all configurations ran if any failed.

    Returns:
        The summary (counts, per-spec results, spills, time).

    Raises:
        PrecompileError: Some configurations failed and `raise_on_error` is set.
        ValueError: `max_workers` is not positive, or `arch` is malformed.
        RuntimeError: `arch` is None and no GPU is available.
    """
    from tqdm.auto import tqdm

    start = time.perf_counter()
    if arch is None:
        from .device import device_arch

        arch = device_arch(device)
    if max_workers is not None and max_workers < 1:
        raise ValueError(f"max_workers: expected a positive int or None, got {max_workers}")
    unique = list(dict.fromkeys(specs))
    for item in unique:
        if not isinstance(item, KernelSpec):
            raise TypeError(f"specs: expected KernelSpec items, got {type(item).__name__}")
    root = str(cache_dir) if cache_dir is not None else None
    results: list[PrecompileResult | None] = [None] * len(unique)
    bar = tqdm(
        total=len(unique), desc=f"flashinfer_jit {arch}", unit="kernel", disable=not progress
    )

    def record(index: int, result: PrecompileResult) -> None:
        results[index] = result
        bar.update(1)
        if not result.ok:
            bar.set_postfix_str(f"failed: {result.spec.label}", refresh=False)

    misses: list[tuple[int, KernelSpec]] = []
    for index, spec in enumerate(unique):
        try:
            hit = lookup_kernel(spec, arch, cache_dir=root)
        except (ValueError, FileNotFoundError, UnicodeDecodeError) as exc:
            record(index, PrecompileResult(spec=spec, arch=arch, ok=False, error=str(exc)))
            continue
        if hit is not None:
            record(index, _result_from(hit))
        else:
            misses.append((index, spec))

    workers = min(max_workers or os.cpu_count() or 1, len(misses))
    if workers <= 1:
        for index, spec in misses:
            record(index, compile_one(spec, arch, root))
    else:
        _run_pool(misses, arch, root, workers, record)
        for index, spec in misses:
            if results[index] is None:
                record(
                    index,
                    PrecompileResult(spec=spec, arch=arch, ok=False, error="no worker ran it"),
                )
    bar.close()

    summary = PrecompileSummary(arch, tuple(r for r in results if r is not None), 0.0)
    if load:
        from .kernel import load_kernel

        for result in summary.results:
            if result.ok:
                load_kernel(result.spec, device, cache_dir=root)
    summary = PrecompileSummary(arch, summary.results, time.perf_counter() - start)
    if raise_on_error and summary.failures:
        raise PrecompileError(summary)
    return summary
