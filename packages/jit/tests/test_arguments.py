"""Launch-argument packing, checked byte by byte against hand-built layouts (CPU only)."""

from __future__ import annotations

import copy
import ctypes
import pickle
import struct

import pytest
import torch
from flashinfer_jit import TensorMap, f32, f64, i32, i64, u32, u64
from flashinfer_jit.arguments import ArgumentPacker

# Offsets/sizes as cuKernelGetParamInfo reports them for
#   (float* out, const float* in, int32_t n, int64_t m, float alpha, CUtensorMap map)
# where the 128-byte map is 64-byte aligned.
LAYOUT = [(0, 8), (8, 8), (16, 4), (24, 8), (32, 4), (64, 128)]
CPU = -1  # torch's get_device() for CPU tensors: lets these tests pack CPU tensors


def _param_bytes(buffer, address: int, sizes: list[int]) -> list[bytes]:
    pointers = struct.unpack_from(f"<{len(sizes)}Q", buffer, 0)
    assert pointers[0] >= address
    return [ctypes.string_at(p, s) for p, s in zip(pointers, sizes)]


def _tensor_map(seed: int) -> TensorMap:
    generator = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (128,), dtype=torch.uint8, generator=generator)
    return TensorMap(bytes(raw.tolist()), torch.float32, (64, 64), (32, 32), "128B")


def test_each_parameter_gets_exactly_its_bytes():
    generator = torch.Generator().manual_seed(0)
    out = torch.randn(7, generator=generator)
    source = torch.randn(5, generator=generator)
    tmap = _tensor_map(1)
    packer = ArgumentPacker(LAYOUT, CPU, "test")
    args = (out, source, i32(-123456), i64(2**40 + 5), f32(0.1), tmap)
    buffer, address = packer.pack(args)
    assert address == ctypes.addressof(buffer)
    got = _param_bytes(buffer, address, [s for _, s in LAYOUT])
    assert got == [
        struct.pack("<Q", out.data_ptr()),
        struct.pack("<Q", source.data_ptr()),
        struct.pack("<i", -123456),
        struct.pack("<q", 2**40 + 5),
        struct.pack("<f", 0.1),
        tmap.raw,
    ]
    # Pointers keep the kernel's relative parameter offsets (the 64-byte alignment of the map).
    pointers = struct.unpack_from("<6Q", buffer, 0)
    assert [p - pointers[0] for p in pointers] == [o for o, _ in LAYOUT]


def test_repacking_with_new_values_rewrites_the_buffer():
    packer = ArgumentPacker([(0, 4), (8, 8)], CPU, "test")
    packer.pack((u32(1), u64(2)))
    buffer, address = packer.pack((u32(2**32 - 1), u64(2**64 - 1)))
    assert _param_bytes(buffer, address, [4, 8]) == [b"\xff" * 4, b"\xff" * 8]
    # A different type tuple gets its own plan, then the first one still works.
    buffer, address = packer.pack((f32(2.5), f64(-1.25)))
    assert _param_bytes(buffer, address, [4, 8]) == [
        struct.pack("<f", 2.5),
        struct.pack("<d", -1.25),
    ]
    buffer, address = packer.pack((u32(7), u64(8)))
    assert _param_bytes(buffer, address, [4, 8]) == [struct.pack("<I", 7), struct.pack("<Q", 8)]


def test_kernel_without_parameters():
    assert ArgumentPacker([], CPU, "test").pack(()) == (None, 0)


def test_arguments_without_a_parameter_list_from_the_driver():
    """Where the driver reports no parameter list, the typed arguments are laid out in C
    order at their natural alignment: LAYOUT's offsets, each value at its own pointer."""
    generator = torch.Generator().manual_seed(2)
    out = torch.randn(3, generator=generator)
    tmap = _tensor_map(3)
    args = (out, out, i32(7), i64(-(2**40)), f32(1.5), tmap)
    buffer, address = ArgumentPacker([], CPU, "k").pack(args)
    assert _param_bytes(buffer, address, [s for _, s in LAYOUT]) == [
        struct.pack("<Q", out.data_ptr()),
        struct.pack("<Q", out.data_ptr()),
        struct.pack("<i", 7),
        struct.pack("<q", -(2**40)),
        struct.pack("<f", 1.5),
        tmap.raw,
    ]
    pointers = struct.unpack_from("<6Q", buffer, 0)
    assert [p - pointers[0] for p in pointers] == [o for o, _ in LAYOUT]


