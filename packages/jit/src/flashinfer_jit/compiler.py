"""Compile a `KernelSpec` to a cubin with NVRTC (through `cuda.core`), using the disk cache."""

from __future__ import annotations

import io
import itertools
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cache import (
    CacheEntry,
    CacheKey,
    CorruptEntry,
    NoCacheFolderError,
    cache_root,
    compute_key,
    discard_entry,
    entry_dir,
    publish_entry,
    read_entry,
)
from .errors import KernelCompileError
from .resources import FunctionResources, parse_ptxas_report, resources_from_json
from .spec import KernelSpec
from .toolchain import PACKAGE_INCLUDE_DIR, cuda_header_dirs

logger = logging.getLogger("flashinfer_jit")

# sm_<major><minor> without a leading zero; "a" (architecture-specific) from sm_90, the first
# SM with such targets, and "f" (family) from sm_100, the first with family targets.
_ARCH = re.compile(r"sm_(?:[1-9][0-9]|9[0-9]a|[1-9][0-9]{2}[af]?)")

# The first import of cuda.core is not thread-safe (cuda-core 1.2 picks its cu12/cu13 build in
# its package __init__; a second thread importing meanwhile can see the half-initialised module
# and fail with "cannot import name 'Program'"), so it is serialized.
_CUDA_CORE_IMPORT = threading.Lock()

# ptxas' resource report is always requested: it is how registers/spills reach the manifest.
_ALWAYS_PTXAS = ("-v",)
_DEFAULT_STD = "c++17"
# How many extra `-v` the next compile that lacked a ptxas report retries with (see
# compile_kernel): each retry in the process gets a count of its own.
_REPORT_RETRIES = itertools.count(1)
_REPORT_RETRY_LOCK = threading.Lock()
_REPORT_TRIES = 4
# False once a compile's retries all came back without a report (see compile_kernel).
_report_retries_help = True


def _stop_report_retries() -> None:
    global _report_retries_help
    _report_retries_help = False
    logger.warning(
        "flashinfer_jit: NVRTC returned no ptxas resource report, also for new ptxas options; "
        "registers and spills go unrecorded in this process"
    )


# Where a cache-folder warning tells the reader the folder came from.
_ROOT_CHOICE = "chosen by the cache_dir argument, else FLASHINFER_JIT_CACHE_DIR"

_OFF = frozenset({"", "0", "false", "no", "off"})


def _env_flag(name: str) -> bool:
    """An on/off environment variable: unset, empty, 0, false, no and off (any case) are off."""
    return os.environ.get(name, "").strip().lower() not in _OFF


def verbose() -> bool:
    """Whether `FLASHINFER_JIT_VERBOSE` asks for a log line per compile and cache hit."""
    return _env_flag("FLASHINFER_JIT_VERBOSE")


def _log(message: str, *args: Any) -> None:
    if verbose():
        # Printed rather than logged at INFO: users set the variable to see it without
        # configuring logging.
        import sys

        print("[flashinfer_jit] " + message % args, file=sys.stderr, flush=True)
    else:
        logger.debug(message, *args)


def base_options() -> tuple[str, ...]:
    """Options added to every compile, including environment-driven ones.

    Returns:
        `--std=c++17`, `--ptxas-options=-v`, plus `-lineinfo` when `FLASHINFER_JIT_LINEINFO`
        is set (for source-level profiling). All of them are part of the cache key.
    """
    opts = [f"--std={_DEFAULT_STD}", "--ptxas-options=-v"]
    if _env_flag("FLASHINFER_JIT_LINEINFO"):
        opts.append("-lineinfo")
    return tuple(opts)


def _bool_option(value: str, option: str) -> bool:
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise ValueError(f"{option} expects true/false, got {value!r}")


def _int_list(value: str) -> list[int]:
    return [int(v) for v in value.split(",") if v]


def _int_within(low: int, high: int) -> Callable[[str, str], int]:
    """A converter of an integer option value in [low, high]: NVRTC 13 aborts or crashes the
    whole process on some values out of range (`--split-compile=2147483648`: an uncaught
    std::out_of_range; 10000000: a segfault) instead of reporting an error."""

    def convert(value: str, option: str) -> int:
        number = int(value)
        if not low <= number <= high:
            raise ValueError(f"{option} expects an integer in [{low}, {high}], got {number}")
        return number

    return convert


