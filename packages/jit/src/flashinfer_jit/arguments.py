"""Packing launch arguments into the `void**` array the driver's `kernelParams` expects.

One `ctypes` buffer holds both halves::

    [ptr_0 ... ptr_{n-1}] [pad to 64] [param bytes at the kernel's own parameter offsets]
      each ptr_i = address of parameter i's bytes in the same buffer

The pointer half never changes, so each thread keeps one buffer per argument-type plan and a
launch only rewrites the parameter bytes. The driver copies those bytes during the launch
call (also under CUDA-graph capture), so reuse after the call returns is safe; buffers are
per thread because the driver call releases the GIL.

Parameter sizes come from the compiled kernel (`cuKernelGetParamInfo`), so an argument of
the wrong width is caught when its plan is built instead of shifting every later parameter.
For speed, each plan is a small generated function specialised to its argument types: it
checks the exact types (falling back to a plan lookup when they differ), checks that tensors
live on the kernel's device, and packs everything with one `struct.pack_into`.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
from collections.abc import Callable, Sequence
from types import CodeType
from typing import Any

from .scalars import _Scalar
from .tma import TensorMap

_MAX_THREAD_BUFFERS = 64


def _kind_of(kind: type, tensor_type: type) -> str:
    if issubclass(kind, tensor_type):
        return "tensor"
    if issubclass(kind, _Scalar):
        return "scalar"
    if issubclass(kind, TensorMap):
        return "tensormap"
    if issubclass(kind, (int, float)):
        return "plain"
    return "unsupported"


def _parameter_words(size: int, kind: type) -> str:
    """What to say of the C parameter a plain number was given for."""
    if size == 0:  # no parameter list from the driver: a plain number has no size to go by
        words = "the C parameter (the driver reported no parameter sizes for this kernel)"
    elif size in (4, 8):
        words = f"the {size}-byte parameter"
    else:  # bool, char, half, ...: the wrappers are 4 or 8 bytes
        words = (
            f"the parameter, which is {size} bytes: no wrapper has that size, so declare the "
            "kernel's parameter as a 4- or 8-byte type"
        )
    if kind is bool:
        words += " (a bool: pass i32(int(value)) or u32(int(value)))"
    return words


def _natural_size(kind: type, tensor_type: type) -> int:
    category = _kind_of(kind, tensor_type)
    if category == "tensor":
        return 8
    if category == "scalar":
        return kind.size
    if category == "tensormap":
        return 128
    return 0  # plain numbers and unsupported types are rejected by the caller


def _c_layout(sizes: list[int]) -> tuple[tuple[int, int], ...]:
    """`(offset, size)` of parameters of these sizes in C order, each aligned to its size (a
    128-byte CUtensorMap to 64 bytes), as the compiler lays out a kernel's parameters. Only
    the values' placement in the packed buffer depends on it: each parameter is passed by its
    own pointer."""
    layout, offset = [], 0
    for size in sizes:
        align = max(1, min(size, 64))
        offset = (offset + align - 1) // align * align
        layout.append((offset, size))
        offset += size
    return tuple(layout)


@functools.lru_cache(maxsize=256)
def _compiled(lines: tuple[str, ...]) -> CodeType:
    """The code object of a generated packer, shared by every kernel with the same argument
    types and layout. A kernel's first packing took 365-580 us on the H200's host, most of its
    first launch; a second kernel with the same layout, reusing the compiled code, took 61-130
    us (2026-12-02, `tools/first_launch_probe.py breakdown`)."""
    return compile("\n".join(lines), "<flashinfer_jit packer>", "exec")


class ArgumentPacker:
    """Packs launch arguments for one kernel, with a generated packer per argument-type tuple.

    Args:
        params: `(offset, size)` of each kernel parameter, in bytes.
        device_index: Device the kernel runs on; tensors must live there.
        label: Kernel label for error messages.
        check_devices: Check that every tensor lives on `device_index` (skip only where the
            caller has checked it, see `Kernel.prepare_launch`).
    """

    def __init__(
        self,
        params: Sequence[tuple[int, int]],
        device_index: int,
        label: str,
        *,
        check_devices: bool = True,
    ) -> None:
        self.params = tuple((int(o), int(s)) for o, s in params)
        self.device_index = device_index
        self.label = label
        self.check_devices = check_devices
        self._plans: dict[tuple[type, ...], Callable[[tuple], Any]] = {}
        self._last: Callable[[tuple], Any] | None = None

    def pack(self, args: tuple[Any, ...]) -> tuple[Any, int]:
        """Pack arguments.

        Args:
            args: The launch arguments (see `Kernel.launch`).

        Returns:
            `(buffer, address)`: keep `buffer` referenced until the launch call returns;
            pass `address` as `kernelParams` (0 when the kernel has no parameters).

        Raises:
            TypeError: Wrong count, unsupported type, plain Python number, size mismatch, or a
                sparse tensor (it has no data pointer to pass).
            ValueError: A tensor, or the tensor a `TensorMap` describes, lives on another
                device (unless built with `check_devices=False`).
        """
        last = self._last
        try:
            if last is not None:
                packed = last(args)
                if packed is not None:
                    return packed
            types = tuple(map(type, args))
            plan = self._plans.get(types)
            if plan is None:
                plan = self._build(types)
                self._plans[types] = plan
            self._last = plan
            packed = plan(args)
        except RuntimeError as exc:  # data_ptr() of a tensor without strided storage: name it
            self._refuse_layouts(args, exc)
            raise
        if packed is None:  # pragma: no cover - the plan was built for exactly these types
            raise RuntimeError("argument plan rejected the types it was built for")
        return packed

    def _refuse_layouts(self, args: tuple[Any, ...], cause: RuntimeError) -> None:
        import torch

        for index, value in enumerate(args):
            if isinstance(value, torch.Tensor) and value.layout != torch.strided:
                raise TypeError(
                    f"kernel {self.label!r} argument {index}: expected a dense (torch.strided) "
                    f"tensor, got layout {value.layout}"
                ) from cause

    def _device_error(self, value: Any, index: int) -> None:
        # Called from generated packers; always raises.
        if isinstance(value, TensorMap):
            what = f"a TensorMap of a tensor on cuda:{value.device_index}"
        else:
            what = f"a tensor on {value.device}"
        raise ValueError(
            f"kernel {self.label!r} runs on cuda:{self.device_index} but got {what} "
            f"(argument {index})"
        )

    def _build(self, types: tuple[type, ...]) -> Callable[[tuple], Any]:
        import torch

        params = self.params
        count = len(types)
        if not params and count:
            # The driver reported no parameter list (seen on the H200 with driver 580 and
            # cuda-bindings 13.3 for some kernels): the explicitly typed arguments say the sizes.
            params = _c_layout([_natural_size(kind, torch.Tensor) for kind in types])
        if count != len(params):
            raise TypeError(
                f"kernel {self.label!r} takes {len(params)} parameters (sizes "
                f"{[size for _, size in params]} bytes), got {count} arguments"
            )
        data_start = (count * 8 + 63) // 64 * 64
        fmt = ["<"]
        cursor = data_start
        values: list[str] = []
        device_checks: list[int] = []
        map_checks: list[int] = []  # TensorMaps: a raw address's device is unknown (None)
        for index, (kind, (offset, size)) in enumerate(zip(types, params)):
            category = _kind_of(kind, torch.Tensor)
            if category == "tensor":
                code, got = "Q", 8
                values.append(f"a{index}.data_ptr()")
                if self.check_devices:
                    device_checks.append(index)
            elif category == "scalar":
                code, got = kind.format, kind.size
                values.append(f"a{index}.value")
            elif category == "tensormap":
                code, got = "128s", 128
                values.append(f"a{index}.raw")
                if self.check_devices:
                    map_checks.append(index)
            elif category == "plain":
                raise TypeError(
                    f"kernel {self.label!r} argument {index}: a plain Python {kind.__name__} "
                    f"does not say its C type; wrap it as flashinfer_jit.i32, u32, i64, u64, "
                    f"f32 or f64 to match {_parameter_words(size, kind)}"
                )
            else:
                raise TypeError(
                    f"kernel {self.label!r} argument {index}: unsupported type "
                    f"{kind.__name__}; expected a torch.Tensor, a scalar wrapper (i32, u32, "
                    f"i64, u64, f32, f64) or a flashinfer_jit.TensorMap"
                )
            if got != size:
                raise TypeError(
                    f"kernel {self.label!r} argument {index}: the C parameter is {size} "
                    f"bytes but a {kind.__name__} is {got} bytes"
                )
            position = data_start + offset
            if position < cursor:
                raise RuntimeError(
                    f"kernel {self.label!r}: parameter offsets are not increasing: {params}"
                )
            fmt.append("x" * (position - cursor) + code)
            cursor = position + got
        total = cursor
        offsets = tuple(data_start + offset for offset, _ in params)
        buffers: dict[int, tuple[Any, int]] = {}

        def new_buffer(ident: int) -> tuple[Any, int]:
            buffer = ctypes.create_string_buffer(max(total, 1))
            base = ctypes.addressof(buffer)
            struct.pack_into(f"<{count}Q", buffer, 0, *(base + o for o in offsets))
            if len(buffers) >= _MAX_THREAD_BUFFERS:
                # Dropping entries is safe: callers keep their own buffer referenced.
                buffers.clear()
            entry = (buffer, base)
            buffers[ident] = entry
            return entry

        namespace = {
            "types": types,
            "pack_into": struct.Struct("".join(fmt)).pack_into,
            "buffers": buffers,
            "new_buffer": new_buffer,
            "get_ident": threading.get_ident,
            "device": self.device_index,
            "device_error": self._device_error,
        }
        names = [f"a{i}" for i in range(count)]
        # The expected types and the device are default arguments: local reads in the hot path.
        for i, kind in enumerate(types):
            namespace[f"t{i}"] = kind
        bound = "".join(f", t{i}=t{i}" for i in range(count))
        lines = [f"def packer(args, device=device{bound}):"]
        if count == 0:
            lines.append("    return (None, 0) if not args else None")
        else:
            lines.append(f"    if len(args) != {count}:")
            lines.append("        return None")
            lines.append(f"    {', '.join(names)}, = args")
            type_checks = " or ".join(f"type({n}) is not t{i}" for i, n in enumerate(names))
            lines.append(f"    if {type_checks}:")
            lines.append("        return None")
            for i in device_checks:
                lines.append(f"    if a{i}.get_device() != device:")
                lines.append(f"        device_error(a{i}, {i})")
            for i in map_checks:
                lines.append(f"    if a{i}.device_index not in (None, device):")
                lines.append(f"        device_error(a{i}, {i})")
            lines.append("    ident = get_ident()")
            lines.append("    entry = buffers.get(ident)")
            lines.append("    if entry is None:")
            lines.append("        entry = new_buffer(ident)")
            lines.append(f"    pack_into(entry[0], {data_start}, {', '.join(values)})")
            lines.append("    return entry")
        exec(_compiled(tuple(lines)), namespace)  # generated from the fixed template above only
        return namespace["packer"]
