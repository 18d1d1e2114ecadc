"""Eager CUDA calls skip the custom-op dispatch but reach the launcher with the same arguments.

No GPU here: the launcher is replaced by a recorder, and `_dispatch` is driven with an object
that says it lives on CUDA.
"""

from __future__ import annotations

import types

import pytest
import torch
from attn_scores_cases import make_fp4_case, make_fp8_case
from flashinfer_attn_scores.paged_mqa_logits import api, custom_ops, launcher


def test_dispatch_picks_the_cuda_kernel_for_cuda_tensors_and_the_op_otherwise():
    calls = []
    op = lambda *a: calls.append(("op", a))  # noqa: E731
    kernel = lambda *a: calls.append(("kernel", a))  # noqa: E731
    on_cuda = types.SimpleNamespace(is_cuda=True)
    on_cpu = torch.zeros(1)
    api._dispatch(op, kernel, (on_cuda, 1))
    api._dispatch(op, kernel, (on_cpu, 2))
    assert [name for name, _ in calls] == ["kernel", "op"]
    assert calls[0][1] == (on_cuda, 1) and calls[1][1][1] == 2


@pytest.fixture
def recorded(monkeypatch):
    seen = {}

    def record(name):
        def launch(*args, **kwargs):
            seen[name] = (args, kwargs)

        return launch

    monkeypatch.setattr(launcher, "launch_fp8_paged_mqa_logits", record("fp8"))
    monkeypatch.setattr(launcher, "launch_fp4_paged_mqa_logits", record("fp4"))
    return seen


def test_fp8_cuda_kernel_function_forwards_every_argument(recorded):
    case = make_fp8_case([40, 10], next_n=2, seed=0)
    storage, schedule = torch.empty(4, 256), torch.zeros(133, 2, dtype=torch.int32)
    custom_ops.fp8_paged_mqa_logits_into_cuda(
        case.q, case.kv_fused, case.weights, case.block_tables, case.seq_lens, 64,
        storage, schedule, torch.float16, torch.float32, torch.float16,
    )  # fmt: skip
    args, kwargs = recorded["fp8"]
    expected = (case.q, case.kv_fused, case.weights, case.block_tables, case.seq_lens, storage)
    assert all(a is b for a, b in zip(args, expected)) and args[6] is schedule
    assert kwargs == {
        "output_dtype": torch.float16,
        "epi_dtype": torch.float32,
        "acc_dtype": torch.float16,
    }


def test_fp4_cuda_kernel_function_forwards_every_argument(recorded):
    case = make_fp4_case([40, 10], next_n=2, block_size=128, interleaved=True, seed=0)
    storage = torch.empty(4, 256, dtype=torch.bfloat16)
    custom_ops.fp4_paged_mqa_logits_into_cuda(
        case.q, case.q_sf, case.kv_fused, case.weights, case.block_tables, case.seq_lens, 64,
        storage, None, 32, torch.bfloat16, torch.float16, True,
    )  # fmt: skip
    args, kwargs = recorded["fp4"]
    expected = (
        case.q, case.q_sf, case.kv_fused, case.weights, case.block_tables, case.seq_lens, storage,
    )  # fmt: skip
    assert all(a is b for a, b in zip(args, expected)) and args[7] is None
    assert kwargs == {
        "sf_vec_size": 32,
        "output_dtype": torch.bfloat16,
        "epi_dtype": torch.float16,
        "is_kv_sf_interleaved": True,
    }
