"""Exceptions raised by flashinfer_jit."""

from __future__ import annotations

from .spec import KernelSpec


class KernelCompileError(RuntimeError):
    """NVRTC rejected a kernel source.

    The message names the kernel, its label, its source file, the defines, the extra options
    and the target arch, followed by the full NVRTC log.

    Attributes:
        spec: The configuration that failed.
        arch: Target arch, for example `"sm_90a"`.
        log: The NVRTC compile log.
    """

    def __init__(self, spec: KernelSpec, arch: str, log: str) -> None:
        self.spec = spec
        self.arch = arch
        self.log = log
        defines = ", ".join(f"{k}={v}" for k, v in spec.defines) or "(none)"
        options = " ".join(spec.options) or "(none)"
        super().__init__(
            f"NVRTC failed to compile kernel {spec.name!r} ({spec.label}) for {arch}\n"
            f"  source:  {spec.source}\n"
            f"  defines: {defines}\n"
            f"  options: {options}\n"
            f"NVRTC log:\n{log}"
        )

    def __reduce__(self):
        return (type(self), (self.spec, self.arch, self.log))


class KernelLaunchError(RuntimeError):
    """The CUDA driver refused a kernel launch (bad configuration, too many resources...)."""
