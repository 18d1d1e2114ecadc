"""The CPU half of `test_gpu_cpu_parity.py`, on every machine.

The parity test states, per mutation, what the CPU call must do (return, or raise a given
error) before it compares the CUDA call with it. Those statements describe the validation and
the reference, which run without a GPU, so they are checked here too: when the host path
changes (numpy integers became valid `max_seq_len` values in 742f7f0), a stale expectation
fails in CI instead of waiting for the next GPU run. Mutations that put an argument on the
other device need CUDA and stay in the GPU test.
"""

from __future__ import annotations

import pytest
import torch
from test_gpu_cpu_parity import MUTATIONS, call, mutated_args, on_device

NEEDS_CUDA = {
    "weights_on_the_other_device",
    "out_on_the_other_device",
    "schedule_on_the_other_device",
}
PARAMS = [
    (variant, name)
    for name, m in MUTATIONS.items()
    if name not in NEEDS_CUDA
    for variant in m.variants
]


def test_the_cuda_only_mutations_exist():
    assert NEEDS_CUDA <= set(MUTATIONS)


@pytest.mark.parametrize(("variant", "name"), PARAMS, ids=[f"{v}-{n}" for v, n in PARAMS])
def test_cpu_outcome_is_the_stated_one(variant, name, monkeypatch):
    mutation = MUTATIONS[name]
    args = on_device(mutated_args(variant, name), torch.device("cpu"))
    monkeypatch.delenv("FLASHINFER_VALIDATE_INPUTS", raising=False)
    # The CPU reference checks the device-data preconditions with or without validate mode.
    expected = mutation.unvalidated_cpu if mutation.validate else mutation.expect
    expected.check("CPU", call(args))
    if mutation.validate:
        monkeypatch.setenv("FLASHINFER_VALIDATE_INPUTS", "1")
        mutation.expect.check("CPU in validate mode", call(args))
