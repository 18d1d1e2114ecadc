"""Collect a kernel's source and every project header it includes, for the cache key.

Every `#include "..."` and `#include <...>` line is followed, whatever preprocessor
conditions surround it (hashing a header that ends up unused only costs a spurious
recompile, missing one would serve a stale binary). An include is resolved in the including
file's folder (quoted form only), then the spec's source folder, its `include_dirs` and the
package's own include folder. Includes found nowhere there are CUDA/CCCL/system headers; those
are covered by the toolchain versions in the key instead of by their text. Includes whose
name is a macro (`#include HEADER`) cannot be followed and are ignored.

The lines are scanned as written, with line continuations spliced and, where a block comment
sits in or before a directive, also without block comments (string, character and raw string
literals and numbers with digit separators read as tokens, so a `/*` inside one opens no
comment); an include any of these scans finds is followed (see `_includes`). Each accepts any
horizontal whitespace (form feed and vertical tab too), the `%:` digraph for `#` and
`#include_next`, whose header is hashed in every folder of the search path that has it (the
one NVRTC reads is among them).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .spec import KernelSpec
from .toolchain import PACKAGE_INCLUDE_DIR

_INCLUDE = re.compile(
    rb'^[ \t\f\v]*(?:#|%:)[ \t\f\v]*include(_next)?[ \t\f\v]*(?:"([^"\n]+)"|<([^>\n]+)>)',
    re.MULTILINE,
)
# Tokens kept whole, so that a `//` or `/*` inside one starts no comment: raw strings (which
# may span lines; not after a letter, digit or `_`, where `R"(` is no raw string), numbers with
# a C++14 digit separator (a `'` between word characters opens no character literal), string
# and character literals (ending at their closing quote or, unterminated, at the line's end,
# as NVRTC reads them); then the comments. Identifiers are not matched: a callback per token
# would make the scan ten times slower.
_LITERAL_OR_COMMENT = re.compile(
    rb'(?<![\w])(?:u8|[uUL])?R"([^()\\ \t\n]{0,16})\(.*?\)\1"'
    rb"|(?<![\w.])\.?[0-9][\w.]*(?:'\w[\w.]*)+"
    rb'|"(?:\\.|[^"\\\n])*(?:"|(?=\n)|\Z)'
    rb"|'(?:\\.|[^'\\\n])*(?:'|(?=\n)|\Z)"
    rb"|//[^\n]*|/\*.*?\*/",
    re.DOTALL,
)
# Where a block comment can hide an include from `_INCLUDE` (on the spliced text): closing
# before a directive, or opening inside one. Only then does the comment scan run; on most
# files it would only cost time (several milliseconds per header). One pattern each: an
# alternation of them scans twice as slowly.
_COMMENT_SCAN_NEEDED = tuple(
    re.compile(pattern)
    for pattern in (
        rb"\*/[ \t\f\v]*(?:#|%:)",
        rb"#[ \t\f\v]*/\*",
        rb"%:[ \t\f\v]*/\*",
        rb"include(?:_next)?[ \t\f\v]*/\*",
    )
)


@functools.lru_cache(maxsize=64)
def _includes(content: bytes) -> tuple[tuple[bool, bool, str], ...]:
    """`(next, quoted, name)` of every include any scan finds, in order of first finding.

    The texts scanned: the lines as written; with line continuations spliced (they may split
    any token, `%:` and `*/` included); and, where a block comment sits in or before a
    directive, spliced and without block comments (`//` comments stay, read as tokens, so
    `<a//b.h>` keeps its name). NVRTC reads a lone carriage return as a space, not a line
    end; a text that has one is scanned both ways. Remembered by content: every
    configuration of a kernel reads the same headers.
    """
    unix = content.replace(b"\r\n", b"\n")
    bases = [unix.replace(b"\r", b"\n")]
    if b"\r" in unix:
        bases.append(unix.replace(b"\r", b" "))
    if b"??" in content:
        # Under --std=c++14 or older NVRTC reads the trigraphs ??= as # and ??/ as \ (a line
        # splice at a line end). Scanned that way too: an extra name costs nothing.
        bases += [b.replace(b"??=", b"#").replace(b"??/", b"\\") for b in bases]
    texts = []
    for lines in bases:
        spliced = lines.replace(b"\\\n", b"")
        texts += [lines, spliced] if spliced != lines else [lines]
        if any(pattern.search(spliced) for pattern in _COMMENT_SCAN_NEEDED):
            texts.append(_without_block_comments(spliced))
    found: dict[tuple[bool, bool, str], None] = {}
    for text in texts:
        for match in _INCLUDE.finditer(text):
            quoted = match.group(2) is not None
            name = match.group(2) if quoted else match.group(3)
            # fsdecode: a name that is not UTF-8 still names its file (surrogate escapes).
            found[(match.group(1) is not None, quoted, os.fsdecode(name))] = None
    return tuple(found)


def _without_block_comments(spliced: bytes) -> bytes:
    """`spliced` (continuations joined) with each block comment one space, as the
    preprocessor's directive phase reads it; literals and line comments kept as they are."""
    return _blank_comments(spliced, (b"/*",))


def without_comments(text: bytes) -> bytes:
    """`text` with every comment one space (literals kept whole, so a `//` in a string stays):
    for finding declarations, not for the include scan."""
    return _blank_comments(text.replace(b"\\\n", b""), (b"/*", b"//"))


def _blank_comments(text: bytes, openers: tuple[bytes, ...]) -> bytes:
    """`text` with each comment that starts with one of `openers` replaced by one space."""

    def blank(match: re.Match) -> bytes:
        token = match.group(0)
        return b" " if token.startswith(openers) else token

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