def _ptxas_value(value: str, option: str) -> str:
    # NVRTC 13 aborts the whole process (an uncaught std::out_of_range) on an empty or blank
    # --ptxas-options value instead of reporting an error.
    if not value.strip():
        raise ValueError(f"{option} expects ptxas options, for example {option}=-O3; got {value!r}")
    return value


# NVRTC option spelling -> (ProgramOptions field, converter of the text after "=").
# `cuda.core.ProgramOptions` has no raw pass-through, so spec options are mapped onto its
# typed fields; anything else is rejected with the supported list.
_VALUED_OPTIONS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    # ptxas allocates at most 255 registers per thread.
    "--maxrregcount": ("max_register_count", _int_within(1, 255)),
    "-maxrregcount": ("max_register_count", _int_within(1, 255)),
    "--ftz": ("ftz", _bool_option),
    "-ftz": ("ftz", _bool_option),
    "--prec-div": ("prec_div", _bool_option),
    "-prec-div": ("prec_div", _bool_option),
    "--prec-sqrt": ("prec_sqrt", _bool_option),
    "-prec-sqrt": ("prec_sqrt", _bool_option),
    "--fmad": ("fma", _bool_option),
    "-fmad": ("fma", _bool_option),
    "--std": ("std", lambda v, o: v),
    "-std": ("std", lambda v, o: v),
    "--diag-suppress": ("diag_suppress", lambda v, o: _int_list(v)),
    "--diag-error": ("diag_error", lambda v, o: _int_list(v)),
    "--diag-warn": ("diag_warn", lambda v, o: _int_list(v)),
    "--ptxas-options": ("ptxas_options", _ptxas_value),
    "-Xptxas": ("ptxas_options", _ptxas_value),
    # Threads NVRTC compiles with (0: as many as the host has).
    "--split-compile": ("split_compile", _int_within(0, 256)),
}
_FLAG_OPTIONS: dict[str, str] = {
    "--use_fast_math": "use_fast_math",
    "-use_fast_math": "use_fast_math",
    "-lineinfo": "lineinfo",
    "--generate-line-info": "lineinfo",
    "-G": "debug",
    "--device-debug": "debug",
    "--extra-device-vectorization": "extra_device_vectorization",
    "-extra-device-vectorization": "extra_device_vectorization",
    "--restrict": "restrict",
    "-restrict": "restrict",
    "--disable-warnings": "disable_warnings",
    "-w": "disable_warnings",
    "--device-int128": "device_int128",
    "--brief-diagnostics": "brief_diagnostics",
}


def supported_options() -> list[str]:
    """Return the NVRTC option spellings accepted in `KernelSpec.options`.

    Returns:
        Flag options as written, valued options as `name=VALUE`.
    """
    return sorted(_FLAG_OPTIONS) + sorted(f"{k}=VALUE" for k in _VALUED_OPTIONS)


def program_options_kwargs(spec: KernelSpec, arch: str) -> dict[str, Any]:
    """Translate a spec into `cuda.core.ProgramOptions` keyword arguments.

    Args:
        spec: The kernel configuration.
        arch: Target arch, for example `"sm_90a"`.

    Returns:
        Keyword arguments for `ProgramOptions`.

    Raises:
        ValueError: An option in `spec.options` is not supported or malformed, or the source's
            or an include folder's path is not UTF-8.
    """
    ptxas = list(_ALWAYS_PTXAS)
    kwargs: dict[str, Any] = {
        "name": str(spec.source),
        "arch": arch,
        "std": _DEFAULT_STD,
        "include_path": [
            str(spec.source.parent),
            *(str(d) for d in spec.include_dirs),
            str(PACKAGE_INCLUDE_DIR),
            *(str(d) for d in cuda_header_dirs()),
        ],
    }
    for path in (kwargs["name"], *kwargs["include_path"]):
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                f"kernel {spec.label!r}: NVRTC takes file and folder names as UTF-8 text, and "
                f"{path!r} is not (bytes that are not UTF-8); move the source or include folder"
            ) from None
    if spec.defines:
        kwargs["define_macro"] = [(name, str(value)) for name, value in spec.defines]
    if "-lineinfo" in base_options():
        kwargs["lineinfo"] = True
    for option in spec.options:
        if option.startswith(("-D", "--define-macro")):
            raise ValueError(
                f"KernelSpec.options: pass macros through KernelSpec.defines, not {option!r}"
            )
        if option.startswith(("-I", "--include-path")):
            raise ValueError(
                f"KernelSpec.options: pass folders through KernelSpec.include_dirs, not {option!r}"
            )
        if option in _FLAG_OPTIONS:
            kwargs[_FLAG_OPTIONS[option]] = True
            continue
        name, sep, value = option.partition("=")
        if sep and name in _VALUED_OPTIONS:
            target, convert = _VALUED_OPTIONS[name]
            try:
                converted = convert(value, name)
            except ValueError as exc:
                raise ValueError(f"KernelSpec.options: bad value in {option!r}: {exc}") from None
            if target == "ptxas_options":
                ptxas.append(converted)
            else:
                kwargs[target] = converted
            continue
        raise ValueError(
            f"KernelSpec.options: unsupported NVRTC option {option!r}; supported: "
            + ", ".join(supported_options())
        )
    kwargs["ptxas_options"] = ptxas
    return kwargs


