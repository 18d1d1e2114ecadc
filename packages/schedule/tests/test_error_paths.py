"""Argument errors no other CPU test reaches."""

import pytest
import torch
from flashinfer_schedule import device_num_sms


@pytest.mark.parametrize(
    ("device", "shown"),
    [("meta", "meta"), (torch.device("meta"), "meta"), ("xpu", "xpu"), ("mps", "mps")],
)
def test_device_num_sms_of_a_device_neither_cuda_nor_cpu_is_a_value_error(device, shown):
    with pytest.raises(ValueError, match=rf"^device: expected a CUDA or CPU device, got {shown}$"):
        device_num_sms(device)
