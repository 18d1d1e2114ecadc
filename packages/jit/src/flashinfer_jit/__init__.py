"""flashinfer_jit: run-time CUDA C++ compilation, disk cache and launches for Hopper kernels.

Importing this package is cheap and does not initialise CUDA: PyTorch, `cuda.core` and the
driver bindings are imported on first use.

Typical launcher::

    import functools
    from pathlib import Path
    import flashinfer_jit as jit

    SOURCE = Path(__file__).with_name("scale.cu")

    @functools.cache
    def _spec(block: int) -> jit.KernelSpec:
        return jit.KernelSpec.make("scale_kernel", SOURCE, {"BLOCK": block})

    def scale(out, x, factor):
        kernel = jit.load_kernel(_spec(256), x.device)
        kernel.launch(
            (x.numel() + 255) // 256, 256, out, x, jit.f32(factor), jit.i32(x.numel())
        )
"""

__version__ = "0.1.0"

from .cache import CACHE_SCHEMA_VERSION, default_cache_dir
from .compiler import CompiledKernel, compile_kernel, lookup_kernel, supported_options
from .device import (
    DeviceInfo,
    arch_for_capability,
    device_arch,
    device_info,
    max_shared_memory_per_block_optin,
    require_supported_arch,
    sm_count,
)
from .errors import KernelCompileError, KernelLaunchError
from .kernel import Kernel, load_kernel, stream_handle
from .precompile import PrecompileError, PrecompileResult, PrecompileSummary, precompile
from .resources import FunctionResources
from .scalars import f32, f64, i32, i64, u32, u64
from .spec import KernelSpec
from .tma import TensorMap, make_tensor_map, tensor_map_for

__all__ = [
    "CACHE_SCHEMA_VERSION",
    "CompiledKernel",
    "DeviceInfo",
    "FunctionResources",
    "Kernel",
    "KernelCompileError",
    "KernelLaunchError",
    "KernelSpec",
    "PrecompileError",
    "PrecompileResult",
    "PrecompileSummary",
    "TensorMap",
    "__version__",
    "arch_for_capability",
    "compile_kernel",
    "default_cache_dir",
    "device_arch",
    "device_info",
    "f32",
    "f64",
    "i32",
    "i64",
    "load_kernel",
    "lookup_kernel",
    "make_tensor_map",
    "max_shared_memory_per_block_optin",
    "precompile",
    "require_supported_arch",
    "sm_count",
    "stream_handle",
    "supported_options",
    "tensor_map_for",
    "u32",
    "u64",
]
