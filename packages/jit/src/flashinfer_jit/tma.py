"""TMA tensor-map descriptors (`CUtensorMap`) for torch tensors, via `cuTensorMapEncodeTiled`.

A descriptor is 128 opaque bytes the kernel receives by value as a
`const __grid_constant__ CUtensorMap` parameter; `Kernel.launch` copies `TensorMap.raw`
into the parameter buffer. Dimensions follow the driver's convention: index 0 is the
innermost (contiguous) dimension. For a row-major `[rows, cols]` tensor::

    global_dims          = (cols, rows)
    global_strides_bytes = (row_stride_bytes,)        # rank - 1 entries, dims 1..rank-1
    box_dims             = (box_cols, box_rows)

`tensor_map_for` derives all of that from a tensor and a box shape given in PyTorch's
(outermost-first) order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .scalars import _as_index, _integer_scalar

_SWIZZLE_BYTES = {"none": 0, "32B": 32, "64B": 64, "128B": 128}
_SWIZZLE_ENUM = {
    "none": "CU_TENSOR_MAP_SWIZZLE_NONE",
    "32B": "CU_TENSOR_MAP_SWIZZLE_32B",
    "64B": "CU_TENSOR_MAP_SWIZZLE_64B",
    "128B": "CU_TENSOR_MAP_SWIZZLE_128B",
}
_L2_ENUM = {
    "none": "CU_TENSOR_MAP_L2_PROMOTION_NONE",
    "64B": "CU_TENSOR_MAP_L2_PROMOTION_L2_64B",
    "128B": "CU_TENSOR_MAP_L2_PROMOTION_L2_128B",
    "256B": "CU_TENSOR_MAP_L2_PROMOTION_L2_256B",
}
_OOB_ENUM = {
    "none": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE",
    "nan": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA",
}
_INTERLEAVE_ENUM = {
    "none": "CU_TENSOR_MAP_INTERLEAVE_NONE",
    "16B": "CU_TENSOR_MAP_INTERLEAVE_16B",
    "32B": "CU_TENSOR_MAP_INTERLEAVE_32B",
}
# torch dtype name -> CU_TENSOR_MAP_DATA_TYPE suffix. TMA copies bytes; fp8/fp4 travel as
# UINT8 (SM90 TMA has no 8-bit float types and never converts).
_DATA_TYPES = {
    "uint8": "UINT8",
    "int8": "UINT8",
    "float8_e4m3fn": "UINT8",
    "float8_e5m2": "UINT8",
    "float8_e8m0fnu": "UINT8",
    "float4_e2m1fn_x2": "UINT8",
    "int16": "UINT16",
    "uint16": "UINT16",
    "float16": "FLOAT16",
    "bfloat16": "BFLOAT16",
    "int32": "INT32",
    "uint32": "UINT32",
    "float32": "FLOAT32",
    "int64": "INT64",
    "uint64": "UINT64",
    "float64": "FLOAT64",
}


class TensorMap:
    """A 128-byte TMA descriptor, passed by value to a `__grid_constant__ CUtensorMap`.

    It keeps a reference to the tensor it describes so the memory outlives the descriptor.

    Attributes:
        raw: The 128 descriptor bytes.
        dtype: The torch dtype described.
        global_dims: Dimensions, innermost first.
        box_dims: Box (tile) dimensions, innermost first.
        swizzle: Swizzle mode name.
        device_index: The CUDA device of the described tensor; None for a raw address,
            whose device the descriptor cannot know.
    """

    __slots__ = ("_keepalive", "box_dims", "device_index", "dtype", "global_dims", "raw", "swizzle")

    def __init__(
        self,
        raw: bytes,
        dtype: Any,
        global_dims: tuple[int, ...],
        box_dims: tuple[int, ...],
        swizzle: str,
        keepalive: Any = None,
        device_index: int | None = None,
    ) -> None:
        if len(raw) != 128:
            raise ValueError(f"TensorMap: expected 128 descriptor bytes, got {len(raw)}")
        self.raw = bytes(raw)
        self.dtype = dtype
        self.global_dims = global_dims
        self.box_dims = box_dims
        self.swizzle = swizzle
        self._keepalive = keepalive
        self.device_index = device_index

    def __repr__(self) -> str:
        return (
            f"TensorMap(dtype={self.dtype}, global_dims={self.global_dims}, "
            f"box_dims={self.box_dims}, swizzle={self.swizzle!r})"
        )


def _choice(value: str, table: dict[str, str], what: str) -> str:
    if not isinstance(value, str):  # a list would fail the lookup unnamed; str enums pass
        raise TypeError(f"{what}: expected one of {sorted(table)}, got {type(value).__name__}")
    if value not in table:
        raise ValueError(f"{what}: expected one of {sorted(table)}, got {value!r}")
    return table[value]


def _ints(values: Sequence[int], what: str) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{what}: expected a sequence of ints, got {type(values).__name__}")
    return tuple(_as_index(v, what, "ints") for v in values)


def validate_tensor_map_args(
    address: int,
    element_size: int,
    global_dims: Sequence[int],
    global_strides_bytes: Sequence[int],
    box_dims: Sequence[int],
    element_strides: Sequence[int] | None,
    swizzle: str,
    interleave: str,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Check arguments against the `cuTensorMapEncodeTiled` rules, with readable errors.

    Args:
        address: Global memory address of the first element.
        element_size: Bytes per element.
        global_dims: Dimensions, innermost first (1 to 5 of them).
        global_strides_bytes: Byte strides of dimensions 1..rank-1.
        box_dims: Box dimensions, innermost first.
        element_strides: Traversal strides per dimension, or None for all ones.
        swizzle: `"none"`, `"32B"`, `"64B"` or `"128B"`.
        interleave: `"none"`, `"16B"` or `"32B"`.

    Returns:
        `(global_dims, global_strides_bytes, box_dims, element_strides)` as int tuples.

    Raises:
        ValueError: A rule is broken; the message names the argument and the rule.
        TypeError: An argument is not a sequence of ints.
    """
    dims = _ints(global_dims, "global_dims")
    strides = _ints(global_strides_bytes, "global_strides_bytes")
    box = _ints(box_dims, "box_dims")
    rank = len(dims)
    if not 1 <= rank <= 5:
        raise ValueError(f"global_dims: TMA supports rank 1 to 5, got rank {rank} ({dims})")
    elems = (1,) * rank if element_strides is None else _ints(element_strides, "element_strides")
    if len(strides) != rank - 1:
        raise ValueError(
            f"global_strides_bytes: expected {rank - 1} strides (for dims 1..{rank - 1}, "
            f"innermost dim is contiguous), got {len(strides)} ({strides})"
        )
    if len(box) != rank or len(elems) != rank:
        raise ValueError(
            f"box_dims and element_strides need {rank} entries like global_dims; got "
            f"box_dims={box}, element_strides={elems}"
        )
    base_align = 32 if interleave == "32B" else 16
    if not 0 <= address < 2**64:
        raise ValueError(f"tensor address {address} is not a 64-bit device address")
    if address % base_align:
        raise ValueError(f"tensor address 0x{address:x} must be {base_align}-byte aligned for TMA")
    for i, d in enumerate(dims):
        if not 1 <= d <= 2**32:
            raise ValueError(f"global_dims[{i}] = {d} is outside [1, 2**32]")
    for i, s in enumerate(strides):
        if s % 16 or not 0 < s < 2**40:
            raise ValueError(
                f"global_strides_bytes[{i}] = {s} must be a positive multiple of 16 below 2**40"
            )
    for i, b in enumerate(box):
        if not 1 <= b <= 256:
            raise ValueError(f"box_dims[{i}] = {b} is outside [1, 256]")
    for i, e in enumerate(elems):
        if not 1 <= e <= 8:
            raise ValueError(f"element_strides[{i}] = {e} is outside [1, 8]")
    inner_bytes = box[0] * element_size
    if interleave == "none":
        if inner_bytes % 16:
            raise ValueError(
                f"box_dims[0] * element size = {inner_bytes} bytes must be a multiple of 16"
            )
        span = _SWIZZLE_BYTES[swizzle]
        if span and inner_bytes > span:
            raise ValueError(
                f"box_dims[0] * element size = {inner_bytes} bytes exceeds the {swizzle} "
                f"swizzle span; use a box of at most {span // element_size} elements"
            )
    return dims, strides, box, elems


