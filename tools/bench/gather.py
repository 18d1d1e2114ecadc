"""The paged-gather ceiling: read-only CUDA kernels over an op call's own pages.

Two kernels read, for the same `kv_fused`, `block_tables` and `seq_lens` as an op call, the KV
cache bytes that call must read (each request's valid tokens' values and their scales, the
scale slice of a request's last block rounded up to a 16-byte vector) and XOR them into a few
words, so nothing they load can be optimised away:

- `loads` (`csrc/paged_gather.cu`): 16-byte loads from every warp of two 256-thread CTAs per SM,
  blocks dealt round-robin, each warp walking the block tables itself;
- `copies` (`csrc/paged_gather_copies.cu`): cp.async.bulk copies into a ring of shared-memory
  slots, 4 producer warps per SM over a contiguous range of a block list built beforehand, as
  the logits kernels' producers read (the faster of the two on large problems, 2026-11-30).

The benchmark times both on each case and keeps the faster as the ceiling: its bandwidth,
bytes read over time, is what a paged op could at best reach on that case, and each op row is
reported as a fraction of it next to the fraction of the copy bandwidth.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .models import kv_bytes_per_token
from .timing import Timing

SOURCE = Path(__file__).resolve().with_name("csrc") / "paged_gather.cu"
KERNEL_NAME = "paged_gather_xor"
COPIES_SOURCE = SOURCE.with_name("paged_gather_copies.cu")
COPIES_KERNEL_NAME = "paged_gather_copies_xor"
COPIES_THREADS = 256  # 4 producer warps and 4 consumer warps
# Shared memory for the copy ring's slots: as many whole blocks as fit, a multiple of the 4
# producer warps, 4 to 64 of them (fp4 block 32: 64 x 2176 bytes).
COPIES_SLOT_BUDGET = 192 * 1024
KINDS = ("loads", "copies")
THREADS = 256
LOADS_PER_LANE = 16
MIN_CTAS_PER_SM = 2
VECTOR_BYTES = 16


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class GatherGeometry:
    """Byte geometry of one kv_fused block: a value region, then a scale region.

    Attributes:
        block_size: Tokens per block.
        value_bytes: Value bytes per token (fp8: head_dim; MXFP4: head_dim / 2).
        scale_bytes: Scale bytes per token (fp8: 4; MXFP4: head_dim / 32).
    """

    block_size: int
    value_bytes: int
    scale_bytes: int

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size % 16:
            raise ValueError(f"block_size must be a positive multiple of 16, got {self.block_size}")
        if self.value_bytes <= 0 or self.value_bytes % VECTOR_BYTES:
            raise ValueError(
                f"value_bytes per token must be a positive multiple of 16, got {self.value_bytes}"
            )
        if self.scale_bytes <= 0:
            raise ValueError(f"scale_bytes per token must be positive, got {self.scale_bytes}")

    @property
    def block_bytes(self) -> int:
        return self.block_size * (self.value_bytes + self.scale_bytes)

    def bytes_read(self, seq_lens: Sequence[int]) -> int:
        """Bytes the kernel reads for these lengths: values and scales of every valid token,
        each block's scale slice rounded up to whole 16-byte vectors."""
        total = 0
        for length in seq_lens:
            full_blocks, tail = divmod(int(length), self.block_size)
            total += length * self.value_bytes
            total += full_blocks * _round_up(self.block_size * self.scale_bytes, VECTOR_BYTES)
            total += _round_up(tail * self.scale_bytes, VECTOR_BYTES)
        return total


@dataclass(frozen=True)
class GatherCeiling:
    """The gather kernel timed on one case, the same way as the op.

    Attributes:
        bytes_read: KV bytes one call reads (`GatherGeometry.bytes_read`).
        timing: Per-call time over CUDA-graph replays of the case's rotation sets.
        grid: CTAs launched (SMs x resident CTAs per SM).
        kernel: Which gather kernel this is (`KINDS`): the faster one on the case.
        programmatic: Launched with programmatic dependent launch, as the ops are unless
            `FLASHINFER_PDL` turns it off (runs before 2026-12-06 launched without it).
    """

    bytes_read: int
    timing: Timing
    grid: int
    kernel: str = "loads"
    programmatic: bool = False

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_read / (self.timing.median_us * 1e-6)


