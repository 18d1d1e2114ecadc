"""What the launchers pass for the schedule (no GPU): a given schedule as is, or a null
pointer so that the kernel derives its own rows, on a grid of one CTA per SM."""

from __future__ import annotations

import flashinfer_jit
import flashinfer_schedule
import pytest
import torch
from flashinfer_attn_scores.paged_mqa_logits import fp8_sm90


def test_a_given_schedule_sets_the_grid_and_no_rows_are_written_back():
    schedule = torch.zeros(133, 2, dtype=torch.int32)
    grid, passed, rows_out = fp8_sm90.schedule_arguments(schedule, torch.device("cpu"))
    assert grid == 132
    assert passed is schedule
    assert isinstance(rows_out, flashinfer_jit.u64) and rows_out.value == 0


@pytest.mark.parametrize("num_sms", [132, 78])
def test_no_schedule_passes_a_null_pointer_and_one_cta_per_sm(monkeypatch, num_sms):
    monkeypatch.setattr(flashinfer_schedule, "device_num_sms", lambda device: num_sms)
    grid, passed, rows_out = fp8_sm90.schedule_arguments(None, torch.device("cuda", 0))
    assert grid == num_sms
    assert isinstance(passed, flashinfer_jit.u64) and passed.value == 0
    assert isinstance(rows_out, flashinfer_jit.u64) and rows_out.value == 0


def test_rows_out_is_passed_through_only_without_a_schedule(monkeypatch):
    monkeypatch.setattr(flashinfer_schedule, "device_num_sms", lambda device: 132)
    rows = torch.zeros(133, 2, dtype=torch.int32)
    _, _, rows_out = fp8_sm90.schedule_arguments(None, torch.device("cuda", 0), rows)
    assert rows_out is rows
    schedule = torch.zeros(133, 2, dtype=torch.int32)
    _, _, rows_out = fp8_sm90.schedule_arguments(schedule, torch.device("cpu"), rows)
    assert isinstance(rows_out, flashinfer_jit.u64) and rows_out.value == 0
