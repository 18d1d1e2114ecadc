"""Repeated eager calls on the GPU: a validated signature's remembered launch (dispatch.EagerCall)
against the float64 reference, with everything the signature does not fix changed between
calls (data, the KV pool's address, q's alignment, the output buffer, the stream)."""

from __future__ import annotations

import flashinfer_attn_scores as fa
import numpy as np
import pytest
import torch
from attn_scores_cases import assert_rows_close
from flashinfer_attn_scores.paged_mqa_logits import dispatch, launcher
from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask
from test_gpu import (
    VARIANTS,
    check_result,
    fp8_case,
    magnitude_of,
    poisoned_out,
    tolerance,
)

pytestmark = pytest.mark.gpu


@pytest.fixture
def prepares(monkeypatch):
    """A fresh table of remembered calls, validate mode off, and a count of prepared launches."""
    monkeypatch.setattr(dispatch, "_EAGER_CALLS", {})
    monkeypatch.delenv("FLASHINFER_VALIDATE_INPUTS", raising=False)
    counts = {"fp8": 0, "fp4": 0}
    for variant in counts:
        name = f"prepare_{variant}_paged_mqa_logits"
        original = getattr(launcher, name)

        def counted(*args, _variant=variant, _original=original, **kwargs):
            counts[_variant] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(launcher, name, counted)
    return counts


def check(variant, case, got, out, next_n=2):
    kind = VARIANTS[variant]
    args, reference = kind.args(case), kind.reference
    expected = reference(*args)
    check_result(
        got,
        out,
        expected,
        case.seq_lens,
        next_n,
        tolerance(kind.output_dtype),
        magnitude_of(reference, args),
        **kind.per_token(case, kind.output_dtype),
    )


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_fresh_tensors_of_a_known_signature_reuse_the_launch(variant, prepares):
    kind = VARIANTS[variant]
    for seed in (30, 31, 32):  # new data, a new KV pool address and a new out each time
        case = kind.make_case(64, 2, seed=seed)
        out = poisoned_out(case.rows, case.max_seq_len, kind.output_dtype)
        got = kind.op(*kind.args(case), out=out)
        check(variant, case, got, out)
    assert prepares[variant] == 1


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_without_out_every_call_gets_its_own_storage(variant, prepares):
    kind = VARIANTS[variant]
    first_case, second_case = kind.make_case(32, 2, seed=33), kind.make_case(32, 2, seed=34)
    first = kind.op(*kind.args(first_case))
    second = kind.op(*kind.args(second_case))
    assert prepares[variant] == 1
    assert first.data_ptr() != second.data_ptr()
    assert first.shape == second.shape == (first_case.rows, first_case.max_seq_len)
    for case, got in ((first_case, first), (second_case, second)):
        args = kind.args(case)
        mask = valid_mask(case.seq_lens.cpu(), case.next_n, case.max_seq_len)
        magnitude = magnitude_of(kind.reference, args)
        tol, per_token = tolerance(kind.output_dtype), kind.per_token(case, kind.output_dtype)
        assert_rows_close(got, kind.reference(*args), mask, tol, magnitude, **per_token)


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_a_numpy_max_seq_len_shares_the_launch_of_its_int(variant, prepares):
    kind = VARIANTS[variant]
    for seed, integer in ((36, int), (37, np.int64), (38, np.int32)):
        case = kind.make_case(64, 2, seed=seed)
        *args, max_seq_len = kind.args(case)
        out = poisoned_out(case.rows, case.max_seq_len, kind.output_dtype)
        got = kind.op(*args, integer(max_seq_len), out=out)
        check(variant, case, got, out)
    assert prepares[variant] == 1


def test_misaligned_q_of_a_known_signature_is_copied(prepares):
    case = fp8_case(64, 2, seed=35)
    fa.fp8_paged_mqa_logits(
        *case.fp8_args(), out=poisoned_out(case.rows, case.max_seq_len, torch.float32)
    )
    shifted = torch.empty(case.q.numel() + 1, dtype=torch.uint8, device="cuda")[1:]
    shifted.copy_(case.q.view(torch.uint8).flatten())
    q = shifted.view(torch.float8_e4m3fn).view(case.q.shape)
    assert q.data_ptr() % 16 and q.stride() == case.q.stride()
    out = poisoned_out(case.rows, case.max_seq_len, torch.float32)
    args = list(case.fp8_args())
    args[0] = q
    got = fa.fp8_paged_mqa_logits(*args, out=out)
    assert prepares["fp8"] == 1
    check("fp8", case, got, out)


def test_a_remembered_call_launches_on_the_current_stream(prepares):
    case = fp8_case(128, 2, seed=36)
    fa.fp8_paged_mqa_logits(
        *case.fp8_args(), out=poisoned_out(case.rows, case.max_seq_len, torch.float32)
    )
    out = poisoned_out(case.rows, case.max_seq_len, torch.float32)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = fa.fp8_paged_mqa_logits(*case.fp8_args(), out=out)
    stream.synchronize()
    assert prepares["fp8"] == 1
    check("fp8", case, got, out)


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_validate_mode_still_checks_a_known_signature(variant, prepares, monkeypatch):
    kind = VARIANTS[variant]
    case = kind.make_case(64, 2, seed=37)
    kind.op(*kind.args(case))
    monkeypatch.setenv("FLASHINFER_VALIDATE_INPUTS", "1")
    case.seq_lens[0] = case.max_seq_len + 1  # same metadata, contents that break the contract
    with pytest.raises(ValueError, match="max_seq_len"):
        kind.op(*kind.args(case))


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_an_inference_out_is_written_only_inside_inference_mode(variant, prepares):
    """Serving code allocates under torch.inference_mode(): there the remembered launch writes
    an inference `out`; outside the mode, where PyTorch allows no in-place update of it, the
    same signature raises before launching, as the custom op path does."""
    kind = VARIANTS[variant]
    case = kind.make_case(64, 2, seed=39)
    with torch.inference_mode():
        out = poisoned_out(case.rows, case.max_seq_len, kind.output_dtype)
        got = kind.op(*kind.args(case), out=out)
    check(variant, case, got, out)
    with torch.inference_mode():
        fresh = poisoned_out(case.rows, case.max_seq_len, kind.output_dtype)
    with pytest.raises(RuntimeError, match="out is an inference tensor"):
        kind.op(*kind.args(case), out=fresh)
    torch.cuda.synchronize()
    assert torch.isnan(fresh[: case.rows, : fa.padded_seq_len(case.max_seq_len)]).all()
    assert prepares[variant] == 1