def geometry_for(op: str, block_size: int, head_dim: int) -> GatherGeometry:
    """The block geometry of an op's `kv_fused` pool."""
    scale_bytes = 4 if op == "fp8" else head_dim // 32
    value_bytes = kv_bytes_per_token(op, head_dim) - scale_bytes
    return GatherGeometry(block_size, value_bytes, scale_bytes)


@functools.cache
def gather_spec(geometry: GatherGeometry):
    """The `flashinfer_jit.KernelSpec` of the gather kernel for one block geometry."""
    from flashinfer_jit import KernelSpec

    return KernelSpec.make(
        KERNEL_NAME,
        SOURCE,
        {
            "BLOCK_SIZE": geometry.block_size,
            "VALUE_BYTES": geometry.value_bytes,
            "SCALE_BYTES": geometry.scale_bytes,
            "THREADS": THREADS,
            "LOADS_PER_LANE": LOADS_PER_LANE,
            "MIN_CTAS_PER_SM": MIN_CTAS_PER_SM,
        },
        label=(
            f"paged_gather[bs={geometry.block_size}, value={geometry.value_bytes} B, "
            f"scale={geometry.scale_bytes} B]"
        ),
    )


def copies_stages(geometry: GatherGeometry) -> int:
    """Ring slots of the `copies` kernel for one block geometry."""
    return max(4, min(64, COPIES_SLOT_BUDGET // geometry.block_bytes // 4 * 4))


@functools.cache
def copies_spec(geometry: GatherGeometry):
    """The `flashinfer_jit.KernelSpec` of the `copies` gather kernel for one block geometry."""
    from flashinfer_attn_scores.paged_mqa_logits import fp8_sm90
    from flashinfer_jit import KernelSpec

    return KernelSpec.make(
        COPIES_KERNEL_NAME,
        COPIES_SOURCE,
        {
            "BLOCK_SIZE": geometry.block_size,
            "VALUE_BYTES": geometry.value_bytes,
            "SCALE_BYTES": geometry.scale_bytes,
            "STAGES": copies_stages(geometry),
        },
        include_dirs=(Path(fp8_sm90.__file__).with_name("csrc"),),
        label=(
            f"paged_gather_copies[bs={geometry.block_size}, value={geometry.value_bytes} B, "
            f"scale={geometry.scale_bytes} B]"
        ),
    )


def block_list(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> torch.Tensor:
    """The blocks a call reads, in request order: `[n, 2]` int32 (physical id, valid tokens)."""
    lengths = seq_lens.clamp(min=0).long()
    counts = (lengths + block_size - 1) // block_size
    total = int(counts.sum())
    request = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=lengths.device), counts, output_size=total
    )
    first = torch.cumsum(counts, 0) - counts
    index = torch.arange(total, device=lengths.device) - first[request]
    ids = block_tables[request, index]
    tokens = torch.clamp(lengths[request] - index * block_size, max=block_size)
    return torch.stack([ids.to(torch.int32), tokens.to(torch.int32)], dim=1).contiguous()


class PagedGather:
    """One gather kernel loaded on one device, with its grid and its small XOR output.

    Args:
        geometry: Block geometry of the pools it will read.
        device: A CUDA device.
        kind: `"loads"` or `"copies"` (see the module docstring).
        programmatic: Launch with programmatic dependent launch (both kernels wait for the
            previous kernel in the stream before they read anything), as the ops do: in a
            graph of back-to-back calls each launch then overlaps the end of the one before
            for the gather as for the op.
    """

    def __init__(
        self,
        geometry: GatherGeometry,
        device: torch.device,
        kind: str = "loads",
        *,
        programmatic: bool = False,
    ) -> None:
        from flashinfer_jit import load_kernel, sm_count

        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
        self.geometry = geometry
        self.kind = kind
        self.programmatic = programmatic
        if kind == "loads":
            self.kernel = load_kernel(gather_spec(geometry), device)
            per_sm = max(1, self.kernel.max_active_blocks_per_sm(THREADS))
            # Every SM gets as many CTAs as fit at once: one wave, persistent over the blocks.
            self.grid = sm_count(device) * per_sm
            self.threads, self.shared_mem = THREADS, 0
        else:
            self.kernel = load_kernel(copies_spec(geometry), device)
            self.grid = sm_count(device)
            stages = copies_stages(geometry)
            # The slots, then full[], empty[] (8 bytes each) and the tokens of each slot.
            self.threads, self.shared_mem = COPIES_THREADS, stages * (geometry.block_bytes + 20)
        self.out = torch.zeros(self.grid, dtype=torch.int32, device=device)

    def _check(
        self, kv_fused: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor
    ) -> None:
        if kv_fused.dtype != torch.uint8 or kv_fused.dim() != 4:
            raise ValueError(
                f"kv_fused: expected a 4-D uint8 pool, got {kv_fused.dim()}-D {kv_fused.dtype}"
            )
        block_elems = kv_fused[0].numel()
        if block_elems != self.geometry.block_bytes or not kv_fused[0].is_contiguous():
            raise ValueError(
                f"kv_fused: expected contiguous blocks of {self.geometry.block_bytes} bytes, got "
                f"{block_elems} bytes with strides {kv_fused.stride()}"
            )
        if kv_fused.data_ptr() % VECTOR_BYTES or kv_fused.stride(0) % VECTOR_BYTES:
            raise ValueError(
                f"kv_fused: the base address and block stride must be multiples of 16 bytes for "
                f"16-byte loads, got 0x{kv_fused.data_ptr():x} and {kv_fused.stride(0)}"
            )
        for name, tensor, ndim in (("block_tables", block_tables, 2), ("seq_lens", seq_lens, 1)):
            if tensor.dtype != torch.int32 or tensor.dim() != ndim:
                raise ValueError(
                    f"{name}: expected a {ndim}-D int32 tensor, got {tensor.dim()}-D {tensor.dtype}"
                )
        if block_tables.shape[0] != seq_lens.shape[0] or block_tables.stride(1) != 1:
            raise ValueError(
                f"block_tables: expected {seq_lens.shape[0]} rows with contiguous entries, got "
                f"shape {tuple(block_tables.shape)} strides {block_tables.stride()}"
            )

    def launcher(
        self, kv_fused: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor
    ) -> Callable[[], torch.Tensor]:
        """A closure that launches one gather on the current stream and returns `out`.

        The XOR of all `out` words is the XOR of every 32-bit word read (see the kernel).
        """
        from flashinfer_jit import i32, i64

        self._check(kv_fused, block_tables, seq_lens)
        if self.kind == "copies":
            blocks = block_list(block_tables, seq_lens, self.geometry.block_size)
            copies_args = (
                kv_fused,
                i64(kv_fused.stride(0)),
                blocks,
                i32(blocks.shape[0]),
                self.out,
            )

            def launch_copies() -> torch.Tensor:
                self.kernel.launch(
                    self.grid,
                    self.threads,
                    *copies_args,
                    shared_mem=self.shared_mem,
                    programmatic=self.programmatic,
                )
                return self.out

            return launch_copies
        args = (
            kv_fused,
            i64(kv_fused.stride(0)),
            block_tables,
            i64(block_tables.stride(0)),
            seq_lens,
            i64(seq_lens.stride(0)),
            i32(seq_lens.shape[0]),
            self.out,
        )

        def launch() -> torch.Tensor:
            self.kernel.launch(self.grid, THREADS, *args, programmatic=self.programmatic)
            return self.out

        return launch
