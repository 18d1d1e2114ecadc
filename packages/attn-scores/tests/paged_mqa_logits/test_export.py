"""torch.export of the public functions (CPU tensors: the same validation and custom ops as
CUDA). Serving stacks export whole decode steps, strict (through dynamo) and non-strict
(plain Python over fake tensors, where a size read from data is a `torch.SymInt`)."""

from __future__ import annotations

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import make_fp4_case, make_fp8_case
from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask

LENS = [37, 0, 300, 5]


def assert_valid_region_equal(got, want, seq_lens, next_n):
    assert got.shape == want.shape and got.dtype == want.dtype
    mask = valid_mask(seq_lens, next_n, got.shape[1])
    assert torch.equal(got[mask], want[mask])


class LengthFromData(torch.nn.Module):
    """The decode step that reads `max_seq_len` from `seq_lens` and sizes `out` from it."""

    def __init__(self, variant: str):
        super().__init__()
        self.variant = variant

    def forward(self, *args):
        seq_lens = args[-1]
        longest = seq_lens.max().item()
        rows = args[0].shape[0] * args[0].shape[1]
        out = torch.empty(rows, fa.padded_seq_len(longest), dtype=torch.float32)
        if self.variant == "fp8":
            return fa.fp8_paged_mqa_logits(*args, longest, out=out)
        return fa.fp4_paged_mqa_logits(*args, longest, out=out, output_dtype=torch.float32)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_a_step_with_max_seq_len_read_from_data_exports_and_reruns(variant, strict, tmp_path):
    if variant == "fp8":
        case = make_fp8_case(LENS, next_n=2, seed=21)
        args, next_n = case.fp8_args()[:-1], 2
        eager = fa.fp8_paged_mqa_logits(*case.fp8_args())
    else:
        case = make_fp4_case(LENS, next_n=1, block_size=64, seed=22)
        args, next_n = case.fp4_args()[:-1], 1
        eager = fa.fp4_paged_mqa_logits(*case.fp4_args(), output_dtype=torch.float32)
    exported = torch.export.export(LengthFromData(variant), args, strict=strict)
    path = tmp_path / "step.pt2"
    torch.export.save(exported, path)
    for program in (exported, torch.export.load(path)):
        got = program.module()(*args)
        assert got.shape == eager.shape
        assert_valid_region_equal(got, eager, case.seq_lens, next_n)


@pytest.mark.parametrize("strict", [False, True])
def test_a_length_read_from_data_reruns_across_multiples_of_256(strict):
    """The returned view is contiguous exactly when max_seq_len is a multiple of 256; a
    `max_seq_len` input with `Dim.DYNAMIC` gets that fixed to the traced side (an exported
    program then refuses 1024 after tracing 300), one read from data does not (quickstart)."""
    case = make_fp8_case([37, 0, 1024, 5], next_n=1, seed=23)
    args = case.fp8_args()[:-1]
    seq_lens = args[-1]
    seq_lens[2] = 300
    exported = torch.export.export(LengthFromData("fp8"), args, strict=strict)
    for longest in (512, 1024, 257, 300, 256):
        seq_lens[2] = longest
        got = exported.module()(*args)
        eager = fa.fp8_paged_mqa_logits(*args, longest)
        assert got.shape == (case.rows, longest)
        assert_valid_region_equal(got, eager, seq_lens, 1)


@pytest.mark.parametrize("strict", [False, True])
def test_the_size_helpers_take_a_size_read_from_data(strict):
    class Sizes(torch.nn.Module):
        def forward(self, seq_lens):
            longest = seq_lens.max().item()
            width = fa.min_block_table_width(longest, 64)
            return torch.zeros(fa.padded_seq_len(longest)), torch.zeros(width)

    seq_lens = torch.tensor(LENS, dtype=torch.int32)
    exported = torch.export.export(Sizes(), (seq_lens,), strict=strict)
    cols, width = exported.module()(torch.tensor([1000, 3, 0, 9], dtype=torch.int32))
    assert cols.shape == (fa.padded_seq_len(1000),) and width.shape == (16,)


@pytest.mark.parametrize("strict", [False, True])
def test_the_schedule_exports_and_follows_new_lengths(strict):
    class Schedule(torch.nn.Module):
        def forward(self, seq_lens):
            return fa.compute_paged_mqa_logits_schedule(seq_lens, next_n=2, num_sms=11)

    seq_lens = torch.tensor(LENS, dtype=torch.int32)
    exported = torch.export.export(Schedule(), (seq_lens,), strict=strict)
    other = torch.tensor([9, 4000, 0, 77], dtype=torch.int32)
    want = fa.compute_paged_mqa_logits_schedule(other, next_n=2, num_sms=11)
    assert torch.equal(exported.module()(other), want)
