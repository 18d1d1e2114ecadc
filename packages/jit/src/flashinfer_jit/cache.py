"""On-disk kernel cache: key computation, atomic publication, validation of entries.

Layout: ``<root>/v<SCHEMA>/<key[:2]>/<key>/{kernel.cubin, manifest.json}``. An entry is
written into a private temporary folder under ``<root>/v<SCHEMA>/tmp/``, flushed to disk,
then renamed into place. Renaming a folder onto an existing non-empty folder fails, so the
first process to publish wins and the others discard their copy; readers therefore see
either no entry or a complete one. The manifest records the size and SHA-256 of the cubin;
an entry that fails that check (a truncated copy, a disk error, a hand edit) is moved aside
and replaced by a fresh compile.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import importlib.util
import json
import logging
import marshal
import os
import shutil
import stat
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .sources import SourceFile, collect_sources
from .spec import KernelSpec

logger = logging.getLogger("flashinfer_jit")

CACHE_SCHEMA_VERSION = 1
"""Version of the cache's key recipe and entry layout, part of every key: bumped whenever
either changes, so entries written by another layout are never read."""

CUBIN_FILE = "kernel.cubin"
MANIFEST_FILE = "manifest.json"


class NoCacheFolderError(OSError):
    """No cache root can be named: `FLASHINFER_JIT_CACHE_DIR` is unset and the user has no
    usable home folder. `compile_kernel` then compiles without the disk cache, with a
    warning, as it does for a cache folder it cannot read or write."""


def default_cache_dir() -> Path:
    """Return the cache root: `FLASHINFER_JIT_CACHE_DIR`, else the user's cache directory.

    Returns:
        `$FLASHINFER_JIT_CACHE_DIR` if set and not blank (surrounding whitespace is dropped,
        and a blank value counts as unset); otherwise
        `$XDG_CACHE_HOME/flashinfer-hopper/jit` (`~/.cache/...` when unset) on Linux,
        `~/Library/Caches/flashinfer-hopper/jit` on macOS and
        `%LOCALAPPDATA%\\flashinfer-hopper\\jit` on Windows. A relative `XDG_CACHE_HOME`
        is ignored, as the XDG specification says (it would give each working directory its
        own cache), and so is an empty or relative home folder.

    Raises:
        NoCacheFolderError: (an OSError) No variable names a folder and the home folder is
            unknown (`HOME` unset and no passwd entry for the uid, as for an arbitrary
            container uid). A shared temporary folder is not used instead: another user
            could plant binaries there.
    """
    override = os.environ.get("FLASHINFER_JIT_CACHE_DIR", "").strip()
    if override:
        return _expanded(Path(override))
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        if local and os.path.isabs(local):
            return Path(local) / "flashinfer-hopper" / "jit"
        base = _home_or_none()
        base = None if base is None else base / "AppData" / "Local"
    elif sys.platform == "darwin":
        base = _home_or_none()
        base = None if base is None else base / "Library" / "Caches"
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        if xdg and os.path.isabs(xdg):
            return Path(xdg) / "flashinfer-hopper" / "jit"
        base = _home_or_none()
        base = None if base is None else base / ".cache"
    if base is None:
        raise NoCacheFolderError(
            "no folder for the kernel cache: FLASHINFER_JIT_CACHE_DIR is unset and the home "
            "folder is unknown (HOME unset, empty or relative, and no passwd entry for this "
            "user); set FLASHINFER_JIT_CACHE_DIR"
        )
    return base / "flashinfer-hopper" / "jit"


def _home_or_none() -> Path | None:
    """The user's home folder if absolute: `HOME`, else the password database's entry (a
    missing, empty or relative `HOME` would put the cache under `/` or the working
    directory), else `Path.home()` (Windows), else None."""
    home = os.environ.get("HOME", "")
    if sys.platform != "win32" and os.path.isabs(home):  # Windows' home is USERPROFILE
        return Path(home)
    try:
        import pwd

        found = Path(pwd.getpwuid(os.getuid()).pw_dir)
    except ImportError:  # Windows
        try:
            found = Path.home()
        except (RuntimeError, KeyError):
            return None
    except KeyError:  # no passwd entry for the uid (an arbitrary container uid)
        return None
    return found if found.is_absolute() else None


def cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    """Return the cache root for a `cache_dir` argument.

    Args:
        cache_dir: A folder, or None for `default_cache_dir()`.

    Returns:
        The root as a Path.

    Raises:
        TypeError: `cache_dir` is not None, a str or a path.
        ValueError: `cache_dir` holds a NUL byte, or is an empty str (which would silently mean the current
            directory). `Path("")` cannot be told from `Path(".")`: both are the current
            directory.
        NoCacheFolderError: `cache_dir` starts with `~` or `~user` and that home folder is
            unknown.
    """
    if cache_dir is None:
        return default_cache_dir()
    if isinstance(cache_dir, os.PathLike):
        cache_dir = os.fspath(cache_dir)
    if not isinstance(cache_dir, str):
        raise TypeError(
            f"cache_dir: expected None, a str or a pathlib.Path, got {type(cache_dir).__name__}"
        )
    if not cache_dir:
        raise ValueError("cache_dir: expected a folder, got an empty str")
    if "\x00" in cache_dir:
        raise ValueError(f"cache_dir: the path contains a NUL byte: {cache_dir!r}")
    return _expanded(Path(cache_dir))  # as FLASHINFER_JIT_CACHE_DIR is


def _expanded(path: Path) -> Path:
    """`path` with a leading `~` or `~user` expanded; NoCacheFolderError (a warning, and no
    disk cache, where a kernel is compiled) when that home folder is unknown."""
    try:
        return path.expanduser()
    except RuntimeError as exc:  # pathlib: "Could not determine home directory."
        raise NoCacheFolderError(f"cache folder {str(path)!r}: {exc}") from None


@dataclass(frozen=True)
class CacheKey:
    """The cache key of one (spec, arch) pair and the material it was computed from.

    Attributes:
        digest: Hex SHA-256 of `material`; names the cache entry.
        material: The JSON-able dict that was hashed (stored in the manifest for debugging).
        source_text: The main source, read while hashing, so compiling does not re-read it.
        files: Every project file hashed into the key.
    """

    digest: str
    material: dict[str, Any]
    source_text: str
    files: tuple[SourceFile, ...]


@functools.cache
def compiler_wrapper_digest() -> str:
    """SHA-256 of `compiler.py`, which maps a spec's options to NVRTC's: it decides the
    cubin as much as the sources do, and its text changes the key even where a change to it
    forgot to bump the package version. Line endings are normalised (a CRLF checkout keys as
    an LF one); an install without the source file (bytecode only) hashes the loaded code."""
    path = Path(__file__).with_name("compiler.py")
    try:
        text = path.read_bytes().replace(b"\r\n", b"\n")
    except OSError:
        spec = importlib.util.find_spec(f"{__package__}.compiler")
        text = marshal.dumps(spec.loader.get_code(spec.name))
    return hashlib.sha256(text).hexdigest()


def compute_key(spec: KernelSpec, arch: str, base_options: tuple[str, ...]) -> CacheKey:
    """Hash everything that decides the cubin of `spec` for `arch`.

    Args:
        spec: The kernel configuration.
        arch: Full target arch string, for example `"sm_90a"`.
        base_options: Options the compiler adds to every compile (and environment-driven
            ones such as line info), so that changing them changes the key.

    Returns:
        The key and the material behind it.
    """
    from . import __version__
    from .toolchain import toolchain_fingerprint

    source_text, files = collect_sources(spec)
    material = {
        "schema": CACHE_SCHEMA_VERSION,
        "package_version": __version__,
        "compiler_wrapper": compiler_wrapper_digest(),
        "toolchain": [list(item) for item in toolchain_fingerprint()],
        "arch": arch,
        "defines": [[name, str(value)] for name, value in spec.defines],
        "options": list(spec.options),
        "base_options": list(base_options),
        "name_expressions": list(spec.name_expressions),
        # Content only, no absolute paths: a cache directory can move between machines.
        "sources": [[f.include_name, f.sha256] for f in files],
    }
    blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode()
    return CacheKey(hashlib.sha256(blob).hexdigest(), material, source_text, files)


def schema_root(root: Path) -> Path:
    return root / f"v{CACHE_SCHEMA_VERSION}"


def entry_dir(root: Path, digest: str) -> Path:
    """Return the folder that holds (or would hold) the entry for `digest`.

    Args:
        root: Cache root.
        digest: Cache key digest.

    Returns:
        ``<root>/v<schema>/<digest[:2]>/<digest>``.
    """
    return schema_root(root) / digest[:2] / digest


@dataclass(frozen=True)
class CacheEntry:
    """A validated cache entry.

    Attributes:
        path: The entry folder.
        cubin: The compiled binary.
        manifest: The parsed manifest.
    """

    path: Path
    cubin: bytes
    manifest: dict[str, Any]


class CorruptEntry(Exception):
    """Raised internally when an entry exists but fails validation."""


# Errors that mean a path of the entry is not the plain file it should be (a folder, a
# symlink loop, a file where a folder should be): damage, unlike permission or I/O errors.
_DAMAGE_ERRNOS = frozenset({errno.EISDIR, errno.ENOTDIR, errno.ELOOP})


def _read_entry_file(folder: Path, name: str) -> bytes:
    path = folder / name
    try:
        # A FIFO would block the read forever and a device (a link to /dev/zero) never end it.
        if not stat.S_ISREG(path.stat().st_mode):
            raise CorruptEntry(f"{path}: not a regular file")
        return path.read_bytes()
    except OSError as exc:
        # Without the entry path itself (a file or a loop where a shard folder should be),
        # there is no entry to move aside: the caller sees a missing entry or a read error.
        if exc.errno not in _DAMAGE_ERRNOS or not os.path.lexists(folder):
            raise
        if not folder.is_dir():
            raise CorruptEntry(f"{folder}: not a folder ({exc.strerror})") from None
        raise CorruptEntry(f"{folder / name}: not a readable file ({exc.strerror})") from None


def _parse_manifest(folder: Path, data: bytes, digest: str) -> dict[str, Any]:
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        raise CorruptEntry(f"{folder}: unreadable manifest ({type(exc).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("key") != digest:
        raise CorruptEntry(f"{folder}: manifest does not belong to key {digest}")
    size, sha256 = manifest.get("cubin_size"), manifest.get("cubin_sha256")
    if type(size) is not int or not isinstance(sha256, str):
        raise CorruptEntry(
            f"{folder}: manifest cubin_size/cubin_sha256 should be an int and a str, got "
            f"{size!r} and {sha256!r}"
        )
    return manifest


def read_entry(root: Path, digest: str) -> CacheEntry | None:
    """Read and validate the entry for `digest`.

    Args:
        root: Cache root.
        digest: Cache key digest.

    Returns:
        The entry, or None when there is none.

    Raises:
        CorruptEntry: The entry exists but its manifest or cubin is damaged, or one of its
            paths is not what it should be (a folder or a symlink loop instead of a file).
        OSError: The cache cannot be read (permissions, I/O error).
    """
    folder = entry_dir(root, digest)
    # Twice: between a read that finds no entry and the check that the folder exists,
    # another process may publish the entry (its rename is atomic). A second miss with the
    # folder there is damage.
    for attempt in range(2):
        try:
            manifest_bytes = _read_entry_file(folder, MANIFEST_FILE)
            break
        except (FileNotFoundError, NotADirectoryError):
            if not os.path.lexists(folder):
                return None  # no entry, or another process moved a damaged one aside meanwhile
            if attempt:
                raise CorruptEntry(f"{folder}: no {MANIFEST_FILE}") from None
    manifest = _parse_manifest(folder, manifest_bytes, digest)
    try:
        cubin = _read_entry_file(folder, CUBIN_FILE)
    except FileNotFoundError:
        raise CorruptEntry(f"{folder}: no {CUBIN_FILE}") from None
    if len(cubin) != manifest["cubin_size"]:
        raise CorruptEntry(
            f"{folder}: cubin is {len(cubin)} bytes, manifest says {manifest['cubin_size']}"
        )
    if hashlib.sha256(cubin).hexdigest() != manifest["cubin_sha256"]:
        raise CorruptEntry(f"{folder}: cubin SHA-256 does not match the manifest")
    return CacheEntry(folder, cubin, manifest)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    # Directory fsync makes the rename durable; not available on Windows, harmless to skip.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def publish_entry(
    root: Path,
    digest: str,
    cubin: bytes,
    manifest: dict[str, Any],
    check: Callable[[CacheEntry], object] | None = None,
) -> Path | None:
    """Atomically publish an entry; if another process published first, keep theirs.

    Args:
        root: Cache root (created if missing).
        digest: Cache key digest.
        cubin: Compiled binary.
        manifest: Manifest fields; `key`, `cubin_size` and `cubin_sha256` are filled in.
        check: Validates the fields an entry already there holds beyond its cubin's size and
            checksum (the compiler's own fields), raising CorruptEntry for a damaged one:
            only an entry that passes is kept as another publisher's.

    Returns:
        The entry folder, or None when no valid entry could be put there: three attempts
        in a row met a damaged entry that could not be moved aside (a shard folder this
        process may not write) or that another process kept re-creating.

    Raises:
        OSError: The cache root is not writable.
    """
    manifest = {
        **manifest,
        "key": digest,
        "cubin_size": len(cubin),
        "cubin_sha256": hashlib.sha256(cubin).hexdigest(),
    }
    final = entry_dir(root, digest)
    tmp_parent = schema_root(root) / "tmp"
    tmp_parent.mkdir(parents=True, exist_ok=True)
    _clear_non_folder(root, final.parent)
    final.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkdtemp: it makes the folder 0700 whatever the umask, and the renamed
    # entry would keep that mode, unreadable to other users of a shared or shipped cache.
    tmp = tmp_parent / f"{digest[:16]}.{uuid.uuid4().hex}"
    tmp.mkdir()
    published = False
    try:
        _write_synced(tmp / CUBIN_FILE, cubin)
        _write_synced(tmp / MANIFEST_FILE, json.dumps(manifest, indent=1).encode())
        _fsync_dir(tmp)
        for _attempt in range(3):
            try:
                os.rename(tmp, final)
            except OSError:
                if not os.path.lexists(final):  # lexists: a symlink loop there is damage too
                    raise
                # Another entry sits there: a concurrent publisher won (keep theirs, it was
                # built from identical inputs) or it is damaged (move it aside and retry).
                try:
                    existing = read_entry(root, digest)
                    if existing is not None:
                        if check is not None:
                            check(existing)
                        published = True
                        break
                except CorruptEntry:
                    discard_entry(root, digest)
            else:
                _fsync_dir(final.parent)
                published = True
                break
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sweep_stale_tmp(root)
    return final if published else None


def _clear_non_folder(root: Path, path: Path) -> None:
    """Move aside whatever is at the shard folder's path if it is not a folder (a file, a
    dangling or looping symlink): else every publication under it would fail for good."""
    if os.path.lexists(path) and not path.is_dir():
        _move_aside_and_remove(root, path, path.name)


def discard_entry(root: Path, digest: str) -> None:
    """Move a damaged entry out of the way (atomically), then delete it.

    Args:
        root: Cache root.
        digest: Cache key digest of the damaged entry.
    """
    _move_aside_and_remove(root, entry_dir(root, digest), digest[:16])


def _move_aside_and_remove(root: Path, path: Path, tag: str) -> None:
    """Rename `path` into the cache's tmp folder (atomic: no reader sees half of it), then
    delete it. Gives up quietly if someone else already moved or replaced it, or the cache is
    read-only (the caller's next write reports that)."""
    trash_parent = schema_root(root) / "tmp"
    trash = trash_parent / f"corrupt.{tag}.{uuid.uuid4().hex}"
    try:
        trash_parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, trash)
    except OSError:
        return
    _remove(trash)


def _remove(path: Path) -> None:
    """Delete a folder or a file, ignoring what is already gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


# Temp folders and moved-aside entries older than this are left by killed processes: a
# publication takes well under a second, so a day old is never one still in progress.
STALE_TMP_AGE_S = 24 * 3600


def sweep_stale_tmp(root: Path, max_age_s: float = STALE_TMP_AGE_S) -> None:
    """Delete what killed processes left in the cache's temp folder.

    Args:
        root: Cache root.
        max_age_s: Age (by modification time) from which an item counts as abandoned.
    """
    tmp_parent = schema_root(root) / "tmp"
    now = time.time()
    with contextlib.suppress(OSError):
        for item in tmp_parent.iterdir():
            with contextlib.suppress(OSError):
                if now - item.lstat().st_mtime > max_age_s:
                    _remove(item)