@dataclass(frozen=True)
class CompiledKernel:
    """A compiled cubin and what ptxas reported about it.

    Attributes:
        spec: The configuration compiled.
        arch: Target arch, for example `"sm_90a"`.
        key: Cache key digest (hex SHA-256).
        cubin: The binary.
        entry_name: The symbol to load: `spec.name` for `extern "C"` kernels, the mangled
            name for a name expression.
        functions: Resources of every function in the cubin (entry and device functions).
        log: The NVRTC/ptxas log of the compile that produced the cubin.
        from_cache: True when read from the disk cache.
        cache_path: The cache entry folder, or None if the cache could not be written.
        compile_seconds: Time NVRTC took when the entry was created.
    """

    spec: KernelSpec
    arch: str
    key: str
    cubin: bytes = field(repr=False)
    entry_name: str
    functions: dict[str, FunctionResources] = field(repr=False)
    log: str = field(repr=False)
    from_cache: bool
    cache_path: Path | None
    compile_seconds: float

    @property
    def resources(self) -> FunctionResources:
        """Resources of the entry function (`entry_name`)."""
        return self.functions[self.entry_name]

    @property
    def spills(self) -> bool:
        """True when any function of the cubin spills registers."""
        return any(f.spills for f in self.functions.values())


def check_arch(arch: str) -> None:
    """Raise TypeError unless `arch` is a str, ValueError unless it names a full SM target."""
    if not isinstance(arch, str):
        raise TypeError(f"arch: expected a str such as 'sm_90a', got {type(arch).__name__}")
    if not _ARCH.fullmatch(arch):
        raise ValueError(
            f"arch: expected a full SM target such as 'sm_90a' (an 'a' suffix from sm_90 on, "
            f"'f' from sm_100 on), got {arch!r}"
        )


def _check_spec(spec: KernelSpec) -> None:
    if not isinstance(spec, KernelSpec):
        raise TypeError(f"spec: expected a KernelSpec, got {type(spec).__name__} ({spec!r:.80})")


def _nvrtc_compile(
    spec: KernelSpec, arch: str, source_text: str, repeat_verbose: int = 0
) -> tuple[bytes, str, dict[str, str]]:
    with _CUDA_CORE_IMPORT:
        from cuda.core import Program, ProgramOptions

    kwargs = program_options_kwargs(spec, arch)
    kwargs["ptxas_options"] = [*kwargs["ptxas_options"], *["-v"] * repeat_verbose]
    options = ProgramOptions(**kwargs)
    log = io.StringIO()
    program = Program(source_text, "c++", options)
    try:
        object_code = program.compile("cubin", name_expressions=spec.name_expressions, logs=log)
    except Exception as exc:
        # cuda.core raises its NVRTCError with the compile log in the message.
        if "NVRTC" not in type(exc).__name__ and "NVRTC" not in str(exc):
            raise
        text = "\n".join(filter(None, (str(exc), log.getvalue()))).replace("\x00", "")
        raise KernelCompileError(spec, arch, text.strip()) from None
    finally:
        program.close()
    mapping = getattr(object_code, "symbol_mapping", None) or getattr(object_code, "_sym_map", {})
    lowered = {
        str(expr): (name.decode() if isinstance(name, bytes) else str(name))
        for expr, name in (mapping or {}).items()
    }
    return bytes(object_code.code), log.getvalue().replace("\x00", "").strip(), lowered


def _entry_name(
    spec: KernelSpec, lowered: dict[str, str], name: str | None = None, source: str = "NVRTC"
) -> str:
    """The symbol of `name` (default `spec.name`): lowered for a name expression. `source`
    says where `lowered` came from, for the error."""
    name = spec.name if name is None else name
    if spec.name_expressions:
        if name not in lowered:
            raise RuntimeError(f"{source} gave no lowered name for {name!r}; got {sorted(lowered)}")
        return lowered[name]
    return name


