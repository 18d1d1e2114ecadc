"""With `schedule_meta=None` each CTA derives its schedule rows from `seq_lens` inside the
logits kernel; they must equal `compute_paged_mqa_logits_schedule` bit for bit (the kernel
writes the rows it used into `schedule_rows_out`, a test-only launcher argument)."""

from __future__ import annotations

import random

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import assert_rows_close, make_fp4_case, make_fp8_case
from flashinfer_attn_scores.paged_mqa_logits import fp4_sm90, fp8_sm90
from flashinfer_attn_scores.paged_mqa_logits.reference import (
    fp4_paged_mqa_logits_reference,
    fp8_paged_mqa_logits_reference,
    valid_mask,
)
from flashinfer_schedule import padded_seq_len
from test_gpu import fp4_per_token, magnitude_of, tolerance

pytestmark = pytest.mark.gpu

BATCH_SIZES = [1, 7, 31, 32, 33, 63, 64, 65, 127, 128, 256, 2048, 12288]


def lengths(mix: str, batch_size: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    longest = 300 if batch_size <= 256 else 70  # keeps the KV pools of B = 12288 small
    if mix == "all_zero":
        return [0] * batch_size
    if mix == "half_zero":
        return [0 if rng.random() < 0.5 else rng.randint(1, longest) for _ in range(batch_size)]
    if mix == "one_huge":
        lens = [rng.randint(0, 3) for _ in range(batch_size)]
        lens[rng.randrange(batch_size)] = 20_000 if batch_size <= 256 else 3_000
        return lens
    return [rng.randint(1, longest) for _ in range(batch_size)]  # "random"


def run_with_rows_out(variant: str, case, block_size: int):
    """Launch with schedule_meta=None; return (logits, rows the kernel computed)."""
    device = case.q.device
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    rows_out = torch.full((num_sms + 1, 2), -7, dtype=torch.int32, device=device)
    out = torch.full(
        (case.rows, max(padded_seq_len(case.max_seq_len), 1)), float("nan"), device=device
    )
    if variant == "fp8":
        fp8_sm90.launch(
            case.q, case.kv_fused, case.weights, case.block_tables, case.seq_lens, out, None,
            max_seq_len=case.max_seq_len, output_dtype=torch.float32, epi_dtype=torch.float32,
            acc_dtype=torch.float32, schedule_rows_out=rows_out,
        )  # fmt: skip
    else:
        fp4_sm90.launch(
            case.q, case.q_sf, case.kv_fused, case.weights, case.block_tables, case.seq_lens,
            out, None, max_seq_len=case.max_seq_len, output_dtype=torch.float32,
            epi_dtype=torch.float32,
            is_kv_sf_interleaved=False, schedule_rows_out=rows_out,
        )  # fmt: skip
    torch.cuda.synchronize()
    return out[:, : case.max_seq_len], rows_out


def make_case(variant: str, lens: list[int], block_size: int, seed: int, next_n: int = 1):
    if variant == "fp8":
        case = make_fp8_case(
            lens, next_n=next_n, num_heads=64, head_dim=128, block_size=block_size, seed=seed
        )
    else:
        case = make_fp4_case(lens, next_n=next_n, block_size=block_size, seed=seed)
    return case.to("cuda")


@pytest.mark.parametrize("mix", ["all_zero", "half_zero", "one_huge", "random"])
@pytest.mark.parametrize("batch_size", BATCH_SIZES)
def test_fp8_in_kernel_rows_equal_the_schedule_helper(batch_size, mix):
    lens = lengths(mix, batch_size, seed=batch_size)
    case = make_case("fp8", lens, 64, seed=batch_size)
    got, rows = run_with_rows_out("fp8", case, 64)
    expected_rows = fa.compute_paged_mqa_logits_schedule(case.seq_lens, next_n=1, variant="fp8")
    assert torch.equal(rows, expected_rows), (rows.cpu().tolist(), expected_rows.cpu().tolist())
    mask = valid_mask(case.seq_lens.cpu(), 1, case.max_seq_len)
    assert not torch.isnan(got[mask.cuda()]).any(), "a unit of the schedule was not computed"
    if batch_size <= 256 and case.max_seq_len > 0:  # the logits, for the smaller batches
        args = case.fp8_args()
        assert_rows_close(
            got,
            fp8_paged_mqa_logits_reference(*args),
            mask,
            tolerance(torch.float32),
            magnitude_of(fp8_paged_mqa_logits_reference, args),
        )


@pytest.mark.parametrize("mix", ["half_zero", "one_huge", "random"])
@pytest.mark.parametrize("batch_size", [1, 33, 128, 2048, 12288])
def test_fp4_in_kernel_rows_equal_the_schedule_helper(batch_size, mix):
    lens = lengths(mix, batch_size, seed=batch_size + 1)
    case = make_case("fp4", lens, 64, seed=batch_size + 1)
    got, rows = run_with_rows_out("fp4", case, 64)
    expected_rows = fa.compute_paged_mqa_logits_schedule(case.seq_lens, next_n=1, variant="fp4")
    assert torch.equal(rows, expected_rows), (rows.cpu().tolist(), expected_rows.cpu().tolist())
    mask = valid_mask(case.seq_lens.cpu(), 1, case.max_seq_len)
    assert not torch.isnan(got[mask.cuda()]).any(), "a unit of the schedule was not computed"
    if batch_size <= 256:  # the logits, for the smaller batches (as for fp8)
        args = case.fp4_args()
        assert_rows_close(
            got,
            fp4_paged_mqa_logits_reference(*args),
            mask,
            tolerance(torch.float32),
            magnitude_of(fp4_paged_mqa_logits_reference, args),
            **fp4_per_token(case, torch.float32),
        )


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
@pytest.mark.parametrize("next_n", [3, 4])
@pytest.mark.parametrize("batch_size", [33, 129])
def test_in_kernel_rows_with_fewer_threads_and_strided_lengths(variant, next_n, batch_size):
    """next_n 3 and 4 run 384-512 threads per CTA (both scan paths depend on the block size),
    and `seq_lens` here is every other element of a wider tensor."""
    lens = lengths("half_zero", batch_size, seed=batch_size + next_n)
    case = make_case(variant, lens, 64, seed=batch_size + next_n, next_n=next_n)
    wide = torch.full((2 * batch_size,), -5, dtype=torch.int32, device="cuda")
    wide[::2] = case.seq_lens
    case.seq_lens = wide[::2]
    assert case.seq_lens.stride(0) == 2
    got, rows = run_with_rows_out(variant, case, 64)
    expected_rows = fa.compute_paged_mqa_logits_schedule(
        case.seq_lens, next_n=next_n, variant=variant
    )
    assert torch.equal(rows, expected_rows), (rows.cpu().tolist(), expected_rows.cpu().tolist())
    reference = (
        fp8_paged_mqa_logits_reference if variant == "fp8" else fp4_paged_mqa_logits_reference
    )
    args = case.fp8_args() if variant == "fp8" else case.fp4_args()
    per_token = {} if variant == "fp8" else fp4_per_token(case, torch.float32)
    assert_rows_close(
        got,
        reference(*args),
        valid_mask(case.seq_lens.cpu(), next_n, case.max_seq_len),
        tolerance(torch.float32),
        magnitude_of(reference, args),
        **per_token,
    )