def _dtype_or_refuse(dtype: Any) -> Any:
    import torch

    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: expected a torch.dtype or None, got {type(dtype).__name__}")
    return dtype


def _data_type_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DATA_TYPES:
        raise ValueError(f"dtype: {dtype} has no TMA data type; supported: {sorted(_DATA_TYPES)}")
    return _DATA_TYPES[name]


def make_tensor_map(
    tensor_or_ptr: Any,
    dtype: Any,
    global_dims: Sequence[int],
    global_strides_bytes: Sequence[int],
    box_dims: Sequence[int],
    *,
    swizzle: str = "128B",
    element_strides: Sequence[int] | None = None,
    l2_promotion: str = "128B",
    oob_fill: str = "none",
    interleave: str = "none",
) -> TensorMap:
    """Encode a tiled TMA descriptor for a global-memory tensor.

    Args:
        tensor_or_ptr: A CUDA `torch.Tensor` (its `data_ptr()` is the base address, and the
            described extent is checked against its storage) or an int device address (a
            numpy integer too).
        dtype: torch dtype of the elements (`None` to take the tensor's). 8-bit float and
            packed fp4 types are described as bytes.
        global_dims: Dimensions, innermost (contiguous) first; 1 to 5 of them.
        global_strides_bytes: Byte strides of dims 1..rank-1 (rank-1 entries, multiples
            of 16).
        box_dims: Tile moved by one TMA instruction, innermost first; each at most 256.
        swizzle: Shared-memory swizzle: `"128B"`, `"64B"`, `"32B"` or `"none"`. The inner box
            extent in bytes must not exceed the swizzle span.
        element_strides: Per-dimension traversal stride (1 to 8), None for all ones.
        l2_promotion: L2 sector promotion: `"none"`, `"64B"`, `"128B"` or `"256B"`.
        oob_fill: Out-of-bounds fill: `"none"` (zeros) or `"nan"`.
        interleave: `"none"`, `"16B"` or `"32B"` (interleaved layouts only).

    Returns:
        The descriptor, ready to pass to `Kernel.launch`.

    Raises:
        TypeError: `tensor_or_ptr` is neither a tensor nor an int, `dtype` is not a
            torch.dtype, a choice (`swizzle`, ...) is not a str, or a size list holds non-ints.
        ValueError: A TMA rule is broken (alignment, stride, box size, swizzle span), the
            dtype is unsupported, the tensor is not on a CUDA device, or the described
            extent runs past the tensor's storage.
        RuntimeError: The driver rejects the descriptor.
    """
    import ctypes

    swizzle_enum = _choice(swizzle, _SWIZZLE_ENUM, "swizzle")
    l2_enum = _choice(l2_promotion, _L2_ENUM, "l2_promotion")
    oob_enum = _choice(oob_fill, _OOB_ENUM, "oob_fill")
    interleave_enum = _choice(interleave, _INTERLEAVE_ENUM, "interleave")
    keepalive = None
    numpy_address = _integer_scalar(tensor_or_ptr)
    if numpy_address is not None:
        tensor_or_ptr = numpy_address
    if isinstance(tensor_or_ptr, int) and not isinstance(tensor_or_ptr, bool):
        if dtype is None:
            raise ValueError("dtype: required when tensor_or_ptr is an address")
        address = tensor_or_ptr
        import torch

        element_size = torch.empty((), dtype=_dtype_or_refuse(dtype)).element_size()
        available = None
    elif hasattr(tensor_or_ptr, "data_ptr") and hasattr(tensor_or_ptr, "untyped_storage"):
        tensor = tensor_or_ptr
        if not tensor.is_cuda:
            raise ValueError(f"tensor_or_ptr: TMA needs a CUDA tensor, got one on {tensor.device}")
        dtype = tensor.dtype if dtype is None else _dtype_or_refuse(dtype)
        element_size = tensor.element_size()
        import torch

        if torch.empty((), dtype=dtype).element_size() != element_size:
            raise ValueError(
                f"dtype: {dtype} has a different element size than the tensor's {tensor.dtype}"
            )
        address = tensor.data_ptr()
        storage = tensor.untyped_storage()
        available = storage.data_ptr() + storage.nbytes() - address
        keepalive = tensor
    else:
        raise TypeError(
            f"tensor_or_ptr: expected a CUDA torch.Tensor or an int address, "
            f"got {type(tensor_or_ptr).__name__}"
        )
    data_type = _data_type_name(dtype)
    dims, strides, box, elems = validate_tensor_map_args(
        address,
        element_size,
        global_dims,
        global_strides_bytes,
        box_dims,
        element_strides,
        swizzle,
        interleave,
    )
    if available is not None:
        last_byte = element_size + sum((d - 1) * s for d, s in zip(dims, (element_size, *strides)))
        if last_byte > available:
            raise ValueError(
                f"global_dims {dims} with strides {strides} span {last_byte} bytes but the "
                f"tensor's storage has {available} bytes from its data pointer"
            )

    from .device import (
        CUDA_ERROR_INVALID_CONTEXT,
        check,
        context_of,
        driver,
        resolve_device_index,
    )

    drv = driver()

    def encode() -> Any:
        return drv.cuTensorMapEncodeTiled(
            getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{data_type}"),
            # Older cuda-bindings (13.3) accept only the wrapped integer types here.
            drv.cuuint32_t(len(dims)),
            address,
            [drv.cuuint64_t(d) for d in dims],
            [drv.cuuint64_t(s) for s in strides],
            [drv.cuuint32_t(b) for b in box],
            [drv.cuuint32_t(e) for e in elems],
            getattr(drv.CUtensorMapInterleave, interleave_enum),
            getattr(drv.CUtensorMapSwizzle, swizzle_enum),
            getattr(drv.CUtensorMapL2promotion, l2_enum),
            getattr(drv.CUtensorMapFloatOOBfill, oob_enum),
        )

    result = encode()
    if int(result[0]) == CUDA_ERROR_INVALID_CONTEXT:
        # The encoding needs a current context, and a thread that has not yet called into
        # the CUDA runtime (a fresh Python thread on a side stream) has none: encode under
        # the device's primary context, the one PyTorch uses.
        index = keepalive.device.index if keepalive is not None else resolve_device_index()
        with context_of(index):
            result = encode()
    tensor_map = check(
        result,
        f"cuTensorMapEncodeTiled(dims={dims}, strides={strides}, box={box}, swizzle={swizzle})",
    )
    raw = ctypes.string_at(tensor_map.getPtr(), 128)
    device_index = keepalive.device.index if keepalive is not None else None
    return TensorMap(raw, dtype, dims, box, swizzle, keepalive, device_index)


