"""Device queries through the CUDA driver API, cached per device index.

Nothing runs at import. The first query initialises the driver (`cuInit`), which does not
create a context; loading a kernel retains the device's primary context, the same one
PyTorch uses.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_driver_module: Any = None
_driver_lock = threading.Lock()

# The driver's answer to a call that needs a current context on a thread that has none.
CUDA_ERROR_INVALID_CONTEXT = 201


def driver() -> Any:
    """Return `cuda.bindings.driver`, initialised (`cuInit`) on first use.

    Returns:
        The `cuda.bindings.driver` module.

    Raises:
        RuntimeError: No NVIDIA driver can be loaded or `cuInit` fails.
    """
    global _driver_module
    if _driver_module is None:
        with _driver_lock:
            if _driver_module is None:
                from cuda.bindings import driver as drv

                try:
                    (err,) = drv.cuInit(0)
                except Exception as exc:  # the pathfinder raises when libcuda is absent
                    raise RuntimeError(
                        f"cannot load the NVIDIA driver (libcuda): {str(exc).rstrip('.')}. "
                        f"Kernels need an NVIDIA GPU and driver; compiling (compile_kernel, precompile, "
                        f"inspect, compile-check) works without one."
                    ) from None
                if err:
                    raise RuntimeError(f"cuInit failed: {error_name(drv, err)}")
                _driver_module = drv
    return _driver_module


def error_name(drv: Any, err: Any) -> str:
    """Return `"CUDA_ERROR_X (description)"` for a driver result code."""
    try:
        _, name = drv.cuGetErrorName(err)
        _, text = drv.cuGetErrorString(err)
        return f"{name.decode()} ({text.decode()})"
    except Exception:
        return repr(err)


def check(result: Any, what: str) -> Any:
    """Unpack a `cuda.bindings` result tuple, raising on a non-zero status.

    Args:
        result: `(status, *values)` as returned by `cuda.bindings.driver` functions.
        what: Description of the call for the error message.

    Returns:
        None, the single value, or a tuple of values.

    Raises:
        RuntimeError: The status is not `CUDA_SUCCESS`.
    """
    status, *values = result
    if status:
        raise RuntimeError(f"{what} failed: {error_name(_driver_module, status)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def arch_for_capability(major: int, minor: int) -> str:
    """Return the full NVRTC target for a compute capability.

    From SM90 on, the arch-specific target (`a` suffix: wgmma, TMA multicast, setmaxnreg,
    ...) is used, since kernels are compiled for exactly the device they run on.

    Args:
        major: Compute capability major version.
        minor: Compute capability minor version.

    Returns:
        For example `"sm_90a"` for 9.0, `"sm_100a"` for 10.0, `"sm_89"` for 8.9.

    Raises:
        TypeError: `major` or `minor` is not an int.
        ValueError: `major` is not in [1, 99] (no SM target to name), or `minor` is not in
            [0, 9].
    """
    for name, value in (("major", major), ("minor", minor)):
        if type(value) is not int:
            raise TypeError(f"{name}: expected an int, got {type(value).__name__} ({value!r})")
    if not 1 <= major <= 99 or not 0 <= minor <= 9:
        raise ValueError(
            f"compute capability: expected major in [1, 99] and minor in [0, 9], got "
            f"{major}.{minor}"
        )
    return f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"


def current_device_index() -> int:
    """Return PyTorch's current CUDA device index.

    Raises:
        RuntimeError: PyTorch has no CUDA device (a CPU-only build, no driver, no GPU); the
            message says that compiling still works.
    """
    import torch

    try:
        return torch.cuda.current_device()
    except (AssertionError, RuntimeError) as exc:  # CPU-only torch raises AssertionError
        raise no_current_device(exc) from None


def no_current_device(exc: BaseException) -> RuntimeError:
    """The error for a device without an index where PyTorch has no current CUDA device."""
    return RuntimeError(
        f"device: without an index it is PyTorch's current CUDA device, but there is none ({exc}). "
        f"Kernels need an NVIDIA GPU and driver; compiling (compile_kernel, precompile with "
        f"arch=..., inspect, compile-check) works without one."
    )


def resolve_device_index(device: Any = None) -> int:
    """Turn a device argument into a CUDA device index.

    Args:
        device: None (PyTorch's current CUDA device), an int index, a `torch.device` or a
            string such as `"cuda:1"`.

    Returns:
        The device index.

    Raises:
        TypeError: `device` is of another type.
        ValueError: The device is not a CUDA device, the index is negative, or a string does
            not parse as a device.
        RuntimeError: `device` names no index and PyTorch has no CUDA device.
    """
    if device is None:
        return current_device_index()
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"device: expected a non-negative CUDA device index, got {device}")
        return device
    if isinstance(device, str) or type(device).__name__ == "device":
        import torch

        try:
            dev = torch.device(device)
        except RuntimeError as err:  # "bogus", "cuda:-1", "cuda:x"
            raise ValueError(f"device: cannot parse {device!r} as a device ({err})") from None
        if dev.type != "cuda":
            raise ValueError(f"device: expected a CUDA device, got {dev}")
        return dev.index if dev.index is not None else current_device_index()
    raise TypeError(
        f"device: expected None, an int, a torch.device or a str, got {type(device).__name__}"
    )


@dataclass(frozen=True)
class DeviceInfo:
    """Static properties of one CUDA device.

    Attributes:
        index: Device index (as PyTorch numbers them, honouring CUDA_VISIBLE_DEVICES).
        name: Marketing name, for example `"NVIDIA H200"`.
        compute_capability: `(major, minor)`.
        arch: Full NVRTC target, see `arch_for_capability`.
        sm_count: Number of streaming multiprocessors.
        max_shared_memory_per_block: Default per-block shared memory limit (48 KiB).
        max_shared_memory_per_block_optin: Per-block limit a kernel may opt in to.
        max_shared_memory_per_sm: Shared memory per SM.
        l2_cache_bytes: L2 cache size.
        handle: The driver `CUdevice`.
    """

    index: int
    name: str
    compute_capability: tuple[int, int]
    arch: str
    sm_count: int
    max_shared_memory_per_block: int
    max_shared_memory_per_block_optin: int
    max_shared_memory_per_sm: int
    l2_cache_bytes: int
    handle: Any


@functools.cache
def _device_info(index: int) -> DeviceInfo:
    drv = driver()
    count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    if index >= count:
        raise ValueError(f"device: index {index} out of range, {count} CUDA device(s) visible")
    dev = check(drv.cuDeviceGet(index), f"cuDeviceGet({index})")
    attr = drv.CUdevice_attribute

    def get(name: str) -> int:
        return int(check(drv.cuDeviceGetAttribute(getattr(attr, name), dev), name))

    raw_name = check(drv.cuDeviceGetName(256, dev), "cuDeviceGetName")
    major = get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR")
    minor = get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")
    return DeviceInfo(
        index=index,
        name=raw_name.split(b"\0", 1)[0].decode(),
        compute_capability=(major, minor),
        arch=arch_for_capability(major, minor),
        sm_count=get("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
        max_shared_memory_per_block=get("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK"),
        max_shared_memory_per_block_optin=get(
            "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"
        ),
        max_shared_memory_per_sm=get("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
        l2_cache_bytes=get("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"),
        handle=dev,
    )


def device_info(device: Any = None) -> DeviceInfo:
    """Return the cached static properties of a device.

    Args:
        device: None (current PyTorch device), index, `torch.device` or `"cuda:N"`.

    Returns:
        The device's properties.

    Raises:
        RuntimeError: No driver is available, or `device` names no index (None, `"cuda"`)
            and PyTorch has no CUDA device.
        ValueError: The device is not a CUDA device (`"cpu"`, say), the index is negative or
            (checked once the driver has loaded) out of range, or a string does not parse as
            a device.
        TypeError: `device` is not None, an int, a `torch.device` or a str (a float, a bool
            or a numpy integer, say).
    """
    return _device_info(resolve_device_index(device))


def device_arch(device: Any = None) -> str:
    """Return the NVRTC target of a device, for example `"sm_90a"` for an H100/H200.

    Args:
        device: None (current PyTorch device), index, `torch.device` or `"cuda:N"`.

    Returns:
        The full arch string.

    Raises:
        RuntimeError, ValueError, TypeError: As for `device_info`, which resolves `device`.
    """
    return device_info(device).arch


def sm_count(device: Any = None) -> int:
    """Return the number of SMs of a device (132 on an H100 SXM / H200).

    Args:
        device: None (current PyTorch device), index, `torch.device` or `"cuda:N"`.

    Returns:
        The SM count.

    Raises:
        RuntimeError, ValueError, TypeError: As for `device_info`, which resolves `device`.
    """
    return device_info(device).sm_count


def max_shared_memory_per_block_optin(device: Any = None) -> int:
    """Return the largest shared memory per block a kernel can opt in to, in bytes.

    Args:
        device: None (current PyTorch device), index, `torch.device` or `"cuda:N"`.

    Returns:
        Bytes (232448, i.e. 227 KiB, on SM90).

    Raises:
        RuntimeError, ValueError, TypeError: As for `device_info`, which resolves `device`.
    """
    return device_info(device).max_shared_memory_per_block_optin


def require_supported_arch(device: Any = None, supported: Iterable[str] = ("sm_90a",)) -> str:
    """Check that a device is one the caller has kernels for.

    Args:
        device: None (current PyTorch device), index, `torch.device` or `"cuda:N"`.
        supported: Arch strings the caller's kernels are built for.

    Returns:
        The device's arch string.

    Raises:
        RuntimeError: The device's arch is not in `supported`; the message names the GPU,
            its compute capability and the supported architectures. Also when no driver is
            available, or `device` names no index (None, `"cuda"`) and PyTorch has no CUDA
            device.
        ValueError: As for `device_info`, which resolves `device`.
        TypeError: `supported` is a str or bytes (a single arch rather than a sequence of
            them) or is not iterable (checked before `device`); or as for `device_info`.
    """
    if isinstance(supported, (str, bytes)) or not isinstance(supported, Iterable):
        raise TypeError(
            f"supported: expected a sequence of arch strings such as ('sm_90a',), got "
            f"{type(supported).__name__} ({supported!r:.60})"
        )
    info = device_info(device)
    supported = tuple(supported)
    if info.arch not in supported:
        major, minor = info.compute_capability
        raise RuntimeError(
            f"cuda:{info.index} is a {info.name} (compute capability {major}.{minor}, "
            f"{info.arch}); these kernels support only {', '.join(supported)}"
        )
    return info.arch


@functools.cache
def primary_context(index: int) -> Any:
    """Retain and return the primary context of a device (the one PyTorch uses).

    Args:
        index: Device index.

    Returns:
        The driver `CUcontext`.
    """
    drv = driver()
    return check(
        drv.cuDevicePrimaryCtxRetain(_device_info(index).handle), "cuDevicePrimaryCtxRetain"
    )


class context_of:
    """Context manager making a device's primary context current, restoring the previous one.

    Args:
        index: Device index.
    """

    def __init__(self, index: int) -> None:
        self._ctx = primary_context(index)
        self._previous: Any = None

    def __enter__(self) -> Any:
        drv = driver()
        self._previous = check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(self._previous) != int(self._ctx):
            check(drv.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        return self._ctx

    def __exit__(self, *exc: object) -> None:
        drv = driver()
        if int(self._previous) != int(self._ctx):
            check(drv.cuCtxSetCurrent(self._previous), "cuCtxSetCurrent")
