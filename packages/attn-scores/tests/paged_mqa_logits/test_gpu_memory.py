"""10^5 eager calls of fp8_paged_mqa_logits grow neither device nor host memory (SM90 GPU).

Each variant runs 1000 warm-up calls (kernel load, caches, allocator pools), takes a baseline,
runs the remaining 99 000 calls back to back and compares. Device memory must be exactly back
at the baseline (PyTorch's allocated and reserved bytes); the host's resident set, read from
/proc/self/statm, may grow by less than RSS_GROWTH_BOUND (the interpreter and allocator keep
some slack, a per-call leak of even 100 bytes would be 9.9 MB). The problem is tiny (three
requests, one of them empty) so the calls take about 10 us each and the test a few seconds.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import make_fp8_case
from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

CALLS = 10**5
WARMUP_CALLS = 1000
RSS_GROWTH_BOUND = 8 << 20  # bytes
# Slack for the schedule kernel's temporaries when schedule_meta is None.
TEMPORARY_SLACK = 1 << 20


def rss_bytes() -> int:
    """Resident set size of this process (second field of /proc/self/statm, in pages)."""
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def case():
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("needs /proc/self/statm (Linux) to read the resident set size")
    return make_fp8_case(
        [200, 0, 77], num_heads=64, head_dim=128, block_size=64, seed=11, spare_blocks=4
    ).to("cuda")


def device_memory() -> tuple[int, int]:
    torch.cuda.synchronize()
    gc.collect()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


def repeat(call: Callable[[], object], count: int) -> None:
    for _ in range(count):
        call()


@pytest.mark.parametrize("precomputed_schedule", [True, False], ids=["schedule", "no-schedule"])
def test_calls_with_out_hold_device_and_host_memory_steady(case, precomputed_schedule):
    out = torch.full((case.rows, fa.padded_seq_len(case.max_seq_len)), float("nan"), device="cuda")
    schedule = (
        fa.compute_paged_mqa_logits_schedule(case.seq_lens, next_n=case.next_n, variant="fp8")
        if precomputed_schedule
        else None
    )

    def call() -> torch.Tensor:
        return fa.fp8_paged_mqa_logits(*case.fp8_args(), schedule_meta=schedule, out=out)

    first = call().cpu()
    repeat(call, WARMUP_CALLS - 1)
    allocated, reserved = device_memory()
    rss = rss_bytes()

    repeat(call, CALLS - WARMUP_CALLS - 1)
    out.fill_(float("nan"))  # else `out` would still hold what an earlier call wrote
    call()
    assert device_memory() == (allocated, reserved)
    growth = rss_bytes() - rss
    assert growth < RSS_GROWTH_BOUND, f"host RSS grew by {growth} bytes over 99 000 calls"
    # The calls kept computing: the last call, into a re-poisoned `out`, wrote bitwise what
    # the first wrote (the op is deterministic).
    last = out[: case.rows, : case.max_seq_len].cpu()
    assert torch.equal(last.isnan(), first.isnan())
    assert torch.equal(last.nan_to_num(), first.nan_to_num())
    assert not first[0, :200].isnan().any()


def test_calls_without_out_free_every_output(case):
    def call() -> torch.Tensor:
        return fa.fp8_paged_mqa_logits(*case.fp8_args())

    baseline, _ = device_memory()
    result = call()
    output_bytes = result.untyped_storage().nbytes()
    first = result.cpu()
    del result
    for _ in range(WARMUP_CALLS - 1):
        result = call()
    del result
    allocated, reserved = device_memory()
    assert allocated == baseline, "outputs freed by the caller left device memory allocated"
    rss = rss_bytes()
    torch.cuda.reset_peak_memory_stats()

    for _ in range(CALLS - WARMUP_CALLS - 1):
        result = call()  # the previous output is freed when `result` is rebound
    # The caching allocator hands the freed block of the same size to the next call, so an
    # output that was never written would still hold an earlier call's logits: poison it.
    result.fill_(float("nan"))
    del result
    result = call()
    last = result.cpu()
    del result
    assert device_memory() == (baseline, reserved)
    # At most two outputs are alive at once (the new one before the old one is released).
    peak = torch.cuda.max_memory_allocated()
    assert peak <= baseline + 2 * output_bytes + TEMPORARY_SLACK
    growth = rss_bytes() - rss
    assert growth < RSS_GROWTH_BOUND, f"host RSS grew by {growth} bytes over 99 000 calls"
    # Fresh outputs hold arbitrary bytes outside the valid region: compare inside it.
    valid = valid_mask(case.seq_lens.cpu(), case.next_n, case.max_seq_len)
    assert torch.isfinite(last[valid]).all()
    assert torch.equal(last[valid], first[valid])


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_a_freed_kv_pool_is_released(variant):
    """The launcher's TMA-descriptor cache must not keep a caller's freed pool alive."""
    from attn_scores_cases import make_fp4_case

    gc.collect()
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    for seed in range(3):  # three distinct pools, each freed after its call
        if variant == "fp8":
            case = make_fp8_case(
                [300, 70], num_heads=64, head_dim=128, block_size=64, spare_blocks=4000, seed=seed
            ).to("cuda")
            fa.fp8_paged_mqa_logits(*case.fp8_args())
        else:
            case = make_fp4_case([300, 70], block_size=64, spare_blocks=4000, seed=seed).to("cuda")
            fa.fp4_paged_mqa_logits(*case.fp4_args())
        torch.cuda.synchronize()
        del case
        gc.collect()
        assert torch.cuda.memory_allocated() == baseline, (
            f"{torch.cuda.memory_allocated() - baseline} bytes still allocated after freeing pool {seed}"
        )
