"""The KV pipeline depth each kernel configuration gets (no GPU needed)."""

import math

import pytest
import torch
from flashinfer_attn_scores.paged_mqa_logits import fp4_sm90, fp8_sm90
from flashinfer_attn_scores.paged_mqa_logits.fp8_sm90 import (
    SM90_SHARED_MEMORY_LIMIT,
    pipeline_depth,
)


def _fp8_configs():
    for head_dim in range(32, 1025, 32):
        for num_heads in range(4, 257, 4):
            for next_n in range(1, 65):
                n = num_heads * next_n
                if n % 8 == 0 and n <= 256:
                    yield fp8_sm90.fp8_config(
                        64, head_dim, num_heads, next_n, *[torch.float32] * 3, ()
                    )


def _check(config, max_stages):
    consumers, producers, stages = config.pipeline
    assert stages % consumers == 0 and stages % producers == 0, (config, config.pipeline)
    assert stages >= 2
    assert config.shared_memory_bytes(stages) <= SM90_SHARED_MEMORY_LIMIT
    # No deeper multiple of both role counts fits.
    deeper = stages + math.lcm(consumers, producers)
    if deeper <= max_stages:
        assert config.shared_memory_bytes(deeper) > SM90_SHARED_MEMORY_LIMIT


def test_fp8_stage_count_is_a_multiple_of_both_role_counts_everywhere_it_fits():
    fitting = [config for config in _fp8_configs() if config.fits]
    assert len(fitting) > 3000
    for config in fitting:
        _check(config, fp8_sm90.MAX_STAGES)


@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
@pytest.mark.parametrize(
    ("block_size", "interleaved"), [(32, False), (64, False), (128, False), (128, True)]
)
def test_fp4_stage_count_is_a_multiple_of_both_role_counts(block_size, next_n, interleaved):
    config = fp4_sm90.fp4_config(block_size, next_n, torch.bfloat16, torch.float32, interleaved, ())
    _check(config, config.max_stages)


def test_role_counts_halve_when_too_few_stages_fit():
    def only(stages_that_fit):
        return lambda stages: 0 if stages <= stages_that_fit else SM90_SHARED_MEMORY_LIMIT + 1

    assert pipeline_depth(only(12), (), 12, 4) == (4, 4, 12)
    assert pipeline_depth(only(11), (), 12, 4) == (4, 4, 8)
    assert pipeline_depth(only(10), (), 12, 2) == (2, 4, 8)
    assert pipeline_depth(only(3), (), 12, 4) == (2, 2, 2)
    assert pipeline_depth(only(3), (), 12, 2) == (2, 2, 2)
    assert pipeline_depth(only(12), (), 12, 3) == (3, 4, 12)
    assert pipeline_depth(only(11), (), 12, 3) == (2, 4, 8)
    assert pipeline_depth(only(5), (), 12, 3) == (2, 4, 4)
    assert pipeline_depth(only(3), (), 12, 3) == (2, 2, 2)
    assert pipeline_depth(only(1), (), 12, 4) == (4, 4, 0)
    assert pipeline_depth(only(16), (("NUM_CONSUMERS", 5),), 16, 4) == (5, 2, 10)
    assert pipeline_depth(only(16), (("NUM_CONSUMERS", 5), ("NUM_PRODUCERS", 5)), 16, 4) == (
        5,
        5,
        15,
    )
    assert pipeline_depth(only(16), (("NUM_STAGES", 6),), 16, 2) == (2, 4, 6)
