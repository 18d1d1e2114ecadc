"""Argument validation shared by every public function of the package.

Every helper raises ``TypeError`` (wrong kind or dtype) or ``ValueError`` (wrong rank, shape,
divisibility, device or value) with a message that names the argument and gives the expected
and the received value, so a caller can fix the call without reading this code.
"""

from __future__ import annotations

import builtins
import math
import numbers
import operator
import os
from collections.abc import Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# FLASHINFER_VALIDATE_INPUTS values that turn the device-data checks on (as in
# flashinfer_attn_scores, so one setting means the same to every package).
_ENV_TRUE = frozenset({"1", "true", "yes", "on"})
INDEX_DTYPES = (torch.int32, torch.int64)


def _dtype_list(dtypes: Sequence[torch.dtype]) -> str:
    return " or ".join(str(d) for d in dtypes)


def type_name(value: object) -> str:
    """Name of ``value``'s type, module-qualified unless it is a builtin (``numpy.bool``, ``int``).

    A bare ``__name__`` would print ``numpy.bool_(True)``'s type as "bool", hiding why it was
    refused.
    """
    cls = type(value)
    if cls.__module__ == builtins.__name__:
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def plain(value: object) -> object:
    """A size, or a shape or stride tuple, as an error message prints it: ``(5, 64, 132)``.

    Under ``torch.compile(dynamic=True)`` sizes are symbols. Dynamo formats a single size into
    an f-string with its traced value, but a tuple of them as ``(s93, s58, s97)``, so a tuple
    is formatted item by item here (with f-strings only: dynamo cannot trace ``str.join``
    over a string built from a size read from data). A size read from tensor data (e.g.
    after ``nonzero()``) has no value while dynamo traces and prints as ``?``.
    """
    if isinstance(value, (tuple, list)):  # torch.Size is a tuple
        text = ""
        for index, size in enumerate(value):
            text = f"{plain(size)}" if index == 0 else f"{text}, {plain(size)}"
        return f"({text},)" if len(value) == 1 else f"({text})"
    is_size = isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)
    if is_size and torch.compiler.is_compiling():
        from torch.fx.experimental import symbolic_shapes  # imports sympy

        # PyTorch's 2.8 docs are the first to list guard_or_false. getattr with a default:
        # dynamo reports a failed `from ... import` under fullgraph=True without our message.
        guard_or_false = getattr(symbolic_shapes, "guard_or_false", None)
        if guard_or_false is None:
            raise RuntimeError(
                f"torch.compile of flashinfer_layouts needs "
                f"torch.fx.experimental.symbolic_shapes.guard_or_false (PyTorch 2.8 and newer); "
                f"this is PyTorch {torch.__version__}"
            )
        # dynamo traces a symbolic size as an int. A size with a traced value (or a constant)
        # decides one of the two; a size read from data that may be 0 or more decides neither.
        # (One read from data but known to be >= 1 passes, and prints as dynamo quotes its
        # symbol: the message is kept, oddly quoted.)
        if not (guard_or_false(value < 1) or guard_or_false(value >= 1)):
            return "?"
        # int(): dynamo cannot always format the symbol itself ("BUILD_STRING type error")
        return int(value)
    return value


def python_int(value: object) -> object:
    """A numpy (or other ``numbers.Integral``) integer as the Python int it holds; any other
    value unchanged, for the checks to accept or name. A bool stays a bool, a tensor a tensor."""
    if type(value) is int or isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return value
    return operator.index(value)


def exact_int(name: str, value: object) -> int | torch.SymInt:
    """Return ``value`` as a Python int if it is a Python or numpy integer, else raise
    TypeError (a bool is refused too: True as a size is a bug at the call site).

    A `torch.SymInt` (a tensor size under a non-strict torch.export) passes as is.
    """
    if isinstance(value, torch.SymInt):
        return value
    value = python_int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int; got {type_name(value)}")
    return value


