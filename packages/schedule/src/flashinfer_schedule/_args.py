"""Argument checks shared by the public functions of the package."""

from __future__ import annotations

import builtins
import operator


def type_name(value: object) -> str:
    """Name of `value`'s type, module-qualified unless it is a builtin (`numpy.bool`, `int`)."""
    cls = type(value)
    if cls.__module__ == builtins.__name__:
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def check_int(name: str, value: object, expected: str = "an int") -> int:
    """Return `value` as a Python int if it is an integer (numpy integers included).

    bool is refused although it has `__index__`: True as a length or count is always a bug at
    the call site. numpy.bool has no `__index__`, so it is refused with float and str.
    """
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{name} must be {expected}, got {type_name(value)} ({value!r})")
