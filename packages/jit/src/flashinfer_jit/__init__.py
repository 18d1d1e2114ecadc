"""flashinfer_jit."""

__version__ = "0.1.0"
