"""`torch.library` registrations of the paged MQA logits computations.

The public functions in `api.py` validate their arguments and choose the padded output
storage in Python (which `torch.compile` traces), then hand the work to one of these custom
ops. To the compiler an op is opaque: it takes the validated tensors and writes the logits
into `out_storage` in place (`mutates_args`), returning nothing, so its fake implementation
has nothing to compute. Dispatch is by device: CPU tensors write the float64 reference
rounded to the output dtype, CUDA tensors launch the SM90 kernel.

Ops (namespace `flashinfer_attn_scores`, reachable as `torch.ops.flashinfer_attn_scores.*`):

* `fp8_paged_mqa_logits_into(q, kv_fused, weights, block_tables, seq_lens, max_seq_len,
  out_storage, schedule_meta, output_dtype, epi_dtype, acc_dtype) -> ()`
* `fp4_paged_mqa_logits_into(q, q_sf, kv_fused, weights, block_tables, seq_lens, max_seq_len,
  out_storage, schedule_meta, sf_vec_size, output_dtype, epi_dtype, is_kv_sf_interleaved)
  -> ()`

They do no argument checking (call the public functions, which do) but these: the FP8 ops
check that the head geometry fits the kernel's shared memory, which a torch.compile trace
with symbolic head sizes leaves to them (see `problem.check_fp8_shared_memory_fit`), and
every op checks that `out_storage` holds what the kernel writes, which an AOTInductor
package, skipping export's input guards, would otherwise leave unchecked (the 2^31 output span
included), and that the rows
it writes share no memory with an input and are no inference tensor outside inference mode
(checks of addresses and run-time state, which the public function makes only in eager
calls).
"""

from collections.abc import Iterator

import torch
from flashinfer_jit.op_args import sizes, strides
from flashinfer_schedule import padded_seq_len

from .. import _validation as v
from . import dispatch, fp8_sm90, launcher
from .reference import fp4_logits_by_request, fp8_logits_by_request, request_rows

__all__ = ["NAMESPACE", "fp4_paged_mqa_logits_into", "fp8_paged_mqa_logits_into"]

NAMESPACE = "flashinfer_attn_scores"


def _write_computed_region(
    out_storage: torch.Tensor, by_request: Iterator[tuple[int, torch.Tensor]], next_n: int
) -> None:
    """Store each request's `[next_n, seq_lens[b]]` float64 logits in its rows, rounded once.

    Everything else, including the rows of empty requests, is left untouched. (The kernel
    also writes the rest of each request's last 64-position unit, which the contract leaves
    unspecified, and leaves everything past it untouched.) One request is held at a time, so
    a wide `max_seq_len` over short requests costs no more memory than `out`.
    """
    for b, logits in by_request:
        rounded = round_once(logits, out_storage.dtype)
        rounded[rounded.isnan()] = float("nan")  # one NaN pattern, whatever produced it
        request_rows(out_storage, b, next_n, logits.shape[1]).copy_(rounded)


