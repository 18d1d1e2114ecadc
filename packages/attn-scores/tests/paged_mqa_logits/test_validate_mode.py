"""FLASHINFER_VALIDATE_INPUTS=1: the opt-in checks that read seq_lens/block_tables/schedule."""

from __future__ import annotations

import os

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import make_fp4_case, make_fp8_case
from flashinfer_attn_scores import _validation

ENV = "FLASHINFER_VALIDATE_INPUTS"


@pytest.fixture
def validate_on(monkeypatch):
    monkeypatch.setenv(ENV, "1")


@pytest.fixture
def validate_unset(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


def test_variable_is_read_on_every_call(monkeypatch):
    """Every way of changing os.environ is seen by the next call (the unset case is a
    lookup in os.environ's backing dict)."""
    monkeypatch.delenv(ENV, raising=False)
    assert not _validation.validate_inputs_enabled()
    for value, wanted in (("1", True), (" On ", True), ("yes", True), ("0", False), ("", False)):
        monkeypatch.setenv(ENV, value)
        assert _validation.validate_inputs_enabled() is wanted, value
    monkeypatch.delenv(ENV)
    assert not _validation.validate_inputs_enabled()
    monkeypatch.setattr(os, "environ", {**os.environ, ENV: "true"})
    assert _validation.validate_inputs_enabled()  # a plain dict standing in for os.environ
    monkeypatch.undo()
    monkeypatch.delenv(ENV, raising=False)  # restores the original value at teardown
    os.environ.update({ENV: "1"})
    assert _validation.validate_inputs_enabled()
    del os.environ[ENV]
    assert not _validation.validate_inputs_enabled()


def small_fp8(**kwargs):
    params = {"next_n": 2, "num_heads": 8, "head_dim": 32, "seed": 21}
    params.update(kwargs)
    lens = params.pop("lens", [100, 0, 70])
    return make_fp8_case(lens, **params)


def stale_schedule(case, variant="fp8"):
    """A correctly shaped schedule computed for different lengths."""
    other = case.seq_lens.clone()
    other[0] += 200
    sched = fa.compute_paged_mqa_logits_schedule(other, next_n=case.next_n, variant=variant)
    assert not torch.equal(
        sched,
        fa.compute_paged_mqa_logits_schedule(case.seq_lens, next_n=case.next_n, variant=variant),
    )
    return sched


def test_off_by_default_a_stale_schedule_is_not_checked(validate_unset):
    case = small_fp8()
    got = fa.fp8_paged_mqa_logits(*case.fp8_args(), schedule_meta=stale_schedule(case))
    assert got.shape == (case.rows, case.max_seq_len)


@pytest.mark.parametrize("value", ["0", "", "false", "off"])
def test_falsy_values_keep_it_off(monkeypatch, value):
    monkeypatch.setenv(ENV, value)
    case = small_fp8()
    fa.fp8_paged_mqa_logits(*case.fp8_args(), schedule_meta=stale_schedule(case))


def test_off_by_default_the_device_data_checks_never_run(validate_unset, monkeypatch):
    def fail(**kwargs):
        raise AssertionError("device-data checks ran with validation off")

    monkeypatch.setattr(_validation, "check_device_data", fail)
    case = small_fp8()
    fa.fp8_paged_mqa_logits(*case.fp8_args())


def test_stale_schedule_is_refused(validate_on):
    case = small_fp8()
    with pytest.raises(ValueError, match=rf"schedule_meta is stale: row \d+ .*\({ENV}=1 check\)"):
        fa.fp8_paged_mqa_logits(*case.fp8_args(), schedule_meta=stale_schedule(case))


def test_a_schedule_stale_in_its_sentinel_row_only_is_refused(validate_on):
    """The last row, (batch_size, 0), is checked too: a schedule built for one more request
    (a trailing zero length) can agree with the fresh one everywhere else."""
    case = small_fp8(lens=[20000])
    longer = torch.cat([case.seq_lens, torch.zeros(1, dtype=torch.int32)])
    sched = fa.compute_paged_mqa_logits_schedule(longer, next_n=case.next_n, variant="fp8")
    fresh = fa.compute_paged_mqa_logits_schedule(case.seq_lens, next_n=case.next_n, variant="fp8")
    assert torch.equal(sched[:-1], fresh[:-1]) and not torch.equal(sched[-1], fresh[-1])
    sentinel = sched.shape[0] - 1
    with pytest.raises(ValueError, match=rf"^schedule_meta is stale: row {sentinel} is \[2, 0\]"):
        fa.fp8_paged_mqa_logits(*case.fp8_args(), schedule_meta=sched)


def test_a_schedule_of_another_variant_or_next_n_is_the_same_tensor_and_accepted(validate_on):
    """The SM90 policy reads only the lengths and the SM count (one pass for every next_n and
    variant), so such a schedule is not stale and validate mode accepts it, as the helper's
    docstring says; one built from other lengths is refused, for fp8 and fp4 alike. (The
    test's old name promised a refusal its body never asserted.)"""
    case = small_fp8(next_n=2)
    fp4_case = make_fp4_case([100, 0, 70], next_n=2, seed=22)
    for variant, c, call in (
        ("fp8", case, lambda s: fa.fp8_paged_mqa_logits(*case.fp8_args(), schedule_meta=s)),
        ("fp4", fp4_case, lambda s: fa.fp4_paged_mqa_logits(*fp4_case.fp4_args(), schedule_meta=s)),
    ):
        own = fa.compute_paged_mqa_logits_schedule(c.seq_lens, next_n=2, variant=variant)
        call(own)
        for other_variant, other_next_n in (("fp8", 1), ("fp8", 4), ("fp4", 1), ("fp4", 4)):
            other = fa.compute_paged_mqa_logits_schedule(
                c.seq_lens, next_n=other_next_n, variant=other_variant
            )
            assert torch.equal(other, own), (other_variant, other_next_n)
            call(other)  # accepted: validate mode compares it with a fresh schedule
        with pytest.raises(ValueError, match="schedule_meta is stale"):
            call(stale_schedule(c, variant))


def test_env_is_read_at_call_time(monkeypatch):
    case = small_fp8()
    stale = stale_schedule(case)
    monkeypatch.delenv(ENV, raising=False)
    fa.fp8_paged_mqa_logits(*case.fp8_args(), schedule_meta=stale)
    monkeypatch.setenv(ENV, "1")
    with pytest.raises(ValueError, match="stale"):
        fa.fp8_paged_mqa_logits(*case.fp8_args(), schedule_meta=stale)


def test_length_beyond_max_seq_len(validate_on):
    case = small_fp8(lens=[100, 0, 70], max_seq_len=90)
    with pytest.raises(
        ValueError,
        match=rf"max\(seq_lens\) = 100 \(request 0\) exceeds max_seq_len = 90.*\({ENV}=1 check\)",
    ):
        fa.fp8_paged_mqa_logits(*case.fp8_args())


def test_negative_length(validate_on):
    case = small_fp8()
    lens = torch.tensor([100, -3, 70], dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"seq_lens\[1\] = -3 is negative \({ENV}=1 check\)"):
        fa.fp8_paged_mqa_logits(
            case.q, case.kv_fused, case.weights, case.block_tables, lens, case.max_seq_len
        )


def test_first_of_two_negative_lengths_is_named(validate_on):
    # The first negative length is named, not the lowest or the last one.
    case = small_fp8()
    lens = torch.tensor([100, -3, -7], dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"^seq_lens\[1\] = -3 is negative \({ENV}=1 check\)$"):
        fa.fp8_paged_mqa_logits(
            case.q, case.kv_fused, case.weights, case.block_tables, lens, case.max_seq_len
        )


def test_table_too_narrow(validate_on):
    case = small_fp8(lens=[100, 0, 70])  # 100 tokens need 4 blocks of 32
    narrow = case.block_tables[:, :3]
    with pytest.raises(
        ValueError,
        match=rf"block_tables has 3 columns but max\(seq_lens\) = 100 with block_size 32 needs "
        rf"min_block_table_width = 4 \({ENV}=1 check\)",
    ):
        fa.fp8_paged_mqa_logits(
            case.q, case.kv_fused, case.weights, narrow, case.seq_lens, case.max_seq_len
        )


@pytest.mark.parametrize("bad_id", [-1, 10**6])
def test_block_id_out_of_range(validate_on, bad_id):
    case = small_fp8(lens=[100, 0, 70])
    tables = case.block_tables.clone()
    tables[2, 1] = bad_id  # request 2 reads entries 0..2
    num_blocks = case.kv_fused.shape[0]
    with pytest.raises(
        ValueError,
        match=rf"block_tables\[2, 1\] = {bad_id} is not a block of kv_fused: .*"
        rf"\[0, num_blocks = {num_blocks}\) \({ENV}=1 check\)",
    ):
        fa.fp8_paged_mqa_logits(
            case.q, case.kv_fused, case.weights, tables, case.seq_lens, case.max_seq_len
        )


def test_unread_table_entries_may_hold_anything(validate_on):
    # The case builder fills every entry past a request's own blocks with -10**6, and the
    # zero-length request's whole row.
    case = small_fp8(lens=[100, 0, 70])
    assert (case.block_tables[1] == -(10**6)).all()
    schedule = fa.compute_paged_mqa_logits_schedule(case.seq_lens, next_n=case.next_n)
    got = fa.fp8_paged_mqa_logits(*case.fp8_args(), schedule_meta=schedule)
    assert got.shape == (case.rows, case.max_seq_len)


def test_skipped_while_a_cuda_graph_is_being_captured(validate_on, monkeypatch):
    # On a GPU the check would copy device data to the host, which capture forbids; here the
    # capture state is simulated so the skip itself can be observed on a CPU-only machine.
    monkeypatch.setattr(_validation, "graph_capture_active", lambda: True)
    case = small_fp8()
    fa.fp8_paged_mqa_logits(*case.fp8_args(), schedule_meta=stale_schedule(case))


def test_cpu_reference_refuses_impossible_inputs_even_when_off(validate_unset):
    # The CPU path reads the lengths anyway, so it never runs out of bounds.
    case = small_fp8(lens=[100, 0, 70], max_seq_len=90)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 100 must be in \[0, max_seq_len = 90\]"):
        fa.fp8_paged_mqa_logits(*case.fp8_args())
