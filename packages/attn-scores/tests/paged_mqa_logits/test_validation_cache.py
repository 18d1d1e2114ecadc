"""The per-signature validation cache skips repeated checks and never skips a needed one."""

from __future__ import annotations

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import make_fp4_case, make_fp8_case
from flashinfer_attn_scores.paged_mqa_logits import api, dispatch
from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask


@pytest.fixture
def counted_checks(monkeypatch):
    calls = []
    original = api.check_common

    def counting(**kwargs):
        calls.append(kwargs["variant"])
        return original(**kwargs)

    monkeypatch.setattr(api, "check_common", counting)
    monkeypatch.setattr(dispatch, "_VALIDATED", {})
    return calls


def test_same_signature_validates_once(counted_checks):
    case = make_fp8_case([40, 70], next_n=1, seed=1)
    first = fa.fp8_paged_mqa_logits(*case.fp8_args())
    second = fa.fp8_paged_mqa_logits(*case.fp8_args())
    assert counted_checks == ["fp8"]
    mask = valid_mask(case.seq_lens, 1, case.max_seq_len)
    assert torch.equal(first[mask], second[mask])
    # Fresh tensors with the same metadata share the signature.
    other = make_fp8_case([40, 70], next_n=1, seed=2)
    fa.fp8_paged_mqa_logits(*other.fp8_args())
    assert counted_checks == ["fp8"]


def test_changed_metadata_is_validated_again(counted_checks):
    case = make_fp8_case([40, 70], next_n=1, seed=3)
    fa.fp8_paged_mqa_logits(*case.fp8_args())
    # A different max_seq_len, a strided view and a wrong dtype are new signatures.
    args = list(case.fp8_args())
    args[-1] = args[-1] + 64
    fa.fp8_paged_mqa_logits(*args)
    assert counted_checks == ["fp8", "fp8"]
    args = list(case.fp8_args())
    args[2] = args[2].t().contiguous().t()  # weights, column-major
    fa.fp8_paged_mqa_logits(*args)
    assert counted_checks == ["fp8"] * 3
    bad = list(case.fp8_args())
    bad[2] = bad[2].to(torch.float16)  # weights must be float32
    with pytest.raises(TypeError, match="weights"):
        fa.fp8_paged_mqa_logits(*bad)
    bad = list(case.fp8_args())
    bad[-1] = -1
    with pytest.raises(ValueError, match="max_seq_len"):
        fa.fp8_paged_mqa_logits(*bad)


# Keyword arguments of a known signature: a valid value of its own, then one the checks refuse.
FP8_KEYWORDS = {
    "output_dtype": (torch.float16, torch.bfloat16, "output_dtype must be one of"),
    "epi_dtype": (torch.float16, torch.bfloat16, "epi_dtype must be one of"),
    "acc_dtype": (torch.float16, torch.bfloat16, "acc_dtype must be one of"),
}
FP4_KEYWORDS = {
    "output_dtype": (torch.float32, torch.float64, "output_dtype must be one of"),
    "epi_dtype": (torch.bfloat16, torch.float64, "epi_dtype must be one of"),
    "sf_vec_size": (None, 16, "sf_vec_size must be 32, got 16"),
}


@pytest.mark.parametrize("keyword", FP8_KEYWORDS)
def test_each_fp8_keyword_is_part_of_the_signature(counted_checks, keyword):
    """The signature keys the validation and, on CUDA, the remembered launch (which fixes the
    kernel's dtypes): a call that differs only in a keyword argument is validated again."""
    valid, refused, message = FP8_KEYWORDS[keyword]
    case = make_fp8_case([40, 70], next_n=1, seed=9)
    fa.fp8_paged_mqa_logits(*case.fp8_args())
    fa.fp8_paged_mqa_logits(*case.fp8_args(), **{keyword: valid})
    assert counted_checks == ["fp8", "fp8"]
    with pytest.raises(ValueError, match=message):
        fa.fp8_paged_mqa_logits(*case.fp8_args(), **{keyword: refused})


@pytest.mark.parametrize("keyword", [*FP4_KEYWORDS, "is_kv_sf_interleaved"])
def test_each_fp4_keyword_is_part_of_the_signature(counted_checks, keyword):
    case = make_fp4_case([40, 70], next_n=1, block_size=32, seed=10)
    fa.fp4_paged_mqa_logits(*case.fp4_args())
    if keyword == "is_kv_sf_interleaved":  # True is refused at this block size
        valid, refused, message = None, True, "is_kv_sf_interleaved=True requires block_size"
    else:
        valid, refused, message = FP4_KEYWORDS[keyword]
    if valid is not None:
        fa.fp4_paged_mqa_logits(*case.fp4_args(), **{keyword: valid})
        assert counted_checks == ["fp4", "fp4"]
    with pytest.raises(ValueError, match=message):
        fa.fp4_paged_mqa_logits(*case.fp4_args(), **{keyword: refused})


