"""The CPU ops build nothing as wide as `max_seq_len`: a wide `max_seq_len` over short
requests costs the output and the requests' own logits, not a float64 copy of every row."""

from __future__ import annotations

import pytest
import torch
from attn_scores_cases import make_fp4_case, make_fp8_case
from flashinfer_attn_scores import fp4_paged_mqa_logits, fp8_paged_mqa_logits, padded_seq_len
from torch.profiler import ProfilerActivity, profile

MAX_SEQ_LEN = 1 << 20  # a float64 row of it is 8 MiB
LENS = [70, 0, 33]


def call_recording(op, args: tuple, out: torch.Tensor, **kwargs) -> tuple[torch.Tensor, int]:
    """The op's result and the most bytes any one operator inside it allocated."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorded:
        logits = op(*args, out=out, **kwargs)
    return logits, max(event.cpu_memory_usage for event in recorded.events())


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_wide_max_seq_len_builds_nothing_row_wide(variant):
    if variant == "fp8":
        case = make_fp8_case(LENS, next_n=2, max_seq_len=MAX_SEQ_LEN, seed=3)
        op, args, dtype = fp8_paged_mqa_logits, case.fp8_args(), torch.float32
    else:
        case = make_fp4_case(LENS, next_n=2, max_seq_len=MAX_SEQ_LEN, seed=3)
        op, args, dtype = fp4_paged_mqa_logits, case.fp4_args(), torch.float32
    rows = len(LENS) * 2
    out = torch.full((rows, padded_seq_len(MAX_SEQ_LEN)), float("nan"), dtype=dtype)

    logits, largest = call_recording(op, args, out, output_dtype=dtype)

    # The per-request logits, the dequantised q and keys: kilobytes. The old CPU path built
    # a [rows, max_seq_len] float64 matrix (48 MiB here) and a mask as wide.
    assert largest < MAX_SEQ_LEN, f"the CPU path allocated {largest} bytes in one operator"
    expected = case.expected()
    for b, length in enumerate(LENS):
        got = logits[2 * b : 2 * b + 2, :length].to(torch.float64)
        torch.testing.assert_close(got, expected[2 * b : 2 * b + 2, :length], rtol=2e-6, atol=0)
    written = ~out.isnan()
    assert not written[2:4].any(), "the rows of the empty request were written"
    assert not written[:, max(LENS) :].any(), "columns past every length were written"
