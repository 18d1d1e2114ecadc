"""Calls from several Python threads at once, each on its own stream with its own inputs.

A serving process may score from more than one thread (one per stream, or a warm-up thread
beside the request loop). The first calls of a configuration compile, load and remember the
launch concurrently; the later ones share the remembered launch and its argument buffer.
"""

from __future__ import annotations

import threading

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import make_fp4_case, make_fp8_case
from flashinfer_attn_scores.paged_mqa_logits.reference import (
    fp4_paged_mqa_logits_reference,
    fp8_paged_mqa_logits_reference,
)
from test_gpu import (
    EDGE_LENGTHS,
    MAX_SEQ_LEN,
    check_result,
    fp4_per_token,
    magnitude_of,
    poisoned_out,
    tolerance,
)

pytestmark = pytest.mark.gpu

THREADS = 6
CALLS_PER_THREAD = 4


def make_case(variant: str, seed: int):
    if variant == "fp8":
        # A configuration no other test file builds, so the threads' first calls compile it.
        return make_fp8_case(
            EDGE_LENGTHS,
            next_n=2,
            num_heads=32,
            head_dim=64,
            block_size=64,
            max_seq_len=MAX_SEQ_LEN,
            spare_blocks=16,
            seed=seed,
        ).to("cuda")
    return make_fp4_case(
        EDGE_LENGTHS, next_n=2, block_size=64, max_seq_len=MAX_SEQ_LEN, spare_blocks=16, seed=seed
    ).to("cuda")


@pytest.mark.parametrize("own_stream", [True, False], ids=["own-stream", "default-stream"])
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_threads_calling_at_once(variant, own_stream):
    """Each thread on a stream of its own, or all on the default stream (a fresh thread has
    no current CUDA context until it calls into the runtime)."""
    op, reference, dtype, args_of = {
        "fp8": (
            fa.fp8_paged_mqa_logits,
            fp8_paged_mqa_logits_reference,
            torch.float32,
            lambda c: c.fp8_args(),
        ),
        "fp4": (
            fa.fp4_paged_mqa_logits,
            fp4_paged_mqa_logits_reference,
            torch.bfloat16,
            lambda c: c.fp4_args(),
        ),
    }[variant]
    cases = [make_case(variant, seed=100 + i) for i in range(THREADS)]
    outs = [
        [poisoned_out(c.rows, MAX_SEQ_LEN, dtype) for _ in range(CALLS_PER_THREAD)] for c in cases
    ]
    torch.cuda.synchronize()
    start = threading.Barrier(THREADS)
    results: list[list[torch.Tensor]] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            stream = torch.cuda.Stream() if own_stream else torch.cuda.default_stream()
            start.wait()
            with torch.cuda.stream(stream):
                for out in outs[i]:
                    results[i].append(op(*args_of(cases[i]), out=out))
            stream.synchronize()
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for case, got_list, out_list in zip(cases, results, outs):
        args = args_of(case)
        expected = reference(*args)
        magnitude = magnitude_of(reference, args)
        per_token = {} if variant == "fp8" else fp4_per_token(case, dtype)
        assert len(got_list) == CALLS_PER_THREAD
        for got, out in zip(got_list, out_list):
            check_result(
                got, out, expected, case.seq_lens, 2, tolerance(dtype), magnitude, **per_token
            )
