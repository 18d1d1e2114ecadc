"""Collect a kernel's source and every project header it includes, for the cache key.

Every `#include "..."` and `#include <...>` line is followed, whatever preprocessor
conditions surround it (hashing a header that ends up unused only costs a spurious
recompile, missing one would serve a stale binary). An include is resolved in the including
file's folder (quoted form only), then the spec's source folder, its `include_dirs` and the
package's own include folder. Includes found nowhere there are CUDA/CCCL/system headers; those
are covered by the toolchain versions in the key instead of by their text. Includes whose
name is a macro (`#include HEADER`) cannot be followed and are ignored.

The lines are scanned as written and, where they can hide an include from that scan (see
`_COMMENT_SCAN_NEEDED`), a second time; an include either scan finds is followed. The second
scan reads them as the preprocessor does (line continuations spliced, comments removed, so
`/* c */ #include`, `#/* c */include` and an include split by `\\` count; string, character
and raw string literals and numbers with digit separators are skipped as tokens, so a `/*`
inside one opens no comment). The first scan covers what the second cannot parse (`<a//b.h>`
reads as a comment there). Both accept any
horizontal whitespace (form feed and vertical tab too), the `%:` digraph for `#` and
`#include_next`, whose header is hashed in every folder of the search path that has it (the
one NVRTC reads is among them).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from .spec import KernelSpec
from .toolchain import PACKAGE_INCLUDE_DIR

_INCLUDE = re.compile(
    rb'^[ \t\f\v]*(?:#|%:)[ \t\f\v]*include(_next)?[ \t\f\v]*([<"])([^>"\n]+)[>"]', re.MULTILINE
)
# Tokens kept whole, so that a `//` or `/*` inside one starts no comment: raw strings (which
# may span lines; not after a letter, digit or `_`, where `R"(` is no raw string), numbers with
# a C++14 digit separator (whose `'` opens no character literal), string and character
# literals (ending at their line's end); then the comments. Identifiers are not matched: a
# callback per token would make the scan ten times slower.
_LITERAL_OR_COMMENT = re.compile(
    rb'(?<![\w])(?:u8|[uUL])?R"([^()\\ \t\n]{0,16})\(.*?\)\1"'
    rb"|(?<![\w.])\.?[0-9][\w.]*'[\w.']*"
    rb'|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\''
    rb"|//[^\n]*|/\*.*?\*/",
    re.DOTALL,
)


# Where the text as written can hide an include from `_INCLUDE`: a comment closing before a
# directive or opening inside one, a continuation in a directive line that is none of the
# usual others (`#define` macros are), or in an include's name. Only then does the comment
# scan run; on most files it would only cost time (several milliseconds per header). One
# pattern each: an alternation of them scans twice as slowly.
_COMMENT_SCAN_NEEDED = tuple(
    re.compile(pattern, re.MULTILINE)
    for pattern in (
        rb"\*/[ \t\f\v]*(?:#|%:)",
        rb"#[ \t\f\v]*/\*",
        rb"%:[ \t\f\v]*/\*",
        rb"include(?:_next)?[ \t\f\v]*/\*",
        rb"^[ \t\f\v]*(?:#|%:)[ \t\f\v]*"
        rb"(?!(?:define|undef|if|ifdef|ifndef|elif|else|endif|pragma|error|warning|line)\b)"
        rb"[^\n]*\\\n",
    )
)


@functools.lru_cache(maxsize=64)
def _includes(content: bytes) -> tuple[tuple[bool, bool, str], ...]:
    """`(next, quoted, name)` of every include either scan finds, in order of first finding.
    Remembered by content: every configuration of a kernel reads the same headers."""
    lines = content.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    texts = [lines]
    if any(pattern.search(lines) for pattern in _COMMENT_SCAN_NEEDED):
        texts.append(_without_comments(lines))
    found: dict[tuple[bool, bool, str], None] = {}
    for text in texts:
        for match in _INCLUDE.finditer(text):
            name = match.group(3).decode("utf-8", "replace").strip()
            found[(match.group(1) is not None, match.group(2) == b'"', name)] = None
    return tuple(found)


def _without_comments(lines: bytes) -> bytes:
    """`lines` (newlines only) as the preprocessor's directive phase reads them:
    continuations spliced, each comment one space (a line comment nothing)."""
    text = lines.replace(b"\\\n", b"")

    def blank(match: re.Match) -> bytes:
        token = match.group(0)
        if token.startswith(b"//"):
            return b""
        return b" " if token.startswith(b"/*") else token

    return _LITERAL_OR_COMMENT.sub(blank, text)


@dataclass(frozen=True)
class SourceFile:
    """One file that takes part in a compilation.

    Attributes:
        include_name: How it was included (`"<main>"` for the kernel source itself).
        path: Where it was found.
        sha256: Hex digest of its bytes.
    """

    include_name: str
    path: Path
    sha256: str


def search_dirs(spec: KernelSpec) -> tuple[Path, ...]:
    """Return the project include directories of a spec, in search order.

    Args:
        spec: The kernel configuration.

    Returns:
        The source's folder, the spec's `include_dirs`, then the package include folder.
    """
    return (spec.source.parent, *spec.include_dirs, PACKAGE_INCLUDE_DIR)


def _read_main_source(spec: KernelSpec) -> bytes:
    try:
        return spec.source.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"kernel source for {spec.label!r} not found: {spec.source}"
        ) from None
    except IsADirectoryError:
        raise IsADirectoryError(
            f"kernel source for {spec.label!r} is a folder, not a .cu file: {spec.source}"
        ) from None
    except OSError as exc:
        raise OSError(
            exc.errno,
            f"kernel source for {spec.label!r} cannot be read: {spec.source} ({exc.strerror})",
        ) from None


def collect_sources(spec: KernelSpec) -> tuple[str, tuple[SourceFile, ...]]:
    """Read a kernel's source and hash it together with every project header it includes.

    Args:
        spec: The kernel configuration.

    Returns:
        `(main_source_text, files)`: the text to hand to NVRTC, and each file that takes part,
        in depth-first include order starting with the main source.

    Raises:
        FileNotFoundError: The main source does not exist.
        IsADirectoryError: The main source is a folder.
        OSError: The main source cannot be read (permissions, I/O error).
        ValueError: The main source is not UTF-8 text.
    """
    main_bytes = _read_main_source(spec)
    try:
        main_text = main_bytes.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"kernel source for {spec.label!r} is not UTF-8 text: {spec.source} ({err})"
        ) from None
    dirs = search_dirs(spec)
    files: list[SourceFile] = []
    # A file is identified by its real path and the real folder its quoted includes are
    # searched in: the same header reached through a symlinked folder may include others.
    visited: set[tuple[Path, Path]] = set()

    def visit(include_name: str, path: Path, content: bytes) -> None:
        visited.add((path.resolve(), path.parent.resolve()))
        files.append(SourceFile(include_name, path, hashlib.sha256(content).hexdigest()))
        for include_next, quoted, name in _includes(content):
            candidates = ((path.parent,) if quoted else ()) + dirs
            for folder in candidates:
                # Not resolved: NVRTC searches a quoted include's folder as the including
                # file was named (through a symlink, the link's folder, not the target's).
                header = folder / name
                if header.is_file():
                    if (header.resolve(), header.parent.resolve()) not in visited:
                        visit(name, header, header.read_bytes())
                    if not include_next:
                        break

    visit("<main>", spec.source, main_bytes)
    return main_text, tuple(files)
