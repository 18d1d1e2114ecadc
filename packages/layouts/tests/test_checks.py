"""The switch for the checks that read tensor contents (shared spelling across packages)."""

from __future__ import annotations

import pytest
import torch
from flashinfer_layouts import _checks


@pytest.mark.parametrize(
    ("setting", "enabled"),
    [
        (None, False),
        ("0", False),
        ("", False),
        ("1", True),
        ("true", True),
        (" ON ", True),
        ("yes", True),
    ],
)
def test_validate_inputs_spellings_match_attn_scores(monkeypatch, setting, enabled):
    """Off the CPU (a meta tensor here) the checks follow FLASHINFER_VALIDATE_INPUTS, with the
    spellings flashinfer_attn_scores accepts."""
    if setting is None:
        monkeypatch.delenv("FLASHINFER_VALIDATE_INPUTS", raising=False)
    else:
        monkeypatch.setenv("FLASHINFER_VALIDATE_INPUTS", setting)
    assert _checks.device_data_checks_enabled(torch.empty(1, device="meta")) is enabled


def test_cpu_tensors_are_always_checked(monkeypatch):
    monkeypatch.setenv("FLASHINFER_VALIDATE_INPUTS", "0")
    assert _checks.device_data_checks_enabled(torch.empty(1))
