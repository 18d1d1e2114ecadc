"""flashinfer_attn_scores."""

__version__ = "0.1.0"
