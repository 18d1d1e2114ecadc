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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from .cache import NoCacheFolderError, cache_root
from .compiler import CompiledKernel, _lookup, check_arch, compile_kernel
from .errors import KernelCompileError
from .resources import FunctionResources
from .spec import KernelSpec


@dataclass(frozen=True)
class PrecompileResult:
    """Outcome for one configuration.

    Attributes:
        spec: The configuration.
        arch: Target arch.
        ok: True when the configuration compiled (or was already cached).
        from_cache: True when it was already cached when the call began.
        stored: True when its cubin is in the disk cache: False on failure, and when it
            compiled but the cache could not be written (the compile logs why).
        compile_seconds: NVRTC time (of the original compile for cache hits).
        functions: Per-function resources (empty on failure).
        error: The error message on failure, else None.
    """

    spec: KernelSpec
    arch: str
    ok: bool
    from_cache: bool = False
    stored: bool = False
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
        """Configurations that were already in the cache when the call began."""
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
    def not_stored(self) -> list[PrecompileResult]:
        """Configurations that compiled but are not in the disk cache (it could not be
        written), so the next process compiles them again."""
        return [r for r in self.results if r.ok and not r.stored]

    @property
    def spills(self) -> list[PrecompileResult]:
        """Compiled configurations with register spills."""
        return [r for r in self.results if r.ok and r.spilling_functions]

    def __str__(self) -> str:
        not_stored = len(self.not_stored)
        unstored = f", {not_stored} not stored (the cache could not be written)" * bool(not_stored)
        return (
            f"{self.total} kernel configuration(s) for {self.arch}: {self.cached} cached, "
            f"{self.compiled} compiled{unstored}, {len(self.failures)} failed, "
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

    def __reduce__(self):
        return (type(self), (self.summary,))


def _result_from(compiled: CompiledKernel) -> PrecompileResult:
    return PrecompileResult(
        spec=compiled.spec,
        arch=compiled.arch,
        ok=True,
        from_cache=compiled.from_cache,
        stored=compiled.cache_path is not None,
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
        The result; `error` holds the message for compile errors, bad options, missing or
        unreadable sources or a missing entry point.
    """
    try:
        return _result_from(compile_kernel(spec, arch, cache_dir=cache_dir))
    except (KernelCompileError, ValueError, OSError) as exc:
        return _failed(spec, arch, str(exc))


def _failed(spec: KernelSpec, arch: str, error: str) -> PrecompileResult:
    return PrecompileResult(spec=spec, arch=arch, ok=False, error=error)


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


#: Module run as a compile worker; tests substitute one that dies on purpose.
WORKER_MODULE = "flashinfer_jit._worker"


def _worker_environment() -> dict[str, str]:
    env = dict(os.environ)
    # Make the worker import this very copy of flashinfer_jit (editable, vendored or installed).
    package_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    return env


def _start_worker(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", WORKER_MODULE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )


def _stop_worker(process: subprocess.Popen) -> None:
    with _suppress():
        process.stdin.close()  # type: ignore[union-attr]  # PIPE was requested
    with _suppress():
        process.wait(timeout=30)
    if process.poll() is None:
        process.kill()


def _ask_worker(
    process: subprocess.Popen, spec: KernelSpec, arch: str, cache_dir: str | None
) -> PrecompileResult | None:
    """The worker's result for `spec`, or None when the worker died on it."""
    try:
        write_frame(process.stdin, (spec, arch, cache_dir))  # type: ignore[arg-type]
        return read_frame(process.stdout)  # type: ignore[arg-type]
    except (EOFError, OSError, pickle.UnpicklingError):
        return None


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
    stopping = threading.Event()  # the caller was interrupted: start nothing more
    live: set[subprocess.Popen] = set()  # workers, for the interrupted caller to kill
    live_lock = threading.Lock()

    def drive() -> None:
        # A worker that dies (NVRTC aborting the process, say) fails only the spec it was
        # compiling; the next spec gets a fresh worker.
        process: subprocess.Popen | None = None
        try:
            while not stopping.is_set():
                try:
                    index, spec = todo.get_nowait()
                except queue.Empty:
                    break
                if process is None:
                    try:
                        process = _start_worker(env)
                    except OSError as exc:
                        done.put((index, _failed(spec, arch, f"cannot start a worker: {exc}")))
                        break
                    with live_lock:
                        live.add(process)
                        if stopping.is_set():  # started after the caller killed the others
                            process.kill()
                result = _ask_worker(process, spec, arch, cache_dir)
                if result is None:
                    _stop_worker(process)
                    error = f"compile worker died (exit code {process.returncode}) compiling it"
                    result, process = _failed(spec, arch, error), None
                done.put((index, result))
        finally:
            if process is not None:
                _stop_worker(process)

    threads = [threading.Thread(target=drive, daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()
    received = 0
    try:
        while received < len(tasks):
            try:
                index, result = done.get(timeout=0.5)
            except queue.Empty:
                if not any(t.is_alive() for t in threads) and done.empty():
                    break  # every worker thread failed (no worker could start); caller reports
                continue
            on_result(index, result)
            received += 1
    except BaseException:  # KeyboardInterrupt above all: stop compiling, then re-raise
        stopping.set()
        with live_lock:
            for process in live:
                with _suppress():
                    process.kill()
        raise
    finally:
        for thread in threads:
            thread.join(timeout=5)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


def _unique_specs(specs: Iterable[KernelSpec]) -> list[KernelSpec]:
    if isinstance(specs, KernelSpec) or not isinstance(specs, Iterable):
        raise TypeError(
            f"specs: expected an iterable of KernelSpec (a list), got {type(specs).__name__}"
        )
    items = list(specs)
    for item in items:
        if not isinstance(item, KernelSpec):
            raise TypeError(f"specs: expected KernelSpec items, got {type(item).__name__}")
    return list(dict.fromkeys(items))


def _check_max_workers(max_workers: int | None) -> None:
    if max_workers is None:
        return
    if type(max_workers) is not int:
        raise TypeError(
            f"max_workers: expected a positive int or None, got {type(max_workers).__name__} "
            f"({max_workers!r})"
        )
    if max_workers < 1:
        raise ValueError(f"max_workers: expected a positive int or None, got {max_workers}")


def _root_for_workers(cache_dir: str | Path) -> str:
    """The cache root the workers are given: `cache_dir` checked (TypeError / ValueError here,
    once) and expanded; one under an unknown `~user` stays as given, so that each compile
    warns and runs without the disk cache, as it does for such a FLASHINFER_JIT_CACHE_DIR."""
    try:
        return str(cache_root(cache_dir))
    except NoCacheFolderError:
        return os.fspath(cache_dir)


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
        TypeError: `specs` is not an iterable of KernelSpec, or `max_workers`,
            `cache_dir`, `arch` or (where it is read) `device` has the wrong type.
        ValueError: `max_workers` is not positive, `cache_dir` is empty, `arch` is
            malformed, or (where it is read: `arch` None or `load` set) `device` is not a
            CUDA device, its index is negative, or a string does not parse as a device.
        RuntimeError: `arch` is None (or `load` is set) and no GPU is available.
    """
    from tqdm.auto import tqdm

    start = time.perf_counter()
    unique = _unique_specs(specs)
    _check_max_workers(max_workers)
    root = None if cache_dir is None else _root_for_workers(cache_dir)
    if load:
        from .device import resolve_device_index

        device = resolve_device_index(device)  # before compiling: no GPU fails fast
    if arch is None:
        from .device import device_arch

        arch = device_arch(device)
    else:
        check_arch(arch)  # once, before any spec: not one failure per configuration
    results: list[PrecompileResult | None] = [None] * len(unique)
    bar = tqdm(
        total=len(unique), desc=f"flashinfer_jit {arch}", unit="kernel", disable=not progress
    )

    def record(index: int, result: PrecompileResult) -> None:
        results[index] = result
        bar.update(1)
        if not result.ok:
            bar.set_postfix_str(f"failed: {result.spec.label}", refresh=False)

    try:  # the bar is closed also when the caller is interrupted (Ctrl-C)
        misses: list[tuple[int, KernelSpec]] = []
        for index, spec in enumerate(unique):
            try:
                # A damaged entry is compiled below, whose read of it says so.
                hit = _lookup(spec, arch, root, report_damage=False)
            except (ValueError, OSError) as exc:
                record(index, _failed(spec, arch, str(exc)))
                continue
            if hit is not None:
                record(index, _result_from(hit))
            else:
                misses.append((index, spec))

        def record_miss(index: int, result: PrecompileResult) -> None:
            # Not in the cache when the call began, even where the compile then found an entry:
            # one this call wrote for another spec of the same cubin (two entry points of one
            # source share a cache key), or another process's.
            record(index, replace(result, from_cache=False))

        workers = min(max_workers or os.cpu_count() or 1, len(misses))
        if workers <= 1:
            for index, spec in misses:
                record_miss(index, compile_one(spec, arch, root))
        else:
            _run_pool(misses, arch, root, workers, record_miss)
            for index, spec in misses:
                if results[index] is None:
                    record(index, _failed(spec, arch, "no worker ran it"))
    finally:
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