def test_unhashable_arguments_fall_back_to_the_checks(counted_checks):
    case = make_fp8_case([40], next_n=1, seed=4)
    args = list(case.fp8_args())
    args[-1] = [int(args[-1])]  # a list is not an int
    with pytest.raises(TypeError, match="max_seq_len"):
        fa.fp8_paged_mqa_logits(*args)


def test_a_sparse_tensor_after_an_expanded_one_of_its_shape_is_still_refused(counted_checks):
    # A sparse COO tensor reports all-zero strides, as an expand()ed dense one does, so a
    # signature holding such a tensor is not remembered.
    case = make_fp8_case([40, 40], next_n=2, num_heads=8, head_dim=32, max_seq_len=64, seed=6)
    args = list(case.fp8_args())
    args[4] = case.seq_lens[:1].expand(2)
    expanded = fa.fp8_paged_mqa_logits(*args)
    fa.fp8_paged_mqa_logits(*args)
    assert counted_checks == ["fp8", "fp8"]
    mask = valid_mask(case.seq_lens, 2, case.max_seq_len)
    assert torch.equal(expanded[mask], fa.fp8_paged_mqa_logits(*case.fp8_args())[mask])
    args[4] = case.seq_lens.to_sparse()
    assert args[4].stride() == (0,)
    with pytest.raises(TypeError, match=r"seq_lens must be a dense \(torch.strided\) tensor"):
        fa.fp8_paged_mqa_logits(*args)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no mkldnn")
def test_an_mkldnn_tensor_after_an_expanded_one_of_its_strides_is_still_refused(counted_checks):
    # An mkldnn tensor reports strides (1, 0, ..., 0), as a dense weights[:, :1].expand() does.
    case = make_fp8_case([40, 40], next_n=1, num_heads=8, head_dim=32, max_seq_len=64, seed=6)
    args = list(case.fp8_args())
    column = case.weights[:, :1].contiguous()
    args[2] = column.expand(case.weights.shape)
    assert args[2].stride() == (1, 0)
    fa.fp8_paged_mqa_logits(*args)
    fa.fp8_paged_mqa_logits(*args)
    assert counted_checks == ["fp8", "fp8"]  # not remembered
    args[2] = args[2].contiguous().to_mkldnn()
    assert args[2].stride() == (1, 0)
    with pytest.raises(TypeError, match=r"weights must be a dense \(torch.strided\) tensor"):
        fa.fp8_paged_mqa_logits(*args)


def test_a_one_dimensional_unit_stride_signature_is_still_remembered(counted_checks):
    # (1,) is a contiguous 1-D tensor's stride, not mkldnn's pattern: seq_lens keeps it.
    case = make_fp8_case([40, 70], next_n=1, seed=1)
    assert case.seq_lens.stride() == (1,)
    fa.fp8_paged_mqa_logits(*case.fp8_args())
    fa.fp8_paged_mqa_logits(*case.fp8_args())
    assert counted_checks == ["fp8"]


@pytest.mark.parametrize(
    "index", [0, 1, 2, 3, 4], ids=["q", "kv_fused", "weights", "tables", "lens"]
)
def test_a_negated_view_is_refused(index):
    # A negated view (is_neg()) holds the negated values in memory, which a kernel reads.
    case = make_fp8_case([40, 70], next_n=1, seed=7)
    args = list(case.fp8_args())
    name = ["q", "kv_fused", "weights", "block_tables", "seq_lens"][index]
    negated = torch._neg_view(args[index])
    assert negated.is_neg()
    args[index] = negated
    with pytest.raises(TypeError, match=rf"{name} is a negated view .*{name}\.resolve_neg\(\)"):
        fa.fp8_paged_mqa_logits(*args)


def test_a_negated_weights_or_out_of_a_known_signature_is_refused(counted_checks):
    # The float tensors a negated view comes from in public PyTorch (.imag of a conj() view)
    # are tested on every call, after the signature is remembered.
    case = make_fp8_case([40, 70], next_n=1, seed=8)
    out = torch.full((case.rows, 256), float("nan"))
    fa.fp8_paged_mqa_logits(*case.fp8_args(), out=out)
    assert counted_checks == ["fp8"]
    conj_imag = torch.complex(torch.zeros_like(case.weights), -case.weights).conj().imag
    assert conj_imag.is_neg() and torch.equal(conj_imag, case.weights)
    args = list(case.fp8_args())
    args[2] = conj_imag
    with pytest.raises(TypeError, match=r"weights is a negated view"):
        fa.fp8_paged_mqa_logits(*args, out=out)
    with pytest.raises(TypeError, match=r"out is a negated view"):
        fa.fp8_paged_mqa_logits(*case.fp8_args(), out=torch._neg_view(out))
