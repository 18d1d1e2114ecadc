"""flashinfer_schedule."""

__version__ = "0.1.0"