def flag(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool, else raise TypeError naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool; got {type_name(value)}")
    return value


def tensor(name: str, value: object) -> torch.Tensor:
    """Return ``value`` if it is a dense (strided) tensor, else raise TypeError naming ``name``.

    Sparse and other non-strided layouts are refused here: the helpers index, view and
    reshape their inputs, which such tensors do not support.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type_name(value)}")
    if value.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (torch.strided) tensor; got {value.layout}")
    return value


def dtype(name: str, t: torch.Tensor, allowed: torch.dtype | Sequence[torch.dtype]) -> None:
    allowed_seq = (allowed,) if isinstance(allowed, torch.dtype) else tuple(allowed)
    if t.dtype not in allowed_seq:
        raise TypeError(f"{name} must have dtype {_dtype_list(allowed_seq)}; got {t.dtype}")


def ndim(name: str, t: torch.Tensor, expected: int, layout: str) -> None:
    if t.dim() != expected:
        raise ValueError(
            f"{name} must be {expected}-D {layout}; got {t.dim()}-D shape {plain(t.shape)}"
        )


def min_ndim(name: str, t: torch.Tensor, minimum: int, layout: str) -> None:
    if t.dim() < minimum:
        raise ValueError(
            f"{name} must have at least {minimum} dimension(s) {layout}; "
            f"got {t.dim()}-D shape {plain(t.shape)}"
        )


def dim_size(name: str, t: torch.Tensor, dim: int, expected: int, what: str) -> None:
    if t.shape[dim] != expected:
        raise ValueError(
            f"{name}.shape[{dim}] ({what}) must be {plain(expected)}; got {plain(t.shape[dim])} "
            f"(shape {plain(t.shape)})"
        )


def in_range(name: str, value: int, low: int, high: int | None = None) -> None:
    """Raise ValueError unless ``low <= value`` (and ``value < high`` when ``high`` is given)."""
    if value < low or (high is not None and value >= high):
        expected = f">= {plain(low)}" if high is None else f"in [{plain(low)}, {plain(high)})"
        raise ValueError(f"{name} must be {expected}; got {plain(value)}")


def divisible(
    name: str, value: int, divisor: int, what: str, divisor_name: str | None = None
) -> None:
    """``value`` must be a multiple of ``divisor`` (named in the message when it is an argument)."""
    if divisor <= 0 or value % divisor != 0:
        expected = plain(divisor) if divisor_name is None else f"{plain(divisor)} ({divisor_name})"
        raise ValueError(f"{name}: {what} must be a multiple of {expected}; got {plain(value)}")


def same_shape(name: str, t: torch.Tensor, expected: Sequence[int], layout: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {plain(expected)} {layout}; got {plain(t.shape)}")


def same_device(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if t.device != ref.device:
        raise ValueError(
            f"{name} must be on the same device as {ref_name} ({ref.device}); got {t.device}"
        )


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def blocks_contiguous(name: str, t: torch.Tensor) -> None:
    """Each ``t[i]`` (a block) must be one contiguous run of memory; ``stride(0)`` is free.

    Strides of dimensions of size 1 are never used, so they are not checked.
    """
    expected = 1
    for dim in range(t.dim() - 1, 0, -1):
        if t.shape[dim] > 1 and t.stride(dim) != expected:
            raise ValueError(
                f"{name} must store each block (each {name}[i]) contiguously: strides of "
                f"dims 1..{t.dim() - 1} must be {plain(_contiguous_strides(t.shape[1:]))}; "
                f"got strides {plain(t.stride())} for shape {plain(t.shape)}"
            )
        expected *= t.shape[dim]


def blocks_disjoint(name: str, t: torch.Tensor) -> None:
    """Blocks ``t[i]`` must not overlap: ``stride(0)`` at least one block's element count.

    A wider pitch (one layer of a layer-interleaved cache, a slice of every other block) is
    fine. Assumes `blocks_contiguous` holds, so a block spans exactly ``t[0].numel()``.
    """
    if t.shape[0] <= 1:
        return  # one block: the stride is never used
    block_size = math.prod(t.shape[1:])
    if t.stride(0) < block_size:
        raise ValueError(
            f"{name} blocks must not overlap: stride(0) must be >= the {plain(block_size)} elements "
            f"of one block; got strides {plain(t.stride())} for shape {plain(t.shape)}"
        )


def positive_int(name: str, value: object) -> int:
    value = exact_int(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be positive; got {plain(value)}")
    return value


@torch.compiler.assume_constant_result
def _visible_cuda_devices() -> int:
    """CUDA devices this process sees, 0 without CUDA (a constant while torch.compile traces:
    dynamo cannot put these torch.cuda queries in a graph)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device(name: str, value: object) -> torch.device | None:
    """Return ``value`` as a ``torch.device`` (None stays None), else raise naming ``name``."""
    if value is None:
        return None
    value = python_int(value)  # a numpy integer as the index it holds
    if isinstance(value, bool) or not isinstance(value, (torch.device, str, int)):
        raise TypeError(
            f"{name} must be a torch.device, a device string or an int; got {type_name(value)}"
        )
    try:
        resolved = torch.device(value)
    except (RuntimeError, ValueError, OverflowError) as error:  # 2**63: "Overflow when unpacking"
        raise ValueError(
            f"{name} must be a valid device such as 'cpu' or 'cuda:0'; got {value!r} ({error})"
        ) from error
    if resolved.type == "cuda":
        # torch answers both cases below with a bare AssertionError from inside a factory.
        count = _visible_cuda_devices()
        if count == 0:
            raise ValueError(f"{name}: got {value!r}, but CUDA is not available in this process")
        if resolved.index is not None and resolved.index >= count:
            raise ValueError(
                f"{name}: got {value!r}, but only {count} CUDA device(s) are visible "
                f"(valid indices 0..{count - 1})"
            )
    return resolved


def choice(name: str, value: object, allowed: Sequence[object]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}; got {value!r}")


def output_float_dtype(name: str, value: object) -> torch.dtype:
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype; got {type_name(value)}")
    if value not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be {_dtype_list(FLOAT_DTYPES)}; got {value}")
    return value


# float32 rounds x to a finite positive value exactly when LOW < x < HIGH: LOW is half the
# smallest subnormal and HIGH float32's largest value plus half its ulp, both ties that round
# to the even neighbour (0 and infinity).
_FLOAT32_POSITIVE_LOW = 2.0**-150
_FLOAT32_FINITE_HIGH = (2 - 2.0**-24) * 2.0**127


def global_scale(name: str, value: object, device: torch.device) -> torch.Tensor:
    """Validate an NVFP4 global scale and return it as a 0-d float32 tensor on ``device``.

    Python and numpy numbers and CPU tensors are checked to be finite and positive once
    rounded to float32 (1e39 would become inf there, 1e-50 zero); a CUDA tensor's value is not
    read (that would synchronise with the device).
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a float or a 1-element floating tensor; got bool")
    if isinstance(value, numbers.Real):
        try:
            number = float(value)
        except OverflowError:  # an int beyond float64's range
            number = math.inf
        # Compared as a Python number, not read back from a tensor: under
        # torch.compile(dynamic=True) the number is symbolic and a tensor read would be
        # data-dependent. NaN first: a symbolic NaN cannot be ordered.
        if number != number or not (_FLOAT32_POSITIVE_LOW < number < _FLOAT32_FINITE_HIGH):
            _refuse_global_scale(name, value, number)
        return torch.tensor(number, dtype=torch.float32).to(device)
    if isinstance(value, torch.Tensor):
        tensor(name, value)
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor; got dtype {value.dtype}")
        if value.numel() != 1:
            raise ValueError(
                f"{name} must hold exactly one element (0-d or 1-element tensor); "
                f"got shape {plain(value.shape)}"
            )
        if value.device.type != "cpu" and value.device != device:
            raise ValueError(
                f"{name} must be on the CPU or on the data's device ({device}); got {value.device}"
            )
        scale = value.reshape(()).to(dtype=torch.float32)
        if value.device.type == "cpu" and not torch.compiler.is_compiling():
            given = value.reshape(()).item()
            if not (0.0 < float(scale) < math.inf):
                _refuse_global_scale(name, given, given)
        return scale.to(device=device)
    raise TypeError(
        f"{name} must be a float or a 1-element floating tensor; got {type_name(value)}"
    )


def _refuse_global_scale(name: str, given: object, number: float) -> None:
    if torch.compiler.is_compiling():
        # The number may be symbolic: dynamo can neither read a tensor made from it nor
        # format it into a string (float() gives the traced value).
        given, in_float32 = float(number), ""
    else:
        in_float32 = f", which is {float(torch.tensor(number, dtype=torch.float32))} in float32"
    raise ValueError(
        f"{name} must be finite and positive as a float32 (between about 1.4e-45 and "
        f"3.4e38); got {given!r}{in_float32}"
    )


def writable_here(name: str, t: torch.Tensor) -> None:
    """Refuse to update ``t`` in place when it is an inference tensor (created under
    ``torch.inference_mode()``) and the call is outside inference mode. PyTorch refuses that
    update too, but from inside the scatter, in a message that names no argument. Skipped
    while torch.compile traces (its fake tensors are not the caller's)."""
    if torch.compiler.is_compiling():
        return
    if t.is_inference() and not torch.is_inference_mode_enabled():
        raise RuntimeError(
            f"{name} is an inference tensor (created under torch.inference_mode()) and this "
            f"call is outside inference mode, where PyTorch allows no in-place update of it; "
            f"make the call inside torch.inference_mode(), or create {name} outside it"
        )


def device_data_checks_enabled(t: torch.Tensor) -> bool:
    """Whether checks that read tensor *contents* should run for ``t``.

    Always on CPU (reading is free there). On other devices only when
    ``FLASHINFER_VALIDATE_INPUTS`` is 1/true/yes/on and no CUDA graph is being captured, because reading
    device data forces a host synchronisation, which is illegal during capture. Never while
    torch.compile traces or on the meta device: neither has data to read.
    """
    if torch.compiler.is_compiling():
        return False
    if t.device.type == "cpu":
        return True
    if t.device.type == "meta":  # shapes only: there is no data to read
        return False
    if os.environ.get("FLASHINFER_VALIDATE_INPUTS", "").strip().lower() not in _ENV_TRUE:
        return False
    if t.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return False
    return True
