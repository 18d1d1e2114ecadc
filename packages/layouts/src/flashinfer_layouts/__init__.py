"""flashinfer_layouts."""

__version__ = "0.1.0"
