"""`compute_paged_mqa_logits_schedule(..., out=)`: what `out` may share, and inputs it refuses.

The overlap check is compared with the bytes each tensor covers, enumerated one element at a
time; the CUDA variants (gpu-marked) hold the kernel to the same refusals, since its direct
launch would otherwise write `out` without PyTorch noticing.
"""

from __future__ import annotations

import random
import re

import pytest
import torch
from flashinfer_schedule import compute_paged_mqa_logits_schedule

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _element_bytes(t: torch.Tensor) -> set[int]:
    """Every byte address `t` covers, from its sizes and strides (int32 elements)."""
    base = t.data_ptr()
    if t.dim() == 1:
        return {base + 4 * i * t.stride(0) + k for i in range(t.shape[0]) for k in range(4)}
    return {
        base + 4 * (i * t.stride(0) + j * t.stride(1)) + k
        for i in range(t.shape[0])
        for j in range(t.shape[1])
        for k in range(4)
    }


def _random_views(rng: random.Random, device: str):
    num_sms = rng.randint(1, 6)
    storage = torch.randint(0, 500, (160,), dtype=torch.int32, device=device)
    count = rng.randint(1, 12)
    stride = rng.choice([0, 1, 1, 2, 3, 7, 13])
    span = (count - 1) * stride + 1
    lens_at = rng.randint(0, 160 - span)
    seq_lens = storage.as_strided((count,), (stride,), lens_at)
    out_at = rng.randint(0, 160 - 2 * (num_sms + 1))
    out = storage.as_strided((num_sms + 1, 2), (2, 1), out_at)
    return seq_lens, out, num_sms


@pytest.mark.parametrize("device", DEVICES)
def test_out_sharing_memory_with_seq_lens_is_refused_exactly_when_bytes_meet(device):
    rng = random.Random(20261205)
    refused = accepted = 0
    for _ in range(600):
        seq_lens, out, num_sms = _random_views(rng, device)
        if _refused_exactly_when_bytes_meet(seq_lens, out, num_sms):
            refused += 1
        else:
            accepted += 1
    assert refused > 50 and accepted > 50  # both sides of the check were exercised


def _refused_exactly_when_bytes_meet(seq_lens, out, num_sms) -> bool:
    """Assert the call refuses `out` if and only if its bytes meet seq_lens'; return whether
    they meet."""
    meets = bool(_element_bytes(seq_lens) & _element_bytes(out))
    if meets:
        with pytest.raises(ValueError, match=r"^out shares memory with seq_lens \(out bytes"):
            compute_paged_mqa_logits_schedule(seq_lens, num_sms=num_sms, out=out)
    else:
        expected = compute_paged_mqa_logits_schedule(seq_lens.clone(), num_sms=num_sms)
        got = compute_paged_mqa_logits_schedule(seq_lens, num_sms=num_sms, out=out)
        assert got is out and torch.equal(got, expected)
    return meets


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stride", [0, 1, 2, 5])
def test_seq_lens_at_every_element_around_the_ends_of_out(device, stride):
    """The cases the random draw may miss: seq_lens starting at each element from before
    `out`'s first to past its last (a stride-0 seq_lens on exactly the first or last element
    included)."""
    storage = torch.randint(0, 500, (200,), dtype=torch.int32, device=device)
    num_sms, out_at = 3, 80
    out = storage.as_strided((num_sms + 1, 2), (2, 1), out_at)
    outcomes = set()
    for count in (1, 3):
        for lens_at in range(out_at - 3 * max(stride, 1) - 2, out_at + 2 * (num_sms + 1) + 2):
            seq_lens = storage.as_strided((count,), (stride,), lens_at)
            outcomes.add(_refused_exactly_when_bytes_meet(seq_lens, out, num_sms))
    assert outcomes == {True, False}


def test_out_on_another_device_than_seq_lens_needs_no_overlap_check():
    # A CPU seq_lens moved to the target is a copy; the same storage cannot be in both.
    storage = torch.zeros(40, dtype=torch.int32)
    seq_lens = storage[:4].fill_(100)
    got = compute_paged_mqa_logits_schedule(
        seq_lens, "cpu", num_sms=2, out=storage[10:16].view(3, 2)
    )
    assert torch.equal(got, compute_paged_mqa_logits_schedule(seq_lens.clone(), num_sms=2))


