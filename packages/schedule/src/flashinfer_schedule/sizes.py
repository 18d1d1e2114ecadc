"""Size rules shared by the paged MQA logits kernels and their callers.

Both rules are tiny, but keeping them in one place means a caller that sizes an `out=` buffer
or a block table with these helpers always agrees with what the kernel reads and writes.
"""

from __future__ import annotations

from flashinfer_jit.op_args import check_int, require, shown

__all__ = ["OUTPUT_COLUMN_GRANULARITY", "min_block_table_width", "padded_seq_len"]

# The output contract pads every row to a multiple of 256 columns (the spec's store granularity,
# e.g. 8000 -> 8192). The SM90 kernels store whole 64-position units of a request, which never
# reach past that padding; columns past the valid region are unspecified either way.
OUTPUT_COLUMN_GRANULARITY = 256


def padded_seq_len(max_seq_len: int) -> int:
    """Return the minimum column count of the paged MQA logits `out` buffer.

    The logits kernels may write past `max_seq_len` up to this padding (the SM90 kernels store
    whole 64-position units), so an `out=` buffer needs at least this many columns (and a row
    stride at least this large). The returned logits are the `[:, :max_seq_len]` view of that storage.

    Args:
        max_seq_len: Maximum KV sequence length of the call, `>= 0`.

    Returns:
        `max_seq_len` rounded up to a multiple of 256, e.g. 8000 -> 8192, 256 -> 256, 1 -> 256.
        `padded_seq_len(0)` is 0: with no KV positions there is nothing to store, so a
        zero-column buffer is enough.

    Raises:
        TypeError: `max_seq_len` is not an integer (a Python or numpy int; a bool or
            tensor is refused).
        ValueError: `max_seq_len` is negative. Inside torch.compile, with a value read from
            device data (`int(seq_lens.max())`), the check runs with the compiled code and
            raises RuntimeError there.
    """
    max_seq_len = check_int("max_seq_len", max_seq_len)
    require(
        max_seq_len >= 0, lambda: ValueError(f"max_seq_len must be >= 0, got {shown(max_seq_len)}")
    )
    tile = OUTPUT_COLUMN_GRANULARITY
    return (max_seq_len + tile - 1) // tile * tile


def min_block_table_width(seq_len: int, block_size: int) -> int:
    """Return the minimum `block_tables` column count for a sequence length.

    A request of `seq_len` KV tokens occupies `ceil(seq_len / block_size)` blocks of the paged
    pool, one table entry each; the kernels never read a row past that many entries. Pass
    `max(seq_lens)` (or the serving stack's `max_seq_len`) to size a whole table.

    Args:
        seq_len: KV sequence length in tokens, `>= 0`.
        block_size: Tokens per KV block (`kv_fused.shape[1]`), `>= 1`. The logits kernels
            accept 32, 64 and 128; this helper accepts any positive size.

    Returns:
        `ceil(seq_len / block_size)`, e.g. `min_block_table_width(8000, 32) == 250`.

    Raises:
        TypeError: An argument is not an integer (a Python or numpy int; a bool or
            tensor is refused).
        ValueError: `seq_len` is negative or `block_size` is not positive (RuntimeError when
            the compiled code runs, for a value read from device data inside torch.compile).
    """
    seq_len = check_int("seq_len", seq_len)
    block_size = check_int("block_size", block_size)
    require(seq_len >= 0, lambda: ValueError(f"seq_len must be >= 0, got {shown(seq_len)}"))
    require(
        block_size >= 1, lambda: ValueError(f"block_size must be >= 1, got {shown(block_size)}")
    )
    return (seq_len + block_size - 1) // block_size
