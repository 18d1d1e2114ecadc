"""The benchmark's shape grid (PERFORMANCE.md) and its deterministic per-request lengths."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import torch

OPS = ("fp8", "fp4")

# The indexer grid of PERFORMANCE.md.
GRID_BATCH = (1, 8, 64, 128)
GRID_AVG_LEN = (4096, 16384, 65536)
GRID_NEXT_N = (1, 2, 3, 4)
GRID_BLOCK_SIZE = (32, 64, 128)

# Request lengths are uniform in [LEN_LOW, LEN_HIGH] times the average length.
LEN_LOW, LEN_HIGH = 0.7, 1.3

# The small-batch target of PERFORMANCE.md: B <= 8 and L <= 16k, one CUDA-graph replay per call.
SMALL_BATCH_MAX_B, SMALL_BATCH_MAX_LEN = 8, 16384

# DeepSeek-V3.2's indexer: 64 heads of 128 (fp4 supports only this shape).
NUM_HEADS, HEAD_DIM = 64, 128

# The epilogue and accumulator dtypes a run may ask for (`--epi-dtype`, `--acc-dtype`), by op.
# float32 is both ops' default; fp4's MMA always accumulates in float32.
EPI_DTYPES = {"fp8": ("float32", "float16"), "fp4": ("float32", "float16", "bfloat16")}
ACC_DTYPES = {"fp8": ("float32", "float16"), "fp4": ("float32",)}
DEFAULT_DTYPE = "float32"


@dataclass(frozen=True)
class IndexerShape:
    """One benchmark case of a paged MQA logits op.

    Attributes:
        op: "fp8" or "fp4".
        batch: Number of requests B.
        avg_len: Average KV length L; each request draws uniformly in 0.7..1.3 of it.
        next_n: Query positions scored per request.
        block_size: Tokens per KV block.
        num_heads: Query heads H.
        head_dim: Head dimension D.
        epi_dtype: The op's `epi_dtype`, by torch name.
        acc_dtype: fp8's `acc_dtype`, by torch name (always float32 for fp4).
    """

    op: str
    batch: int
    avg_len: int
    next_n: int
    block_size: int
    num_heads: int = NUM_HEADS
    head_dim: int = HEAD_DIM
    epi_dtype: str = DEFAULT_DTYPE
    acc_dtype: str = DEFAULT_DTYPE

    @property
    def data_label(self) -> str:
        """The label without the dtypes: what the lengths and data are drawn from, so a run
        with other dtypes times the same bytes as the default run."""
        return (
            f"{self.op} B={self.batch} L={self.avg_len} next_n={self.next_n} bs={self.block_size}"
        )

    @property
    def label(self) -> str:
        dtypes = "".join(
            f" {name}={value}"
            for name, value in (("epi", self.epi_dtype), ("acc", self.acc_dtype))
            if value != DEFAULT_DTYPE
        )
        return self.data_label + dtypes

    @property
    def small_batch(self) -> bool:
        """Whether the small-batch target (one call per graph replay) covers this shape."""
        return self.batch <= SMALL_BATCH_MAX_B and self.avg_len <= SMALL_BATCH_MAX_LEN

    def seed(self) -> int:
        """A seed derived from the shape alone, so every run draws the same lengths and data."""
        digest = hashlib.sha256(self.data_label.encode()).digest()
        return int.from_bytes(digest[:4], "little")

    def seq_lens(self) -> list[int]:
        """Per-request KV lengths, uniform in [0.7 L, 1.3 L], the same on every run."""
        gen = torch.Generator().manual_seed(self.seed())
        fractions = LEN_LOW + (LEN_HIGH - LEN_LOW) * torch.rand(self.batch, generator=gen)
        lengths = (fractions.double() * self.avg_len).round().long().clamp_min(self.next_n)
        return lengths.tolist()


def gpu_grid(
    ops: Iterable[str],
    quick: bool,
    epi_dtype: str = DEFAULT_DTYPE,
    acc_dtype: str = DEFAULT_DTYPE,
) -> list[IndexerShape]:
    """The full PERFORMANCE.md grid, or a small slice of it with `quick`, at these dtypes."""
    if quick:
        batches, lens, next_ns, blocks = (8, 128), (16384,), (1, 2), (64,)
    else:
        batches, lens, next_ns, blocks = GRID_BATCH, GRID_AVG_LEN, GRID_NEXT_N, GRID_BLOCK_SIZE
    return _shapes(ops, itertools.product(batches, lens, next_ns, blocks), epi_dtype, acc_dtype)


def cpu_grid(
    ops: Iterable[str],
    quick: bool,
    epi_dtype: str = DEFAULT_DTYPE,
    acc_dtype: str = DEFAULT_DTYPE,
) -> list[IndexerShape]:
    """Small shapes that exercise the pipeline through the CPU reference path in seconds.

    They keep the grid's structure (several requests, every block size, next_n up to 4) at
    lengths of a few hundred tokens.
    """
    cases = [(2, 256, 1, 32), (3, 384, 2, 64)]
    if not quick:
        cases += [(4, 512, 3, 128), (2, 640, 4, 64), (8, 192, 1, 32)]
    return _shapes(ops, cases, epi_dtype, acc_dtype)


def _shapes(
    ops: Iterable[str], cases: Iterable[tuple[int, int, int, int]], epi_dtype: str, acc_dtype: str
) -> list[IndexerShape]:
    """Every op at every (batch, avg_len, next_n, block_size) of `cases`, at these dtypes."""
    cases = list(cases)
    return [
        IndexerShape(op, b, length, n, bs, epi_dtype=epi_dtype, acc_dtype=acc_dtype)
        for op in ops
        for b, length, n, bs in cases
    ]
