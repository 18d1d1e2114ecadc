"""The ops under test and their float64 references, called with one rotation set's inputs."""

from __future__ import annotations

from collections.abc import Callable

import flashinfer_attn_scores
import torch
from flashinfer_attn_scores.paged_mqa_logits import reference

from .data import CallInputs, CaseData


def op_call(case: CaseData, inputs: CallInputs) -> Callable[[], torch.Tensor]:
    """A closure that runs the op on `inputs`, writing into `inputs.out`, returning the view,
    with the case's epilogue (and, for fp8, accumulator) dtype."""
    kv, n, shape = case.kv_fused, case.max_seq_len, case.shape
    epi_dtype = getattr(torch, shape.epi_dtype)
    if shape.op == "fp8":
        acc_dtype = getattr(torch, shape.acc_dtype)
        return lambda: flashinfer_attn_scores.fp8_paged_mqa_logits(
            inputs.q,
            kv,
            inputs.weights,
            inputs.block_tables,
            inputs.seq_lens,
            n,
            epi_dtype=epi_dtype,
            acc_dtype=acc_dtype,
            out=inputs.out,
        )
    return lambda: flashinfer_attn_scores.fp4_paged_mqa_logits(
        inputs.q,
        inputs.q_sf,
        kv,
        inputs.weights,
        inputs.block_tables,
        inputs.seq_lens,
        n,
        epi_dtype=epi_dtype,
        out=inputs.out,
    )


def reference_logits(
    case: CaseData,
    inputs: CallInputs,
    requests: slice,
    max_seq_len: int,
    *,
    abs_weights: bool = False,
) -> torch.Tensor:
    """Float64 reference logits `[len(requests)*next_n, max_seq_len]` of a slice of the batch.

    The reference gathers only the pages each request reads, so the pool's size does not
    matter; `max_seq_len` bounds the chunk's float64 output. With `abs_weights` the weights'
    signs are dropped: the result is the size of the head terms each logit sums.
    """
    next_n = inputs.q.shape[1]
    rows = slice(requests.start * next_n, requests.stop * next_n)
    weights = inputs.weights[rows]
    args = (
        case.kv_fused,
        weights.abs() if abs_weights else weights,
        inputs.block_tables[requests],
        inputs.seq_lens[requests],
        max_seq_len,
    )
    if case.shape.op == "fp8":
        return reference.fp8_paged_mqa_logits_reference(inputs.q[requests], *args)
    if inputs.q_sf is None:
        raise ValueError(f"{case.shape.label}: an fp4 case needs q_sf, got None")
    return reference.fp4_paged_mqa_logits_reference(
        inputs.q[requests], inputs.q_sf[requests], *args
    )