@pytest.mark.parametrize("plain", [5, 2.0, True])
def test_plain_python_numbers_are_rejected(plain):
    packer = ArgumentPacker([(0, 4)], CPU, "k")
    with pytest.raises(TypeError, match=r"plain Python .* wrap it as flashinfer_jit\.i32"):
        packer.pack((plain,))


def test_wrong_width_is_rejected_before_it_shifts_later_arguments():
    packer = ArgumentPacker([(0, 4), (8, 8)], CPU, "k")
    with pytest.raises(TypeError, match=r"argument 0: the C parameter is 4 bytes but a i64 is 8"):
        packer.pack((i64(1), i64(2)))


def test_wrong_argument_count_is_rejected():
    packer = ArgumentPacker([(0, 4), (8, 8)], CPU, "k")
    with pytest.raises(TypeError, match="takes 2 parameters"):
        packer.pack((i32(1),))


def test_unsupported_type_is_rejected():
    packer = ArgumentPacker([(0, 8)], CPU, "k")
    with pytest.raises(TypeError, match="unsupported type list"):
        packer.pack(([1, 2],))


def test_tensor_on_another_device_is_rejected():
    packer = ArgumentPacker([(0, 8)], 0, "k")
    with pytest.raises(ValueError, match="runs on cuda:0 but got a tensor on cpu"):
        packer.pack((torch.ones(3),))


def test_packers_sharing_generated_code_keep_their_own_device_label_and_buffer():
    """Two kernels with the same argument types share one compiled packer source, but each
    packs into its own buffer and reports its own label and device."""
    first = ArgumentPacker([(0, 8), (8, 4)], CPU, "first")
    second = ArgumentPacker([(0, 8), (8, 4)], 0, "second")
    tensor = torch.ones(3)
    buffer, address = first.pack((tensor, i32(11)))
    with pytest.raises(ValueError, match="'second' runs on cuda:0 but got a tensor on cpu"):
        second.pack((tensor, i32(12)))
    third = ArgumentPacker([(0, 8), (8, 4)], CPU, "third")
    other_buffer, other_address = third.pack((tensor, i32(13)))
    assert other_address != address
    assert _param_bytes(buffer, address, [8, 4])[1] == struct.pack("<i", 11)
    assert _param_bytes(other_buffer, other_address, [8, 4])[1] == struct.pack("<i", 13)


@pytest.mark.parametrize(
    ("wrapper", "value", "error", "message"),
    [
        (i32, 2**31, ValueError, r"i32: 2147483648 is outside \[-2147483648, 2147483647\]"),
        (i32, -(2**31) - 1, ValueError, r"i32: -2147483649 is outside \[-2147483648, "),
        (u32, -1, ValueError, r"u32: -1 is outside \[0, 4294967295\] \(uint32_t\)"),
        (
            u64,
            2**64,
            ValueError,
            r"u64: 18446744073709551616 is outside \[0, 18446744073709551615\]",
        ),
        (i64, 1.0, TypeError, r"i64: expected an integer, got float \(1.0\)"),
        (i32, True, TypeError, r"i32: expected an integer, got bool \(True\)"),
        (f32, 1e39, ValueError, r"f32: 1e\+39 overflows float32"),
        (f32, "1.0", TypeError, r"f32: expected a real number, got str"),
        (f32, True, TypeError, r"f32: expected a real number, got bool"),
    ],
)
def test_scalar_wrappers_check_their_range(wrapper, value, error, message):
    with pytest.raises(error, match=f"^{message}"):
        wrapper(value)


@pytest.mark.parametrize(
    ("wrapper", "low", "high"),
    [
        (i32, -(2**31), 2**31 - 1),
        (u32, 0, 2**32 - 1),
        (i64, -(2**63), 2**63 - 1),
        (u64, 0, 2**64 - 1),
    ],
)
def test_integer_wrappers_accept_their_whole_range_and_nothing_beyond(wrapper, low, high):
    assert wrapper(low).value == low and wrapper(high).value == high
    for outside in (low - 1, high + 1):
        with pytest.raises(ValueError, match=rf"^{wrapper.__name__}: {outside} is outside"):
            wrapper(outside)


@pytest.mark.parametrize(("wrapper", "value"), [(f32, 2**1024), (f64, 10**400)], ids=["f32", "f64"])
def test_integers_beyond_the_double_range_are_a_value_error(wrapper, value):
    with pytest.raises(
        ValueError, match=rf"{wrapper.__name__}: expected a value within the double"
    ):
        wrapper(value)


