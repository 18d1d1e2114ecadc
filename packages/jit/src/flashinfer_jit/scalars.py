"""Explicitly typed scalar kernel arguments.

A plain Python `int` does not say whether the kernel parameter is 32 or 64 bits wide, and
guessing wrong shifts every later argument. `Kernel.launch` therefore rejects plain
numbers; wrap each scalar in the type of the C parameter::

    kernel.launch(grid, block, out, x, i32(n), f32(scale), u64(ptr))
"""

from __future__ import annotations

import math
import struct
import sys


def _refuse_tensor(wrapper: str, value: object) -> None:
    """A tensor is not a host number: its value would be read with an implicit `.item()`, a
    device synchronisation (and an error during CUDA-graph capture). torch is only looked up,
    never imported here: without it loaded, `value` cannot be a tensor."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        raise TypeError(
            f"{wrapper}: expected a Python number, got a torch.Tensor on {value.device} "
            "(pass value.item() explicitly if a host read is intended)"
        )
    # A numpy array of one element converts like a scalar in some numpy versions and raises
    # numpy's own TypeError in others: refused here by its dimensions, naming the wrapper.
    if getattr(value, "ndim", 0) != 0 and hasattr(value, "shape"):
        raise TypeError(
            f"{wrapper}: expected a number, got an array of shape {tuple(value.shape)} "
            "(index it, e.g. value[0], to pass one element)"
        )


def _integer_scalar(value: object) -> int | None:
    """`value` as a Python int when it is an integer scalar other than an int (a numpy
    integer), else None. Not a bool, and not a tensor: a one-element tensor has `__index__`
    too, and reading a CUDA one is a device synchronisation."""
    if isinstance(value, (bool, int)) or not hasattr(value, "__index__"):
        return None
    if hasattr(value, "data_ptr"):  # torch.Tensor, without importing torch here
        return None
    return value.__index__()  # type: ignore[attr-defined]


def _as_index(value: object, what: str, expected: str) -> int:
    """`value` as a Python int: ints and objects with `__index__` (numpy integer scalars), not
    bools (an int subclass) or floats; a TypeError naming `what` otherwise."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what}: expected {expected}, got {type(value).__name__} ({value!r})")
    return value.__index__()  # type: ignore[attr-defined]


class _Scalar:
    """Base of the scalar wrappers: a value, its `struct` format and its size in bytes."""

    __slots__ = ("value",)
    format: str = ""
    size: int = 0
    c_type: str = ""

    def __setattr__(self, name: str, value: object) -> None:
        # Checked once, at construction: a value changed afterwards would reach the launch
        # unchecked (and fail inside `struct`, or pack as something else).
        raise AttributeError(f"{type(self).__name__} is immutable: make a new one")

    def __reduce__(self) -> tuple:
        # copy and pickle rebuild through the constructor (and its check), not setattr.
        return (type(self), (self.value,))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.value == self.value  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.value))


class _Integer(_Scalar):
    __slots__ = ()
    low: int = 0
    high: int = 0

    def __init__(self, value: int) -> None:
        _refuse_tensor(type(self).__name__, value)
        # `_as_index` inline: wrappers are built per call on some launch paths (the schedule's).
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(
                f"{type(self).__name__}: expected an integer, got {type(value).__name__} ({value!r})"
            )
        value = value.__index__()
        if not self.low <= value <= self.high:
            raise ValueError(
                f"{type(self).__name__}: {value} is outside [{self.low}, {self.high}] "
                f"({self.c_type})"
            )
        object.__setattr__(self, "value", value)


class i32(_Integer):
    """A C `int32_t` / `int` kernel argument.

    Args:
        value: Integer in [-2**31, 2**31 - 1].

    Raises:
        TypeError: `value` is not an integer.
        ValueError: `value` does not fit.
    """

    __slots__ = ()
    format, size, c_type, low, high = "i", 4, "int32_t", -(2**31), 2**31 - 1


class u32(_Integer):
    """A C `uint32_t` / `unsigned` kernel argument.

    Args:
        value: Integer in [0, 2**32 - 1].

    Raises:
        TypeError: `value` is not an integer.
        ValueError: `value` does not fit.
    """

    __slots__ = ()
    format, size, c_type, low, high = "I", 4, "uint32_t", 0, 2**32 - 1


class i64(_Integer):
    """A C `int64_t` / `long long` kernel argument.

    Args:
        value: Integer in [-2**63, 2**63 - 1].

    Raises:
        TypeError: `value` is not an integer.
        ValueError: `value` does not fit.
    """

    __slots__ = ()
    format, size, c_type, low, high = "q", 8, "int64_t", -(2**63), 2**63 - 1


class u64(_Integer):
    """A C `uint64_t` kernel argument; also carries raw device pointers.

    Args:
        value: Integer in [0, 2**64 - 1].

    Raises:
        TypeError: `value` is not an integer.
        ValueError: `value` does not fit.
    """

    __slots__ = ()
    format, size, c_type, low, high = "Q", 8, "uint64_t", 0, 2**64 - 1


_NOT_REAL_TYPE_NAMES = frozenset(
    {"bool", "complex64", "complex128", "clongdouble", "complex256", "datetime64", "timedelta64"}
)


def _real(wrapper: str, value: object) -> float:
    _refuse_tensor(wrapper, value)
    # numpy.bool_ is no Python bool but has __float__: refused by its type name, as bool is.
    # numpy's complex scalars have __float__ too (dropping the imaginary part), and its
    # datetime64 / timedelta64 convert as counts of their unit: refused as well.
    if (
        isinstance(value, (bool, complex))
        or type(value).__name__ in _NOT_REAL_TYPE_NAMES
        or not hasattr(value, "__float__")
    ):
        raise TypeError(
            f"{wrapper}: expected a real number, got {type(value).__name__} ({value!r})"
        )
    try:
        result = float(value)  # type: ignore[arg-type]
        # Decimal and numpy.longdouble round a finite value past the double range to inf
        # instead of raising; an infinity given as such compares equal to it.
        if math.isinf(result) and not value == result:
            raise OverflowError
        return result
    except ValueError as exc:  # Decimal("sNaN"): a signalling NaN refuses the conversion
        raise ValueError(f"{wrapper}: {value!r} has no double value ({exc})") from None
    except OverflowError:  # an int beyond the double range, such as 10**400
        text = repr(value)
        text = text if len(text) <= 40 else f"{text[:37]}..."
        raise ValueError(
            f"{wrapper}: expected a value within the double range, got {text}"
        ) from None


class f32(_Scalar):
    """A C `float` kernel argument.

    Args:
        value: Real number; rounded to the nearest float32.

    Raises:
        TypeError: `value` is not a real number.
        ValueError: `value` is finite but too large for float32 (or for a double).
    """

    __slots__ = ()
    format, size, c_type = "f", 4, "float"

    def __init__(self, value: float) -> None:
        value = _real("f32", value)
        try:
            struct.pack("<f", value)
        except OverflowError:
            raise ValueError(f"f32: {value} overflows float32") from None
        object.__setattr__(self, "value", value)


class f64(_Scalar):
    """A C `double` kernel argument.

    Args:
        value: Real number.

    Raises:
        TypeError: `value` is not a real number.
        ValueError: `value` is an integer too large for a double.
    """

    __slots__ = ()
    format, size, c_type = "d", 8, "double"

    def __init__(self, value: float) -> None:
        object.__setattr__(self, "value", _real("f64", value))


SCALAR_TYPES: tuple[type[_Scalar], ...] = (i32, u32, i64, u64, f32, f64)
