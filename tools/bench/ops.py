"""The ops under test and their float64 references, called with one rotation set's inputs."""

from __future__ import annotations

from collections.abc import Callable

import flashinfer_attn_scores
import torch
from flashinfer_attn_scores.paged_mqa_logits import reference

from .data import CallInputs, CaseData


def op_call(case: CaseData, inputs: CallInputs) -> Callable[[], torch.Tensor]:
    """A closure that runs the op on `inputs`, writing into `inputs.out`, returning the view."""
    kv, n = case.kv_fused, case.max_seq_len
    if case.shape.op == "fp8":
        return lambda: flashinfer_attn_scores.fp8_paged_mqa_logits(
            inputs.q, kv, inputs.weights, inputs.block_tables, inputs.seq_lens, n, out=inputs.out
        )
    return lambda: flashinfer_attn_scores.fp4_paged_mqa_logits(
        inputs.q,
        inputs.q_sf,
        kv,
        inputs.weights,
        inputs.block_tables,
        inputs.seq_lens,
        n,
        out=inputs.out,
    )


def reference_logits(
    op: str,
    inputs: CallInputs,
    kv_fused: torch.Tensor,
    block_tables: torch.Tensor,
    requests: slice,
    max_seq_len: int,
) -> torch.Tensor:
    """The float64 reference logits of the requests in `requests` (a slice of the batch).

    `kv_fused` and `block_tables` are passed separately so the caller can hand over a compact
    copy of just the pages these requests read.
    """
    next_n = inputs.q.shape[1]
    rows = slice(requests.start * next_n, requests.stop * next_n)
    seq_lens = inputs.seq_lens[requests]
    weights = inputs.weights[rows]
    if op == "fp8":
        return reference.fp8_paged_mqa_logits_reference(
            inputs.q[requests], kv_fused, weights, block_tables, seq_lens, max_seq_len
        )
    return reference.fp4_paged_mqa_logits_reference(
        inputs.q[requests],
        inputs.q_sf[requests],
        kv_fused,
        weights,
        block_tables,
        seq_lens,
        max_seq_len,
    )
