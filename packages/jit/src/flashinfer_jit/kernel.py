"""Loaded kernels and their launch path.

`load_kernel` compiles (or fetches from the disk cache), loads the cubin once per device and
keeps the result in an in-process table keyed by `(spec, device index)`; a warm call is one
dict lookup. `Kernel.launch` packs the arguments into one buffer laid out as the driver
reports the kernel's parameters (offsets and sizes from `cuKernelGetParamInfo`), then calls
`cuLaunchKernel` (or `cuLaunchKernelEx` for clusters and programmatic dependent launch) on
the current PyTorch stream.

Launch cost is kept low by caching, per kernel, a packing plan for each distinct tuple of
argument types (see `flashinfer_jit.arguments`), so a launch does one type-tuple lookup, one
`struct.pack_into` and the driver call. `Kernel.prepare_launch` fixes the geometry and options
of a launch that repeats (an op's launch for one argument signature) and keeps the driver's
launch configuration per stream, so a repeated launch does no checking of them either.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .arguments import ArgumentPacker
from .compiler import CompiledKernel, _check_spec, compile_kernel
from .device import (
    CUDA_ERROR_INVALID_CONTEXT,
    check,
    context_of,
    device_info,
    driver,
    error_name,
    no_current_device,
    resolve_device_index,
)
from .errors import KernelLaunchError
from .scalars import _as_index, _integer_scalar
from .spec import KernelSpec

_torch: Any = None
_raw_stream: Callable[[int], int] | None = None
_current_device: Callable[[], int] | None = None


def _torch_module() -> Any:
    global _torch, _raw_stream, _current_device
    if _torch is None:
        import torch

        try:
            from torch._C import _cuda_getCurrentRawStream as raw
            from torch._C import _cuda_getDevice as current

            _raw_stream, _current_device = raw, current
        except ImportError:  # pragma: no cover - every torch 2.x CUDA build has them

            def _fallback(index: int) -> int:
                return torch.cuda.current_stream(index).cuda_stream

            _raw_stream, _current_device = _fallback, torch.cuda.current_device
        # Last: another thread that sees `_torch` set reads the two hooks without the lock.
        _torch = torch
    return _torch


def stream_handle(stream: Any) -> int:
    """Return the raw `CUstream` handle of a stream-like object.

    Args:
        stream: An object implementing the `__cuda_stream__` protocol (cuda.core streams,
            recent PyTorch streams), a `torch.cuda.Stream`/`ExternalStream` (`.cuda_stream`),
            or an int handle (a numpy integer too).

    Returns:
        The handle as an int (0 is the legacy default stream).

    Raises:
        TypeError: `stream` is none of those.
        ValueError: An int handle outside [0, 2**64).
    """
    if isinstance(stream, int) and not isinstance(stream, bool):
        if not 0 <= stream < 2**64:
            raise ValueError(f"stream: an int handle must be in [0, 2**64), got {stream}")
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        value = protocol() if callable(protocol) else protocol
        return int(value[1])
    handle = getattr(stream, "cuda_stream", None)
    if handle is not None:
        return int(handle)
    numpy_handle = _integer_scalar(stream)
    if numpy_handle is not None:
        return stream_handle(numpy_handle)
    raise TypeError(
        "stream: expected a torch.cuda.Stream, an object with __cuda_stream__ or an int "
        f"handle, got {type(stream).__name__}"
        + (" (Kernel.launch takes stream=None for the current stream)" if stream is None else "")
    )


# Launch dimensions are unsigned 32-bit in the driver API; the hardware limits below that
# (grid y/z 65535, 1024 threads per block) are the driver's to report, as launch errors.
_DIM_END = 2**32


def _dim3(value: Any, what: str) -> tuple[int, int, int]:
    if type(value) is int:
        if 0 < value < _DIM_END:
            return value, 1, 1
    elif isinstance(value, (tuple, list)) and 1 <= len(value) <= 3:
        dims = tuple(value) + (1,) * (3 - len(value))
        if all(type(d) is int and 0 < d < _DIM_END for d in dims):
            return dims  # type: ignore[return-value]
    expected = "a positive int below 2**32 or a tuple of 1-3 such ints"
    items = value if isinstance(value, (tuple, list)) else (value,)
    if isinstance(value, (tuple, list)) and not 1 <= len(value) <= 3:
        raise ValueError(f"{what}: expected {expected}, got {len(value)} dimensions: {value!r}")
    for item in items:
        if type(item) is not int:  # bool, float, numpy integers: the size is not an int
            raise TypeError(f"{what}: expected {expected}, got {type(item).__name__} ({value!r})")
    raise ValueError(f"{what}: expected {expected}, got {value!r}")


class Kernel:
    """A kernel loaded on one device, ready to launch.

    Obtain one with `load_kernel`. Keep a reference to it in a launcher to skip even the
    lookup of `load_kernel`.

    Attributes:
        spec: The configuration it was built from.
        compiled: The compiled cubin with its resource report.
        device_index: The CUDA device it is loaded on.
        param_sizes: Byte size of each kernel parameter, from the driver.
    """

    def __init__(self, compiled: CompiledKernel, device_index: int) -> None:
        drv = driver()
        info = device_info(device_index)
        self.spec: KernelSpec = compiled.spec
        self.compiled = compiled
        self.device_index = device_index
        self._device = info.handle
        with context_of(device_index):
            self._library = check(
                drv.cuLibraryLoadData(compiled.cubin, None, None, 0, None, None, 0),
                f"cuLibraryLoadData({self.spec.label})",
            )
            self._kernel = check(
                drv.cuLibraryGetKernel(self._library, compiled.entry_name.encode()),
                f"cuLibraryGetKernel({compiled.entry_name})",
            )
            # The function in the primary context (the one PyTorch uses).
            self._function = check(drv.cuKernelGetFunction(self._kernel), "cuKernelGetFunction")
            # Needs a current context: outside it the driver answers INVALID_CONTEXT, which
            # read as "no parameters" in a process where PyTorch had not yet made one current.
            self._params = self._param_layout(drv)
        # Launch a CUkernel cast to CUfunction: the driver takes the context from the stream.
        self._launch_handle = drv.CUfunction(int(self._kernel))
        self.param_sizes = tuple(size for _, size in self._params)
        attr = drv.CUfunction_attribute
        self._static_smem = self._get_attr(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        self._smem_limit = self._get_attr(attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
        self._smem_cap = info.max_shared_memory_per_block_optin - self._static_smem
        self._non_portable_cluster = False
        self._packer = ArgumentPacker(self._params, device_index, self.spec.label)
        self._packer_without_device_checks: ArgumentPacker | None = None
        self._configs: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self._cuLaunchKernel = drv.cuLaunchKernel
        self._cuLaunchKernelEx = drv.cuLaunchKernelEx
        torch = _torch_module()
        self._raw_stream = _raw_stream
        self._current_device = _current_device
        self._capturing = torch.cuda.is_current_stream_capturing

    def _get_attr(self, attribute: Any) -> int:
        drv = driver()
        return int(
            check(drv.cuKernelGetAttribute(attribute, self._kernel, self._device), str(attribute))
        )

    def _param_layout(self, drv: Any) -> tuple[tuple[int, int], ...]:
        params = []
        while True:
            result = drv.cuKernelGetParamInfo(self._kernel, len(params))
            code = int(result[0])
            if code == 1:  # CUDA_ERROR_INVALID_VALUE: past the last parameter
                break
            if code:
                check(result, f"cuKernelGetParamInfo({self.spec.label}, {len(params)})")
            params.append((int(result[1]), int(result[2])))
        return tuple(params)

    def __repr__(self) -> str:
        return f"Kernel({self.spec.label!r}, device=cuda:{self.device_index}, arch={self.compiled.arch})"

    # ----------------------------------------------------------------------------------------
    # launch

    def launch(
        self,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        *args: Any,
        shared_mem: int = 0,
        cluster: int | tuple[int, ...] | None = None,
        stream: Any = None,
        programmatic: bool = False,
    ) -> None:
        """Launch the kernel asynchronously.

        Args:
            grid: Blocks per grid, an int or a tuple of up to 3 ints.
            block: Threads per block, an int or a tuple of up to 3 ints.
            *args: One argument per kernel parameter, in order: a `torch.Tensor` (its data
                pointer is passed; it must live on this kernel's device), a scalar wrapper
                (`i32`, `u32`, `i64`, `u64`, `f32`, `f64`), or a `TensorMap` (passed by value
                to a `const __grid_constant__ CUtensorMap` parameter). Plain Python numbers
                are rejected. Sizes are checked against the compiled parameter list.
            shared_mem: Dynamic shared memory per block in bytes. Above the 48 KiB default,
                the kernel's limit is raised once through the driver.
            cluster: Thread-block cluster dimensions (SM90+), an int or a tuple; each grid
                dimension must be a multiple of the matching cluster dimension.
            stream: None for `torch.cuda.current_stream()` of this device at call time
                (CUDA-graph capture works), or an explicit stream (see `stream_handle`).
            programmatic: Launch with programmatic stream serialization (programmatic
                dependent launch, PDL): the kernel may start before the previous kernel in
                the stream has finished, so it must execute `griddepcontrol.wait` before it
                touches memory that kernel may write. Kept in CUDA-graph capture.

        Raises:
            TypeError: Wrong number, type or size of arguments; a grid, block, cluster
                or `shared_mem` that is not a (tuple of) Python int.
            ValueError: Bad grid/block/cluster values, a tensor or PyTorch stream on another
                device, an int stream handle outside [0, 2**64), or `shared_mem` above what
                the device allows.
            KernelLaunchError: The driver refused the launch.
        """
        gx, gy, gz = (
            (grid, 1, 1) if type(grid) is int and 0 < grid < _DIM_END else _dim3(grid, "grid")
        )
        bx, by, bz = (
            (block, 1, 1) if type(block) is int and 0 < block < _DIM_END else _dim3(block, "block")
        )
        if type(shared_mem) is not int or not 0 <= shared_mem <= self._smem_limit:
            self._raise_shared_memory_limit(shared_mem)
        if cluster is not None and not (
            type(cluster) is tuple
            and len(cluster) == 3
            and type(cluster[0]) is int
            and type(cluster[1]) is int
            and type(cluster[2]) is int
        ):
            # Checked before it keys the configurations: True, 1.0 and numpy's 1 hash as 1.
            # (Three ints key them as they are; their range is checked when one is built.)
            cluster = _dim3(cluster, "cluster")
        handle = self._raw_stream(self.device_index) if stream is None else self._handle(stream)
        buffer, params = self._packer.pack(args)  # `buffer` must stay referenced until launched
        # The legacy/per-thread default streams (handles 0-2) belong to whatever context is
        # current. PyTorch's current device (a thread-local read, unlike the driver's
        # cuCtxGetCurrent, which costs ~1-2 us from Python) names the primary context it made
        # current; a thread with no context at all gets INVALID_CONTEXT, then the retry below.
        launch = (gx, gy, gz, bx, by, bz, shared_mem, cluster, programmatic, handle)
        if handle <= 2 and self._current_device() != self.device_index:
            self._refuse_launch_beside_a_capture()
            with context_of(self.device_index):
                self._launch(launch, params)
            return
        if cluster is None and not programmatic:
            (err,) = self._cuLaunchKernel(
                self._launch_handle, gx, gy, gz, bx, by, bz, shared_mem, handle, params, 0
            )
        else:
            err = self._launch_ex(launch, params)
        if err:
            if handle <= 2 and int(err) == CUDA_ERROR_INVALID_CONTEXT:
                with context_of(self.device_index):  # a thread where no context was current
                    self._launch(launch, params)
            else:
                self._launch_failed(err, launch)
        del buffer

    def prepare_launch(
        self,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        *,
        shared_mem: int = 0,
        cluster: int | tuple[int, ...] | None = None,
        programmatic: bool = False,
        devices_checked: bool = False,
    ) -> Callable[..., None]:
        """Fix everything of a launch but its arguments and stream; return `launch(*args)`.

        `launch(*args)` does what `launch(grid, block, *args, ...)` does with these options,
        including the current-stream lookup at call time (CUDA-graph capture works), for
        less host time: the geometry is checked and the shared-memory limit raised here, once,
        and the driver's launch configuration is kept per stream.

        Args:
            grid: As for `launch`.
            block: As for `launch`.
            shared_mem: As for `launch`.
            cluster: As for `launch`.
            programmatic: As for `launch`.
            devices_checked: The caller guarantees that every tensor argument, and every
                `TensorMap`'s tensor, lives on this kernel's device (for example because it
                validated them and keys the prepared launch on their devices), so the
                per-call device checks are skipped. A tensor on another device would then be
                read through a foreign address: leave this False unless that guarantee holds.

        Raises:
            TypeError: A grid, block, cluster or `shared_mem` that is not a (tuple of)
                Python int.
            ValueError: Bad grid, block, cluster or `shared_mem` values (here, not per call).
        """
        gx, gy, gz = _dim3(grid, "grid")
        bx, by, bz = _dim3(block, "block")
        if type(shared_mem) is not int or shared_mem < 0 or shared_mem > self._smem_limit:
            self._raise_shared_memory_limit(shared_mem)
        if cluster is not None:  # part of the configurations' keys: checked first
            cluster = _dim3(cluster, "cluster")
            self._launch_config((gx, gy, gz, bx, by, bz, shared_mem, cluster, programmatic, 0))
        pack = (self._unchecked_packer() if devices_checked else self._packer).pack
        raw_stream, current_device = self._raw_stream, self._current_device
        index, function = self.device_index, self._launch_handle
        launch_plain, launch_ex = self._cuLaunchKernel, self._cuLaunchKernelEx
        extended = cluster is not None or programmatic
        fixed = (gx, gy, gz, bx, by, bz, shared_mem, cluster, programmatic)
        configs: dict[int, Any] = {}  # stream handle -> the driver's launch configuration

        def launch(*args: Any) -> None:
            handle = raw_stream(index)
            buffer, params = pack(args)  # `buffer` must stay referenced until launched
            if handle <= 2 and current_device() != index:
                # A default stream of a device that is not current: `launch` finds the context.
                self.launch(
                    grid,
                    block,
                    *args,
                    shared_mem=shared_mem,
                    cluster=cluster,
                    programmatic=programmatic,
                )
                return
            if extended:
                config = configs.get(handle)
                if config is None:
                    if len(configs) > 256:  # streams seen in serving are few; bound memory
                        configs.clear()
                    config = configs[handle] = self._launch_config((*fixed, handle))
                (err,) = launch_ex(config, function, params, 0)
            else:
                (err,) = launch_plain(
                    function, gx, gy, gz, bx, by, bz, shared_mem, handle, params, 0
                )
            if err:
                if handle <= 2 and int(err) == CUDA_ERROR_INVALID_CONTEXT:
                    with context_of(index):  # a thread where no context was current
                        self._launch((*fixed, handle), params)
                else:
                    self._launch_failed(err, (*fixed, handle))
            del buffer

        return launch

    def _unchecked_packer(self) -> ArgumentPacker:
        packer = self._packer_without_device_checks
        if packer is None:
            packer = ArgumentPacker(
                self._params, self.device_index, self.spec.label, check_devices=False
            )
            self._packer_without_device_checks = packer
        return packer

    def _refuse_launch_beside_a_capture(self) -> None:
        """Raise if the calling thread is capturing a CUDA graph on another device's stream.

        The launch would go to this kernel's device's default stream, which that capture does
        not record: the kernel would run once, now, and never on replay. (Reached only for
        launches on a default stream of a device that is not current: no cost on the usual
        path.)
        """
        if self._capturing():
            current = self._current_device()
            raise RuntimeError(
                f"{self.spec.label!r}: a CUDA graph is being captured on the current stream "
                f"of cuda:{current}, but this launch's tensors are on cuda:{self.device_index} "
                f"and it would go to that device's default stream, outside the graph (run "
                f"once now, never on replay). Capture on a stream of cuda:{self.device_index}, "
                f"e.g. torch.cuda.graph(g, stream=torch.cuda.Stream({self.device_index}))."
            )

    def _handle(self, stream: Any) -> int:
        """`stream_handle`, refusing a stream of another device (PyTorch's or cuda.core's;
        an int handle or a bare `__cuda_stream__` object says no device): the driver would run
        the kernel on that stream's GPU with this device's addresses, or, for its default
        stream, on this device's default stream instead of the one named."""
        handle = stream_handle(stream)
        index = getattr(stream, "device_index", None)  # torch.cuda.Stream / ExternalStream
        if index is None:  # cuda.core's Stream: .device.device_id
            index = getattr(getattr(stream, "device", None), "device_id", None)
        if type(index) is int and index != self.device_index:
            raise ValueError(
                f"stream: {self.spec.label!r} runs on cuda:{self.device_index} but the stream "
                f"is on cuda:{index}"
            )
        return handle

    def _launch_ex(self, launch: tuple, params: Any) -> Any:
        # `launch` (grid, block, shared memory, cluster, PDL, stream) is also the config's key.
        if type(launch[7]) is list:  # a cluster list: hashable as a tuple
            launch = (*launch[:7], tuple(launch[7]), *launch[8:])
        config = self._configs.get(launch)
        if config is None:
            config = self._launch_config(launch)
        (err,) = self._cuLaunchKernelEx(config, self._launch_handle, params, 0)
        return err

    def _launch(self, launch: tuple, params: Any) -> None:
        gx, gy, gz, bx, by, bz, shared_mem, cluster, programmatic, handle = launch
        if cluster is None and not programmatic:
            (err,) = driver().cuLaunchKernel(
                self._launch_handle, gx, gy, gz, bx, by, bz, shared_mem, handle, params, 0
            )
        else:
            err = self._launch_ex(launch, params)
        if err:
            self._launch_failed(err, launch)

    def _launch_failed(self, err: Any, launch: tuple) -> None:
        gx, gy, gz, bx, by, bz, shared_mem, cluster, programmatic, handle = launch
        raise KernelLaunchError(
            f"launching {self.spec.label!r} on cuda:{self.device_index} failed: "
            f"{error_name(driver(), err)}; grid=({gx}, {gy}, {gz}) block=({bx}, {by}, {bz}) "
            f"shared_mem={shared_mem} cluster={cluster} programmatic={programmatic} "
            f"stream=0x{handle:x}"
        )

    def _raise_shared_memory_limit(self, shared_mem: int) -> None:
        if type(shared_mem) is not int:
            raise TypeError(
                f"shared_mem: expected a non-negative int, got {type(shared_mem).__name__} "
                f"({shared_mem!r})"
            )
        if shared_mem < 0:
            raise ValueError(f"shared_mem: expected a non-negative int, got {shared_mem!r}")
        if shared_mem > self._smem_cap:
            raise ValueError(
                f"shared_mem: {self.spec.label!r} asks for {shared_mem} bytes of dynamic shared "
                f"memory; cuda:{self.device_index} allows at most {self._smem_cap} per block "
                f"({self._smem_cap + self._static_smem} opt-in minus {self._static_smem} static)"
            )
        drv = driver()
        with self._lock:
            if shared_mem > self._smem_limit:
                check(
                    drv.cuKernelSetAttribute(
                        drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        shared_mem,
                        self._kernel,
                        self._device,
                    ),
                    "cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                )
                self._smem_limit = shared_mem

    def _launch_config(self, launch: tuple) -> Any:
        gx, gy, gz, bx, by, bz, shared_mem, cluster, programmatic, handle = launch
        grid = (gx, gy, gz)
        drv = driver()
        attributes = []
        if cluster is not None:
            cx, cy, cz = _dim3(cluster, "cluster")
            if grid[0] % cx or grid[1] % cy or grid[2] % cz:
                raise ValueError(
                    f"cluster: grid {grid} is not a multiple of cluster dimensions {(cx, cy, cz)}"
                )
            if cx * cy * cz > 8 and not self._non_portable_cluster:
                # SM90 runs clusters of up to 16 blocks, above the portable 8 only on request.
                check(
                    drv.cuKernelSetAttribute(
                        drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                        1,
                        self._kernel,
                        self._device,
                    ),
                    "cuKernelSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)",
                )
                self._non_portable_cluster = True
            attribute = drv.CUlaunchAttribute()
            attribute.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attribute.value.clusterDim.x = cx
            attribute.value.clusterDim.y = cy
            attribute.value.clusterDim.z = cz
            attributes.append(attribute)
        if programmatic:
            attribute = drv.CUlaunchAttribute()
            attribute.id = (
                drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            )
            attribute.value.programmaticStreamSerializationAllowed = 1
            attributes.append(attribute)
        config = drv.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
        config.sharedMemBytes = shared_mem
        config.hStream = handle
        config.attrs = attributes
        config.numAttrs = len(attributes)
        if len(self._configs) > 256:  # configurations seen in serving are few; bound memory
            self._configs.clear()
        self._configs[launch] = config
        return config

    def max_active_blocks_per_sm(self, block_threads: int, shared_mem: int = 0) -> int:
        """Return how many blocks of this kernel fit on one SM (occupancy).

        Args:
            block_threads: Threads per block.
            shared_mem: Dynamic shared memory per block in bytes.

        Returns:
            Resident blocks per SM.

        Raises:
            TypeError: `block_threads` or `shared_mem` is not an int (numpy integers are
                taken; bools and floats are not).
            ValueError: `block_threads` is not positive, or `shared_mem` is negative or above
                what the device allows.
            RuntimeError: The driver refused the query.
        """
        block_threads = _as_index(block_threads, "block_threads", "a positive int")
        if block_threads <= 0:
            raise ValueError(f"block_threads: expected a positive int, got {block_threads}")
        shared_mem = _as_index(shared_mem, "shared_mem", "a non-negative int")
        if not 0 <= shared_mem <= self._smem_limit:
            self._raise_shared_memory_limit(shared_mem)
        drv = driver()
        with context_of(self.device_index):
            return int(
                check(
                    drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                        self._function, block_threads, shared_mem
                    ),
                    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                )
            )


_LOADED: dict[tuple[KernelSpec, int], Kernel] = {}
_LOAD_LOCKS: dict[tuple[KernelSpec, int], threading.Lock] = {}
_LOAD_LOCKS_GUARD = threading.Lock()


def load_kernel(
    spec: KernelSpec, device: Any = None, *, cache_dir: str | Path | None = None
) -> Kernel:
    """Return `spec` loaded on a device, compiling for the device's arch if needed.

    Warm calls (same spec and device as before in this process) are a dict lookup: no
    hashing of sources, no file I/O, no driver calls.

    Args:
        spec: The kernel configuration.
        device: None (PyTorch's current device), an index, a `torch.device` or `"cuda:N"`.
        cache_dir: Disk cache root for a cold load (default `default_cache_dir()`).

    Returns:
        The loaded kernel.

    Raises:
        TypeError: `spec` is not a KernelSpec, or `device` is of another type.
        ValueError: `device` is not a CUDA device, its index is negative, or a string does not
            parse as a device.
        KernelCompileError: NVRTC rejected the source.
        RuntimeError: No driver/GPU (also for `device=None` without a CUDA device), or the
            driver failed to load the cubin.
    """
    if type(spec) is not KernelSpec:
        _check_spec(spec)  # a subclass passes; anything else is named here, not in a lookup
    if device is None:
        if _torch is None:
            _torch_module()  # picks `_current_device`, the launch path's query too
        try:
            index = _current_device()
        except (AssertionError, RuntimeError) as exc:  # CPU-only torch raises AssertionError
            raise no_current_device(exc) from None
    elif type(device) is int and device >= 0:
        index = device
    else:
        index = resolve_device_index(device)
    kernel = _LOADED.get((spec, index))
    if kernel is not None:
        return kernel
    return _load_cold(spec, index, cache_dir)


def _load_cold(spec: KernelSpec, index: int, cache_dir: str | Path | None) -> Kernel:
    key = (spec, index)
    with _LOAD_LOCKS_GUARD:
        lock = _LOAD_LOCKS.setdefault(key, threading.Lock())
    with lock:
        kernel = _LOADED.get(key)
        if kernel is None:
            arch = device_info(index).arch
            kernel = Kernel(compile_kernel(spec, arch, cache_dir=cache_dir), index)
            _LOADED[key] = kernel
    return kernel