@pytest.mark.parametrize("wrapper", [f32, f64])
def test_finite_values_past_the_double_range_are_a_value_error_whatever_their_type(wrapper):
    """Decimal and numpy.longdouble give inf from float() instead of raising; an infinity
    given as such is still accepted."""
    import decimal

    np = pytest.importorskip("numpy")
    for value in (decimal.Decimal("1e5000"), -decimal.Decimal("1e5000"), np.longdouble("1e4000")):
        with pytest.raises(ValueError, match=rf"{wrapper.__name__}: expected a value within"):
            wrapper(value)
    assert wrapper(decimal.Decimal("Infinity")).value == float("inf")
    assert wrapper(np.longdouble("-inf")).value == float("-inf")


@pytest.mark.parametrize("wrapper", [i32, u32, i64, u64, f32, f64])
def test_a_numpy_array_is_no_scalar_even_with_one_element(wrapper):
    np = pytest.importorskip("numpy")
    for array in (np.array([5]), np.array([[5]]), np.zeros(3)):
        with pytest.raises(
            TypeError, match=rf"^{wrapper.__name__}: expected a number, got an array"
        ):
            wrapper(array)
    assert wrapper(np.array(5)).value == 5  # 0-d: a scalar


@pytest.mark.parametrize("wrapper", [i32, u32, i64, u64, f32, f64])
def test_a_scalar_wrapper_cannot_be_changed_after_its_check(wrapper):
    scalar = wrapper(1)
    with pytest.raises(AttributeError, match=rf"^{wrapper.__name__} is immutable"):
        scalar.value = 2**70
    assert scalar.value == 1
    for copied in (copy.copy(scalar), copy.deepcopy(scalar), pickle.loads(pickle.dumps(scalar))):
        assert type(copied) is wrapper and copied == scalar


def test_scalar_wrappers_accept_integer_like_values():
    assert i32(torch.tensor(5, dtype=torch.int32).item()).value == 5
    assert f32(torch.tensor(0.5).item()).value == 0.5


@pytest.mark.parametrize("wrapper", [i32, u32, i64, u64, f32, f64])
def test_scalar_wrappers_refuse_tensors(wrapper):
    """A 0-d tensor has __index__ / __float__, but reading it is a device synchronisation
    (an error inside CUDA-graph capture): the caller must say .item() if that is meant."""
    with pytest.raises(TypeError, match=r"expected a Python number, got a torch.Tensor on cpu"):
        wrapper(torch.tensor(7))


def test_a_numpy_bool_is_no_real_number():
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match="f32: expected a real number, got bool"):
        f32(np.True_)


@pytest.mark.parametrize("wrapper", [f32, f64])
def test_numpy_complex_and_time_values_are_no_real_numbers(wrapper):
    """numpy's complex scalars convert with float() by dropping the imaginary part (a warning,
    not an error), and datetime64 / timedelta64 as counts of their unit: all refused."""
    np = pytest.importorskip("numpy")
    name = wrapper.__name__
    for value, type_name in [
        (np.complex128(1 + 2j), "complex128"),
        (np.complex64(3 + 4j), "complex64"),
        (np.datetime64(5, "s"), "datetime64"),
        (np.timedelta64(5), "timedelta64"),
    ]:
        with pytest.raises(TypeError, match=rf"^{name}: expected a real number, got {type_name}"):
            wrapper(value)
    assert wrapper(np.float32(2.5)).value == 2.5


def test_a_signalling_nan_decimal_is_named():
    import decimal

    with pytest.raises(ValueError, match=r"^f64: Decimal\('sNaN'\) has no double value"):
        f64(decimal.Decimal("sNaN"))


def test_the_device_error_names_the_argument():
    packer = ArgumentPacker([(0, 8), (8, 8), (16, 4)], CPU, "k")
    tensor = torch.ones(3)
    packer.pack((tensor, tensor, i32(1)))
    wrong = ArgumentPacker([(0, 8), (8, 8), (16, 4)], 0, "k")
    with pytest.raises(ValueError, match=r"got a tensor on cpu \(argument 0\)$"):
        wrong.pack((tensor, tensor, i32(1)))


