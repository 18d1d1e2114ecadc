"""How the kernel packages' public functions check scalar arguments and name refused values.

Shared by `flashinfer_schedule` and `flashinfer_attn_scores` (and meant for every package
built on this runtime), so their errors word a refused value the same way, also under
`torch.compile`. `flashinfer_layouts` depends on torch alone and keeps its own checks.
"""

from __future__ import annotations

import builtins
import numbers
import operator
from collections.abc import Callable

import torch


def type_name(value: object) -> str:
    """Name of `value`'s type, module-qualified unless it is a builtin (`numpy.bool`, `int`)."""
    cls = type(value)
    if cls.__module__ == builtins.__name__:
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def shown(value: object) -> object:
    """An int or float argument as an error message prints it.

    Under `torch.compile(dynamic=True)` a Python-number argument is symbolic, and dynamo
    cannot format a symbolic value into an f-string: the error would surface as
    "BUILD_STRING type error" without its message. `int()` / `float()` give the traced value.
    """
    if not torch.compiler.is_compiling() or isinstance(value, bool):
        return value
    if isinstance(value, (int, torch.SymInt)):
        return int(value)
    if isinstance(value, (float, torch.SymFloat)):
        return float(value)
    return value


# PyTorch's functions behind guard_or(condition, default) (a test renames them, to be missing).
_GUARD_OR_NAMES = {True: "guard_or_true", False: "guard_or_false"}


def guard_or(condition: object, default: bool) -> bool:
    """`condition` decided while torch.compile traces: its value where the trace knows it (a
    guard then keeps the compiled code to calls where it holds the same), `default` where it
    depends on a size read from device data. PyTorch's `guard_or_true` / `guard_or_false`
    (its 2.8 docs are the first to list them; the packages install from 2.6, and their eager
    calls never get here)."""
    from torch.fx.experimental import symbolic_shapes  # imports sympy

    # getattr with a default, not `from ... import` in a try: dynamo turns a missing name
    # there into an AttributeError that fullgraph=True reports without this message.
    name = _GUARD_OR_NAMES[default]
    decide = getattr(symbolic_shapes, name, None)
    if decide is None:
        raise RuntimeError(
            f"torch.compile of the flashinfer ops needs "
            f"torch.fx.experimental.symbolic_shapes.{name} (PyTorch 2.8 and newer); "
            f"this is PyTorch {torch.__version__}"
        )
    return decide(condition)


def require(condition: object, error: Callable[[], Exception]) -> None:
    """Raise `error()` unless the size comparison `condition` holds.

    While torch.compile traces, a size derived from device data (a `max_seq_len` taken with
    `.item()`) has no value, and branching on it would need a guard that dynamo cannot build.
    There `error()` is raised only when `condition` is known to be false; otherwise it becomes
    a runtime assertion (`torch._check`), so the compiled code raises a RuntimeError naming the
    failed comparison if a call breaks it.
    """
    if not torch.compiler.is_compiling():
        if not condition:
            raise error()
        return
    if not guard_or(condition, True):
        raise error()
    # No message function: torch 2.11's dynamo refuses one that closes over anything, and
    # the runtime assertion names the failed comparison itself.
    torch._check(condition)


def decided(condition: object, default: bool) -> bool:
    """A size comparison's value in an eager call; under torch.compile, `guard_or`'s (its
    value where the trace knows it, `default` where it depends on a size read from device
    data, such as an unbacked batch dimension)."""
    if torch.compiler.is_compiling():
        return guard_or(condition, default)
    return bool(condition)


# How a size read from tensor data (an unbacked symbol, e.g. after nonzero()) prints while
# dynamo traces with dynamic shapes: it has no value then.
DATA_DEPENDENT_SIZE = "?"


def _size_text(size: object) -> str:
    if not torch.compiler.is_compiling():
        return f"{size}"
    # A size with a traced value (or a constant) decides one of the two, and dynamo then
    # formats the value; a size read from data that may be 0 or more decides neither. (One
    # known >= 1 passes as having a value and prints as dynamo quotes its symbol: kept, ugly.)
    if not (guard_or(size < 1, False) or guard_or(size >= 1, False)):
        return DATA_DEPENDENT_SIZE
    return f"{int(size)}"