@pytest.mark.parametrize("device", DEVICES)
def test_an_inference_out_outside_inference_mode_is_refused(device):
    seq_lens = torch.tensor([100, 0, 300], dtype=torch.int32, device=device)
    with torch.inference_mode():
        out = torch.full((5, 2), -7, dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match=r"^out is an inference tensor .* outside inference"):
        compute_paged_mqa_logits_schedule(seq_lens, num_sms=4, out=out)
    assert (out == -7).all()  # not written
    with torch.inference_mode():
        got = compute_paged_mqa_logits_schedule(seq_lens, num_sms=4, out=out)
    assert got is out and torch.equal(out, compute_paged_mqa_logits_schedule(seq_lens, num_sms=4))


@pytest.mark.parametrize("argument", ["seq_lens", "out"])
def test_a_nested_tensor_is_a_type_error_naming_the_argument(argument):
    nested = torch.nested.nested_tensor(
        [torch.zeros(2, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)]
    )
    seq_lens = nested if argument == "seq_lens" else torch.tensor([1, 2], dtype=torch.int32)
    out = nested if argument == "out" else None
    with pytest.raises(TypeError, match=rf"^{argument} must be a dense .* got a nested tensor$"):
        compute_paged_mqa_logits_schedule(seq_lens, "cpu", num_sms=2, out=out)


@pytest.mark.parametrize("index", [2**63, 2**64 + 1])
def test_a_cuda_index_past_64_bits_is_a_value_error_naming_device(index):
    with pytest.raises(ValueError, match=rf"^device: cannot parse {index} as a torch device"):
        compute_paged_mqa_logits_schedule(torch.tensor([1], dtype=torch.int32), index)


def test_a_numpy_integer_device_is_the_cuda_index_it_holds():
    """The docstring's "integers may be Python or numpy ints" holds for `device` too: the
    same schedule (or the same refusal, without CUDA) as the Python int."""
    numpy = pytest.importorskip("numpy")
    seq_lens = torch.tensor([5, 0, 300], dtype=torch.int32)

    def outcome(device):
        try:
            return compute_paged_mqa_logits_schedule(seq_lens, device, num_sms=3).cpu().tolist()
        except (TypeError, ValueError) as error:
            return type(error), str(error)

    assert outcome(numpy.int64(0)) == outcome(0)
    with pytest.raises(TypeError, match=r"^device must be a torch.device, str or int, got numpy"):
        compute_paged_mqa_logits_schedule(seq_lens, numpy.bool_(False), num_sms=3)


def test_the_cuda_ops_checks_refuse_what_an_aot_package_could_hand_it():
    # An AOTInductor package skips export's input guards; the op itself refuses an out the
    # kernel would overrun or that overlaps seq_lens (the checks run on CPU tensors here;
    # the arguments are the op's: seq_lens, num_sms, passes, out).
    from flashinfer_schedule.custom_ops import check_op_arguments

    storage = torch.zeros(64, dtype=torch.int32)
    seq_lens = storage[:4]
    check_op_arguments(seq_lens, 3, 1, storage[8:16].view(4, 2))  # apart: fine
    with pytest.raises(ValueError, match=r"^out shares memory with seq_lens"):
        check_op_arguments(seq_lens, 3, 1, storage[2:10].view(4, 2))
    with pytest.raises(ValueError, match=r"^out must have shape \[num_sms \+ 1, 2\]"):
        check_op_arguments(seq_lens, 3, 1, storage[8:14].view(3, 2))
    with pytest.raises(TypeError, match=r"^out must have dtype torch.int32"):
        check_op_arguments(seq_lens, 3, 1, torch.zeros(4, 2, dtype=torch.int64))


