"""Whether a call runs outside every tracer, and so may launch a kernel directly.

Used by every public function of the kernel packages that launches on CUDA: outside a
tracer it launches through `Kernel`, under one it must go through its `torch.library` op.
"""

import torch
from torch._C._functorch import peek_interpreter_stack


def plain_eager() -> bool:
    """Whether this call runs outside every tracer: not under torch.compile, `torch.jit.trace`,
    a `TorchDispatchMode` (`make_fx`, `FakeTensorMode`, ...) nor a `torch.func` transform
    (`grad`, `vmap`, `functionalize`, whose tensors are wrappers without storage). Only then
    may a CUDA call launch a kernel directly; under a tracer it must go through the custom op,
    or the trace would record an output the kernel never wrote (and a transform gets
    PyTorch's own word on what it cannot do with the op)."""
    return not (
        torch.compiler.is_compiling()
        or torch._C._get_tracing_state() is not None
        or torch._C._len_torch_dispatch_stack()
        or peek_interpreter_stack() is not None
    )
