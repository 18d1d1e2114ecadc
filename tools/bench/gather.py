"""The paged-gather ceiling: a read-only CUDA kernel over an op call's own pages.

`csrc/paged_gather.cu` reads, for the same `kv_fused`, `block_tables` and `seq_lens` as an
op call, the KV cache bytes that call must read (each request's valid tokens' values and their
scales, the scale slice of a request's last block rounded up to a 16-byte vector) and XORs
them into a few words, so nothing it loads can be optimised away. Its bandwidth, bytes read
over time, is what a paged op could at best reach on that case; the benchmark reports each op
row as a fraction of it next to the fraction of the copy bandwidth.
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
    """

    bytes_read: int
    timing: Timing
    grid: int

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


class PagedGather:
    """The gather kernel loaded on one device, with its grid and its small XOR output.

    Args:
        geometry: Block geometry of the pools it will read.
        device: A CUDA device.
    """

    def __init__(self, geometry: GatherGeometry, device: torch.device) -> None:
        from flashinfer_jit import load_kernel, sm_count

        self.geometry = geometry
        self.kernel = load_kernel(gather_spec(geometry), device)
        per_sm = max(1, self.kernel.max_active_blocks_per_sm(THREADS))
        # Every SM gets as many CTAs as fit at once: one wave, persistent over the blocks.
        self.grid = sm_count(device) * per_sm
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
            self.kernel.launch(self.grid, THREADS, *args)
            return self.out

        return launch