# What the CUDA kernel assumes of the arguments the op passes on, each broken once. The op's
# schema gives it tensors and ints of any value; these are the ones the kernel would misread
# (seq_lens is read as a `const int*` at seq_lens[b * stride(0)]), divide by (num_sms = 0) or
# count wrongly with (passes < 1, or so many passes that a unit index overflows int32).
_OP_REFUSALS = {
    **{
        f"seq_lens_{dtype}".replace("torch.", ""): (
            {"seq_lens": torch.zeros(4, dtype=dtype)},
            TypeError,
            rf"^seq_lens must have dtype torch\.int32, got {re.escape(str(dtype))}$",
        )
        for dtype in (torch.int16, torch.uint8, torch.int64, torch.float32)
    },
    "seq_lens_2d": (
        {"seq_lens": torch.zeros(2, 2, dtype=torch.int32)},
        ValueError,
        r"^seq_lens must be 1-D \[batch_size\], got 2-D shape \[2, 2\]$",
    ),
    "seq_lens_0d": (
        {"seq_lens": torch.tensor(5, dtype=torch.int32)},
        ValueError,
        r"^seq_lens must be 1-D \[batch_size\], got 0-D shape \[\]$",
    ),
    "seq_lens_sparse": (
        {"seq_lens": torch.zeros(4, dtype=torch.int32).to_sparse()},
        TypeError,
        r"^seq_lens must be a dense \(torch\.strided\) tensor, got layout torch\.sparse_coo$",
    ),
    "num_sms_0": (
        {"num_sms": 0, "out": torch.zeros(1, 2, dtype=torch.int32)},
        ValueError,
        r"^num_sms must be in 1\.\.2147483647 \(2\*\*31 - 1\), got 0$",
    ),
    "num_sms_negative": (
        {"num_sms": -2},
        ValueError,
        r"^num_sms must be in 1\.\.2147483647 \(2\*\*31 - 1\), got -2$",
    ),
    "num_sms_past_int32": (
        {"num_sms": 2**31},
        ValueError,
        r"^num_sms must be in 1\.\.2147483647 \(2\*\*31 - 1\), got 2147483648$",
    ),
    "passes_0": ({"passes": 0}, ValueError, r"^passes must be in 1\.\.64, got 0$"),
    "passes_negative": ({"passes": -1}, ValueError, r"^passes must be in 1\.\.64, got -1$"),
    "passes_65": ({"passes": 65}, ValueError, r"^passes must be in 1\.\.64, got 65$"),
    "passes_bool": ({"passes": True}, TypeError, r"^passes must be an int, got bool \(True\)$"),
    "out_rows_not_num_sms_plus_1": (
        {"out": torch.zeros(5, 2, dtype=torch.int32)},
        ValueError,
        r"^out must have shape \[num_sms \+ 1, 2\] = \[4, 2\] \(num_sms=3\), got \[5, 2\]$",
    ),
    "out_on_another_device": (
        {"out": torch.zeros(4, 2, dtype=torch.int32, device="meta")},
        ValueError,
        r"^out must be on the target device cpu, got meta$",
    ),
}


@pytest.mark.parametrize(
    ("arguments", "error", "match"), _OP_REFUSALS.values(), ids=_OP_REFUSALS.keys()
)
def test_the_cuda_ops_checks_refuse_inputs_the_kernel_would_misread(arguments, error, match):
    # The op's own checks, which an AOTInductor package (no export guards) relies on; the
    # public function's refusals, word for word. Run on CPU tensors here.
    from flashinfer_schedule.custom_ops import check_op_arguments

    arguments = {
        "seq_lens": torch.zeros(4, dtype=torch.int32),
        "num_sms": 3,
        "passes": 1,
        "out": torch.zeros(4, 2, dtype=torch.int32),
        **arguments,
    }
    with pytest.raises(error, match=match):
        check_op_arguments(**arguments)


def test_the_cuda_ops_checks_accept_the_largest_passes():
    from flashinfer_schedule.custom_ops import check_op_arguments

    check_op_arguments(
        seq_lens=torch.full((4,), 2**31 - 1, dtype=torch.int32),
        num_sms=3,
        passes=64,
        out=torch.zeros(4, 2, dtype=torch.int32),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_a_non_contiguous_out_names_the_strides_it_needs(device):
    out = torch.zeros(2, 5, dtype=torch.int32, device=device).t()
    with pytest.raises(
        ValueError, match=r"^out must be contiguous, with strides \(2, 1\), got strides \(1, 5\)$"
    ):
        compute_paged_mqa_logits_schedule(
            torch.tensor([1, 2], dtype=torch.int32, device=device), num_sms=4, out=out
        )
