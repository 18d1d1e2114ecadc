"""Byte comparisons shared by the layouts tests (imported through conftest's sys.path)."""

from __future__ import annotations

import torch


def same(cpu_out, gpu_out) -> bool:
    """Same dtypes, shapes and raw bytes (so -0.0 != 0.0 and NaN encodings count)."""
    if isinstance(cpu_out, torch.Tensor):
        a, b = cpu_out, gpu_out.cpu()
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    return len(cpu_out) == len(gpu_out) and all(same(x, y) for x, y in zip(cpu_out, gpu_out))


def on_cpu(out):
    """A tensor or a nested tuple of tensors, copied to the CPU."""
    if isinstance(out, torch.Tensor):
        return out.cpu()
    return tuple(on_cpu(x) for x in out)