def _is_entry_point(entry: str, functions: dict[str, FunctionResources]) -> bool:
    # No ptxas report in the NVRTC log (some cuda-core/NVRTC versions return no log for a
    # clean compile): loading the module still fails clearly on a missing entry point.
    return not functions or (entry in functions and functions[entry].is_entry)


def _check_entry(spec: KernelSpec, entry: str, functions: dict[str, FunctionResources]) -> None:
    if not _is_entry_point(entry, functions):
        raise _not_an_entry_point(spec, functions)


def _not_an_entry_point(spec: KernelSpec, functions: dict[str, FunctionResources]) -> ValueError:
    entries = sorted(name for name, f in functions.items() if f.is_entry)
    return ValueError(
        f"kernel {spec.name!r} ({spec.label}) is not an entry point of {spec.source}; "
        f'entry points found: {entries or "none"}. Declare it `extern "C" __global__` (outside '
        f"any #if its defines switch off), or pass name_expressions for templates."
    )


def _is_str_dict(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _publisher_name(manifest: dict[str, Any]) -> object:
    published_spec = manifest.get("spec")
    return published_spec.get("name") if isinstance(published_spec, dict) else None


def _check_field_types(manifest: dict[str, Any]) -> None:
    seconds = manifest.get("compile_seconds")
    if not (
        _is_str_dict(manifest.get("lowered_names"))
        and isinstance(manifest.get("log"), str)
        and isinstance(seconds, (int, float))
        and not isinstance(seconds, bool)
        and isinstance(_publisher_name(manifest), str)
    ):
        raise CorruptEntry(
            "lowered_names, log, compile_seconds or spec.name is missing or of the wrong type"
        )


def _cached_fields(
    spec: KernelSpec, entry: CacheEntry
) -> tuple[dict[str, FunctionResources], str, str, float]:
    """Check the compiler's fields of a cached manifest against what `compile_kernel` writes.

    Returns:
        `(functions, entry name of spec, log, compile seconds)`.

    Raises:
        CorruptEntry: A field is missing or of another type, or the entry contradicts
            itself: the kernel that published it is not an entry point of it (not in the
            cubin, or not an entry function of the ptxas report), although `compile_kernel`
            checked exactly that before publishing.
    """
    manifest = entry.manifest
    try:
        functions = resources_from_json(manifest.get("functions"))
    except ValueError as exc:
        raise CorruptEntry(str(exc)) from None
    _check_field_types(manifest)
    lowered, log, publisher = manifest["lowered_names"], manifest["log"], _publisher_name(manifest)
    try:  # every name expression is lowered when compiling
        published_entry = _entry_name(spec, lowered, publisher, "the manifest")  # type: ignore[arg-type]
        entry_name = _entry_name(spec, lowered, source="the manifest")
    except RuntimeError as exc:
        raise CorruptEntry(str(exc)) from None
    # The symbol is in the cubin's ELF string table; this holds without a ptxas report too.
    in_cubin = _symbol_in_cubin(published_entry, entry.cubin)
    if not (in_cubin and _is_entry_point(published_entry, functions)):
        raise CorruptEntry(f"{publisher!r}, which published the entry, is not an entry point of it")
    if not functions and parse_ptxas_report(log):
        raise CorruptEntry("no functions, although the log holds a ptxas report")
    # extern "C" kernels of one source share the entry. Asking it for a name the cubin has no
    # code for is the caller's mistake (`_check_entry` names it; a `__constant__` variable or
    # a section name's tail is such a name); a function the cubin holds code for (its
    # `.text.<name>` section) but the report does not list contradicts the report.
    if functions and entry_name not in functions and _code_in_cubin(entry_name, entry.cubin):
        raise CorruptEntry(f"{entry_name!r} is in the cubin but not in the manifest's functions")
    return functions, entry_name, log, float(manifest["compile_seconds"])


def _code_in_cubin(name: str, cubin: bytes) -> bool:
    """Whether the cubin has a code section for function `name` (`.text.<name>`)."""
    return b".text." + name.encode() + b"\0" in cubin


def _symbol_in_cubin(name: str, cubin: bytes) -> bool:
    """Whether the cubin's string tables hold `name` whole: as a string of its own, or ending a
    section name (`.text.<name>`), never as the tail of a longer name."""
    encoded = name.encode() + b"\0"
    return b"\0" + encoded in cubin or b"." + encoded in cubin


def _from_cache(
    spec: KernelSpec, arch: str, root: Path, key: CacheKey, *, report_damage: bool = True
) -> CompiledKernel | None:
    try:
        entry = read_entry(root, key.digest)
    except CorruptEntry as exc:
        # Moved aside when the recompiled entry is published (see publish_entry). Left in
        # place until then, so a caller that recompiles next (report_damage False) leaves the
        # warning to the compile's own read: said once, not twice.
        if report_damage:
            logger.warning("flashinfer_jit: damaged cache entry, recompiling: %s", exc)
        return None
    except OSError as exc:
        logger.warning(
            "flashinfer_jit: cannot read the kernel cache at %s (%s): %s",
            root,
            _ROOT_CHOICE,
            exc,
        )
        return None
    if entry is None:
        return None
    try:
        functions, entry_name, log, compile_seconds = _cached_fields(spec, entry)
    except CorruptEntry as exc:
        # The size and SHA-256 checks passed, so the fields themselves are damaged. Moved
        # aside, or publishing the recompiled entry would keep this one as a concurrent win.
        logger.warning("flashinfer_jit: damaged cache entry, recompiling: %s: %s", entry.path, exc)
        discard_entry(root, key.digest)
        return None
    # Can fail for a valid entry: an extern "C" kernel of another name shares it.
    _check_entry(spec, entry_name, functions)
    _log("cache hit %s for %s (%s)", spec.label, arch, key.digest[:12])
    return CompiledKernel(
        spec=spec,
        arch=arch,
        key=key.digest,
        cubin=entry.cubin,
        entry_name=entry_name,
        functions=functions,
        log=log,
        from_cache=True,
        cache_path=entry.path,
        compile_seconds=compile_seconds,
    )


_warned_no_cache_folder = False


def _root_or_none(cache_dir: str | Path | None) -> Path | None:
    """The cache root, or None (compile without the disk cache) when none can be named."""
    global _warned_no_cache_folder
    try:
        return cache_root(cache_dir)
    except NoCacheFolderError as exc:
        if not _warned_no_cache_folder:
            _warned_no_cache_folder = True
            logger.warning("flashinfer_jit: compiling without the disk cache: %s", exc)
        return None


def lookup_kernel(
    spec: KernelSpec, arch: str, *, cache_dir: str | Path | None = None
) -> CompiledKernel | None:
    """Return `spec` for `arch` from the disk cache, without compiling.

    Args:
        spec: The kernel configuration.
        arch: Full target arch, for example `"sm_90a"`.
        cache_dir: Cache root; defaults to `default_cache_dir()`.

    Returns:
        The cached kernel, or None when there is no valid entry.

    Raises:
        TypeError: `spec` is not a KernelSpec, or `cache_dir` is not a path.
        ValueError: `arch` is malformed, `cache_dir` is empty, the source is not UTF-8, or
            `spec.name` is not an entry point of the cubin.
        FileNotFoundError: The source file does not exist.
        OSError: The source is a folder or cannot be read.
    """
    return _lookup(spec, arch, cache_dir, report_damage=True)


def _lookup(
    spec: KernelSpec, arch: str, cache_dir: str | Path | None, *, report_damage: bool
) -> CompiledKernel | None:
    """`lookup_kernel`; with `report_damage` False an entry whose files are damaged is a quiet
    miss, for callers that compile it next (`compile_kernel` reads it again and warns)."""
    _check_spec(spec)
    check_arch(arch)
    root = _root_or_none(cache_dir)
    if root is None:
        return None
    key = compute_key(spec, arch, base_options())
    return _from_cache(spec, arch, root, key, report_damage=report_damage)


def _sources_unchanged(spec: KernelSpec, arch: str, key: CacheKey) -> bool:
    """NVRTC reads the headers from disk after they were hashed: if one changed (or went
    away: a package upgrade on a live host) meanwhile, the cubin may be of text other than
    the key's, so it is used but not published under it."""
    try:
        unchanged = compute_key(spec, arch, base_options()).digest == key.digest
    except OSError:
        unchanged = False
    if not unchanged:
        logger.warning(
            "flashinfer_jit: a source of %s changed while it compiled; not cached", spec.label
        )
    return unchanged


def compile_kernel(
    spec: KernelSpec, arch: str, *, cache_dir: str | Path | None = None
) -> CompiledKernel:
    """Compile `spec` for `arch`, or fetch it from the disk cache.

    Hashes the source and every project header it includes (see `flashinfer_jit.cache`),
    looks the key up, and compiles with NVRTC on a miss. A damaged entry is reported with a
    warning, recompiled and replaced. Needs no GPU.

    Args:
        spec: The kernel configuration.
        arch: Full target arch, for example `"sm_90a"` (use `device_arch()` for a device).
        cache_dir: Cache root; defaults to `default_cache_dir()` (honours
            `FLASHINFER_JIT_CACHE_DIR`).

    Returns:
        The cubin with its resource report.

    Raises:
        KernelCompileError: NVRTC rejected the source (message carries the NVRTC log).
        TypeError: `spec` is not a KernelSpec, or `cache_dir` is not a path.
        ValueError: `arch` is malformed, `cache_dir` is empty, an option is unsupported or
            malformed, the source is not UTF-8, or `spec.name` is not an entry point of the
            compiled source.
        FileNotFoundError: The source file does not exist.
        OSError: The source is a folder or cannot be read.
    """
    _check_spec(spec)
    check_arch(arch)
    root = _root_or_none(cache_dir)
    key: CacheKey = compute_key(spec, arch, base_options())
    cached = None if root is None else _from_cache(spec, arch, root, key)
    if cached is not None:
        return cached

    start = time.perf_counter()
    cubin, log, lowered = _nvrtc_compile(spec, arch, key.source_text)
    entry_name = _entry_name(spec, lowered)
    functions = parse_ptxas_report(log)
    if not _code_in_cubin(entry_name, cubin):
        # Checked before the report retries below: a cubin without the kernel's code (the
        # kernel inside a false `#if`, a template without name_expressions) may have no
        # report to give, and must not be published.
        raise _not_an_entry_point(spec, functions)
    if not functions and _report_retries_help:
        # With a CUDA driver present, NVRTC answers a repeated compile from an in-process
        # cache keyed by the PTX and the ptxas options, and returns no ptxas report (an H100
        # host, NVRTC 13.0, 2026-12-06: the first compile in a process reported, every later
        # one of the same PTX did not, a changed source comment did not help, CUDA_CACHE_DISABLE=1
        # set before NVRTC loaded did). Without the report, registers and spills would go
        # unrecorded. Again with `-v` repeated a number of times no earlier retry in this
        # process used: the same code under ptxas options the cache has not seen (unless a
        # spec of its own asked for as many, hence a few tries). Where none of them brings a
        # report, this NVRTC gives none at all, and later compiles do not retry.
        for _ in range(_REPORT_TRIES):
            with _REPORT_RETRY_LOCK:
                repeats = next(_REPORT_RETRIES)
            cubin, log, lowered = _nvrtc_compile(spec, arch, key.source_text, repeats)
            functions = parse_ptxas_report(log)
            if functions:
                break
        else:
            _stop_report_retries()
    seconds = time.perf_counter() - start
    _check_entry(spec, entry_name, functions)
    _log("compiled %s for %s in %.2f s (%s)", spec.label, arch, seconds, key.digest[:12])
    manifest = {
        "material": key.material,
        "spec": {
            "name": spec.name,
            "label": spec.label,
            "source": str(spec.source),
            "defines": [[k, v] for k, v in spec.defines],
            "include_dirs": [str(d) for d in spec.include_dirs],
            "options": list(spec.options),
            "name_expressions": list(spec.name_expressions),
        },
        "arch": arch,
        "lowered_names": lowered,
        "functions": {name: f.to_json() for name, f in functions.items()},
        "log": log,
        "compile_seconds": seconds,
        "created_unix": time.time(),
    }
    path: Path | None = None
    if root is not None and _sources_unchanged(spec, arch, key):
        try:
            # An entry already there counts as published only with fields this spec accepts
            # (one whose damaged fields could not be moved aside is not stored).
            path = publish_entry(
                root, key.digest, cubin, manifest, check=lambda entry: _cached_fields(spec, entry)
            )
        except OSError as exc:
            logger.warning(
                "flashinfer_jit: cannot write the kernel cache at %s (%s): %s",
                root,
                _ROOT_CHOICE,
                exc,
            )
        else:
            if path is None:
                logger.warning(
                    "flashinfer_jit: cannot write the kernel cache at %s: a damaged entry at "
                    "%s could not be replaced",
                    root,
                    entry_dir(root, key.digest),
                )
    return CompiledKernel(
        spec=spec,
        arch=arch,
        key=key.digest,
        cubin=cubin,
        entry_name=entry_name,
        functions=functions,
        log=log,
        from_cache=False,
        cache_path=path,
        compile_seconds=seconds,
    )
