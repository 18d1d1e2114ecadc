"""The SM90 MXFP4 paged MQA logits kernel: specialisation, compilation and launch.

No validation happens here: `api.py` has checked every argument before calling `launch`.
The kernel source is `csrc/fp4_paged_mqa_logits.cu` (it shares the FP8 kernel's pipeline
pieces through `csrc/paged_mqa_common.cuh`); its shared-memory layout is mirrored by
`Fp4KernelConfig.shared_memory_bytes`, and the kernel refuses to compile when the size it is
launched with (the `SHARED_BYTES` define) does not cover its layout.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from flashinfer_schedule import SCHEDULE_REQUEST_ENTRY_UNITS

from .fp8_sm90 import (
    _ALIGNMENT_SLACK,
    CSRC,
    DTYPE_CODE,
    TOKENS_PER_UNIT,
    Pipeline,
    _contiguous_aligned,
    _short,
    barrier_bytes,
    kv_values_tensor_map,
    mma_halves_for,
    pipeline_depth,
    prepared_launcher,
)

NUM_HEADS = 64
HEAD_DIM = 128
ROW_BYTES = HEAD_DIM // 2  # packed E2M1 bytes per token
MAX_STAGES = 16  # a stage is only 4 KiB of packed KV (five consumers get more: max_stages)
_LUT_LEVELS = 32


def weight_pair_loads(next_n: int, epi_dtype: torch.dtype) -> bool:
    """Whether the float32 epilogue stores the weights quad-major and reads two 8-column groups
    per 16-byte load (the kernel's WEIGHT_PAIR_LOADS). At next_n 2: 9 SASS instructions fewer
    per unit (block 64) and 1.4-3.7 % less time (H200, 2026-12-01, `tools/tree_ab.py`, outputs
    bitwise equal). Not at next_n 4 (16 instructions fewer, -0.4 % to +1.6 % time: the epilogue
    is not what limits two consumer warpgroups), nor at next_n 1 (80 registers) and 3, where
    the pair loads spilled 8-16 bytes."""
    return next_n == 2 and epi_dtype == torch.float32


def consumers_for(n: int, epi_dtype: torch.dtype) -> int:
    """Consumer warpgroups: as many as the accumulator (N/2 fp32 registers per thread) leaves
    room for. next_n 1 (N = 64) with 5 instead of 4 (80 registers each, 20 stages): 248-251 ->
    240-242 us at B 128, L 64k, block 64 and 136-140 -> 128-130 us at B 128, L 32k, block 32
    (H200, 2026-11-30, `--experiments fp4-stages`, two rounds, outputs bitwise equal). next_n 2
    (N = 128) with 3 instead of 2: 495 -> 417 us (H200, B 128, L 64k, block 64, 2026-11-29);
    with 4 it spills. next_n 3 (N = 192) with 3: 621 -> 540 us at B 128, L 64k and 163 -> 147
    us at B 64, L 32k, with a float32 epilogue; with the bfloat16 one, whose head sums run on
    the tensor cores, 3 instead of 2 took 0.87-0.93x the time (B 64 L 32k and B 128 L 32k-64k,
    blocks 32, 64 and 128 interleaved, H200, 2026-12-01, `tools/tree_ab.py`, outputs bitwise
    equal). With 3, the float16 epilogue spills at block 64 and at block 128 in token order."""
    if n <= 64:
        return 5
    if n <= 128 or (n <= 192 and epi_dtype != torch.float16):
        return 3
    return 2


@dataclasses.dataclass(frozen=True)
class Fp4KernelConfig:
    """One compiled specialisation of the MXFP4 kernel (H = 64, D = 128)."""

    block_size: int
    next_n: int
    output_dtype: torch.dtype = torch.bfloat16
    epi_dtype: torch.dtype = torch.float32
    interleaved: bool = False
    # Developer measurement knobs (defines that override the ones below); empty in production.
    experiment: tuple[tuple[str, int], ...] = ()

    @property
    def n(self) -> int:
        return self.next_n * NUM_HEADS

    @property
    def scale_bytes(self) -> int:
        return self.block_size * 4 if self.interleaved else TOKENS_PER_UNIT * 4

    def shared_memory_bytes(self, stages: int) -> int:
        q_slots = 2 * self.n * HEAD_DIM
        # The bfloat16 epilogue's tensor-core head sum: per q slot, 8 x N bfloat16 weights.
        head_sum = q_slots + (2 * 8 * self.n * 2 if self.epi_dtype == torch.bfloat16 else 0)
        weights = head_sum + stages * TOKENS_PER_UNIT * ROW_BYTES
        # Weight slots: with paired loads, four quad-major runs padded by 4 floats each.
        pair_loads = weight_pair_loads(self.next_n, self.epi_dtype)
        head_scales = weights + 2 * (self.n + 16 if pair_loads else self.n) * 4
        slot_exp = head_scales + 2 * self.n * 4
        lut = slot_exp + 2 * 4 * 4
        scales = lut + _LUT_LEVELS * 8
        barriers = scales + stages * self.scale_bytes
        return barriers + barrier_bytes(stages) + _ALIGNMENT_SLACK

    @property
    def max_stages(self) -> int:
        """MAX_STAGES, or 4 stages per consumer warpgroup with 5 of them (20: a multiple of 5
        consumers and 4 producers)."""
        return max(MAX_STAGES, 4 * consumers_for(self.n, self.epi_dtype))

    @functools.cached_property
    def pipeline(self) -> Pipeline:
        return pipeline_depth(
            self.shared_memory_bytes,
            self.experiment,
            self.max_stages,
            consumers_for(self.n, self.epi_dtype),
        )

    @property
    def consumers(self) -> int:
        return self.pipeline.consumers

    @property
    def stages(self) -> int:
        """KV pipeline depth (see `pipeline_depth`)."""
        return self.pipeline.stages

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @functools.cached_property
    def spec(self):
        from flashinfer_jit import KernelSpec

        return KernelSpec.make(
            "fp4_paged_mqa_logits_sm90",
            CSRC / "fp4_paged_mqa_logits.cu",
            {
                "BLOCK_SIZE": self.block_size,
                "NEXT_N": self.next_n,
                "NUM_STAGES": self.stages,
                "NUM_CONSUMERS": self.consumers,
                "NUM_PRODUCERS": self.pipeline.producers,
                "MMA_HALVES": mma_halves_for(self.n),
                "OUT_DTYPE": DTYPE_CODE[self.output_dtype],
                "EPI_DTYPE": DTYPE_CODE[self.epi_dtype],
                "SF_INTERLEAVED": int(self.interleaved),
                "WEIGHT_PAIR_LOADS": int(weight_pair_loads(self.next_n, self.epi_dtype)),
                "SCHEDULE_ENTRY_UNITS": SCHEDULE_REQUEST_ENTRY_UNITS,
                # The launch size, so the kernel can check its layout against it.
                "SHARED_BYTES": self.shared_memory_bytes(self.stages),
                **dict(self.experiment),
            },
            label=(
                f"fp4_paged_mqa_logits[bs={self.block_size}, next_n={self.next_n}, "
                f"out={_short(self.output_dtype)}, epi={_short(self.epi_dtype)}"
                f"{', interleaved' if self.interleaved else ''}]"
            ),
        )


@functools.cache
def fp4_config(
    block_size: int,
    next_n: int,
    output_dtype: torch.dtype,
    epi_dtype: torch.dtype,
    interleaved: bool,
    experiment: tuple[tuple[str, int], ...] = (),
) -> Fp4KernelConfig:
    return Fp4KernelConfig(block_size, next_n, output_dtype, epi_dtype, interleaved, experiment)


def serving_configs(
    block_sizes=(32, 64, 128),
    next_ns=(1, 2, 3, 4),
    output_dtypes=(torch.bfloat16,),
    epi_dtypes=(torch.float32,),
    interleaved=(False,),
) -> list[Fp4KernelConfig]:
    """The MXFP4 indexer configurations a deployment compiles ahead of serving."""
    return [
        fp4_config(bs, n, out, epi, inter)
        for bs in block_sizes
        for n in next_ns
        for out in output_dtypes
        for epi in epi_dtypes
        for inter in interleaved
        if not inter or bs == 128
    ]


def all_kernel_specs():
    """Every configuration CI compiles for sm_90a (entry point `flashinfer_jit.kernels`)."""
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    configs = serving_configs(output_dtypes=dtypes, epi_dtypes=dtypes, interleaved=(False, True))
    return [config.spec for config in configs]


def _kv_tensor_map(kv_fused: torch.Tensor):
    """MXFP4 values: rows of 64 packed bytes, no swizzle (consumers read them with LDS.128)."""
    return kv_values_tensor_map(kv_fused, ROW_BYTES, HEAD_DIM // 32, ROW_BYTES, "none")


def prepare(
    q: torch.Tensor,
    q_sf: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out_storage: torch.Tensor,
    schedule_meta: torch.Tensor | None,
    *,
    max_seq_len: int,
    output_dtype: torch.dtype,
    epi_dtype: torch.dtype,
    is_kv_sf_interleaved: bool,
    sf_vec_size: int = 32,
    experiment: tuple[tuple[str, int], ...] = (),
    schedule_rows_out: torch.Tensor | None = None,
    devices_checked: bool = False,
):
    """The launch of every call whose arguments match these in dtype, device, shape and
    strides: returns `run(q, q_sf, kv_fused, weights, block_tables, seq_lens, out_storage,
    schedule_meta)`, which reads only data pointers and the current stream (as
    `fp8_sm90.prepare`, whose `max_seq_len` it takes too). `sf_vec_size` is always 32 here
    (validated by the api); the kernel hard-codes it."""

    config = fp4_config(
        kv_fused.shape[1],
        q.shape[1],
        output_dtype,
        epi_dtype,
        bool(is_kv_sf_interleaved),
        experiment,
    )
    launch = prepared_launcher(
        config,
        q,
        kv_fused,
        block_tables,
        seq_lens,
        max_seq_len,
        out_storage,
        schedule_meta,
        schedule_rows_out,
        _kv_tensor_map,
        devices_checked,
    )

    def run(q, q_sf, kv_fused, weights, block_tables, seq_lens, out_storage, schedule_meta):
        # q rows are read as 16-byte vectors, q_sf and the weights as one word per row.
        q_operands = (
            _contiguous_aligned(q),
            _contiguous_aligned(q_sf),
            _contiguous_aligned(weights),
        )
        launch(kv_fused, q_operands, block_tables, seq_lens, schedule_meta, out_storage)

    return run


def launch(*tensors, **options) -> None:
    """Prepare and launch once on the current stream: `tensors` are `prepare`'s positional
    arguments (those `run` takes too), `options` its keyword arguments."""
    prepare(*tensors, **options)(*tensors)
