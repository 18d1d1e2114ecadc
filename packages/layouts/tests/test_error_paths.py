"""Argument errors no other CPU test reaches: mixed devices, a dtype that is no torch.dtype, a
bool global scale, empty head dimensions and negative swizzle sizes."""

from __future__ import annotations

import flashinfer_layouts as fl
import pytest
import torch

E4M3 = torch.float8_e4m3fn
META = torch.device("meta")


def _fp8_kv_cache() -> torch.Tensor:
    return fl.pack_fp8_kv_cache(torch.zeros(2, 4, 16).to(E4M3), torch.ones(2, 4))


def _msa_pages() -> torch.Tensor:
    k = torch.zeros(1, 1, fl.MSA_PAGE_SIZE, fl.MSA_HEAD_DIM)
    return fl.pack_nvfp4_msa_pages(k, k, 1.0, 1.0)


def _nvfp4() -> tuple[torch.Tensor, torch.Tensor]:
    return fl.nvfp4_quantize(torch.ones(128, 64), 1.0)


def _mxfp4_q() -> tuple[torch.Tensor, torch.Tensor]:
    return fl.quantize_mxfp4_q(torch.ones(2, 1, 4, 128))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: fl.pack_fp8_kv_cache(
                torch.zeros(2, 4, 16).to(E4M3), torch.ones(2, 4, device=META)
            ),
            r"^scales must be on the same device as values \(cpu\); got meta$",
        ),
        (
            lambda: fl.pack_nvfp4_msa_pages(
                torch.zeros(1, 1, 128, 128), torch.zeros(1, 1, 128, 128, device=META), 1.0, 1.0
            ),
            r"^v must be on the same device as k \(cpu\); got meta$",
        ),
        (
            lambda: fl.pack_mxfp4_kv_cache(
                torch.zeros(2, 4, 16, dtype=torch.uint8),
                torch.zeros(2, 4, 1, dtype=torch.uint8, device=META),
            ),
            r"^scales must be on the same device as packed \(cpu\); got meta$",
        ),
        (
            lambda: fl.dequantize_mxfp4(
                torch.zeros(4, 16, dtype=torch.uint8),
                torch.zeros(4, 1, dtype=torch.uint8, device=META),
            ),
            r"^scales must be on the same device as packed \(cpu\); got meta$",
        ),
        (
            lambda: fl.nvfp4_dequantize(_nvfp4()[0], _nvfp4()[1].to(META), 1.0),
            r"^a_sf must be on the same device as a_fp4 \(cpu\); got meta$",
        ),
        (
            lambda: fl.write_fp8_kv_cache(
                torch.zeros(2, 4, 1, 20, dtype=torch.uint8),
                torch.zeros(3, 16, device=META),
                torch.tensor([0, 1, 2]),
            ),
            r"^k must be on the same device as kv_fused \(cpu\); got meta$",
        ),
        (
            lambda: fl.write_fp8_kv_cache(
                torch.zeros(2, 4, 1, 20, dtype=torch.uint8),
                torch.zeros(3, 16),
                torch.tensor([0, 1, 2], device=META),
            ),
            r"^slot_mapping must be on the same device as kv_fused \(cpu\); got meta$",
        ),
    ],
    ids=[
        "fp8_pack_scales",
        "msa_pack_v",
        "mxfp4_pack_scales",
        "mxfp4_dequantize_scales",
        "nvfp4_dequantize_a_sf",
        "write_fp8_k",
        "write_fp8_slot_mapping",
    ],
)
def test_a_tensor_on_another_device_is_a_value_error_naming_both(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    ("dtype", "shown"),
    [("float32", "str"), (None, "NoneType"), (float, "type")],
    ids=["str", "None", "python_float"],
)
@pytest.mark.parametrize(
    "dequantize",
    [
        lambda dtype: fl.dequantize_fp8_kv_cache(_fp8_kv_cache(), dtype=dtype),
        lambda dtype: fl.dequantize_mxfp4(
            torch.zeros(4, 16, dtype=torch.uint8),
            torch.full((4, 1), 127, dtype=torch.uint8),
            dtype=dtype,
        ),
        lambda dtype: fl.dequantize_mxfp4_q(*_mxfp4_q(), dtype=dtype),
        lambda dtype: fl.nvfp4_dequantize(*_nvfp4(), 1.0, dtype=dtype),
        lambda dtype: fl.unpack_nvfp4_msa_pages(_msa_pages(), 1, 1.0, 1.0, dtype=dtype),
    ],
    ids=["fp8_kv_cache", "mxfp4", "mxfp4_q", "nvfp4", "msa_pages"],
)
def test_an_output_dtype_that_is_no_torch_dtype_is_a_type_error(dequantize, dtype, shown):
    with pytest.raises(TypeError, match=rf"^dtype must be a torch\.dtype; got {shown}$"):
        dequantize(dtype)


