"""Integer arguments take Python and numpy integers alike (as the schedule helpers do), come
back as Python ints, and still refuse bool, float and tensors."""

from __future__ import annotations

import flashinfer_layouts as fl
import pytest
import torch

np = pytest.importorskip("numpy")

NUMPY_INTEGERS = [np.int64, np.int32, np.uint8]


@pytest.mark.parametrize("integer", NUMPY_INTEGERS)
def test_sizes_and_offsets(integer):
    assert fl.msa_page_offsets(integer(4)) == fl.msa_page_offsets(4)
    assert all(type(x) is int for x in fl.msa_page_offsets(integer(4)))

    shape = fl.swizzled_128x4_shape(integer(130), integer(5))
    assert shape == (256, 8)
    assert all(type(x) is int for x in shape)

    offset = fl.swizzle_128x4_offset(integer(129), integer(2), integer(5))
    assert offset == fl.swizzle_128x4_offset(129, 2, 5)
    assert type(offset) is int


@pytest.mark.parametrize("integer", NUMPY_INTEGERS)
def test_interleaved_maps(integer):
    for fn in (fl.mxfp4_interleaved_token_of_slot, fl.mxfp4_interleaved_slot_of_token):
        assert torch.equal(fn(integer(128)), fn(128))


@pytest.mark.parametrize("integer", [np.int64, np.int16])
def test_group_sizes(integer):
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    packed, scales = fl.quantize_mxfp4(x, sf_vec_size=integer(32))
    expected_packed, expected_scales = fl.quantize_mxfp4(x, sf_vec_size=32)
    assert torch.equal(packed, expected_packed) and torch.equal(scales, expected_scales)
    assert torch.equal(
        fl.dequantize_mxfp4(packed, scales, sf_vec_size=integer(32)),
        fl.dequantize_mxfp4(packed, scales, sf_vec_size=32),
    )

    a = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    global_sf = fl.nvfp4_global_scale(a)
    got = fl.nvfp4_quantize(a, global_sf, sf_vec_size=integer(16), swizzled=False)
    expected = fl.nvfp4_quantize(a, global_sf, sf_vec_size=16, swizzled=False)
    assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        (np.bool_(True), r"numpy\.bool"),
        (np.float64(128.0), r"numpy\.float64"),
        (torch.tensor(128), r"torch\.Tensor"),
        (True, "bool"),
    ],
)
def test_non_integers_are_still_refused(value, type_name):
    with pytest.raises(TypeError, match=rf"block_size must be an int; got {type_name}$"):
        fl.mxfp4_interleaved_token_of_slot(value)
    with pytest.raises(TypeError, match=rf"num_kv_heads must be an int; got {type_name}$"):
        fl.msa_page_offsets(value)


def test_a_numpy_integer_out_of_range_is_still_a_value_error():
    with pytest.raises(ValueError, match="num_kv_heads must be positive; got 0"):
        fl.msa_page_offsets(np.int64(0))
    with pytest.raises(ValueError, match="block_size == 128"):
        fl.mxfp4_interleaved_slot_of_token(np.int32(64))