def round_once(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 `values` rounded once, to nearest even, to `dtype`.

    PyTorch converts float64 to float16 or bfloat16 through float32, two roundings (1 + 2^-11
    + 2^-40 becomes 1, not 1 + 2^-10, in float16). Rounding to float32 to odd first (toward
    zero, the last bit set where inexact) makes the second rounding give the once-rounded
    value, as float32 keeps at least two bits more than either 16-bit format at every
    magnitude, their subnormals included.
    """
    single = values.to(torch.float32)
    if dtype not in (torch.float16, torch.bfloat16):
        return single if dtype == torch.float32 else values.to(dtype)
    widened = single.to(torch.float64)
    inexact = (widened != values) & torch.isfinite(values)
    bits = single.view(torch.int32)
    # Sign and magnitude: one less in the bits is one step toward zero (inf to the largest
    # finite value, the smallest subnormal to zero).
    bits = torch.where(inexact & (widened.abs() > values.abs()), bits - 1, bits)
    bits = torch.where(inexact, bits | 1, bits)
    return bits.view(torch.float32).to(dtype)


def _check_storage_fits(
    out_storage: torch.Tensor, q: torch.Tensor, max_seq_len: int, output_dtype: torch.dtype
) -> tuple[int, int]:
    """The kernels write `q.shape[0] * q.shape[1]` rows of `padded_seq_len(max_seq_len)`
    columns of `output_dtype`. The public functions check a caller's `out` for that, but an
    AOTInductor package of an exported program does not run export's input guards
    (pytorch/pytorch#141115), so the op checks its storage itself before anything writes
    into it (a float16 `out` under a float32 kernel would be written past its end), and
    applies the 2^31 output-span rule."""
    if out_storage.dtype != output_dtype:
        raise TypeError(
            f"out must have dtype output_dtype = {output_dtype}, got {out_storage.dtype}"
        )
    rows, cols = q.shape[0] * q.shape[1], padded_seq_len(max_seq_len)
    fits = (
        out_storage.dim() == 2
        and out_storage.shape[0] >= rows
        and out_storage.shape[1] >= cols
        and (out_storage.stride(1) == 1 or out_storage.shape[1] <= 1)
        and out_storage.stride(0) >= cols
    )
    if not fits:
        raise ValueError(
            f"out must hold batch_size*next_n = {rows} rows of padded_seq_len(max_seq_len) = "
            f"{cols} columns with contiguous rows, got shape {sizes(out_storage.shape)} and "
            f"strides {strides(out_storage.stride())}"
        )
    # The public functions' 2^31 span rule, which a direct call of the op has not met: the
    # kernels' in-row column offsets and in-kernel schedule sums are 32-bit, and past it a
    # length near 2^31 wraps its unit count, so every unit reads block 0.
    v.check_output_span(rows, cols, out_storage)
    return rows, cols


def _check_storage(
    variant: str,
    inputs: tuple,
    out_storage: torch.Tensor,
    max_seq_len: int,
    output_dtype: torch.dtype,
) -> None:
    """`out_storage` holds what the kernel writes, apart from the inputs (`inputs`: the op's
    input tensors in `dispatch.INPUT_NAMES` order, q first)."""
    rows, cols = _check_storage_fits(out_storage, inputs[0], max_seq_len, output_dtype)
    dispatch.check_op_out(variant, inputs, out_storage, rows, cols)


def _check_schedule_rows(schedule_meta: torch.Tensor | None, q: torch.Tensor) -> None:
    """The CUDA kernels read one schedule row per SM of q's device, plus one: a smaller
    `schedule_meta` from an AOTInductor package (no export guards) would be read past."""
    if schedule_meta is not None:
        v.check_schedule_meta(schedule_meta, q)


def _check_fp8_call(
    inputs: tuple, out_storage: torch.Tensor, max_seq_len: int, output_dtype: torch.dtype
) -> None:
    """The FP8 ops' own checks: the head geometry fits the kernel's shared memory, and
    `_check_storage`."""
    _, next_n, num_heads, head_dim = inputs[0].shape
    fp8_sm90.check_shared_memory_fit(num_heads, head_dim, next_n)
    _check_storage("fp8", inputs, out_storage, max_seq_len, output_dtype)


@torch.library.custom_op(
    f"{NAMESPACE}::fp8_paged_mqa_logits_into", mutates_args=("out_storage",), device_types="cpu"
)
def fp8_paged_mqa_logits_into(
    q: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    out_storage: torch.Tensor,
    schedule_meta: torch.Tensor | None,
    output_dtype: torch.dtype,
    epi_dtype: torch.dtype,
    acc_dtype: torch.dtype,
) -> None:
    """Write FP8 paged MQA logits into `out_storage` (validated arguments only).

    CPU kernel: the float64 reference rounded to `out_storage.dtype`; `schedule_meta`,
    `epi_dtype` and `acc_dtype` do not change it.
    """
    fp8_inputs = (q, kv_fused, weights, block_tables, seq_lens, schedule_meta)
    _check_fp8_call(fp8_inputs, out_storage, max_seq_len, output_dtype)
    if q.shape[0] == 0:
        return
    by_request = fp8_logits_by_request(q, kv_fused, weights, block_tables, seq_lens, max_seq_len)
    _write_computed_region(out_storage, by_request, q.shape[1])


@fp8_paged_mqa_logits_into.register_kernel("cuda")
def fp8_paged_mqa_logits_into_cuda(
    q: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    out_storage: torch.Tensor,
    schedule_meta: torch.Tensor | None,
    output_dtype: torch.dtype,
    epi_dtype: torch.dtype,
    acc_dtype: torch.dtype,
) -> None:
    fp8_inputs = (q, kv_fused, weights, block_tables, seq_lens, schedule_meta)
    _check_fp8_call(fp8_inputs, out_storage, max_seq_len, output_dtype)
    _check_schedule_rows(schedule_meta, q)
    # Nothing to launch (see dispatch.run, which decides this before the op where a trace
    # knows the sizes): no rows, or an empty pool, which TMA cannot describe.
    if q.shape[0] == 0 or kv_fused.shape[0] == 0:
        return
    launcher.launch_fp8_paged_mqa_logits(
        q,
        kv_fused,
        weights,
        block_tables,
        seq_lens,
        out_storage,
        schedule_meta,
        max_seq_len=max_seq_len,
        output_dtype=output_dtype,
        epi_dtype=epi_dtype,
        acc_dtype=acc_dtype,
    )


@fp8_paged_mqa_logits_into.register_fake
def _fp8_paged_mqa_logits_into_fake(
    q: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    out_storage: torch.Tensor,
    schedule_meta: torch.Tensor | None,
    output_dtype: torch.dtype,
    epi_dtype: torch.dtype,
    acc_dtype: torch.dtype,
) -> None:
    # The op only writes into out_storage, whose metadata does not change.
    return None


@torch.library.custom_op(
    f"{NAMESPACE}::fp4_paged_mqa_logits_into", mutates_args=("out_storage",), device_types="cpu"
)
def fp4_paged_mqa_logits_into(
    q: torch.Tensor,
    q_sf: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    out_storage: torch.Tensor,
    schedule_meta: torch.Tensor | None,
    sf_vec_size: int,
    output_dtype: torch.dtype,
    epi_dtype: torch.dtype,
    is_kv_sf_interleaved: bool,
) -> None:
    """Write MXFP4 paged MQA logits into `out_storage` (validated arguments only).

    CPU kernel: the float64 reference rounded to `out_storage.dtype`; `schedule_meta` and
    `epi_dtype` do not change it.
    """
    fp4_inputs = (q, q_sf, kv_fused, weights, block_tables, seq_lens, schedule_meta)
    _check_storage("fp4", fp4_inputs, out_storage, max_seq_len, output_dtype)
    if q.shape[0] == 0:
        return
    by_request = fp4_logits_by_request(
        q,
        q_sf,
        kv_fused,
        weights,
        block_tables,
        seq_lens,
        max_seq_len,
        is_kv_sf_interleaved=is_kv_sf_interleaved,
    )
    _write_computed_region(out_storage, by_request, q.shape[1])


@fp4_paged_mqa_logits_into.register_kernel("cuda")
def fp4_paged_mqa_logits_into_cuda(
    q: torch.Tensor,
    q_sf: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    out_storage: torch.Tensor,
    schedule_meta: torch.Tensor | None,
    sf_vec_size: int,
    output_dtype: torch.dtype,
    epi_dtype: torch.dtype,
    is_kv_sf_interleaved: bool,
) -> None:
    fp4_inputs = (q, q_sf, kv_fused, weights, block_tables, seq_lens, schedule_meta)
    _check_storage("fp4", fp4_inputs, out_storage, max_seq_len, output_dtype)
    _check_schedule_rows(schedule_meta, q)
    # Nothing to launch (see dispatch.run, which decides this before the op where a trace
    # knows the sizes): no rows, or an empty pool, which TMA cannot describe.
    if q.shape[0] == 0 or kv_fused.shape[0] == 0:
        return
    launcher.launch_fp4_paged_mqa_logits(
        q,
        q_sf,
        kv_fused,
        weights,
        block_tables,
        seq_lens,
        out_storage,
        schedule_meta,
        max_seq_len=max_seq_len,
        sf_vec_size=sf_vec_size,
        output_dtype=output_dtype,
        epi_dtype=epi_dtype,
        is_kv_sf_interleaved=is_kv_sf_interleaved,
    )


@fp4_paged_mqa_logits_into.register_fake
def _fp4_paged_mqa_logits_into_fake(
    q: torch.Tensor,
    q_sf: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    out_storage: torch.Tensor,
    schedule_meta: torch.Tensor | None,
    sf_vec_size: int,
    output_dtype: torch.dtype,
    epi_dtype: torch.dtype,
    is_kv_sf_interleaved: bool,
) -> None:
    # The op only writes into out_storage, whose metadata does not change.
    return None