def tensor_map_for(
    tensor: Any,
    box_shape: Sequence[int],
    *,
    swizzle: str = "128B",
    l2_promotion: str = "128B",
    oob_fill: str = "none",
) -> TensorMap:
    """Encode a descriptor for a tensor whose last dimension is contiguous.

    Args:
        tensor: CUDA tensor of rank 1 to 5 with `stride(-1) == 1`; other strides may be
            arbitrary (row pitch, slices) as long as their byte sizes are multiples of 16.
        box_shape: Tile shape in PyTorch's order (outermost first), same rank as `tensor`.
        swizzle: See `make_tensor_map`.
        l2_promotion: See `make_tensor_map`.
        oob_fill: See `make_tensor_map`.

    Returns:
        The descriptor.

    Raises:
        TypeError: `tensor` is not a torch.Tensor, `box_shape` is not a sequence of ints, or
            a choice (`swizzle`, ...) is not a str.
        ValueError: `tensor` is not on a CUDA device, the last dimension is not contiguous,
            ranks differ, or a TMA rule is broken.
    """
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor: expected a CUDA torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() == 0:
        raise ValueError("tensor: TMA describes tensors of 1 to 5 dimensions, got a 0-d tensor")
    box = _ints(box_shape, "box_shape")
    if tensor.dim() != len(box):
        raise ValueError(
            f"box_shape: expected {tensor.dim()} entries for a {tensor.dim()}-d tensor of "
            f"shape {tuple(tensor.shape)}, got {box}"
        )
    if tensor.dim() == 0 or tensor.stride(-1) != 1:
        raise ValueError(
            f"tensor: TMA needs a contiguous last dimension; got shape {tuple(tensor.shape)} "
            f"strides {tensor.stride()}"
        )
    size = tensor.element_size()
    strides_bytes: list[int] = []  # innermost first, as the descriptor takes them
    inner_extent = tensor.shape[-1] * size
    for d in range(tensor.dim() - 2, -1, -1):
        if tensor.shape[d] == 1:
            # PyTorch leaves a size-1 dimension's stride arbitrary (`is_contiguous()` ignores
            # it) and TMA never steps along it: use the packed value, rounded up to 16.
            stride = max(16, -(-inner_extent // 16) * 16)
        else:
            stride = tensor.stride(d) * size
            if stride % 16 or not 0 < stride < 2**40:
                raise ValueError(
                    f"tensor: TMA needs each outer dimension's stride to be a positive multiple "
                    f"of 16 bytes below 2**40; dimension {d} of shape {tuple(tensor.shape)} has "
                    f"stride {tensor.stride(d)} elements = {stride} bytes (strides "
                    f"{tensor.stride()}, {size}-byte elements)"
                )
        strides_bytes.append(stride)
        inner_extent = stride * tensor.shape[d]
    return make_tensor_map(
        tensor,
        tensor.dtype,
        global_dims=tuple(reversed(tensor.shape)),
        global_strides_bytes=tuple(strides_bytes),
        box_dims=tuple(reversed(box)),
        swizzle=swizzle,
        l2_promotion=l2_promotion,
        oob_fill=oob_fill,
    )
