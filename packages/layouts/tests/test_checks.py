"""Shared checks: the switch for the checks that read tensor contents (shared spelling
across packages), and the dense-layout check every tensor argument goes through."""

from __future__ import annotations

import types

import flashinfer_layouts as fl
import pytest
import torch
from flashinfer_layouts import _checks


@pytest.mark.parametrize(
    ("setting", "enabled"),
    [
        (None, False),
        ("0", False),
        ("", False),
        ("1", True),
        ("true", True),
        (" ON ", True),
        ("yes", True),
    ],
)
def test_validate_inputs_spellings_match_attn_scores(monkeypatch, setting, enabled):
    """Off the CPU (a stand-in with a non-CPU device here: this machine may have no GPU) the
    checks follow FLASHINFER_VALIDATE_INPUTS, with the spellings flashinfer_attn_scores
    accepts. A meta tensor has no data: never checked."""
    if setting is None:
        monkeypatch.delenv("FLASHINFER_VALIDATE_INPUTS", raising=False)
    else:
        monkeypatch.setenv("FLASHINFER_VALIDATE_INPUTS", setting)
    off_cpu = types.SimpleNamespace(device=torch.device("xpu"))
    assert _checks.device_data_checks_enabled(off_cpu) is enabled
    assert _checks.device_data_checks_enabled(torch.empty(1, device="meta")) is False


def test_meta_tensors_pass_through_the_data_checks_under_validate_inputs(monkeypatch):
    """Shapes only: with FLASHINFER_VALIDATE_INPUTS on, the functions that read values (slot
    ranges, swizzle indices) still trace meta tensors instead of failing inside torch."""
    monkeypatch.setenv("FLASHINFER_VALIDATE_INPUTS", "1")
    pool = torch.zeros(2, 32, 1, 68, dtype=torch.uint8, device="meta")
    fl.write_mxfp4_kv_cache(
        pool, torch.randn(1, 128, device="meta"), torch.tensor([1], device="meta")
    )
    offset = fl.swizzle_128x4_offset(torch.tensor([130], device="meta"), 2, 4)
    assert offset.device.type == "meta" and offset.shape == (1,)


def test_cpu_tensors_are_always_checked(monkeypatch):
    monkeypatch.setenv("FLASHINFER_VALIDATE_INPUTS", "0")
    assert _checks.device_data_checks_enabled(torch.empty(1))


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: fl.quantize_fp8_per_token(torch.ones(2, 128).to_sparse()), "x"),
        (
            lambda: fl.pack_fp8_kv_cache(
                torch.ones(1, 2, 4).to(torch.float8_e4m3fn), torch.ones(1, 2).to_sparse()
            ),
            "scales",
        ),
        (
            lambda: fl.unpack_fp8_kv_cache(torch.ones(1, 2, 1, 8, dtype=torch.uint8).to_sparse()),
            "kv_fused",
        ),
        (lambda: fl.quantize_mxfp4(torch.ones(2, 128).to_sparse()), "x"),
        (lambda: fl.nvfp4_quantize(torch.ones(2, 16), torch.ones(1).to_sparse()), "a_global_sf"),
        (lambda: fl.swizzle_128x4_offset(torch.tensor([1, 0]).to_sparse(), 0, 4), "row"),
        (
            lambda: fl.write_fp8_kv_cache(
                torch.zeros(1, 2, 1, 132, dtype=torch.uint8),
                torch.ones(1, 128),
                torch.tensor([1]).to_sparse(),
            ),
            "slot_mapping",
        ),
    ],
)
def test_sparse_tensors_are_refused_naming_the_argument(call, name):
    with pytest.raises(
        TypeError, match=rf"^{name} must be a dense \(torch.strided\) tensor; got torch.sparse_coo$"
    ):
        call()


def test_a_compiled_size_message_names_a_missing_torch_api(monkeypatch):
    # PyTorch before guard_or_false (2.8's docs are the first to list it): a size printed
    # while dynamo traces says which API it needs instead of failing on the import.
    from torch.fx.experimental import symbolic_shapes

    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _checks.plain(5) == 5
    monkeypatch.delattr(symbolic_shapes, "guard_or_false")
    with pytest.raises(RuntimeError, match=r"needs torch\.fx\.experimental\.symbolic_shapes"):
        _checks.plain(5)


def _unavailable_cuda_device() -> str:
    """A CUDA device this process cannot use: any, without CUDA; one past the last, with it."""
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


@pytest.mark.parametrize(
    "helper", [fl.mxfp4_interleaved_token_of_slot, fl.mxfp4_interleaved_slot_of_token]
)
def test_an_unusable_cuda_device_is_a_value_error_naming_device(helper):
    """torch's own answer is a bare AssertionError from inside its factory function."""
    device = _unavailable_cuda_device()
    with pytest.raises(ValueError, match=rf"^device: got '{device}', but "):
        helper(128, device)


def _outcome(call):
    """What a call gives: its result, or its exception's type and message."""
    try:
        return call()
    except (TypeError, ValueError) as error:
        return type(error), str(error)


@pytest.mark.parametrize("index", [2**63, 2**64 + 1])
def test_a_device_index_past_64_bits_is_a_value_error_naming_device(index):
    with pytest.raises(ValueError, match=rf"^device must be a valid device .* got {index} \("):
        fl.mxfp4_interleaved_token_of_slot(128, device=index)


def test_a_numpy_integer_device_is_the_index_it_holds():
    """As every other integer argument of the package: the same device (or the same refusal,
    without CUDA) as the Python int."""
    numpy = pytest.importorskip("numpy")
    for value in (numpy.int64(0), numpy.int32(0)):
        assert _outcome(lambda v=value: _checks.device("device", v)) == _outcome(
            lambda: _checks.device("device", 0)
        )
    with pytest.raises(TypeError, match=r"^device must be a torch.device, .* got numpy.bool"):
        _checks.device("device", numpy.bool_(True))


def test_a_global_scale_on_another_device_is_a_value_error_naming_it():
    a = torch.randn(4, 32)
    with pytest.raises(ValueError, match=r"^a_global_sf must be on the CPU or on the data's"):
        fl.nvfp4_quantize(a, torch.tensor(1.0, device="meta"))


def test_swizzle_offsets_of_row_and_col_on_two_devices_are_refused():
    row, col = torch.tensor([1], device="meta"), torch.tensor([1])
    with pytest.raises(
        ValueError, match=r"^col must be on the same device as row \(meta\); got cpu"
    ):
        fl.swizzle_128x4_offset(row, col, 4)


def test_swizzle_offsets_take_a_0d_cpu_index_beside_any_device():
    """torch combines a 0-d CPU tensor with a tensor elsewhere as a scalar; so does the check."""
    row = torch.arange(5, device="meta")
    assert fl.swizzle_128x4_offset(row, torch.tensor(1), 4).shape == (5,)
