"""Shared inputs of the flashinfer_layouts tests."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

# The tests run with --import-mode=importlib: make layouts_bytes.py and tricky_inputs.py
# importable.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import tricky_inputs


@pytest.fixture
def tricky_rows() -> torch.Tensor:
    """`tricky_inputs.tricky_rows`: ``[8, 128]`` float32 rows at every rounding edge."""
    return tricky_inputs.tricky_rows()


@pytest.fixture
def tricky_cases(tricky_rows):
    """`tricky_inputs.tricky_cases`: every quantiser and dequantiser on `tricky_rows`."""
    return tricky_inputs.tricky_cases(tricky_rows)
