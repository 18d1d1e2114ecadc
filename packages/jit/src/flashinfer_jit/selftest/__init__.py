"""Self-test kernels of flashinfer_jit, registered for `python -m flashinfer_jit compile-check`.

They back the package's GPU tests and the launch-overhead benchmark, and give CI something to
compile when no other package registers kernels.
"""

from __future__ import annotations

from pathlib import Path

from ..spec import KernelSpec

HERE = Path(__file__).resolve().parent
VECTOR_OPS = HERE / "vector_ops.cu"
TMA_TILE = HERE / "tma_tile.cu"
CLUSTER = HERE / "cluster.cu"
TEMPLATED = HERE / "templated.cu"

SCALE_ADD = KernelSpec.make("scale_add", VECTOR_OPS, {"OFFSET": 3})
EMPTY = KernelSpec.make("empty_kernel", VECTOR_OPS)
REVERSE_CHUNKS = KernelSpec.make("reverse_chunks", VECTOR_OPS)
TMA_LOAD_TILE = KernelSpec.make("tma_load_tile", TMA_TILE, {"BOX_ROWS": 64, "BOX_COLS": 32})
CLUSTER_NEIGHBOURS = KernelSpec.make("cluster_neighbours", CLUSTER)
FILL_VALUE = KernelSpec.make(
    "fill_value<5, float>", TEMPLATED, name_expressions=("fill_value<5, float>",)
)


def kernel_specs() -> list[KernelSpec]:
    """Return every self-test kernel configuration (the `flashinfer_jit.kernels` entry point).

    Returns:
        The specs, each compiled by `compile-check`.
    """
    return [SCALE_ADD, EMPTY, REVERSE_CHUNKS, TMA_LOAD_TILE, CLUSTER_NEIGHBOURS, FILL_VALUE]