def _joined(values: object) -> str:
    # Item by item, with f-strings only: dynamo formats one traced size with its value but a
    # tuple or list of them as symbols ("[s48, s91, s88]", "s85**2"), and it cannot trace
    # str.join over a string it built from a size read from data.
    text = ""
    for index, size in enumerate(values):
        text = _size_text(size) if index == 0 else f"{text}, {_size_text(size)}"
    return text


def sizes(values: object) -> str:
    """A shape as an error message prints it, ``[2, 8, 128]``, also under a dynamic trace
    (where a size read from tensor data prints as ``?``)."""
    return f"[{_joined(values)}]"


def strides(values: object) -> str:
    """Strides as an error message prints them, ``(4, 2)`` or ``(1,)`` like ``t.stride()``,
    also under a dynamic trace."""
    text = _joined(values)
    return f"({text},)" if len(values) == 1 else f"({text})"


def _traced_numpy(value: object) -> bool:
    """Whether dynamo traces `value`, a numpy scalar, as an array (PyTorch 2.13): it is then
    neither `numbers.Integral` nor safe to repr (the repr would read the traced data)."""
    return torch.compiler.is_compiling() and type(value).__module__ == "numpy"


def describe(value: object) -> str:
    """How an error names a refused value: its type and repr, or for a tensor its dtype, shape
    and device (a tensor's repr reads its data: a host sync on CUDA, and refused by dynamo
    under `torch.compile(fullgraph=True)`, which would hide the error behind its own)."""
    if isinstance(value, torch.Tensor):
        # A nested tensor has no sizes.
        shape = f"{value.dim()}-D" if value.is_nested else f"shape {sizes(value.shape)}"
        return f"{type_name(value)} of dtype {value.dtype}, {shape} on {value.device}"
    if _traced_numpy(value):
        return "a numpy value"
    return f"{type_name(value)} ({shown(value)!r})"


def numpy_int_as_int(value: object) -> object:
    """A numpy (or other `numbers.Integral`) integer as the Python int it holds; any other
    value (a bool, a tensor, a str) unchanged, for the caller's own checks."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return operator.index(value)
    return value


def check_int(name: str, value: object, expected: str = "an int") -> int:
    """Return `value` as a Python int if it is an integer (numpy integers included).

    bool is refused although it is an int: True as a length or count is always a bug at the
    call site. Tensors and numpy arrays are refused although a one-element integer one has
    `__index__` (reading a CUDA tensor is a host sync); numpy.bool is refused with float, str.
    A `torch.SymInt` (a size read from data under a non-strict torch.export) passes as is.
    """
    if type(value) is int:  # the common case, without the ABC check below (~0.2 us)
        return value
    if isinstance(value, torch.SymInt):  # a size read from data under a non-strict export
        return value
    value = numpy_int_as_int(value)
    if type(value) is int:
        return value
    raise TypeError(f"{name} must be {expected}, got {describe(value)}{int_hint(value)}")


def int_hint(value: object) -> str:
    """A sentence for an integer argument given as a tensor (the spec writes sizes such as
    `max(seq_lens)`, a 0-d tensor) or as a numpy integer under torch.compile: how to pass it."""
    if isinstance(value, torch.Tensor):
        return "; pass a Python int such as int(t.max()) (reading a CUDA tensor is a host sync)"
    if _traced_numpy(value):
        return "; under torch.compile pass numpy integers as int(value)"
    return ""


def inference_out_error() -> RuntimeError:
    """The error for an eager call (CPU or CUDA) that would write an inference tensor (`out`
    created under `torch.inference_mode()`) outside inference mode. PyTorch refuses such
    in-place updates, and a custom op would too, with its own message; a direct CUDA launch
    would not notice, so the eager paths check first."""
    return RuntimeError(
        "out is an inference tensor (created under torch.inference_mode()) and this call is "
        "outside inference mode, where PyTorch allows no in-place update of it; make the call "
        "inside torch.inference_mode(), or pass an out created outside it"
    )