@pytest.mark.parametrize("flag", [True, False])
@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("a_global_sf", lambda sf: fl.nvfp4_quantize(torch.ones(128, 64), sf)),
        ("a_global_sf", lambda sf: fl.nvfp4_dequantize(*_nvfp4(), sf)),
        (
            "k_global_sf",
            lambda sf: fl.pack_nvfp4_msa_pages(
                torch.zeros(1, 1, 128, 128), torch.zeros(1, 1, 128, 128), sf, 1.0
            ),
        ),
        (
            "v_global_sf",
            lambda sf: fl.pack_nvfp4_msa_pages(
                torch.zeros(1, 1, 128, 128), torch.zeros(1, 1, 128, 128), 1.0, sf
            ),
        ),
        ("k_global_sf", lambda sf: fl.unpack_nvfp4_msa_pages(_msa_pages(), 1, sf, 1.0)),
        ("v_global_sf", lambda sf: fl.unpack_nvfp4_msa_pages(_msa_pages(), 1, 1.0, sf)),
    ],
    ids=[
        "nvfp4_quantize",
        "nvfp4_dequantize",
        "msa_pack_k",
        "msa_pack_v",
        "msa_unpack_k",
        "msa_unpack_v",
    ],
)
def test_a_bool_global_scale_is_a_type_error_naming_it(name, call, flag):
    with pytest.raises(
        TypeError, match=rf"^{name} must be a float or a 1-element floating tensor; got bool$"
    ):
        call(flag)


@pytest.mark.parametrize("num_blocks", [2, 0])
def test_pack_fp8_kv_cache_refuses_an_empty_head_dim(num_blocks):
    values = torch.zeros(num_blocks, 4, 0).to(E4M3)
    with pytest.raises(
        ValueError, match=rf"^values must have head_dim >= 1; got shape \({num_blocks}, 4, 0\)$"
    ):
        fl.pack_fp8_kv_cache(values, torch.ones(num_blocks, 4))


@pytest.mark.parametrize("num_pages", [1, 0])
def test_pack_nvfp4_msa_pages_refuses_zero_kv_heads(num_pages):
    k = torch.zeros(num_pages, 0, fl.MSA_PAGE_SIZE, fl.MSA_HEAD_DIM)
    with pytest.raises(
        ValueError,
        match=rf"^k must have num_kv_heads >= 1; got shape \({num_pages}, 0, 128, 128\)$",
    ):
        fl.pack_nvfp4_msa_pages(k, k.clone(), 1.0, 1.0)


@pytest.mark.parametrize(("block_size", "interleaved"), [(4, False), (128, True)])
def test_pack_mxfp4_kv_cache_refuses_an_empty_head_dim(block_size, interleaved):
    empty = torch.zeros(2, block_size, 0, dtype=torch.uint8)
    with pytest.raises(
        ValueError,
        match=rf"^packed must have head_dim >= 32; got shape \(2, {block_size}, 0\)$",
    ):
        fl.pack_mxfp4_kv_cache(empty, empty.clone(), interleaved=interleaved)


@pytest.mark.parametrize(("rows", "cols"), [(-1, 4), (4, -1), (-128, -4)])
def test_swizzled_128x4_shape_refuses_negative_sizes(rows, cols):
    with pytest.raises(
        ValueError,
        match=rf"^rows and cols must be non-negative; got rows={rows}, cols={cols}$",
    ):
        fl.swizzled_128x4_shape(rows, cols)
