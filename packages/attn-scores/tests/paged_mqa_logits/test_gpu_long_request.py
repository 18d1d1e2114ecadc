"""Requests of a million tokens and more (long-context serving), against the float64
expectation of `attn_scores_cases` (independent of the package's reference).

One request that long is tens of thousands of 64-token units, split over every CTA, with a
block table row of tens of thousands of entries; the other requests of the call are tiny or
empty. The head shapes are kept small where the op allows it, so the float64 expectation of
every position fits the host's memory.
"""

from __future__ import annotations

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import make_fp4_case, make_fp8_case
from test_gpu import check_result, fp4_per_token, poisoned_out, tolerance

pytestmark = pytest.mark.gpu


def test_fp8_three_million_token_request():
    # (num_heads 8, head_dim 32, next_n 2): a configuration the compile check builds.
    lens = [3_000_017, 0, 70]
    case = make_fp8_case(
        lens, next_n=2, num_heads=8, head_dim=32, block_size=32, spare_blocks=64, seed=17
    ).to("cuda")
    out = poisoned_out(case.rows, case.max_seq_len, torch.float32)
    got = fa.fp8_paged_mqa_logits(*case.fp8_args(), out=out)
    magnitude = case.expected(abs_weights=True)
    check_result(got, out, case.expected(), case.seq_lens, 2, tolerance(torch.float32), magnitude)


def test_fp4_million_token_request_interleaved_scales():
    lens = [5, 1_048_579]
    case = make_fp4_case(
        lens, next_n=1, block_size=128, interleaved=True, spare_blocks=64, seed=19
    ).to("cuda")
    out = poisoned_out(case.rows, case.max_seq_len, torch.bfloat16)
    got = fa.fp4_paged_mqa_logits(*case.fp4_args(), is_kv_sf_interleaved=True, out=out)
    magnitude = case.expected(abs_weights=True)
    tol = tolerance(torch.bfloat16)
    per_token = fp4_per_token(case, torch.bfloat16, interleaved=True)  # slot -> token order
    check_result(got, out, case.expected(), case.seq_lens, 1, tol, magnitude, **per_token)
