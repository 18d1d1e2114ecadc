"""Paged MQA logits: the FP8 and MXFP4 lightning-indexer scoring ops."""

from .api import (
    PagedMqaLogitsConfig,
    fp4_paged_mqa_logits,
    fp8_paged_mqa_logits,
    precompile_paged_mqa_logits,
)
from .reference import (
    fp4_paged_mqa_logits_reference,
    fp8_paged_mqa_logits_reference,
    valid_mask,
)

__all__ = [
    "PagedMqaLogitsConfig",
    "fp4_paged_mqa_logits",
    "fp4_paged_mqa_logits_reference",
    "fp8_paged_mqa_logits",
    "fp8_paged_mqa_logits_reference",
    "precompile_paged_mqa_logits",
    "valid_mask",
]
