"""The SM90 FP8 paged MQA logits kernel: specialisation, compilation and launch.

No validation happens here: `api.py` has checked every argument before calling `launch`.
The kernel source is `csrc/fp8_paged_mqa_logits.cu`; its shared-memory layout is mirrored
by `Fp8KernelConfig.shared_memory_bytes` below, and the kernel refuses to compile when the size
it is launched with (the `SHARED_BYTES` define) does not cover its layout.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import torch
from flashinfer_schedule import SCHEDULE_REQUEST_ENTRY_UNITS, SCHEDULE_TOKENS_PER_UNIT

CSRC = Path(__file__).with_name("csrc")

# KV tokens per work unit: the schedule's unit, and WGMMA's M, which the kernels state as
# `kTile` in csrc/paged_mqa_common.cuh (test_kernel_sources checks that the two agree).
TOKENS_PER_UNIT = SCHEDULE_TOKENS_PER_UNIT


# Consumer warpgroups. The epilogue is latency-bound (ncu on the H200, 2026-11-29: 7 cycles per
# issued instruction, 0.38 eligible warps per scheduler with 2 consumers), so more warps help
# wherever the accumulator (N/2 fp32 registers per thread) leaves room: 104 registers per
# consumer thread with 4 warpgroups, 152 with 3, 224 with 2.
def consumers_for(n: int) -> int:
    """Consumer warpgroups: as many as the accumulator (N/2 fp32 registers per thread) leaves
    room for. next_n 3 (N = 192) with 3 instead of 2: 464 -> 434 us at B 128, L 64k and
    127 -> 119 us at B 64, L 32k (H200, block 64, 2026-11-29); with 3 at N = 256 the float32
    accumulator spills."""
    return 4 if n <= 128 else 3 if n <= 192 else 2


# MMA commit groups per unit: with two (N/2 columns each) the epilogue of the first half runs
# while the tensor cores compute the second, without more accumulator registers. Measured on
# the H200 (2026-11-29, tools/fp8_kernel_check.py): a gain only where N > 128 (next_n 4:
# 0.45 -> 0.47 and 0.48 -> 0.50 of copy; next_n 3: 0.54 -> 0.55), a loss at N = 128 (next_n 2:
# 0.84 -> 0.77), none at N = 64. Shared by the MXFP4 kernel (next_n 4: 221 -> 213 us).
def mma_halves_for(n: int) -> int:
    return 2 if n > 128 and (n // 2) % 8 == 0 else 1


# 8-column groups of N whose weights a consumer keeps in registers per request (WEIGHT_REGS)
# instead of loading them from shared memory for every unit: all of them where at most two
# consumer warpgroups leave the room (224 registers per thread for N/2 accumulators and
# N/4 weights), and under three consumers with a float16 epilogue, whose weights are half2
# (N/8 registers); none otherwise.
# Measured on the H200 (2026-11-30, tools/fp8_kernel_check.py --experiments weight-regs,
# bitwise equal to loading them): next_n 4 151.8 -> 144.7 us (B 64, L 32k, block 64) and
# 289 -> 272 us (B 128, L 32k, block 128); next_n 2 (4 consumers, room for half the groups)
# 1 % and next_n 3 (3 consumers) nothing. With a float16 epilogue (tools/tree_ab.py): next_n 4
# 127.3 -> 124.0 us (B 64, L 32k, block 64); next_n 3 (3 consumers) 100.1 -> 96.7 us and,
# with a float16 accumulator too, 95.3 -> 86.5 us (B 64, L 32k, block 64); under 4 consumers
# (next_n 1-2) between 1.3 % slower and 1.2 % faster, so not there (2026-11-30 16:29 UTC).
def weight_register_groups(n: int, consumers: int, epi_dtype: torch.dtype = torch.float32) -> int:
    if consumers <= 2 or (consumers == 3 and epi_dtype == torch.float16):
        return n // 8
    return 0


MAX_STAGES = 12
# Opt-in dynamic shared memory per block on H100/H200 (227 KiB).
SM90_SHARED_MEMORY_LIMIT = 232_448
_ALIGNMENT_SLACK = 1024  # the kernel rounds its dynamic shared memory base up to 1024 bytes


def barrier_bytes(stages: int) -> int:
    """`Barriers::kBytes` of csrc/paged_mqa_common.cuh: full/empty per stage, q_full/q_empty
    per q slot, then the in-kernel schedule rows (two rows' request and unit, the first
    request's length: 5 ints in 32 bytes)."""
    return (2 * stages + 4) * 8 + 32


# TMA-issuing producer warps. One could not issue the copies fast enough: 0.47 -> 0.70 of copy
# bandwidth with 4 (H200, next_n 1, block 64, B 128, L 32k, 2026-11-29).
PRODUCER_WARPS = 4


class Pipeline(NamedTuple):
    """A kernel's roles and KV pipeline depth (NUM_CONSUMERS, NUM_PRODUCERS, NUM_STAGES)."""

    consumers: int  # consumer warpgroups; unit k goes to consumer k % consumers
    producers: int  # producer warps; unit k is issued by warp k % producers
    stages: int  # KV stages, a multiple of both counts; 0 when not even two stages fit


def pipeline_depth(
    shared_memory_bytes, experiment: tuple, max_stages: int, consumers: int
) -> Pipeline:
    """The deepest pipeline (<= max_stages stages) whose `shared_memory_bytes(stages)` fits,
    with the stage count a multiple of the consumer warpgroups and of the producer warps. Where
    fewer stages fit than that needs, 3 consumers drop to 2, then the larger role count halves
    until it fits. An experiment's NUM_CONSUMERS / NUM_PRODUCERS / NUM_STAGES win (and are
    never changed; the kernel's static_assert rejects a stage count that breaks the rule).
    Shared by both kernels.

    Why multiples: unit k lives in stage k % S, and its consumer waits on full[k % S] (its
    producer on empty[k % S]) for the phase parity of round k // S. A parity test cannot tell
    "round r done" from "round r - 2 done, r - 1 not". It is only safe when the waiting warp
    itself already waited for round r - 1 of that stage, i.e. when its role count divides S.
    Otherwise a consumer can read a stage still being filled, or a producer refill one still
    being read: with 5 consumer warpgroups and S = 12, 15 or 16 (4 producers) the H200 hit
    "unspecified launch failure" (2026-11-29)."""
    experiment = dict(experiment)
    consumers = experiment.get("NUM_CONSUMERS", consumers)
    producers = experiment.get("NUM_PRODUCERS", PRODUCER_WARPS)
    if "NUM_STAGES" in experiment:
        return Pipeline(consumers, producers, experiment["NUM_STAGES"])
    fitting = next(
        (s for s in range(max_stages, 1, -1) if shared_memory_bytes(s) <= SM90_SHARED_MEMORY_LIMIT),
        0,
    )
    if fitting < 2:
        return Pipeline(consumers, producers, 0)
    # Shrink the counts the experiment leaves free until a multiple of both fits: 3 consumer
    # warpgroups first become 2 (the measured 3 ran with 4 producers and 12 stages), then the
    # larger count halves.
    consumers_free, producers_free = (
        "NUM_CONSUMERS" not in experiment,
        "NUM_PRODUCERS" not in experiment,
    )
    while math.lcm(consumers, producers) > fitting:
        if consumers_free and consumers == 3:
            consumers = 2
        elif producers_free and producers > 1 and (producers >= consumers or not consumers_free):
            producers //= 2
        elif consumers_free and consumers > 1:
            consumers //= 2
        else:
            return Pipeline(consumers, producers, 0)
    step = math.lcm(consumers, producers)
    return Pipeline(consumers, producers, fitting // step * step)


# OUT_DTYPE / EPI_DTYPE codes of csrc/paged_mqa_common.cuh.
DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@dataclasses.dataclass(frozen=True)
class Fp8KernelConfig:
    """One compiled specialisation of the FP8 kernel."""

    block_size: int
    head_dim: int
    num_heads: int
    next_n: int
    output_dtype: torch.dtype = torch.float32
    epi_dtype: torch.dtype = torch.float32
    acc_dtype: torch.dtype = torch.float32
    # Developer measurement knobs, e.g. (("EXP_SKIP_MATH", 1),) or (("NUM_STAGES", 4),);
    # they override the defines below. Empty in production.
    experiment: tuple[tuple[str, int], ...] = ()

    @property
    def n(self) -> int:
        """WGMMA N: every draft slot's heads side by side."""
        return self.next_n * self.num_heads

    def shared_memory_bytes(self, stages: int) -> int:
        kv_tile = TOKENS_PER_UNIT * self.head_dim
        q_slot = self.n * self.head_dim
        weights = 2 * q_slot + stages * kv_tile
        scales = weights + 2 * self.n * 4
        barriers = (scales + stages * TOKENS_PER_UNIT * 4 + 7) // 8 * 8
        return barriers + barrier_bytes(stages) + _ALIGNMENT_SLACK

    @functools.cached_property
    def pipeline(self) -> Pipeline:
        return pipeline_depth(
            self.shared_memory_bytes, self.experiment, MAX_STAGES, consumers_for(self.n)
        )

    @property
    def consumers(self) -> int:
        return self.pipeline.consumers

    @property
    def stages(self) -> int:
        """KV pipeline depth (see `pipeline_depth`); 0 when not even two stages fit."""
        return self.pipeline.stages

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def fits(self) -> bool:
        return self.stages >= 2

    @functools.cached_property
    def spec(self):
        from flashinfer_jit import KernelSpec

        return KernelSpec.make(
            "fp8_paged_mqa_logits_sm90",
            CSRC / "fp8_paged_mqa_logits.cu",
            {
                "BLOCK_SIZE": self.block_size,
                "HEAD_DIM": self.head_dim,
                "NUM_HEADS": self.num_heads,
                "NEXT_N": self.next_n,
                "NUM_STAGES": self.stages,
                "NUM_CONSUMERS": self.consumers,
                "NUM_PRODUCERS": self.pipeline.producers,
                "MMA_HALVES": mma_halves_for(self.n),
                "WEIGHT_REGS": weight_register_groups(self.n, self.consumers, self.epi_dtype),
                "OUT_DTYPE": DTYPE_CODE[self.output_dtype],
                "EPI_DTYPE": DTYPE_CODE[self.epi_dtype],
                "ACC_FP16": int(self.acc_dtype == torch.float16),
                "SCHEDULE_ENTRY_UNITS": SCHEDULE_REQUEST_ENTRY_UNITS,
                # The launch size, so the kernel can check its layout against it.
                "SHARED_BYTES": self.shared_memory_bytes(self.stages),
                **dict(self.experiment),
            },
            label=(
                f"fp8_paged_mqa_logits[bs={self.block_size}, D={self.head_dim}, "
                f"H={self.num_heads}, next_n={self.next_n}, out={_short(self.output_dtype)}, "
                f"epi={_short(self.epi_dtype)}, acc={_short(self.acc_dtype)}]"
            ),
        )


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@functools.cache
def fp8_config(
    block_size: int,
    head_dim: int,
    num_heads: int,
    next_n: int,
    output_dtype: torch.dtype,
    epi_dtype: torch.dtype,
    acc_dtype: torch.dtype,
    experiment: tuple[tuple[str, int], ...] = (),
) -> Fp8KernelConfig:
    return Fp8KernelConfig(
        block_size, head_dim, num_heads, next_n, output_dtype, epi_dtype, acc_dtype, experiment
    )


@functools.lru_cache(maxsize=4096)
def fits_shared_memory(head_dim: int, num_heads: int, next_n: int) -> bool:
    """Whether (head_dim, num_heads, next_n) fits the SM90 kernel's shared memory. Not
    through `fp8_config`'s unbounded cache, which refused calls would fill with a
    configuration per head_dim tried; its own cache is bounded (every fp8 custom-op call asks)."""
    config = Fp8KernelConfig(
        64, head_dim, num_heads, next_n, torch.float32, torch.float32, torch.float32
    )
    return config.fits


def check_shared_memory_fit(num_heads: int, head_dim: int, next_n: int) -> None:
    """Raise ValueError, naming the largest head_dim that fits, unless (num_heads, head_dim,
    next_n) fits the SM90 kernel's shared memory."""
    if fits_shared_memory(head_dim, num_heads, next_n):
        return
    largest = largest_fitting_head_dim(num_heads, next_n)
    raise ValueError(
        f"head_dim={head_dim} with num_heads={num_heads} and next_n={next_n} does not fit the "
        f"SM90 kernel's shared memory (227 KiB per CTA: two q slots of next_n*num_heads*head_dim "
        f"bytes and at least two KV stages of 64*head_dim bytes); at next_n*num_heads = "
        f"{next_n * num_heads} the largest head_dim that fits is {largest}"
    )


def largest_fitting_head_dim(num_heads: int, next_n: int) -> int:
    """The largest head_dim (a multiple of 32) that fits at this next_n * num_heads; 0 if none.
    The shared memory grows with head_dim, so the first one that does not fit ends the scan."""
    largest, head_dim = 0, 32
    while fits_shared_memory(head_dim, num_heads, next_n):
        largest, head_dim = head_dim, head_dim + 32
    return largest


def serving_configs(
    block_sizes=(32, 64, 128),
    next_ns=(1, 2, 3, 4),
    output_dtypes=(torch.float32, torch.float16),
    *,
    head_dim: int = 128,
    num_heads: int = 64,
    epi_dtypes=(torch.float32,),
    acc_dtypes=(torch.float32,),
) -> list[Fp8KernelConfig]:
    """The DeepSeek-V3.2 indexer configurations a deployment compiles ahead of serving."""
    return [
        fp8_config(bs, head_dim, num_heads, n, out, epi, acc)
        for bs in block_sizes
        for n in next_ns
        for out in output_dtypes
        for epi in epi_dtypes
        for acc in acc_dtypes
    ]


def all_kernel_specs():
    """Every configuration CI compiles for sm_90a (entry point `flashinfer_jit.kernels`)."""
    dtypes = (torch.float32, torch.float16)
    configs = serving_configs(epi_dtypes=dtypes, acc_dtypes=dtypes)
    # Parametric shapes the tests exercise.
    for head_dim, num_heads, next_n in [
        (128, 32, 4),
        (128, 32, 6),
        (128, 32, 8),
        (64, 64, 1),
        (128, 16, 1),
        (256, 64, 1),
        (96, 8, 1),
        (128, 4, 64),
        (64, 8, 31),
        (96, 12, 20),
        (64, 36, 4),
        (32, 248, 1),
        # Head shapes of the seeded random calls and the thread test.
        (64, 16, 1),
        (32, 8, 2),
        (160, 4, 2),
        (160, 8, 1),
        (64, 32, 2),
        # The rest of test_gpu.py's PARAMETRIC_SHAPES: wide heads down to two KV stages, and
        # head_dim / 16 a multiple of 7 (224, 896), whose q staging once spilled.
        (128, 4, 2),
        (160, 12, 2),
        (320, 64, 1),
        (640, 64, 1),
        (512, 16, 1),
        (256, 32, 3),
        (224, 64, 3),
        (256, 64, 3),
        (896, 64, 1),
        (352, 64, 4),
        (128, 100, 2),
        (32, 4, 2),
    ]:
        configs += [
            fp8_config(bs, head_dim, num_heads, next_n, torch.float32, torch.float32, torch.float32)
            for bs in (32, 64, 128)
        ]
    # num_heads % 8 == 4, where an 8-column group holds the heads of two draft slots, at every
    # epilogue and accumulator dtype (test_gpu.py's STRADDLING_HEADS).
    for num_heads, next_n in [(12, 2), (4, 4), (20, 4), (100, 2), (36, 4)]:
        configs += [
            fp8_config(64, 128, num_heads, next_n, torch.float32, epi, acc)
            for epi in dtypes
            for acc in dtypes
        ]
    # Once each: (128, 100, 2) at the float32 dtypes is in both lists above.
    return list({config.spec.label: config.spec for config in configs}.values())


# KV pool descriptors by (address, geometry), least recently used first. A model keeps one
# pool per layer (61 indexer layers in DeepSeek-V3.2), so the bound leaves room for several
# models; clearing the table instead would rebuild every layer's map on every call once the
# layers outnumbered it.
_tensor_maps: OrderedDict[tuple, object] = OrderedDict()
_TENSOR_MAPS_LIMIT = 1024

# TMA reads the pool from a 16-byte aligned address with strides that are multiples of 16
# bytes; the scale regions' bulk copies need the same alignment.
POOL_ALIGNMENT = 16


def kv_block_stride(kv_fused: torch.Tensor) -> int:
    """Bytes from one block of the pool to the next: `kv_fused.stride(0)` (the pool may be a
    view with a wider pitch, e.g. one layer of a layer-interleaved cache). A one-block pool's
    stride is meaningless, so it counts as contiguous."""
    if kv_fused.shape[0] > 1:
        return kv_fused.stride(0)
    return kv_fused[0].numel()


def kv_values_tensor_map(
    kv_fused: torch.Tensor, value_bytes: int, scale_bytes: int, box_bytes: int, swizzle: str
):
    """Cached TMA descriptor of the value region of every block of a `kv_fused` pool.

    Dims (value_bytes, block_size, num_blocks) with the pool's block stride
    (`kv_block_stride`); one box is `box_bytes` x min(64, block_size) rows x 1 block. Shared
    by the FP8 and MXFP4 launchers. Raises ValueError for a pool address TMA cannot read from.
    """
    from flashinfer_jit import make_tensor_map

    num_blocks, block_size = kv_fused.shape[:2]
    address, block_stride = kv_fused.data_ptr(), kv_block_stride(kv_fused)
    key = (
        address,
        kv_fused.device.index,
        num_blocks,
        block_size,
        block_stride,
        value_bytes,
        scale_bytes,
        box_bytes,
        swizzle,
    )
    tensor_map = _tensor_maps.get(key)
    if tensor_map is not None:
        try:
            _tensor_maps.move_to_end(key)
        except KeyError:  # dropped by another thread meanwhile; the map is still valid
            pass
    else:
        if address % POOL_ALIGNMENT:
            raise ValueError(
                f"kv_fused must start at a {POOL_ALIGNMENT}-byte aligned address on CUDA (the "
                f"kernel reads it with TMA), got data_ptr() = {address:#x} "
                f"({address % POOL_ALIGNMENT} bytes past alignment)"
            )
        # The descriptor encodes only the address, dims and strides (all in the key), so it
        # describes the address, not the tensor: a cached map must not keep freed pools alive.
        tensor_map = make_tensor_map(
            address,
            torch.uint8,
            global_dims=(value_bytes, block_size, num_blocks),
            global_strides_bytes=(value_bytes, block_stride),
            box_dims=(box_bytes, min(TOKENS_PER_UNIT, block_size), 1),
            swizzle=swizzle,
        )
        _tensor_maps[key] = tensor_map
        while len(_tensor_maps) > _TENSOR_MAPS_LIMIT:
            try:
                _tensor_maps.popitem(last=False)
            except KeyError:  # emptied by another thread meanwhile
                break
    return tensor_map


def schedule_arguments(
    schedule_meta: torch.Tensor | None,
    device: torch.device,
    schedule_rows_out: torch.Tensor | None = None,
) -> tuple:
    """Grid size and the kernel's (`schedule`, `schedule_rows_out`) arguments.

    With `schedule_meta=None` the kernel derives each CTA's range from `seq_lens` itself
    (`schedule_rows` in csrc/paged_mqa_common.cuh, one pass per token, the policy of
    `flashinfer_schedule`): one launch per call, and a captured graph re-derives the schedule
    on every replay. `schedule_rows_out`, a `[num_sms + 1, 2]` int32 tensor, receives the rows
    the kernel computed (tests compare them with `compute_paged_mqa_logits_schedule`).
    Shared by the FP8 and MXFP4 launchers.
    """
    from flashinfer_jit import u64
    from flashinfer_schedule import device_num_sms

    if schedule_meta is not None:
        return schedule_meta.shape[0] - 1, schedule_meta, u64(0)
    rows_out = u64(0) if schedule_rows_out is None else schedule_rows_out
    return device_num_sms(device), u64(0), rows_out


def _kv_tensor_map(kv_fused: torch.Tensor, config: Fp8KernelConfig):
    """FP8 values: rows of head_dim bytes in 128/64/32-byte swizzled boxes."""
    swizzle = 128 if config.head_dim % 128 == 0 else 64 if config.head_dim % 64 == 0 else 32
    return kv_values_tensor_map(kv_fused, config.head_dim, 4, swizzle, f"{swizzle}B")


class PoolTensorMap:
    """The TMA descriptor of the KV pool a prepared launch saw last (pools rarely move).

    One compare of the pool's address per call; a different pool goes through the shared
    cache of `kv_values_tensor_map`. The (address, map) pair is replaced as one attribute,
    so concurrent callers never pair an address with another pool's map.
    """

    __slots__ = ("_entry", "_make")

    def __init__(self, make) -> None:
        self._make = make
        self._entry: tuple[int, object] = (-1, None)

    def __call__(self, kv_fused: torch.Tensor):
        address = kv_fused.data_ptr()
        entry = self._entry
        if entry[0] != address:
            entry = (address, self._make(kv_fused))
            self._entry = entry
        return entry[1]


# The spellings that turn PDL off, as they turn the JIT runtime's switches off; an empty
# value is a switch not set, which for PDL means on.
_PDL_OFF = frozenset({"0", "false", "no", "off"})


def programmatic_launch_enabled() -> bool:
    """Whether the logits kernels are launched with programmatic dependent launch (PDL): yes
    unless `FLASHINFER_PDL` is 0/false/no/off (any case). Read when a call signature is first
    prepared, so set it before the first call. With PDL a kernel's launch and prologue
    overlap the end of the kernel before it in the stream (the kernel waits for that one to
    complete before it touches memory); in a CUDA graph of back-to-back calls at small batches that saved 0.4-0.7 us per
    call (H200, 2026-11-29). It changes no result."""
    return os.environ.get("FLASHINFER_PDL", "1").strip().lower() not in _PDL_OFF


def prepared_launcher(
    config,
    q: torch.Tensor,
    kv_fused: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    out_storage: torch.Tensor,
    schedule_meta: torch.Tensor | None,
    schedule_rows_out: torch.Tensor | None,
    make_kv_map,
    devices_checked: bool,
):
    """What a prepared launch fixes for one argument signature, shared by both kernels: returns
    `launch(kv_fused, q_operands, block_tables, seq_lens, schedule_meta, out_storage)`, which
    launches on the grid of `schedule_arguments` with the kernels' common signature, the
    kernel's own q operands (fp8: q, weights; fp4: q, q_sf, weights) in place of `q_operands`.
    `max_seq_len` and the pool's block count are passed too: they bound what the kernel writes
    and reads when the lengths or the block table break the contract (see `UnitWalker` and
    `run_producer` in paged_mqa_common.cuh)."""
    from flashinfer_jit import i32, i64, load_kernel, u64

    kernel = load_kernel(config.spec, q.device)
    grid, _, rows_out = schedule_arguments(schedule_meta, q.device, schedule_rows_out)
    # EXP_CLUSTER (measurement only, tools/call_gaps.py --cluster): launch in clusters of that
    # many CTAs along x; the kernel itself uses no cluster feature.
    cluster = dict(config.experiment).get("EXP_CLUSTER")
    launch_kernel = kernel.prepare_launch(
        grid,
        config.threads,
        cluster=(cluster, 1, 1) if cluster else None,
        shared_mem=config.shared_memory_bytes(config.stages),
        programmatic=programmatic_launch_enabled(),
        devices_checked=devices_checked,
    )
    pool_map = PoolTensorMap(make_kv_map)
    block_stride = i64(kv_block_stride(kv_fused))
    table_stride, lens_stride = i64(block_tables.stride(0)), i64(seq_lens.stride(0))
    no_schedule = u64(0)  # the null schedule pointer of a call without schedule_meta
    rows, out_stride = i32(q.shape[0]), i64(out_storage.stride(0))
    max_len, num_blocks = i32(max_seq_len), i32(kv_fused.shape[0])

    def launch(kv_fused, q_operands, block_tables, seq_lens, schedule_meta, out_storage):
        launch_kernel(
            pool_map(kv_fused),
            kv_fused,
            block_stride,
            *q_operands,
            block_tables,
            table_stride,
            seq_lens,
            lens_stride,
            no_schedule if schedule_meta is None else schedule_meta,
            rows_out,
            rows,
            max_len,
            num_blocks,
            out_storage,
            out_stride,
        )

    return launch


def prepare(
    q: torch.Tensor,
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
    acc_dtype: torch.dtype,
    experiment: tuple[tuple[str, int], ...] = (),
    schedule_rows_out: torch.Tensor | None = None,
    devices_checked: bool = False,
):
    """The launch of every call whose arguments match these in dtype, device, shape and
    strides (their data may differ): returns `run(q, kv_fused, weights, block_tables,
    seq_lens, out_storage, schedule_meta)`. `max_seq_len` is the call's (`out_storage` has at
    least `padded_seq_len(max_seq_len)` columns); the kernel clamps every length to it.

    Everything derived from that metadata (configuration, loaded kernel, grid, strides as
    kernel scalars) is fixed here; `run` reads only data pointers and the current stream, so
    `dispatch.py` keeps one per validated argument signature and a warm eager call is one launch.
    `schedule_meta=None`: the kernel schedules itself (see `schedule_arguments`).
    """

    _, next_n, num_heads, head_dim = q.shape
    config = fp8_config(
        kv_fused.shape[1],
        head_dim,
        num_heads,
        next_n,
        output_dtype,
        epi_dtype,
        acc_dtype,
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
        lambda pool: _kv_tensor_map(pool, config),
        devices_checked,
    )

    def run(q, kv_fused, weights, block_tables, seq_lens, out_storage, schedule_meta):
        # The kernel reads q and weight rows as 16-byte vectors.
        q_operands = (_contiguous_aligned(q), _contiguous_aligned(weights))
        launch(kv_fused, q_operands, block_tables, seq_lens, schedule_meta, out_storage)

    return run


def launch(*tensors, **options) -> None:
    """Prepare and launch once on the current stream: `tensors` are `prepare`'s positional
    arguments (those `run` takes too), `options` its keyword arguments."""
    prepare(*tensors, **options)(*tensors)


def _contiguous_aligned(t: torch.Tensor) -> torch.Tensor:
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)  # fresh allocations are aligned
