"""SM90 launchers of the paged MQA logits kernels.

Contract with `api.py`: arguments arrive fully validated (the launcher does no checking),
on one SM90 CUDA device. The launcher builds the kernel specialisation, compiles it through
`flashinfer_jit` (cached), computes the schedule on the GPU when `schedule_meta` is None, and
launches on `torch.cuda.current_stream()` with no host synchronisation, writing
`batch_size*next_n` rows of `out_storage` (a `[>= rows, >= padded_seq_len(max_seq_len)]`
2-D buffer with `stride(1) == 1`, padding columns included).

The FP8 kernel is `fp8_sm90`, the MXFP4 kernel `fp4_sm90`; both share the pipeline pieces in
`csrc/paged_mqa_common.cuh`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import fp4_sm90, fp8_sm90


def launch_fp8_paged_mqa_logits(
    q: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out_storage: torch.Tensor,
    schedule_meta: torch.Tensor | None,
    *,
    output_dtype: torch.dtype,
    epi_dtype: torch.dtype,
    acc_dtype: torch.dtype,
) -> None:
    """Launch the SM90 FP8 logits kernel into `out_storage` (see `fp8_sm90`)."""
    fp8_sm90.launch(
        q,
        kv_fused,
        weights,
        block_tables,
        seq_lens,
        out_storage,
        schedule_meta,
        output_dtype=output_dtype,
        epi_dtype=epi_dtype,
        acc_dtype=acc_dtype,
    )


def launch_fp4_paged_mqa_logits(
    q: torch.Tensor,
    q_sf: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out_storage: torch.Tensor,
    schedule_meta: torch.Tensor | None,
    *,
    sf_vec_size: int,
    output_dtype: torch.dtype,
    epi_dtype: torch.dtype,
    is_kv_sf_interleaved: bool,
) -> None:
    """Launch the SM90 MXFP4 logits kernel into `out_storage` (see `fp4_sm90`).

    `sf_vec_size` is always 32 here (validated); the kernel hard-codes it.
    """
    del sf_vec_size
    fp4_sm90.launch(
        q,
        q_sf,
        kv_fused,
        weights,
        block_tables,
        seq_lens,
        out_storage,
        schedule_meta,
        output_dtype=output_dtype,
        epi_dtype=epi_dtype,
        is_kv_sf_interleaved=is_kv_sf_interleaved,
    )


def compile_paged_mqa_logits_kernels(configs: Sequence[object], device: torch.device) -> None:
    """Compile (into the on-disk JIT cache) and load every configuration in `configs`.

    `configs` are `PagedMqaLogitsConfig` entries from `precompile_paged_mqa_logits`; the
    device is an SM90 CUDA device. Compiles run in parallel worker processes with a progress
    bar (`flashinfer_jit.precompile`); the kernels are then loaded on `device`, so the first
    serving call neither compiles nor loads code.
    """
    from flashinfer_jit import precompile

    specs = [
        fp4_sm90.fp4_config(
            c.block_size, c.next_n, c.output_dtype, c.epi_dtype, c.is_kv_sf_interleaved
        ).spec
        if c.variant == "fp4"
        else fp8_sm90.fp8_config(
            c.block_size,
            c.head_dim,
            c.num_heads,
            c.next_n,
            c.output_dtype,
            c.epi_dtype,
            c.acc_dtype,
        ).spec
        for c in configs
    ]
    precompile(specs, device, load=True)
