"""Kernel loading and launch logic against a recording stand-in for the CUDA driver.

The real driver calls are covered by the GPU tests; these check, on any machine, what
`Kernel` asks the driver to do: which handle, grid, stream and parameter bytes reach
`cuLaunchKernel`, when the shared-memory limit is raised, how clusters are configured and
when the context is switched.
"""

from __future__ import annotations

import ctypes
import struct
from types import SimpleNamespace

import pytest
import torch
from cuda.bindings import driver as real_driver
from flashinfer_jit import KernelLaunchError, compile_kernel, f32, i32
from flashinfer_jit import device as device_module
from flashinfer_jit import kernel as kernel_module
from flashinfer_jit.selftest import SCALE_ADD

OUR_CONTEXT = 0x5000
OTHER_CONTEXT = 0x6000
KERNEL_HANDLE = 0x1234
STREAM = 0xABC000
# scale_add(float* out, const float* a, const float* b, float alpha, int32_t n)
PARAMS = [(0, 8), (8, 8), (16, 8), (24, 4), (28, 4)]
CPU = -1  # loading "on device -1" lets CPU tensors pass the device check


class RecordingDriver:
    """Answers the driver calls `Kernel` makes and records them."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.current_context = OUR_CONTEXT
        self.launch_result = 0
        self.max_dynamic_shared = 49152
        self.launched_params: list[list[bytes]] = []
        # Types and enums are the real ones: they need no driver.
        for name in (
            "CUfunction",
            "CUlaunchConfig",
            "CUlaunchAttribute",
            "CUlaunchAttributeID",
            "CUfunction_attribute",
            "CUcontext",
        ):
            setattr(self, name, getattr(real_driver, name))

    def cuLibraryLoadData(self, code, *rest):
        self.calls.append(("cuLibraryLoadData", bytes(code[:4])))
        return 0, "library"

    def cuLibraryGetKernel(self, library, name):
        self.calls.append(("cuLibraryGetKernel", name))
        return 0, real_driver.CUkernel(KERNEL_HANDLE)

    def cuKernelGetFunction(self, kernel):
        self.calls.append(("cuKernelGetFunction", int(kernel)))
        return 0, real_driver.CUfunction(0x99)

    def cuKernelGetParamInfo(self, kernel, index):
        if index < len(PARAMS):
            return (0, *PARAMS[index])
        return 1, 0, 0

    def cuKernelGetAttribute(self, attribute, kernel, device):
        values = {
            real_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: 1024,
            real_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: self.max_dynamic_shared,
        }
        return 0, values[attribute]

    def cuKernelSetAttribute(self, attribute, value, kernel, device):
        self.calls.append(("cuKernelSetAttribute", attribute, value))
        return (0,)

    def cuDevicePrimaryCtxRetain(self, device):
        return 0, real_driver.CUcontext(OUR_CONTEXT)

    def cuCtxGetCurrent(self):
        return 0, real_driver.CUcontext(self.current_context)

    def cuCtxSetCurrent(self, context):
        self.calls.append(("cuCtxSetCurrent", int(context)))
        self.current_context = int(context)
        return (0,)

    def _read_params(self, address: int) -> list[bytes]:
        if not address:
            return []
        pointers = struct.unpack(f"<{len(PARAMS)}Q", ctypes.string_at(address, 8 * len(PARAMS)))
        return [ctypes.string_at(p, size) for p, (_, size) in zip(pointers, PARAMS)]

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.calls.append(
            (
                "cuLaunchKernel",
                int(f),
                (gx, gy, gz),
                (bx, by, bz),
                smem,
                stream,
                self.current_context,
            )
        )
        self.launched_params.append(self._read_params(params))
        return (self.launch_result,)

    def cuLaunchKernelEx(self, config, f, params, extra):
        ids = real_driver.CUlaunchAttributeID
        cluster, programmatic = None, False
        assert config.numAttrs == len(config.attrs)
        for attribute in config.attrs:
            if attribute.id == ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
                dim = attribute.value.clusterDim
                cluster = (dim.x, dim.y, dim.z)
            elif attribute.id == ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
                programmatic = bool(attribute.value.programmaticStreamSerializationAllowed)
            else:
                raise AssertionError(f"unexpected launch attribute {attribute.id}")
        self.calls.append(
            (
                "cuLaunchKernelEx",
                int(f),
                (config.gridDimX, config.gridDimY, config.gridDimZ),
                cluster,
                programmatic,
                int(config.hStream),
                config.sharedMemBytes,
                (config.blockDimX, config.blockDimY, config.blockDimZ),
            )
        )
        self.launched_params.append(self._read_params(params))
        return (self.launch_result,)

    def cuGetErrorName(self, err):
        return 0, b"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"

    def cuGetErrorString(self, err):
        return 0, b"too many resources requested for launch"


@pytest.fixture
def fake_driver(monkeypatch):
    fake = RecordingDriver()
    info = SimpleNamespace(handle=real_driver.CUdevice(0), max_shared_memory_per_block_optin=232448)
    monkeypatch.setattr(device_module, "_driver_module", fake)
    monkeypatch.setattr(device_module, "_device_info", lambda index: info)
    monkeypatch.setattr(kernel_module, "device_info", lambda index: info)
    device_module.primary_context.cache_clear()
    yield fake
    device_module.primary_context.cache_clear()


@pytest.fixture
def kernel(fake_driver, cache_dir):
    compiled = compile_kernel(SCALE_ADD, "sm_90a", cache_dir=cache_dir)
    loaded = kernel_module.Kernel(compiled, CPU)
    loaded._raw_stream = lambda index: STREAM  # what torch would report as current stream
    loaded._capturing = lambda: False  # no CUDA-graph capture on PyTorch's current stream
    fake_driver.calls.clear()
    return loaded


def _args(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    out, a, b = (torch.randn(8, generator=gen) for _ in range(3))
    return out, a, b, f32(1.5), i32(8)


def _expected_bytes(args) -> list[bytes]:
    out, a, b, alpha, n = args
    return [
        struct.pack("<Q", out.data_ptr()),
        struct.pack("<Q", a.data_ptr()),
        struct.pack("<Q", b.data_ptr()),
        struct.pack("<f", alpha.value),
        struct.pack("<i", n.value),
    ]


def test_loading_goes_through_the_library_api(fake_driver, cache_dir):
    compiled = compile_kernel(SCALE_ADD, "sm_90a", cache_dir=cache_dir)
    loaded = kernel_module.Kernel(compiled, CPU)
    names = [call[0] for call in fake_driver.calls]
    assert names[:3] == ["cuLibraryLoadData", "cuLibraryGetKernel", "cuKernelGetFunction"]
    assert fake_driver.calls[0][1] == b"\x7fELF"
    assert fake_driver.calls[1][1] == b"scale_add"
    assert loaded.param_sizes == (8, 8, 8, 4, 4)


def test_launch_on_the_current_stream_passes_the_packed_arguments(kernel, fake_driver):
    args = _args()
    kernel.launch(3, 128, *args)
    assert fake_driver.calls == [
        ("cuLaunchKernel", KERNEL_HANDLE, (3, 1, 1), (128, 1, 1), 0, STREAM, OUR_CONTEXT)
    ]
    assert fake_driver.launched_params == [_expected_bytes(args)]


def test_explicit_streams_and_tuple_dims(kernel, fake_driver):
    class ProtocolStream:
        def __cuda_stream__(self):
            return (0, 0xDEF000)

    args = _args(1)
    kernel.launch((2, 3), (32, 4, 1), *args, stream=ProtocolStream())
    kernel.launch(1, 32, *args, stream=SimpleNamespace(cuda_stream=0xFED000))
    launches = [c for c in fake_driver.calls if c[0] == "cuLaunchKernel"]
    assert [(c[2], c[3], c[5]) for c in launches] == [
        ((2, 3, 1), (32, 4, 1), 0xDEF000),
        ((1, 1, 1), (32, 1, 1), 0xFED000),
    ]


def test_shared_memory_limit_is_raised_once(kernel, fake_driver):
    args = _args()
    for _ in range(3):
        kernel.launch(1, 128, *args, shared_mem=100 * 1024)
    kernel.launch(1, 128, *args, shared_mem=40 * 1024)  # below the raised limit
    raises = [c for c in fake_driver.calls if c[0] == "cuKernelSetAttribute"]
    assert raises == [
        (
            "cuKernelSetAttribute",
            real_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            100 * 1024,
        )
    ]
    with pytest.raises(ValueError, match=r"allows at most 231424 per block"):
        kernel.launch(1, 128, *args, shared_mem=232448 - 1024 + 4)


def test_cluster_launch_uses_launch_kernel_ex(kernel, fake_driver):
    args = _args()
    kernel.launch(8, 64, *args, cluster=(2, 1, 1))
    kernel.launch(16, 64, *args, cluster=16)
    ex = [c for c in fake_driver.calls if c[0] == "cuLaunchKernelEx"]
    assert ex == [
        ("cuLaunchKernelEx", KERNEL_HANDLE, (8, 1, 1), (2, 1, 1), False, STREAM, 0, (64, 1, 1)),
        ("cuLaunchKernelEx", KERNEL_HANDLE, (16, 1, 1), (16, 1, 1), False, STREAM, 0, (64, 1, 1)),
    ]
    assert fake_driver.launched_params == [_expected_bytes(args)] * 2
    non_portable = [c for c in fake_driver.calls if c[0] == "cuKernelSetAttribute"]
    assert len(non_portable) == 1  # only the 16-block cluster needed it
    with pytest.raises(ValueError, match="not a multiple of cluster"):
        kernel.launch(9, 64, *args, cluster=2)


@pytest.mark.parametrize("programmatic", [False, True])
def test_extended_launch_passes_3d_grid_and_block_exactly(kernel, fake_driver, programmatic):
    args = _args()
    options = {"cluster": (2, 1, 3), "programmatic": programmatic}
    kernel.launch((4, 5, 6), (8, 4, 2), *args, **options)
    kernel.prepare_launch((4, 5, 6), (8, 4, 2), **options)(*args)
    expected = ("cuLaunchKernelEx", KERNEL_HANDLE, (4, 5, 6), (2, 1, 3), programmatic, STREAM, 0)
    assert fake_driver.calls == [(*expected, (8, 4, 2))] * 2


def test_a_cluster_of_8_is_portable_and_of_9_needs_the_non_portable_attribute(kernel, fake_driver):
    args = _args()
    kernel.launch((2, 2, 2), 64, *args, cluster=(2, 2, 2))
    kernel.prepare_launch(8, 64, cluster=8)(*args)
    assert [c[0] for c in fake_driver.calls] == ["cuLaunchKernelEx"] * 2
    kernel.launch(9, 64, *args, cluster=(9, 1, 1))
    assert fake_driver.calls[2] == (
        "cuKernelSetAttribute",
        real_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
        1,
    )
    assert fake_driver.calls[3][:4] == ("cuLaunchKernelEx", KERNEL_HANDLE, (9, 1, 1), (9, 1, 1))


def test_programmatic_launch_carries_the_attribute(kernel, fake_driver):
    args = _args()
    kernel.launch(4, 64, *args, shared_mem=1024, programmatic=True)
    kernel.launch(8, 64, *args, cluster=2, programmatic=True)
    kernel.launch(4, 64, *args)  # without it: the plain launch
    assert [c[0] for c in fake_driver.calls if c[0].startswith("cuLaunch")] == [
        "cuLaunchKernelEx",
        "cuLaunchKernelEx",
        "cuLaunchKernel",
    ]
    ex = [c for c in fake_driver.calls if c[0] == "cuLaunchKernelEx"]
    assert ex == [
        ("cuLaunchKernelEx", KERNEL_HANDLE, (4, 1, 1), None, True, STREAM, 1024, (64, 1, 1)),
        ("cuLaunchKernelEx", KERNEL_HANDLE, (8, 1, 1), (2, 1, 1), True, STREAM, 0, (64, 1, 1)),
    ]
    assert fake_driver.launched_params == [_expected_bytes(args)] * 3


def test_default_stream_switches_to_the_kernels_context_and_back(kernel, fake_driver):
    kernel._raw_stream = lambda index: 0
    kernel._current_device = lambda: kernel.device_index + 1  # PyTorch is on another GPU
    fake_driver.current_context = OTHER_CONTEXT
    kernel.launch(1, 32, *_args())
    assert fake_driver.calls == [
        ("cuCtxSetCurrent", OUR_CONTEXT),
        ("cuLaunchKernel", KERNEL_HANDLE, (1, 1, 1), (32, 1, 1), 0, 0, OUR_CONTEXT),
        ("cuCtxSetCurrent", OTHER_CONTEXT),
    ]
    fake_driver.calls.clear()
    kernel._current_device = lambda: kernel.device_index
    fake_driver.current_context = OUR_CONTEXT
    kernel.launch(1, 32, *_args())
    assert [c[0] for c in fake_driver.calls] == ["cuLaunchKernel"]  # no switch needed


@pytest.mark.parametrize("handle", [1, 2], ids=["legacy", "per_thread"])
def test_legacy_and_per_thread_default_streams_switch_to_the_kernels_context(
    kernel, fake_driver, handle
):
    """Handles 1 (CU_STREAM_LEGACY) and 2 (CU_STREAM_PER_THREAD) name the default streams of
    the current context, like 0: launched from another device, the context is switched."""
    kernel._current_device = lambda: kernel.device_index + 1  # PyTorch is on another GPU
    fake_driver.current_context = OTHER_CONTEXT
    kernel.launch(1, 32, *_args(), stream=handle)
    kernel._raw_stream = lambda index: handle
    kernel.prepare_launch(1, 32)(*_args())
    switched = [
        ("cuCtxSetCurrent", OUR_CONTEXT),
        ("cuLaunchKernel", KERNEL_HANDLE, (1, 1, 1), (32, 1, 1), 0, handle, OUR_CONTEXT),
        ("cuCtxSetCurrent", OTHER_CONTEXT),
    ]
    assert fake_driver.calls == switched * 2


def test_default_stream_of_another_device_during_a_capture_is_refused(kernel, fake_driver):
    # PyTorch's current stream (of another GPU) is capturing a graph; the launch would go to
    # this kernel's device's default stream, which the capture does not record.
    kernel._raw_stream = lambda index: 0
    kernel._current_device = lambda: kernel.device_index + 1
    kernel._capturing = lambda: True
    with pytest.raises(RuntimeError, match="outside the graph") as caught:
        kernel.launch(1, 32, *_args())
    assert f"cuda:{kernel.device_index + 1}" in str(caught.value)
    assert f"torch.cuda.Stream({kernel.device_index})" in str(caught.value)
    assert fake_driver.calls == []


def test_default_stream_in_a_thread_without_a_context_retries_in_the_kernels(
    kernel, fake_driver, monkeypatch
):
    kernel._raw_stream = lambda index: 0
    kernel._current_device = lambda: kernel.device_index  # the runtime's default, device 0
    fake_driver.current_context = 0
    original = fake_driver.cuLaunchKernel

    def launch(*args):
        original(*args)
        return (201 if fake_driver.current_context == 0 else 0,)  # INVALID_CONTEXT

    monkeypatch.setattr(fake_driver, "cuLaunchKernel", launch)
    kernel._cuLaunchKernel = launch  # the fast path keeps the driver function it was built with
    kernel.launch(1, 32, *_args())
    assert [(c[0], c[-1]) for c in fake_driver.calls] == [
        ("cuLaunchKernel", 0),
        ("cuCtxSetCurrent", OUR_CONTEXT),
        ("cuLaunchKernel", OUR_CONTEXT),
        ("cuCtxSetCurrent", 0),
    ]


def test_driver_errors_become_kernel_launch_errors(kernel, fake_driver):
    fake_driver.launch_result = 701
    with pytest.raises(KernelLaunchError, match="CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES") as info:
        kernel.launch(4, 1024, *_args())
    assert "grid=(4, 1, 1) block=(1024, 1, 1)" in str(info.value)


@pytest.mark.parametrize(
    ("grid", "block", "message"),
    [
        (0, 32, "grid: expected a positive int"),
        (1, (32, 0), r"block: .* got \(32, 0\)"),
        (1, (1, 2, 3, 4), "block: .* got 4 dimensions"),
        (1, (), "block: .* got 0 dimensions"),
        (2**32, 32, "grid: .* got 4294967296"),
        (1, (32, 2**32), "block: .* got"),
        (-1, 32, "grid: .* got -1"),
    ],
)
def test_launch_dimensions_out_of_range_are_value_errors(kernel, fake_driver, grid, block, message):
    with pytest.raises(ValueError, match=message):
        kernel.launch(grid, block, *_args())
    with pytest.raises(ValueError, match=message):
        kernel.prepare_launch(grid, block)
    assert not [c for c in fake_driver.calls if c[0].startswith("cuLaunch")]


@pytest.mark.parametrize(
    ("grid", "block", "message"),
    [
        (1.0, 32, r"grid: expected .* got float \(1\.0\)"),
        (True, 32, r"grid: expected .* got bool \(True\)"),
        ("4", 32, "grid: expected .* got str"),
        (1, (32, 2.0), r"block: expected .* got float \(\(32, 2\.0\)\)"),
        (1, {32: 1}, "block: expected .* got dict"),
        (None, 32, "grid: expected .* got NoneType"),
    ],
)
def test_launch_dimensions_of_another_type_are_type_errors(
    kernel, fake_driver, grid, block, message
):
    with pytest.raises(TypeError, match=message):
        kernel.launch(grid, block, *_args())
    with pytest.raises(TypeError, match=message):
        kernel.prepare_launch(grid, block)
    assert not [c for c in fake_driver.calls if c[0].startswith("cuLaunch")]


def test_a_cluster_of_another_type_or_size_is_refused(kernel, fake_driver):
    with pytest.raises(TypeError, match=r"cluster: expected .* got float \(2\.0\)"):
        kernel.launch(2, 32, *_args(), cluster=2.0)
    with pytest.raises(ValueError, match=r"cluster: expected .* got 0"):
        kernel.launch(2, 32, *_args(), cluster=0)
    assert not [c for c in fake_driver.calls if c[0].startswith("cuLaunch")]
    # Also once the configuration of an equal-hashing int cluster is cached (True, 1.0 and
    # numpy's 1 hash as 1), and for unhashable values, which a key lookup would name badly.
    kernel.launch(2, 32, *_args(), cluster=1)
    kernel.prepare_launch(2, 32, cluster=2)
    launches = len([c for c in fake_driver.calls if c[0].startswith("cuLaunch")])
    for cluster, name in [(True, "bool"), (1.0, "float"), ((1.0,), "float"), (2.0, "float")]:
        with pytest.raises(TypeError, match=f"cluster: expected .* got {name}"):
            kernel.launch(2, 32, *_args(), cluster=cluster)
        with pytest.raises(TypeError, match=f"cluster: expected .* got {name}"):
            kernel.prepare_launch(2, 32, cluster=cluster)
    for cluster in ({2: 1}, {2}):
        with pytest.raises(TypeError, match=f"cluster: expected .* got {type(cluster).__name__}"):
            kernel.launch(2, 32, *_args(), cluster=cluster)
    assert len([c for c in fake_driver.calls if c[0].startswith("cuLaunch")]) == launches


@pytest.mark.parametrize(
    ("shared_mem", "error", "message"),
    [
        (-1, ValueError, "shared_mem: expected a non-negative int, got -1"),
        (True, TypeError, r"shared_mem: expected a non-negative int, got bool \(True\)"),
        (1.5, TypeError, r"shared_mem: expected a non-negative int, got float \(1\.5\)"),
        ("1024", TypeError, "shared_mem: expected a non-negative int, got str"),
    ],
)
def test_bad_shared_memory_is_refused_before_the_driver(
    kernel, fake_driver, shared_mem, error, message
):
    with pytest.raises(error, match=message):
        kernel.launch(1, 32, *_args(), shared_mem=shared_mem)
    with pytest.raises(error, match=message):
        kernel.prepare_launch(1, 32, shared_mem=shared_mem)
    assert not [c for c in fake_driver.calls if c[0].startswith("cuLaunch")]


def test_tensor_map_encoded_on_a_thread_without_a_context_retries_in_the_primary_one(
    fake_driver, monkeypatch
):
    from flashinfer_jit import make_tensor_map

    for name in (
        "CUtensorMapDataType",
        "CUtensorMapInterleave",
        "CUtensorMapSwizzle",
        "CUtensorMapL2promotion",
        "CUtensorMapFloatOOBfill",
        "cuuint32_t",
        "cuuint64_t",
    ):
        setattr(fake_driver, name, getattr(real_driver, name))
    descriptor = ctypes.create_string_buffer(bytes(range(128)), 128)

    def encode(*args):
        fake_driver.calls.append(("cuTensorMapEncodeTiled", fake_driver.current_context))
        if fake_driver.current_context == 0:
            return 201, None  # CUDA_ERROR_INVALID_CONTEXT: no context on this thread
        return 0, SimpleNamespace(getPtr=lambda: ctypes.addressof(descriptor))

    fake_driver.cuTensorMapEncodeTiled = encode
    monkeypatch.setattr(device_module, "resolve_device_index", lambda device=None: 0)
    fake_driver.current_context = 0
    tensor_map = make_tensor_map(0x10000, torch.float32, (64, 64), (256,), (32, 32), swizzle="none")
    assert fake_driver.calls == [
        ("cuTensorMapEncodeTiled", 0),
        ("cuCtxSetCurrent", OUR_CONTEXT),
        ("cuTensorMapEncodeTiled", OUR_CONTEXT),
        ("cuCtxSetCurrent", 0),
    ]
    assert tensor_map.raw == bytes(range(128))


# Kernel.prepare_launch: the same driver calls as `launch`, with the checks done once.


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"shared_mem": 100 * 1024},
        {"programmatic": True, "shared_mem": 1024},
        {"cluster": 2, "programmatic": True},
        {"cluster": (2, 1, 1)},
    ],
)
def test_prepared_launch_makes_the_calls_launch_makes(kernel, fake_driver, options):
    args = _args(3)
    kernel.launch(8, 64, *args, **options)
    direct = [c for c in fake_driver.calls if c[0].startswith("cuLaunch")]
    fake_driver.calls.clear()
    launch = kernel.prepare_launch(8, 64, **options)
    for _ in range(2):
        launch(*args)
    prepared = [c for c in fake_driver.calls if c[0].startswith("cuLaunch")]
    assert prepared == direct * 2
    assert fake_driver.launched_params == [_expected_bytes(args)] * 3


def test_prepared_launch_reads_the_current_stream_per_call(kernel, fake_driver):
    current = {"stream": STREAM}
    kernel._raw_stream = lambda index: current["stream"]
    launch = kernel.prepare_launch(4, 64, programmatic=True)
    plain = kernel.prepare_launch(4, 64)
    for stream in (STREAM, 0xDEF000, STREAM):
        current["stream"] = stream
        launch(*_args())
        plain(*_args())
    assert [(c[0], c[5]) for c in fake_driver.calls] == [
        ("cuLaunchKernelEx", STREAM),
        ("cuLaunchKernel", STREAM),
        ("cuLaunchKernelEx", 0xDEF000),
        ("cuLaunchKernel", 0xDEF000),
        ("cuLaunchKernelEx", STREAM),
        ("cuLaunchKernel", STREAM),
    ]


def test_prepared_launch_checks_its_geometry_when_prepared(kernel, fake_driver):
    with pytest.raises(ValueError, match="positive int"):
        kernel.prepare_launch(0, 64)
    with pytest.raises(ValueError, match="positive int"):
        kernel.prepare_launch(1, (32, 0))
    with pytest.raises(ValueError, match="not a multiple of cluster"):
        kernel.prepare_launch(9, 64, cluster=2)
    with pytest.raises(ValueError, match=r"allows at most 231424 per block"):
        kernel.prepare_launch(1, 64, shared_mem=232448)
    with pytest.raises(ValueError, match="non-negative int"):
        kernel.prepare_launch(1, 64, shared_mem=-1)
    kernel.prepare_launch(1, 64, shared_mem=100 * 1024)
    raises = [c for c in fake_driver.calls if c[0] == "cuKernelSetAttribute"]
    assert [c[2] for c in raises] == [100 * 1024]  # raised when prepared, not per launch
    assert not [c for c in fake_driver.calls if c[0].startswith("cuLaunch")]


def test_prepared_launch_checks_devices_unless_the_caller_did(fake_driver, cache_dir):
    compiled = compile_kernel(SCALE_ADD, "sm_90a", cache_dir=cache_dir)
    on_gpu0 = kernel_module.Kernel(compiled, 0)
    on_gpu0._raw_stream = lambda index: STREAM
    args = _args()  # CPU tensors: get_device() is -1, not 0
    with pytest.raises(ValueError, match="runs on cuda:0 but got a tensor on cpu"):
        on_gpu0.prepare_launch(1, 32)(*args)
    with pytest.raises(ValueError, match="runs on cuda:0 but got a tensor on cpu"):
        on_gpu0.launch(1, 32, *args)
    fake_driver.calls.clear()
    on_gpu0.prepare_launch(1, 32, devices_checked=True)(*args)
    assert [c[0] for c in fake_driver.calls] == ["cuLaunchKernel"]
    assert fake_driver.launched_params[-1] == _expected_bytes(args)


def test_prepared_launch_on_the_default_stream_of_another_device(kernel, fake_driver):
    kernel._raw_stream = lambda index: 0
    kernel._current_device = lambda: kernel.device_index + 1  # PyTorch is on another GPU
    fake_driver.current_context = OTHER_CONTEXT
    kernel.prepare_launch(1, 32)(*_args())
    assert fake_driver.calls == [
        ("cuCtxSetCurrent", OUR_CONTEXT),
        ("cuLaunchKernel", KERNEL_HANDLE, (1, 1, 1), (32, 1, 1), 0, 0, OUR_CONTEXT),
        ("cuCtxSetCurrent", OTHER_CONTEXT),
    ]


def test_prepared_launch_errors_name_the_launch(kernel, fake_driver):
    fake_driver.launch_result = 701
    launch = kernel.prepare_launch(4, 1024, programmatic=True)
    with pytest.raises(KernelLaunchError, match="CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES") as info:
        launch(*_args())
    assert "grid=(4, 1, 1) block=(1024, 1, 1)" in str(info.value)
    assert "programmatic=True" in str(info.value)


def test_a_cluster_given_as_a_list_launches_like_the_tuple(kernel, fake_driver):
    args = _args()
    kernel.launch(8, 64, *args, cluster=[2])
    kernel.prepare_launch(8, 64, cluster=[2, 1])(*args)
    ex = [c for c in fake_driver.calls if c[0] == "cuLaunchKernelEx"]
    assert len(ex) == 2 and all(c[3] == (2, 1, 1) for c in ex)


@pytest.mark.parametrize("handle", [-1, 2**64])
def test_an_int_stream_outside_64_bits_is_a_value_error_naming_stream(kernel, handle):
    with pytest.raises(
        ValueError, match=rf"^stream: an int handle must be in \[0, 2\*\*64\), got {handle}$"
    ):
        kernel.launch(1, 32, *_args(), stream=handle)


def _torch_like_stream(device: int) -> SimpleNamespace:
    return SimpleNamespace(cuda_stream=0xD00D, device_index=device)


def _cuda_core_like_stream(device: int) -> SimpleNamespace:
    return SimpleNamespace(cuda_stream=0xD00D, device=SimpleNamespace(device_id=device))


@pytest.mark.parametrize("make_stream", [_torch_like_stream, _cuda_core_like_stream])
@pytest.mark.parametrize("stream_device", [1, 0])
def test_a_stream_of_another_device_is_refused(kernel, fake_driver, stream_device, make_stream):
    # Kernel on "device -1" (CPU tensors pass its checks); stand-ins with the attributes of a
    # torch.cuda.Stream (device_index) and of a cuda.core Stream (device.device_id).
    stream = make_stream(stream_device)
    with pytest.raises(
        ValueError,
        match=rf"^stream: 'scale_add.*' runs on cuda:-1 but the stream is on cuda:{stream_device}$",
    ):
        kernel.launch(1, 32, *_args(), stream=stream)
    assert not [c for c in fake_driver.calls if c[0].startswith("cuLaunch")]
    same = make_stream(kernel.device_index)
    kernel.launch(1, 32, *_args(), stream=same)
    assert [c[1] for c in fake_driver.calls if c[0] == "cuLaunchKernel"] == [KERNEL_HANDLE]


def test_torch_module_publishes_torch_only_after_its_hooks(monkeypatch):
    # Another thread that sees `_torch` set reads the hooks without a lock: they must be set.
    seen = {}
    real_import = (
        __builtins__["__import__"] if isinstance(__builtins__, dict) else __builtins__.__import__
    )

    def spying_import(name, *rest, **kw):
        if name == "torch._C" and kernel_module._torch is not None:
            seen["hooks"] = (kernel_module._raw_stream, kernel_module._current_device)
        return real_import(name, *rest, **kw)

    monkeypatch.setattr(kernel_module, "_torch", None)
    monkeypatch.setattr(kernel_module, "_raw_stream", None)
    monkeypatch.setattr(kernel_module, "_current_device", None)
    monkeypatch.setattr("builtins.__import__", spying_import)
    kernel_module._torch_module()
    monkeypatch.undo()
    assert "hooks" not in seen  # `_torch` was still None while the hooks were being picked


@pytest.mark.parametrize(
    ("block_threads", "shared_mem", "error", "message"),
    [
        (128.0, 0, TypeError, r"block_threads: expected a positive int, got float"),
        (True, 0, TypeError, r"block_threads: expected a positive int, got bool"),
        (0, 0, ValueError, r"block_threads: expected a positive int, got 0"),
        (128, "x", TypeError, r"shared_mem: expected a non-negative int, got str"),
        (128, 1.0, TypeError, r"shared_mem: expected a non-negative int, got float"),
        (128, -1, ValueError, r"shared_mem: expected a non-negative int, got -1"),
        (128, 232449, ValueError, r"shared_mem: .* allows at most"),
    ],
)
def test_occupancy_query_arguments_are_checked_before_the_driver(
    kernel, fake_driver, block_threads, shared_mem, error, message, monkeypatch
):
    # The recording driver has no occupancy query of its own: give it one that records, so
    # "not asked" is observed rather than implied by a missing method.
    asked = []
    monkeypatch.setattr(
        fake_driver,
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        lambda *args: asked.append(args) or (0, 1),
        raising=False,
    )
    with pytest.raises(error, match=message):
        kernel.max_active_blocks_per_sm(block_threads, shared_mem)
    assert asked == []


@pytest.mark.parametrize("spec", [{}, "scale_add", None, [SCALE_ADD]])
def test_load_kernel_names_a_spec_of_another_type(fake_driver, spec):
    with pytest.raises(TypeError, match=r"spec: expected a KernelSpec, got"):
        kernel_module.load_kernel(spec, 0)


def test_occupancy_query_takes_numpy_integers(kernel, fake_driver, monkeypatch):
    import numpy as np

    asked = []

    def occupancy(function, block_threads, shared_mem):
        asked.append((type(block_threads), block_threads, type(shared_mem), shared_mem))
        return 0, 3

    monkeypatch.setattr(
        fake_driver, "cuOccupancyMaxActiveBlocksPerMultiprocessor", occupancy, raising=False
    )
    assert kernel.max_active_blocks_per_sm(np.int64(128), np.int32(1024)) == 3
    assert asked == [(int, 128, int, 1024)]


def test_load_kernel_takes_a_kernel_spec_subclass(fake_driver, cache_dir, monkeypatch):
    class LabelledSpec(type(SCALE_ADD)):
        pass

    info = kernel_module.device_info(0)
    monkeypatch.setattr(
        kernel_module, "device_info", lambda index: SimpleNamespace(**vars(info), arch="sm_90a")
    )
    spec = LabelledSpec(*SCALE_ADD._identity(), label="sub")
    try:
        loaded = kernel_module.load_kernel(spec, 0, cache_dir=cache_dir)
        assert loaded.spec is spec and loaded.compiled.entry_name == "scale_add"
    finally:
        kernel_module._LOADED.pop((spec, 0), None)


def test_a_numpy_integer_stream_handle_is_an_int_handle():
    import numpy as np

    assert kernel_module.stream_handle(np.int64(0xD00D)) == 0xD00D
    assert kernel_module.stream_handle(np.uint64(2**64 - 1)) == 2**64 - 1
    with pytest.raises(ValueError, match=r"^stream: an int handle must be in \[0, 2\*\*64\)"):
        kernel_module.stream_handle(np.int64(-1))
    with pytest.raises(TypeError, match=r"^stream: expected a torch\.cuda\.Stream"):
        kernel_module.stream_handle(np.True_)


@pytest.mark.parametrize(
    "tensor", [torch.tensor(7), torch.tensor([9]), torch.tensor(True)], ids=["0d", "1el", "bool"]
)
def test_a_tensor_is_not_a_stream_handle(kernel, fake_driver, tensor):
    with pytest.raises(TypeError, match=r"^stream: expected a torch\.cuda\.Stream.*got Tensor"):
        kernel.launch(1, 32, *_args(), stream=tensor)
    assert not [c for c in fake_driver.calls if c[0].startswith("cuLaunchKernel")]
