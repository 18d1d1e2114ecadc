"""Whether a call runs outside every tracer, and so may launch a kernel directly.

Used by every public function of the kernel packages that launches on CUDA: outside a
tracer it launches through `Kernel`, under one it must go through its `torch.library` op.
"""

import torch


def plain_eager() -> bool:
    """Whether this call runs outside every tracer: not under torch.compile, `torch.jit.trace`,
    nor a `TorchDispatchMode` (`make_fx`, `FakeTensorMode`, ...). Only then may a CUDA call
    launch a kernel directly; under a tracer it must go through the custom op, or the trace
    would record an output the kernel never wrote."""
    return not (
        torch.compiler.is_compiling()
        or torch._C._get_tracing_state() is not None
        or torch._C._len_torch_dispatch_stack()
    )
