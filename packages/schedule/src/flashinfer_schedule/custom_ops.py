"""`torch.library` registration of the CUDA schedule kernel, for torch.compile traces.

Eager calls launch the kernel directly (`_schedule_cuda.launch_schedule_kernel`): a custom
op's dispatch costs host time and buys nothing outside a trace. While dynamo traces
`compute_paged_mqa_logits_schedule`, the launch (a JIT kernel load through cuda.core) cannot
be put in a graph, so it goes through this op, which is opaque to the compiler: it writes the
schedule into `out` in place and returns nothing. The CPU path is plain torch ops, which
dynamo traces as they are, so the op is registered for CUDA only.

Op (namespace `flashinfer_schedule`, reachable as `torch.ops.flashinfer_schedule.*`):

* `paged_mqa_logits_schedule_into(seq_lens, num_sms, passes, out) -> ()`

`compute_paged_mqa_logits_schedule` checks the arguments. The op, which anyone can call,
checks them once more against what the kernel assumes (`check_op_arguments`: a 1-D int32
`seq_lens`, `num_sms` and `passes` in range, an `out` of `num_sms + 1` rows on the same
device), and that `out` shares no memory with `seq_lens`: an AOTInductor package of an
exported program skips export's input guards (pytorch/pytorch#141115), and only here, at run
time, are the tensors' addresses known. The errors are the public function's.
"""

import torch

from ._schedule_cuda import launch_schedule_kernel
from .schedule import (
    SCHEDULE_REQUEST_ENTRY_UNITS,
    SCHEDULE_TOKENS_PER_UNIT,
    _check_num_sms,
    _check_out,
    _check_out_apart,
    _check_passes,
    _check_seq_lens,
)

__all__ = ["NAMESPACE", "check_op_arguments", "paged_mqa_logits_schedule_into"]

NAMESPACE = "flashinfer_schedule"


@torch.library.custom_op(
    f"{NAMESPACE}::paged_mqa_logits_schedule_into", mutates_args=("out",), device_types="cuda"
)
def paged_mqa_logits_schedule_into(
    seq_lens: torch.Tensor, num_sms: int, passes: int, out: torch.Tensor
) -> None:
    """Write the schedule of `seq_lens` for `num_sms` SMs into `out` (`[num_sms + 1, 2]`)."""
    check_op_arguments(seq_lens, num_sms, passes, out)
    launch_schedule_kernel(
        seq_lens, num_sms, passes, SCHEDULE_TOKENS_PER_UNIT, SCHEDULE_REQUEST_ENTRY_UNITS, out
    )


def check_op_arguments(
    seq_lens: torch.Tensor, num_sms: int, passes: int, out: torch.Tensor
) -> None:
    """What the kernel assumes of the op's arguments, with the public function's checks:
    `seq_lens` a dense 1-D int32 tensor (read as `const int*` at `b * stride(0)`), `num_sms`
    (a divisor) and `passes` (a factor of int32 unit indices) in range, `out` a contiguous
    int32 `[num_sms + 1, 2]` tensor on `seq_lens`' device (so both are on the CUDA device the
    kernel is loaded for) that shares no memory with `seq_lens`, which the kernel reads after
    writing rows of `out`. (Host time: about 4 us on a CPU test host, where the checks of
    `out` alone took 3 us.)"""
    _check_seq_lens(seq_lens)
    _check_num_sms(num_sms, "an int")
    _check_passes(passes)
    _check_out(out, num_sms, seq_lens.device)
    _check_out_apart(out, seq_lens)


@paged_mqa_logits_schedule_into.register_fake
def _paged_mqa_logits_schedule_into_fake(
    seq_lens: torch.Tensor, num_sms: int, passes: int, out: torch.Tensor
) -> None:
    # The op only writes into out, whose metadata does not change.
    return None
