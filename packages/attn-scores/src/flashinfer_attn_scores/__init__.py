"""flashinfer_attn_scores: FP8 and MXFP4 paged MQA logits (the sparse-attention indexer).

The public ops follow FlashInfer's `flashinfer.fp8_paged_mqa_logits` /
`flashinfer.fp4_paged_mqa_logits` contracts; porting is a rename of the module prefix.
CUDA tensors on SM90 run the Hopper kernels, CPU tensors the float64 reference.
"""

from flashinfer_schedule import (
    compute_paged_mqa_logits_schedule,
    min_block_table_width,
    padded_seq_len,
)

from .paged_mqa_logits import (
    PagedMqaLogitsConfig,
    fp4_paged_mqa_logits,
    fp8_paged_mqa_logits,
    precompile_paged_mqa_logits,
)

__version__ = "0.1.0"

__all__ = [
    "PagedMqaLogitsConfig",
    "__version__",
    "compute_paged_mqa_logits_schedule",
    "fp4_paged_mqa_logits",
    "fp8_paged_mqa_logits",
    "min_block_table_width",
    "padded_seq_len",
    "precompile_paged_mqa_logits",
]