@pytest.mark.parametrize(
    ("params", "plain", "words"),
    [
        ([], 5, r"match the C parameter \(the driver reported no parameter sizes"),
        ([(0, 1)], True, r"which is 1 bytes: no wrapper has that size.*\(a bool: pass i32"),
        ([(0, 4)], True, r"match the 4-byte parameter \(a bool: pass i32\(int\(value\)\)"),
        ([(0, 2)], 2.0, r"which is 2 bytes: no wrapper has that size"),
    ],
)
def test_plain_numbers_are_told_what_the_parameter_needs(params, plain, words):
    # Without a parameter list a plain number has no size to quote; a bool fits no wrapper.
    packer = ArgumentPacker(params, CPU, "k")
    with pytest.raises(TypeError, match=words) as info:
        packer.pack((plain,))
    assert "0-byte" not in str(info.value)


@pytest.mark.parametrize(("map_device", "refused"), [(1, True), (0, False), (None, False)])
def test_a_tensor_map_of_another_device_is_refused(map_device, refused):
    # A descriptor holds its tensor's address; on another device's kernel it is a foreign one.
    # A raw address's descriptor (device None) cannot be checked.
    tmap = _tensor_map(3)
    tmap.device_index = map_device
    packer = ArgumentPacker([(0, 128)], 0, "k")
    if refused:
        with pytest.raises(
            ValueError,
            match=r"runs on cuda:0 but got a TensorMap of a tensor on cuda:1 \(argument 0\)$",
        ):
            packer.pack((tmap,))
    else:
        buffer, address = packer.pack((tmap,))
        assert _param_bytes(buffer, address, [128]) == [tmap.raw]
    unchecked = ArgumentPacker([(0, 128)], 0, "k", check_devices=False)
    unchecked.pack((tmap,))  # the caller vouches for the devices


@pytest.mark.parametrize(
    "params",
    [[(0, 4), (0, 4)], [(0, 4), (2, 4)], [(8, 4), (0, 4)]],
    ids=["same_offset", "overlapping", "decreasing"],
)
def test_parameter_offsets_that_do_not_increase_are_refused(params):
    # Packing runs through the parameters in order with one struct format; an offset that
    # steps back would put a value somewhere other than where its pointer says.
    packer = ArgumentPacker(params, CPU, "k")
    with pytest.raises(
        RuntimeError, match=r"^kernel 'k': parameter offsets are not increasing: \(\(\d"
    ):
        packer.pack((i32(1), i32(2)))


def test_per_thread_buffers_of_a_plan_stay_bounded():
    # Each thread gets its own buffer per plan; past `_MAX_THREAD_BUFFERS` threads the plan
    # forgets the old ones instead of keeping one per thread that ever launched.
    import threading

    from flashinfer_jit import arguments

    limit = arguments._MAX_THREAD_BUFFERS
    threads = limit + 8
    packer = ArgumentPacker([(0, 4), (8, 8)], CPU, "k")
    packer.pack((i32(0), i64(0)))
    plan = packer._plans[(i32, i64)]
    buffers = plan.__globals__["buffers"]
    assert len(buffers) == 1
    # All threads stay alive until each has packed, so no thread id is reused.
    barrier = threading.Barrier(threads)
    results: dict[int, list[bytes]] = {}
    errors: list[BaseException] = []

    def launch(n: int) -> None:
        try:
            buffer, address = packer.pack((i32(n), i64(-n)))
            results[n] = _param_bytes(buffer, address, [4, 8])  # the caller's buffer stays good
            barrier.wait(timeout=30)
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=launch, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors
    assert results == {n: [struct.pack("<i", n), struct.pack("<q", -n)] for n in range(threads)}
    assert 1 <= len(buffers) <= limit


@pytest.mark.parametrize("check_devices", [True, False])
def test_a_tensor_without_a_data_pointer_is_named(check_devices):
    """A sparse tensor has no data pointer: its argument is named (after a packed dense call
    too, where the cached plan raised torch's unnamed RuntimeError)."""
    packer = ArgumentPacker([(0, 8), (8, 4)], CPU, "k", check_devices=check_devices)
    dense = torch.zeros(4)
    packer.pack((dense, i32(1)))
    for bad, layout in [
        (torch.zeros(4).to_sparse(), "torch.sparse_coo"),
        (torch.zeros(4, 4).to_sparse_csr(), "torch.sparse_csr"),
    ]:
        with pytest.raises(TypeError, match=f"argument 0: expected a dense .* got layout {layout}"):
            packer.pack((bad, i32(1)))
