"""Command line: `python -m flashinfer_jit {inspect, compile-check, cache-info}`.

All commands compile with NVRTC and need no GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from .cache import MANIFEST_FILE
from .compiler import CompiledKernel, check_arch, compile_kernel
from .errors import KernelCompileError
from .precompile import PrecompileSummary, precompile
from .registry import ENTRY_POINT_GROUP, SpecSource, discover_registered_specs, load_target
from .sources import without_comments
from .spec import KernelSpec
from .toolchain import nvrtc_supported_archs

# Shared memory per block a kernel can opt in to, by arch family, for the inspect report.
_OPTIN_SHARED_BYTES = {"sm_90": 232448, "sm_100": 232448, "sm_80": 166912, "sm_89": 101376}
# __launch_bounds__(...) may sit before or after `void`; its arguments may hold one level of
# parentheses (`__launch_bounds__(kThreads(), 1)`).
_LAUNCH_BOUNDS = rb"__launch_bounds__\((?:[^()]|\([^()]*\))*\)\s+"
_EXTERN_C_KERNEL = re.compile(
    rb'extern\s+"C"\s+__global__\s+(?:'
    + _LAUNCH_BOUNDS
    + rb")?void\s+(?:"
    + _LAUNCH_BOUNDS
    + rb")?(\w+)"
)


class UsageError(Exception):
    """A bad command line: reported in one line with exit status 2, as argparse does."""


def _arch(value: str) -> str:
    try:
        check_arch(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    # Well formed but unknown to this NVRTC (sm_99a): one usage error, not one NVRTC log per
    # configuration.
    supported = nvrtc_supported_archs()
    number = int(re.sub(r"\D", "", value))
    if supported is not None and number not in supported:
        known = ", ".join(f"sm_{a}" for a in supported)
        raise argparse.ArgumentTypeError(
            f"arch: {value!r} is not a target of this NVRTC, which compiles for {known} "
            "(with an 'a' or 'f' suffix where the GPU has one)"
        )
    return value


def _non_empty(value: str) -> str:
    if not value:
        raise argparse.ArgumentTypeError("expected a non-empty value, got ''")
    return value


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {value!r}")
    return number


def find_sass_tool() -> tuple[str, list[str]] | None:
    """Locate a SASS disassembler: nvdisasm (preferred) or cuobjdump.

    Looks in the NVIDIA wheels via `cuda.pathfinder` (`nvidia-cuda-nvdisasm`,
    `nvidia-cuda-cuobjdump`), then on PATH.

    Returns:
        `(path, arguments before the cubin path)`, or None when neither tool exists.
    """
    for tool, args in (("nvdisasm", ["-c"]), ("cuobjdump", ["-sass"])):
        path = None
        try:
            from cuda.pathfinder import find_nvidia_binary_utility

            path = find_nvidia_binary_utility(tool)
        except Exception:  # older cuda-pathfinder without binary lookup, or not found
            path = None
        path = path or shutil.which(tool)
        if path:
            return str(path), args
    return None


def _parse_defines(items: Sequence[str]) -> dict[str, str | int]:
    defines: dict[str, str | int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not name:
            raise UsageError(f"-D expects NAME or NAME=VALUE, got {item!r}")
        if not sep:
            value = "1"
        # A canonical decimal becomes an int (the label KernelSpec prints for it); any other
        # text, such as 010 (octal 8 to the compiler), is passed through as written.
        parsed: str | int = value
        if re.fullmatch(r"-?\d+", value) and str(int(value)) == value:
            parsed = int(value)
        if name in defines and defines[name] != parsed:
            raise UsageError(
                f"-D {name} given twice with different values: {defines[name]!r} and {parsed!r}"
            )
        defines[name] = parsed
    return defines


def _spec_from_file(args: argparse.Namespace, path: Path) -> KernelSpec:
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "no such file"
        raise UsageError(f"target: {what}: {path}")
    name = args.kernel
    if name is None:
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise UsageError(f"target: cannot read {path}: {exc.strerror or exc}") from None
        found = _EXTERN_C_KERNEL.findall(without_comments(text))
        if not found:
            raise UsageError(f'{path}: no extern "C" __global__ kernel found; pass --kernel NAME')
        name = found[0].decode()
    try:
        return KernelSpec.make(
            name,
            path.resolve(),
            _parse_defines(args.define),
            include_dirs=[Path(d).resolve() for d in args.include],
            options=args.option,
            name_expressions=[name] if args.template else (),
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _specs_from_module(target: str) -> tuple[KernelSpec, ...]:
    module, sep, attribute = target.partition(":")
    if not (module and sep and attribute):
        raise UsageError(
            f"target: expected a .cu file or 'package.module:callable', got {target!r}"
        )
    try:
        return load_target(target)
    except Exception as exc:  # the target's own code may raise anything (compile-check too)
        raise UsageError(f"target {target!r}: {type(exc).__name__}: {exc}") from None


def _specs_from_target(args: argparse.Namespace) -> tuple[KernelSpec, ...]:
    target: str = args.target
    path = Path(target)
    if path.suffix in (".cu", ".cuh") or path.is_file():
        return (_spec_from_file(args, path),)
    if path.is_dir():
        raise UsageError(
            f"target: {target!r} is a folder; expected a .cu file or 'package.module:callable'"
        )
    if args.define or args.include or args.option:
        raise UsageError("-D/-I/--option apply only to a .cu path target")
    specs = _specs_from_module(target)
    if args.kernel:
        specs = tuple(s for s in specs if args.kernel in (s.name, s.label))
    return specs


def _optin_bytes(arch: str) -> int | None:
    family = re.sub(r"[af]$", "", arch)
    return _OPTIN_SHARED_BYTES.get(family)


def print_report(compiled: CompiledKernel, out: TextIO) -> None:
    """Print the resource report of one compiled configuration.

    Args:
        compiled: The compiled kernel.
        out: Where to write.
    """
    spec = compiled.spec
    origin = "cached" if compiled.from_cache else f"compiled in {compiled.compile_seconds:.2f} s"
    out.write(f"== {spec.label}  [{compiled.arch}, {origin}]\n")
    out.write(f"   source: {spec.source}\n")
    out.write(f"   cache:  {compiled.cache_path}\n")
    optin = _optin_bytes(compiled.arch)
    for function in compiled.functions.values():
        kind = "kernel" if function.is_entry else "device function"
        marker = "  <- entry point" if function.name == compiled.entry_name else ""
        out.write(f"   {kind} {function.name}{marker}\n")
        if function.is_entry:
            out.write(f"     registers:            {function.registers} per thread\n")
            dynamic = "set at launch"
            if optin is not None:
                dynamic += f" (up to {optin - function.static_shared_bytes} bytes per block)"
            out.write(
                f"     shared memory:        {function.static_shared_bytes} bytes static; "
                f"dynamic {dynamic}\n"
            )
            out.write(f"     barriers:             {function.barriers}\n")
        out.write(
            f"     spills:               {function.spill_store_bytes} bytes stores, "
            f"{function.spill_load_bytes} bytes loads"
            f"{'  (SPILLS)' if function.spills else ''}\n"
        )
        out.write(f"     local memory (stack): {function.stack_frame_bytes} bytes per thread\n")
        if function.constant_bytes:
            bank = function.constant_bytes
            out.write(f"     constant bank 0:      {bank} bytes (parameters; per function)\n")


def disassemble(cubin: bytes) -> tuple[str, subprocess.CompletedProcess[str]] | None:
    """Run the SASS disassembler of `find_sass_tool` on `cubin`.

    Returns:
        `(tool name, the finished process)`: "nvdisasm" or "cuobjdump", whose `stdout` is the
        SASS when `returncode` is 0 (only nvdisasm prints branch labels). None when neither
        tool exists.
    """
    tool = find_sass_tool()
    if tool is None:
        return None
    path, tool_args = tool
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "kernel.cubin"
        file.write_bytes(cubin)
        result = subprocess.run(
            [path, *tool_args, str(file)], capture_output=True, text=True, check=False
        )
    return Path(path).name, result


def _dump_sass(compiled: CompiledKernel, out: TextIO) -> None:
    disassembled = disassemble(compiled.cubin)
    if disassembled is None:
        out.write(
            "   SASS: neither nvdisasm nor cuobjdump found (pip install nvidia-cuda-nvdisasm, "
            "or put a CUDA toolkit's bin/ on PATH)\n"
        )
        return
    name, result = disassembled
    out.write(f"   SASS ({name}):\n")
    out.write(result.stdout if result.returncode == 0 else result.stderr)
    out.write("\n")


def _toolchain_problem() -> str | None:
    """Why NVRTC or the CUDA headers cannot be used here, or None when they can."""
    from .toolchain import toolchain_fingerprint

    try:
        toolchain_fingerprint()
    except RuntimeError as exc:
        return str(exc)
    return None


def cmd_inspect(args: argparse.Namespace) -> int:
    specs = _specs_from_target(args)
    if not specs:
        print(f"no kernel configurations matched {args.target!r}", file=sys.stderr)
        return 1
    problem = _toolchain_problem()
    if problem:
        print(f"inspect: cannot compile: {problem}", file=sys.stderr)
        return 1
    status = 0
    for spec in specs:
        try:
            compiled = compile_kernel(spec, args.arch, cache_dir=args.cache_dir)
        except (KernelCompileError, ValueError, OSError) as exc:
            print(f"== {spec.label}: FAILED\n{exc}", file=sys.stdout)
            status = 1
            continue
        print_report(compiled, sys.stdout)
        if args.sass:
            _dump_sass(compiled, sys.stdout)
    return status


def report_compile_check(
    sources: Sequence[SpecSource], summary: PrecompileSummary, out: TextIO
) -> int:
    """Print the compile-check report and return the exit status.

    Args:
        sources: Where the specs came from (entry points or targets), with load errors.
        summary: The precompile summary.
        out: Where to write.

    Returns:
        0 when everything compiled without spills into the cache and every source loaded,
        else 1.
    """
    status = 0
    for source in sources:
        if source.error:
            out.write(
                f"FAILED to load kernel registrations from {source.name}:\n  {source.error}\n"
            )
            status = 1
    for result in summary.failures:
        out.write(f"FAILED {result.spec.label} ({result.spec.source}):\n{result.error}\n\n")
        status = 1
    for result in summary.spills:
        for function in result.spilling_functions:
            out.write(
                f"SPILLS {result.spec.label}: function {function.name} spills "
                f"{function.spill_store_bytes} bytes stores / {function.spill_load_bytes} "
                f"bytes loads per thread\n"
            )
        status = 1
    for result in summary.not_stored:
        # A cache built to be shipped would be missing these.
        out.write(
            f"NOT STORED {result.spec.label}: compiled, but the kernel cache could not be "
            f"written (the warning above says why)\n"
        )
        status = 1
    out.write(f"{summary}\n")
    out.write("compile-check " + ("passed" if status == 0 else "FAILED") + "\n")
    return status


def cmd_compile_check(args: argparse.Namespace) -> int:
    if args.specs:
        sources = []
        for target in args.specs:
            try:
                sources.append(SpecSource(target, load_target(target)))
            except Exception as exc:  # report every broken target, not just the first
                sources.append(SpecSource(target, (), f"{type(exc).__name__}: {exc}"))
    else:
        sources = discover_registered_specs(args.group)
    # Once each: a spec two sources (or one target given twice) register is compiled once.
    specs = list(dict.fromkeys(spec for source in sources for spec in source.specs))
    loaded = sum(1 for s in sources if not s.error)
    if not specs and not any(s.error for s in sources):
        where = "the given targets" if args.specs else f"entry-point group {args.group!r}"
        print(f"no kernel configurations registered in {where}; nothing to compile")
        return 0
    problem = _toolchain_problem()
    if problem:
        print(f"compile-check: cannot compile: {problem}", file=sys.stderr)
        print("compile-check FAILED")
        return 1
    print(
        f"compile-check: {len(specs)} configuration(s) from {loaded} source(s) for {args.arch}",
        flush=True,
    )
    summary = precompile(
        specs,
        arch=args.arch,
        max_workers=args.jobs,
        progress=not args.no_progress,
        cache_dir=args.cache_dir,
        raise_on_error=False,
    )
    return report_compile_check(sources, summary, sys.stdout)


def cmd_cache_info(args: argparse.Namespace) -> int:
    from .cache import NoCacheFolderError, cache_root, schema_root

    try:
        root = cache_root(args.cache_dir)
    except NoCacheFolderError as exc:
        print(f"cache-info: {exc}", file=sys.stderr)
        return 1
    folder = schema_root(root)
    for path, what in ((root, "the cache root"), (folder, "the cache's schema folder")):
        # lexists: a dangling or looping link there is no folder either
        if os.path.lexists(path) and not path.is_dir():
            print(f"cache-info: {what} {path} is not a folder", file=sys.stderr)
            return 1
    try:
        entries, size = _entries_and_bytes(folder)
    except OSError as exc:
        print(f"cache-info: cannot read the cache at {root}: {exc}", file=sys.stderr)
        return 1
    total, unreadable = _bytes_under(folder)
    print(f"cache root: {root}")
    print(f"entries:    {entries} ({_size(size)}) in {folder}")
    if total != size or unreadable:  # unfinished publications in tmp/, stray folders
        line = f"on disk:    {_size(total)} in all, {_size(total - size)} outside the entries"
        if unreadable:
            line += f" ({unreadable} unreadable folder(s) not counted)"
        print(line)
    return 0


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


def _entries_and_bytes(folder: Path) -> tuple[int, int]:
    """The entries under the schema folder and the bytes of their files. An entry is a folder
    `<key[:2]>/<key>` holding a manifest (not a link: the cache publishes none). OSError for a
    shard or entry this process may not read; what another process removes meanwhile is
    skipped."""
    entries = size = 0
    for shard in _listing(folder):
        if len(shard.name) != 2 or shard.is_symlink() or not shard.is_dir():
            continue
        for entry in _listing(shard):
            if entry.name[:2] != shard.name or entry.is_symlink():
                continue
            if not (entry.is_dir() and (entry / MANIFEST_FILE).is_file()):
                continue
            entries += 1
            for file in _listing(entry):
                with contextlib.suppress(FileNotFoundError):
                    if file.is_file() and not file.is_symlink():
                        size += file.stat().st_size
    return entries, size


def _bytes_under(folder: Path) -> tuple[int, int]:
    """The bytes of every file under `folder` (links not followed) and how many folders could
    not be read (left out, not an error: `tmp/` holds other processes' half-written entries)."""
    total = unreadable = 0
    try:
        children = _listing(folder)
    except OSError:
        return 0, 1
    for child in children:
        with contextlib.suppress(FileNotFoundError):
            if child.is_symlink():
                continue
            if child.is_dir():
                sub_total, sub_unreadable = _bytes_under(child)
                total, unreadable = total + sub_total, unreadable + sub_unreadable
            elif child.is_file():
                total += child.stat().st_size
    return total, unreadable


def _listing(folder: Path) -> list[Path]:
    """`folder`'s children; none if it is gone (moved aside or swept meanwhile)."""
    try:
        return list(folder.iterdir())
    except FileNotFoundError:
        return []


_CACHE_DIR_HELP = "cache root (default: FLASHINFER_JIT_CACHE_DIR)"


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of `python -m flashinfer_jit`."""
    parser = argparse.ArgumentParser(
        prog="python -m flashinfer_jit",
        description="Compile, inspect and check flashinfer_jit kernels (NVRTC, no GPU needed).",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    inspect = commands.add_parser(
        "inspect",
        help="print registers, shared memory, spills and local memory of kernels",
        description="Compile kernels (or take them from the cache) and print their resources.",
    )
    inspect.add_argument(
        "target",
        help="'package.module:callable' returning KernelSpecs, or a .cu file",
    )
    inspect.add_argument(
        "--arch", type=_arch, default="sm_90a", help="target arch (default sm_90a)"
    )
    inspect.add_argument(
        "-D",
        dest="define",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="macro for a .cu target (repeatable)",
    )
    inspect.add_argument(
        "-I",
        dest="include",
        action="append",
        default=[],
        metavar="DIR",
        help="include folder for a .cu target (repeatable)",
    )
    inspect.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="OPT",
        help="NVRTC option for a .cu target, e.g. --option=--use_fast_math",
    )
    inspect.add_argument(
        "--kernel", type=_non_empty, help="entry point (.cu target) or name/label filter"
    )
    inspect.add_argument(
        "--template", action="store_true", help="treat --kernel as a template name expression"
    )
    inspect.add_argument("--sass", action="store_true", help="also dump SASS")
    inspect.add_argument("--cache-dir", type=_non_empty, help=_CACHE_DIR_HELP)
    inspect.set_defaults(handler=cmd_inspect, parser=inspect)

    check = commands.add_parser(
        "compile-check",
        help="compile every registered kernel configuration; fail on errors or spills",
        description=(
            "Compile every configuration registered under the flashinfer_jit.kernels "
            "entry-point group (or the given --specs targets). Exits 1 on any compile error, "
            "broken registration or register spill."
        ),
    )
    check.add_argument("--arch", type=_arch, default="sm_90a", help="target arch (default sm_90a)")
    check.add_argument(
        "--specs",
        action="append",
        default=[],
        metavar="MODULE:CALLABLE",
        help="check these targets instead of the entry points (repeatable)",
    )
    check.add_argument("--group", default=ENTRY_POINT_GROUP, help="entry-point group")
    check.add_argument(
        "-j",
        "--jobs",
        type=_positive_int,
        default=None,
        help="worker processes (default: CPU count)",
    )
    check.add_argument("--no-progress", action="store_true", help="no progress bar")
    check.add_argument("--cache-dir", type=_non_empty, help=_CACHE_DIR_HELP)
    check.set_defaults(handler=cmd_compile_check, parser=check)

    info = commands.add_parser("cache-info", help="print the cache location and size")
    info.add_argument("--cache-dir", type=_non_empty, help=_CACHE_DIR_HELP)
    info.set_defaults(handler=cmd_cache_info, parser=info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments without the program name (default `sys.argv[1:]`).

    Returns:
        The exit status.
    """
    args = build_parser().parse_args(argv)
    try:
        status = int(args.handler(args))
        sys.stdout.flush()  # here, not at exit: a reader that left must reach the handler
        return status
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, as other command-line tools do,
        # and keep Python from reporting the pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except UsageError as exc:
        args.parser.error(str(exc))  # exits with status 2
        raise  # unreachable: error() exits
    except KeyboardInterrupt:
        # Ctrl-C: one line, no traceback, the shell's status for SIGINT. Every cache entry is
        # published whole or not at all, so what was compiled before it stays usable.
        print("\ninterrupted", file=sys.stderr)
        return 130
