"""flashinfer_schedule: size helpers and the CTA schedule of the paged MQA logits kernels."""

from flashinfer_schedule.schedule import (
    DEFAULT_CPU_NUM_SMS,
    SCHEDULE_REQUEST_ENTRY_UNITS,
    SCHEDULE_TOKENS_PER_UNIT,
    compute_paged_mqa_logits_schedule,
    device_num_sms,
    passes_per_token,
    resolve_device,
)
from flashinfer_schedule.sizes import min_block_table_width, padded_seq_len

# Registers the CUDA launch as a torch.library op for torch.compile traces.
from flashinfer_schedule import custom_ops as _custom_ops  # noqa: F401  isort: skip

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_CPU_NUM_SMS",
    "SCHEDULE_REQUEST_ENTRY_UNITS",
    "SCHEDULE_TOKENS_PER_UNIT",
    "__version__",
    "compute_paged_mqa_logits_schedule",
    "device_num_sms",
    "min_block_table_width",
    "padded_seq_len",
    "passes_per_token",
    "resolve_device",
]
