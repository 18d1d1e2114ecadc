"""The GPU schedule kernel (`csrc/paged_mqa_logits_schedule.cu`): one CTA, no host sync."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

_SOURCE = Path(__file__).with_name("csrc") / "paged_mqa_logits_schedule.cu"
_THREADS = 1024


@functools.cache
def schedule_kernel_spec(tokens_per_unit: int, entry_units: int):
    from flashinfer_jit import KernelSpec

    return KernelSpec.make(
        "paged_mqa_logits_schedule",
        _SOURCE,
        {"TOKENS_PER_UNIT": tokens_per_unit, "ENTRY_UNITS": entry_units},
    )


def all_kernel_specs():
    """Every configuration CI compiles for sm_90a (entry point `flashinfer_jit.kernels`)."""
    from .schedule import SCHEDULE_REQUEST_ENTRY_UNITS, SCHEDULE_TOKENS_PER_UNIT

    return [schedule_kernel_spec(SCHEDULE_TOKENS_PER_UNIT, SCHEDULE_REQUEST_ENTRY_UNITS)]


def launch_schedule_kernel(
    seq_lens: torch.Tensor,
    num_sms: int,
    passes: int,
    tokens_per_unit: int,
    entry_units: int,
    out: torch.Tensor,
) -> torch.Tensor:
    from flashinfer_jit import i32, i64, load_kernel

    kernel = load_kernel(schedule_kernel_spec(tokens_per_unit, entry_units), seq_lens.device)
    kernel.launch(
        1,
        _THREADS,
        seq_lens,
        i64(seq_lens.stride(0)),
        i32(seq_lens.shape[0]),
        i32(num_sms),
        i32(passes),
        out,
    )
    return out
