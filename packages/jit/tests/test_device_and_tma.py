"""Device helpers and TMA argument checks that need no GPU."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
import torch
from flashinfer_jit import (
    arch_for_capability,
    device_arch,
    device_info,
    load_kernel,
    make_tensor_map,
    max_shared_memory_per_block_optin,
    precompile,
    require_supported_arch,
    sm_count,
    tensor_map_for,
)
from flashinfer_jit import device as device_module
from flashinfer_jit import kernel as kernel_module
from flashinfer_jit import tma as tma_module
from flashinfer_jit.selftest import SCALE_ADD
from flashinfer_jit.tma import validate_tensor_map_args


@pytest.mark.parametrize(
    ("capability", "arch"),
    [
        ((9, 0), "sm_90a"),
        ((10, 0), "sm_100a"),
        ((12, 0), "sm_120a"),
        ((8, 9), "sm_89"),
        ((8, 0), "sm_80"),
    ],
)
def test_arch_for_capability(capability, arch):
    assert arch_for_capability(*capability) == arch


@pytest.mark.parametrize(
    ("capability", "error", "fragment"),
    [
        (("9", "0"), TypeError, "major: expected an int, got str"),
        ((9.0, 0), TypeError, "major: expected an int, got float"),
        ((True, 0), TypeError, "major: expected an int, got bool"),
        ((9, None), TypeError, "minor: expected an int, got NoneType"),
        ((-1, 0), ValueError, r"minor in \[0, 9\], got -1\.0"),
        ((9, 10), ValueError, r"minor in \[0, 9\], got 9\.10"),
        ((9, -1), ValueError, r"minor in \[0, 9\], got 9\.-1"),
        # No SM target has these names (sm_00, sm_1000a): check_arch refuses them.
        ((0, 0), ValueError, r"major in \[1, 99\] and minor in \[0, 9\], got 0\.0"),
        ((100, 0), ValueError, r"major in \[1, 99\] and minor in \[0, 9\], got 100\.0"),
    ],
)
def test_arch_for_capability_rejects_what_is_no_capability(capability, error, fragment):
    with pytest.raises(error, match=fragment):
        arch_for_capability(*capability)


def _without_cuda(exc: BaseException):
    def current_device() -> int:
        raise exc

    return current_device


NO_CUDA = [
    AssertionError("Torch not compiled with CUDA enabled"),  # a CPU-only torch build
    RuntimeError("Found no NVIDIA driver on your system."),  # a CUDA build without a GPU
]


@pytest.mark.parametrize("exc", NO_CUDA, ids=["cpu_torch", "no_driver"])
@pytest.mark.parametrize(
    "query",
    [
        device_info,
        device_arch,
        sm_count,
        max_shared_memory_per_block_optin,
        require_supported_arch,
        pytest.param(device_module.resolve_device_index, id="resolve_device_index"),
        pytest.param(
            lambda device: precompile([SCALE_ADD], device, progress=False), id="precompile"
        ),
        pytest.param(
            lambda device: precompile(
                [SCALE_ADD], device, arch="sm_90a", load=True, progress=False
            ),
            id="precompile_load",
        ),
    ],
)
@pytest.mark.parametrize("device", [None, "cuda"])
def test_the_current_device_without_cuda_is_a_clear_runtime_error(monkeypatch, exc, query, device):
    monkeypatch.setattr(torch.cuda, "current_device", _without_cuda(exc))
    with pytest.raises(
        RuntimeError,
        match="device: without an index it is PyTorch's current CUDA device, but there is none",
    ) as info:
        query(device)
    assert str(exc) in str(info.value)


@pytest.mark.parametrize("exc", NO_CUDA, ids=["cpu_torch", "no_driver"])
def test_load_kernel_on_the_current_device_without_cuda_is_a_clear_runtime_error(monkeypatch, exc):
    kernel_module._torch_module()  # the first call picks the query; this test replaces it after
    monkeypatch.setattr(kernel_module, "_current_device", _without_cuda(exc))
    with pytest.raises(
        RuntimeError,
        match="device: without an index it is PyTorch's current CUDA device, but there is none",
    ):
        load_kernel(SCALE_ADD)


def test_load_kernel_on_the_current_device_keeps_the_launch_paths_device_query(monkeypatch):
    # The launch path asks `torch._C._cuda_getDevice` (no lazy-init wrapper) where the build has
    # it; a first `load_kernel(spec)` used to replace that, for every kernel loaded after it,
    # with `torch.cuda.current_device`.
    monkeypatch.setattr(kernel_module, "_torch", None)
    monkeypatch.setattr(kernel_module, "_current_device", None)
    try:
        load_kernel(SCALE_ADD)
    except RuntimeError:
        pass  # no GPU here; the query was picked before the load failed
    expected = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
    assert kernel_module._current_device is expected


def _fake_device(monkeypatch, name: str, capability: tuple[int, int]) -> None:
    info = device_module.DeviceInfo(
        index=0,
        name=name,
        compute_capability=capability,
        arch=arch_for_capability(*capability),
        sm_count=108,
        max_shared_memory_per_block=49152,
        max_shared_memory_per_block_optin=166912,
        max_shared_memory_per_sm=167936,
        l2_cache_bytes=40 * 2**20,
        handle=None,
    )
    monkeypatch.setattr(device_module, "_device_info", lambda index: info)


def test_unsupported_gpu_error_names_gpu_capability_and_supported(monkeypatch):
    _fake_device(monkeypatch, "NVIDIA A100-SXM4-80GB", (8, 0))
    with pytest.raises(RuntimeError) as info:
        require_supported_arch(0)
    message = str(info.value)
    assert "NVIDIA A100-SXM4-80GB" in message
    assert "compute capability 8.0" in message
    assert "sm_90a" in message


@pytest.mark.parametrize("supported", ["sm_90a", None, 90])
def test_supported_archs_must_be_a_sequence_of_strings(monkeypatch, supported):
    """A bare str would be split into its characters (and a matching GPU refused)."""
    _fake_device(monkeypatch, "NVIDIA H100 80GB HBM3", (9, 0))
    with pytest.raises(TypeError, match=r"^supported: expected a sequence of arch strings"):
        require_supported_arch(0, supported)
    assert require_supported_arch(0, ["sm_90a"]) == "sm_90a"


def test_supported_gpu_passes(monkeypatch):
    _fake_device(monkeypatch, "NVIDIA H200", (9, 0))
    assert require_supported_arch(0) == "sm_90a"
    assert require_supported_arch("cuda:0", supported=("sm_90a", "sm_100a")) == "sm_90a"


@pytest.mark.parametrize(
    ("device", "error", "message"),
    [
        (-1, ValueError, "device: expected a non-negative CUDA device index, got -1"),
        ("cpu", ValueError, "device: expected a CUDA device, got cpu"),
        (1.0, TypeError, "device: expected None, an int, a torch.device or a str, got float"),
        ("bogus", ValueError, r"device: cannot parse 'bogus' as a device \(.*\)"),
        ("cuda:-1", ValueError, r"device: cannot parse 'cuda:-1' as a device \(.*\)"),
        ("cuda:x", ValueError, r"device: cannot parse 'cuda:x' as a device \(.*\)"),
    ],
)
def test_bad_device_arguments(device, error, message):
    with pytest.raises(error, match=f"^{message}$"):
        device_module.resolve_device_index(device)


GOOD = {
    "address": 0x7F0000000000,
    "element_size": 4,
    "global_dims": (100, 200),
    "global_strides_bytes": (400,),
    "box_dims": (32, 64),
    "element_strides": None,
    "swizzle": "128B",
    "interleave": "none",
}


def test_valid_tensor_map_arguments_pass():
    dims, strides, box, elems = validate_tensor_map_args(**GOOD)
    assert (dims, strides, box, elems) == ((100, 200), (400,), (32, 64), (1, 1))


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"address": 0x7F0000000008}, "16-byte aligned"),
        ({"global_strides_bytes": (404,)}, "multiple of 16"),
        ({"global_strides_bytes": ()}, "expected 1 strides"),
        ({"box_dims": (32, 300)}, r"box_dims\[1\] = 300"),
        ({"box_dims": (64, 64)}, "exceeds the 128B swizzle span"),
        ({"box_dims": (32, 64), "swizzle": "64B"}, "exceeds the 64B swizzle span"),
        ({"box_dims": (3, 64), "swizzle": "none"}, "multiple of 16"),
        ({"global_dims": (), "global_strides_bytes": (), "box_dims": ()}, "rank 1 to 5"),
        ({"element_strides": (1, 9)}, r"element_strides\[1\] = 9"),
        ({"global_dims": (0, 200)}, r"global_dims\[0\] = 0"),
        ({"address": -0x7F0000000000}, "not a 64-bit device address"),
    ],
)
def test_tensor_map_rules_give_readable_errors(change, fragment):
    with pytest.raises(ValueError, match=fragment):
        validate_tensor_map_args(**{**GOOD, **change})


@pytest.mark.parametrize(
    ("largest", "next_one", "fragment"),
    [
        ({"global_dims": (2**32, 200)}, {"global_dims": (2**32 + 1, 200)}, r"global_dims\[0\]"),
        (
            {"global_strides_bytes": (2**40 - 16,)},
            {"global_strides_bytes": (2**40,)},
            r"global_strides_bytes\[0\] = 1099511627776",
        ),
        ({"box_dims": (32, 256)}, {"box_dims": (32, 257)}, r"box_dims\[1\] = 257"),
        ({"element_strides": (8, 1)}, {"element_strides": (9, 1)}, r"element_strides\[0\] = 9"),
        (
            {"interleave": "32B", "address": 0x7F0000000020},
            {"interleave": "32B", "address": 0x7F0000000010},
            "32-byte aligned",
        ),
        ({"address": 0x7F0000000010}, {"address": 0x7F0000000008}, "16-byte aligned"),
    ],
    ids=["global_dims", "global_strides", "box_dims", "element_strides", "align_32B", "align"],
)
def test_tensor_map_limits_accept_the_largest_value_and_reject_the_next(
    largest, next_one, fragment
):
    validate_tensor_map_args(**{**GOOD, **largest})
    with pytest.raises(ValueError, match=fragment):
        validate_tensor_map_args(**{**GOOD, **next_one})


def test_tensor_map_for_passes_rank_3_dims_and_strides_innermost_first(monkeypatch):
    calls = []
    monkeypatch.setattr(tma_module, "make_tensor_map", lambda *a, **k: calls.append((a, k)))
    tensor = torch.empty(2, 5, 16)[:, :3, :8]  # shape (2, 3, 8), strides (80, 16, 1)
    tensor_map_for(tensor, (1, 2, 8), swizzle="32B")
    ((args, kwargs),) = calls
    assert args == (tensor, torch.float32)
    assert kwargs["global_dims"] == (8, 3, 2)
    assert kwargs["global_strides_bytes"] == (16 * 4, 80 * 4)
    assert kwargs["box_dims"] == (8, 2, 1)
    assert kwargs["swizzle"] == "32B"


def test_tensor_map_for_ignores_the_stride_of_a_size_one_dimension(monkeypatch):
    # PyTorch leaves a size-1 dimension's stride arbitrary; `is_contiguous()` ignores it.
    calls = []
    monkeypatch.setattr(tma_module, "make_tensor_map", lambda *a, **k: calls.append((a, k)))
    tensor = torch.empty(4, 1, 64, dtype=torch.float16).as_strided((4, 1, 64), (64, 1, 1))
    assert tensor.is_contiguous()
    tensor_map_for(tensor, (2, 1, 64), swizzle="none")
    ((_, kwargs),) = calls
    assert kwargs["global_dims"] == (64, 1, 4)
    assert kwargs["global_strides_bytes"] == (128, 128)


def test_tensor_map_for_names_the_dimension_whose_stride_breaks_tma():
    tensor = torch.empty(40).as_strided((4, 8), (3, 1))
    with pytest.raises(
        ValueError,
        match=r"^tensor: TMA .* dimension 0 of shape \(4, 8\) has stride 3 elements = 12 bytes",
    ):
        tensor_map_for(tensor, (4, 8))


def test_tensor_map_needs_a_cuda_tensor():
    with pytest.raises(ValueError, match="needs a CUDA tensor"):
        make_tensor_map(torch.ones(16, 16), None, (16, 16), (64,), (16, 16))


def test_tensor_map_rejects_unknown_option_names():
    with pytest.raises(ValueError, match="swizzle"):
        make_tensor_map(0x1000, torch.float32, (16,), (), (16,), swizzle="256B")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"swizzle": ["128B"]}, r"swizzle: expected one of .* got list"),
        ({"l2_promotion": None}, r"l2_promotion: expected one of .* got NoneType"),
        ({"oob_fill": 0}, r"oob_fill: expected one of .* got int"),
        ({"dtype": "float32"}, r"dtype: expected a torch\.dtype or None, got str"),
    ],
)
def test_tensor_map_arguments_of_another_type_are_named_type_errors(kwargs, message):
    arguments = {"dtype": torch.float32, **kwargs}
    with pytest.raises(TypeError, match=message):
        make_tensor_map(
            0x1000, global_dims=(16,), global_strides_bytes=(), box_dims=(16,), **arguments
        )


@pytest.mark.parametrize("value", [None, np.zeros((64, 64), dtype=np.float32), [[1.0]]])
def test_tensor_map_for_needs_a_tensor(value):
    with pytest.raises(TypeError, match=r"tensor: expected a CUDA torch\.Tensor, got"):
        tensor_map_for(value, (64, 64))


@pytest.mark.parametrize(
    ("swizzle", "element_size", "span_elements"),
    [("32B", 4, 8), ("64B", 4, 16), ("128B", 4, 32), ("128B", 2, 64), ("64B", 1, 64)],
)
def test_the_inner_box_may_fill_the_swizzle_span_but_not_one_step_more(
    swizzle, element_size, span_elements
):
    # Without interleave the inner box is a multiple of 16 bytes: the next size past the span
    # is the span + 16 bytes.
    exact = {"swizzle": swizzle, "element_size": element_size, "box_dims": (span_elements, 64)}
    validate_tensor_map_args(**{**GOOD, **exact})
    over = {**exact, "box_dims": (span_elements + 16 // element_size, 64)}
    span = span_elements * element_size
    with pytest.raises(
        ValueError,
        match=rf"^box_dims\[0\] \* element size = {span + 16} bytes exceeds the {swizzle} "
        rf"swizzle span; use a box of at most {span_elements} elements$",
    ):
        validate_tensor_map_args(**{**GOOD, **over})


def test_tensor_map_for_rounds_a_size_one_dimensions_stride_up_to_16_bytes(monkeypatch):
    # A size-1 dimension above a 24-byte inner extent gets the packed stride rounded up to
    # 32 bytes (TMA strides are multiples of 16), whatever stride PyTorch left there.
    calls = []
    monkeypatch.setattr(tma_module, "make_tensor_map", lambda *a, **k: calls.append((a, k)))
    tensor = torch.empty(64, dtype=torch.float16).as_strided((4, 1, 12), (16, 7, 1))
    tensor_map_for(tensor, (2, 1, 8), swizzle="none")
    ((_, kwargs),) = calls
    assert kwargs["global_dims"] == (12, 1, 4)
    assert kwargs["global_strides_bytes"] == (32, 32)


class _CudaLooking:
    """A CPU tensor dressed as a CUDA one: what `make_tensor_map` reads of a tensor."""

    is_cuda = True

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self.dtype = tensor.dtype
        self.device = torch.device("cuda", 0)

    def element_size(self) -> int:
        return self._tensor.element_size()

    def data_ptr(self) -> int:
        return self._tensor.data_ptr()

    def untyped_storage(self):
        return self._tensor.untyped_storage()


class _Names:
    def __getattr__(self, name: str) -> str:
        return name


def _fake_driver(calls: list) -> object:
    """Enough of `cuda.bindings.driver` for `make_tensor_map` to encode a descriptor."""
    from types import SimpleNamespace

    raw = ctypes.create_string_buffer(bytes(range(128)), 128)

    def encode(*args):
        calls.append(args)
        return (0, SimpleNamespace(getPtr=lambda: ctypes.addressof(raw)))

    names = _Names()
    return SimpleNamespace(
        CUtensorMapDataType=names,
        CUtensorMapInterleave=names,
        CUtensorMapSwizzle=names,
        CUtensorMapL2promotion=names,
        CUtensorMapFloatOOBfill=names,
        cuuint32_t=int,
        cuuint64_t=int,
        cuTensorMapEncodeTiled=encode,
    )


# (elements before the view, global_dims, global_strides_bytes, box_dims): each descriptor's
# last element is element 31 of the view, the 128th byte from its data pointer.
EXTENTS = [
    (0, (32,), (), (16,)),
    (4, (8, 4), (32,), (8, 4)),
]


@pytest.mark.parametrize(("skip", "dims", "strides", "box"), EXTENTS, ids=["rank1", "rank2"])
def test_a_tensor_map_may_reach_the_last_element_of_the_storage(
    monkeypatch, skip, dims, strides, box
):
    calls = []
    monkeypatch.setattr(device_module, "driver", lambda: _fake_driver(calls))
    view = torch.empty(skip + 32, dtype=torch.float32)[skip:]
    tensor_map = make_tensor_map(_CudaLooking(view), None, dims, strides, box, swizzle="none")
    assert tensor_map.raw == bytes(range(128))
    assert tensor_map.global_dims == dims and tensor_map.device_index == 0
    ((_, _, address, *_),) = calls
    assert address == view.data_ptr()


@pytest.mark.parametrize(("skip", "dims", "strides", "box"), EXTENTS, ids=["rank1", "rank2"])
def test_a_tensor_map_one_element_past_the_storage_is_refused(
    monkeypatch, skip, dims, strides, box
):
    monkeypatch.setattr(device_module, "driver", lambda: pytest.fail("reached the driver"))
    view = torch.empty(skip + 31, dtype=torch.float32)[skip:]
    with pytest.raises(
        ValueError,
        match=rf"^global_dims {re.escape(str(dims))} with strides {re.escape(str(strides))} "
        r"span 128 bytes but the tensor's storage has 124 bytes from its data pointer$",
    ):
        make_tensor_map(_CudaLooking(view), None, dims, strides, box, swizzle="none")


def test_tensor_map_choices_take_str_subclasses_as_their_value():
    import enum

    from flashinfer_jit import tma

    class Swizzle(str, enum.Enum):
        B128 = "128B"

    plain = tma._choice("128B", tma._SWIZZLE_ENUM, "swizzle")
    assert tma._choice(Swizzle.B128, tma._SWIZZLE_ENUM, "swizzle") == plain
    assert tma._choice(np.str_("128B"), tma._SWIZZLE_ENUM, "swizzle") == plain


def test_tensor_map_for_refuses_a_0d_tensor_by_its_rank():
    with pytest.raises(ValueError, match=r"^tensor: TMA describes tensors of 1 to 5 dimensions"):
        tensor_map_for(torch.tensor(1.0), ())


def test_a_numpy_integer_address_is_an_address(monkeypatch):
    import numpy as np

    calls = []
    monkeypatch.setattr(tma_module, "validate_tensor_map_args", lambda *a: calls.append(a) or 1 / 0)
    with pytest.raises(ZeroDivisionError):  # stops once the address is taken as one
        make_tensor_map(np.int64(0x1000), torch.float32, (16,), (), (16,), swizzle="none")
    assert calls[0][0] == 0x1000 and type(calls[0][0]) is int
