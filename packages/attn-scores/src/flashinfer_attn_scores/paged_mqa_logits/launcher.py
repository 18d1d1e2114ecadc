"""SM90 launchers of the paged MQA logits kernels.

Contract with `api.py`: arguments arrive fully validated (the launcher does no checking),
on one SM90 CUDA device. The launcher builds the kernel specialisation, compiles it through
`flashinfer_jit` (cached) and launches on `torch.cuda.current_stream()` with no host
synchronisation (with `schedule_meta=None` the kernel derives its schedule from `seq_lens`
itself, in the same launch), writing
`batch_size*next_n` rows of `out_storage` (a `[>= rows, >= padded_seq_len(max_seq_len)]`
2-D buffer with `stride(1) == 1`, padding columns included).

The FP8 kernel is `fp8_sm90`, the MXFP4 kernel `fp4_sm90`; both share the pipeline pieces in
`csrc/paged_mqa_common.cuh`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from . import fp4_sm90, fp8_sm90

if TYPE_CHECKING:
    from flashinfer_jit import KernelSpec, PrecompileSummary

    from .precompile import PagedMqaLogitsConfig

# Looked up at call time, so tests can replace them. The custom ops' CUDA kernels (the
# torch.compile path) launch once per call; eager calls keep the prepared launch of each
# argument signature (see `dispatch.EagerCall`). These are the kernels' own functions, not
# wrappers: one Python call less per launch.
launch_fp8_paged_mqa_logits = fp8_sm90.launch
launch_fp4_paged_mqa_logits = fp4_sm90.launch
prepare_fp8_paged_mqa_logits = fp8_sm90.prepare
prepare_fp4_paged_mqa_logits = fp4_sm90.prepare


def config_spec(config: PagedMqaLogitsConfig) -> KernelSpec:
    """The kernel specialisation that `config` (a `precompile_paged_mqa_logits` entry) names."""
    if config.variant == "fp4":
        return fp4_sm90.fp4_config(
            config.block_size,
            config.next_n,
            config.output_dtype,
            config.epi_dtype,
            config.is_kv_sf_interleaved,
        ).spec
    return fp8_sm90.fp8_config(
        config.block_size,
        config.head_dim,
        config.num_heads,
        config.next_n,
        config.output_dtype,
        config.epi_dtype,
        config.acc_dtype,
    ).spec


def paged_mqa_logits_kernel_specs(configs: Sequence[PagedMqaLogitsConfig]) -> list[KernelSpec]:
    """The kernel specialisations a deployment of `configs` launches: each configuration's,
    then `flashinfer_schedule`'s schedule kernel (`compute_paged_mqa_logits_schedule` on CUDA
    tensors, the usual way to build a `schedule_meta` shared by several calls), as that
    package registers it for `flashinfer_jit`'s compile checks."""
    from flashinfer_schedule._schedule_cuda import all_kernel_specs as schedule_kernel_specs

    return [config_spec(c) for c in configs] + schedule_kernel_specs()


def compile_paged_mqa_logits_kernels(
    configs: Sequence[PagedMqaLogitsConfig], device: torch.device
) -> PrecompileSummary:
    """Compile (into the on-disk JIT cache) and load every configuration in `configs`, and
    the schedule kernel (`paged_mqa_logits_kernel_specs`).

    `configs` are `PagedMqaLogitsConfig` entries from `precompile_paged_mqa_logits`; the
    device is an SM90 CUDA device. Compiles run in parallel worker processes with a progress
    bar (`flashinfer_jit.precompile`); the kernels are then loaded on `device`, so the first
    serving call (of the logits ops or of `compute_paged_mqa_logits_schedule`) neither
    compiles nor loads code. Returns `flashinfer_jit.precompile`'s summary.
    """
    from flashinfer_jit import precompile

    return precompile(paged_mqa_logits_kernel_specs(configs), device, load=True)
