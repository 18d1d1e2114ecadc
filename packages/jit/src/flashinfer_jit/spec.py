"""`KernelSpec`: what to compile (source, entry point, specialisation constants, options)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

DefineValue = str | int

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _normalise_defines(
    defines: Mapping[str, DefineValue] | Iterable[tuple[str, DefineValue]] | None,
) -> tuple[tuple[str, DefineValue], ...]:
    if defines is None:
        return ()
    expected = "defines: expected a dict or (name, value) pairs, got"
    if isinstance(defines, Mapping):
        items = list(defines.items())
    elif isinstance(defines, (str, bytes)):  # would split into characters
        raise TypeError(f"{expected} {type(defines).__name__} ({defines!r:.60})")
    else:
        try:
            items = list(defines)
        except TypeError:  # not iterable
            raise TypeError(f"{expected} {type(defines).__name__} ({defines!r:.60})") from None
    seen: dict[str, DefineValue] = {}
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(
                f"defines: expected (name, value) pairs or a dict, got an item {item!r} "
                f"of type {type(item).__name__}"
            )
        name, value = item
        if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
            raise ValueError(f"defines: macro name must be a C identifier, got {name!r}")
        # bool is an int subclass; True would silently become "True", which C does not know.
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise TypeError(
                f"defines[{name!r}]: expected str or int, got {type(value).__name__} ({value!r})"
            )
        if isinstance(value, str) and "\x00" in value:
            # NVRTC reads C strings: everything after the NUL would silently be dropped.
            raise ValueError(f"defines[{name!r}]: value contains a NUL byte: {value!r}")
        if name in seen and seen[name] != value:
            raise ValueError(f"defines: macro {name!r} given twice ({seen[name]!r} and {value!r})")
        seen[name] = value
    return tuple(sorted(seen.items()))


def _absolute_path(value: object, what: str) -> Path:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{what}: expected a pathlib.Path or str, got {type(value).__name__}")
    text = os.fspath(value)
    if not isinstance(text, str):
        raise TypeError(f"{what}: expected a pathlib.Path or str, got {type(text).__name__}")
    if not text:
        raise ValueError(f"{what}: expected a path, got an empty str")
    if "\x00" in text:
        raise ValueError(f"{what}: path contains a NUL byte: {text!r}")
    # Absolute (without resolving symlinks, which needs I/O) so equal files compare equal
    # whatever the working directory was when the spec was built. `..` is kept: folding it
    # as text (os.path.abspath) names another file when the part before it is a symlink.
    return Path(text).absolute()


def _as_sequence(value: object, what: str) -> object:
    """`tuple(value)` for `make`, except that a bare str (or path) is passed through, so the
    constructor rejects it instead of splitting it into characters."""
    if isinstance(value, (str, bytes, os.PathLike)):
        return value
    try:
        return tuple(value)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(
            f"KernelSpec.{what}: expected a sequence, got {type(value).__name__} ({value!r:.60})"
        ) from None


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One kernel configuration: a CUDA C++ source plus its specialisation.

    Specs are immutable and hashable; equal specs share cache entries and loaded kernels.
    Build each configuration once (for example behind `functools.cache`) and keep it, so the
    launch path only pays a dict lookup.

    Attributes:
        name: The entry point. Either the name of an `extern "C" __global__` function, or,
            when `name_expressions` is given, one of those expressions (for example
            `"my_kernel<128, true>"`).
        source: Path of the main `.cu` file, usually shipped as package data next to its
            launcher (made absolute). Its folder is always on the include path.
        defines: Specialisation constants as sorted `(name, value)` pairs, passed to NVRTC as
            `-Dname=value`. A dict or unsorted pairs are accepted and normalised.
        include_dirs: Extra include directories searched for `#include "..."` and
            `#include <...>` (after the source's own folder).
        options: Extra NVRTC options, for example `("--use_fast_math",)`.
        name_expressions: Template instantiations to compile and expose (NVRTC name
            expressions). Empty for `extern "C"` kernels.
        label: Short human-readable description for progress bars and error messages;
            defaults to `name` plus the defines. Not part of the cache key.
    """

    name: str
    source: Path
    defines: tuple[tuple[str, DefineValue], ...] = ()
    include_dirs: tuple[Path, ...] = ()
    options: tuple[str, ...] = ()
    name_expressions: tuple[str, ...] = ()
    label: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(
                f"KernelSpec.name: expected a non-empty str, got {type(self.name).__name__}"
            )
        if not self.name:
            raise ValueError("KernelSpec.name: expected a non-empty str, got ''")
        if not isinstance(self.label, str):
            raise TypeError(f"KernelSpec.label: expected a str, got {type(self.label).__name__}")
        object.__setattr__(self, "source", _absolute_path(self.source, "KernelSpec.source"))
        object.__setattr__(self, "defines", _normalise_defines(self.defines))
        if isinstance(self.include_dirs, (str, bytes, os.PathLike)):
            raise TypeError("KernelSpec.include_dirs: expected a sequence of paths, got one path")
        object.__setattr__(
            self,
            "include_dirs",
            tuple(_absolute_path(d, "KernelSpec.include_dirs") for d in self.include_dirs),
        )
        for field in ("options", "name_expressions"):
            value = getattr(self, field)
            if isinstance(value, str):
                raise TypeError(f"KernelSpec.{field}: expected a sequence of str, got one str")
            value = tuple(value)
            for item in value:
                if not isinstance(item, str):
                    raise TypeError(
                        f"KernelSpec.{field}: expected str items, got {type(item).__name__} ({item!r})"
                    )
                if "\x00" in item:
                    raise ValueError(f"KernelSpec.{field}: {item!r} contains a NUL byte")
            object.__setattr__(self, field, value)
        if self.name_expressions and self.name not in self.name_expressions:
            raise ValueError(
                f"KernelSpec.name {self.name!r} must be one of name_expressions "
                f"{list(self.name_expressions)}"
            )
        if not self.label:
            consts = ", ".join(f"{k}={v}" for k, v in self.defines)
            object.__setattr__(self, "label", f"{self.name}[{consts}]" if consts else self.name)
        # Launch paths look specs up in dicts: hash once, not on every lookup.
        object.__setattr__(self, "_hash", hash(self._identity()))

    def _identity(self) -> tuple:
        return (
            self.name,
            self.source,
            self.defines,
            self.include_dirs,
            self.options,
            self.name_expressions,
        )

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __reduce__(self):
        # Rebuild through __init__ so the cached hash is recomputed in the receiving process
        # (str hashes are randomised per process).
        return (_rebuild_spec, (*self._identity(), self.label))

    @classmethod
    def make(
        cls,
        name: str,
        source: str | Path,
        defines: Mapping[str, DefineValue] | Iterable[tuple[str, DefineValue]] | None = None,
        *,
        include_dirs: Iterable[str | Path] = (),
        options: Iterable[str] = (),
        name_expressions: Iterable[str] = (),
        label: str = "",
    ) -> KernelSpec:
        """Build a spec from friendlier argument types.

        Args:
            name: Entry point (see the class attributes).
            source: Path of the main `.cu` file.
            defines: Specialisation constants as a dict or `(name, value)` pairs; values are
                str or int.
            include_dirs: Extra include directories.
            options: Extra NVRTC options.
            name_expressions: Template instantiations to expose.
            label: Human-readable description (defaults to name plus defines).

        Returns:
            The normalised, hashable spec.

        Raises:
            TypeError: `name` or `label` is not a str, `source` or an include folder is not a
                path, `defines` is neither a dict nor pairs, a define value is not str/int, an
                option or name expression is not a str, or a sequence argument is a bare str.
            ValueError: `name` is empty, a macro name is not a C identifier or is given twice
                with different values, `name` is not among `name_expressions`, a path is empty
                or holds a NUL byte, or a define value, option or name expression holds a NUL
                byte.
        """
        return cls(
            name=name,
            source=source,  # type: ignore[arg-type]  # checked and made a Path in __post_init__
            defines=defines,  # type: ignore[arg-type]  # normalised in __post_init__
            include_dirs=_as_sequence(include_dirs, "include_dirs"),  # type: ignore[arg-type]
            options=_as_sequence(options, "options"),  # type: ignore[arg-type]
            name_expressions=_as_sequence(name_expressions, "name_expressions"),  # type: ignore[arg-type]
            label=label,
        )

    def with_defines(self, **defines: DefineValue) -> KernelSpec:
        """Return a copy with some defines added or replaced.

        Args:
            **defines: Macro names and their new values.

        Returns:
            A new spec; its label is recomputed from the new defines.

        Raises:
            TypeError: A value is not str/int (a bool included).
            ValueError: A name is not a C identifier, or a str value holds a NUL byte.
        """
        merged = dict(self.defines)
        merged.update(defines)
        return dataclasses.replace(self, defines=tuple(merged.items()), label="")


def _rebuild_spec(name, source, defines, include_dirs, options, name_expressions, label):
    return KernelSpec(name, source, defines, include_dirs, options, name_expressions, label)
