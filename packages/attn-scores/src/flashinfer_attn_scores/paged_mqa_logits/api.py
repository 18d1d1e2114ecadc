"""Public paged MQA logits ops: signature, validation, dispatch through the custom ops."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from flashinfer_schedule import padded_seq_len, resolve_device

from .. import _validation as v
from . import custom_ops, fp8_sm90, launcher

__all__ = [
    "PagedMqaLogitsConfig",
    "fp4_paged_mqa_logits",
    "fp8_paged_mqa_logits",
    "precompile_paged_mqa_logits",
]

FP8_OUTPUT_DTYPES = (torch.float32, torch.float16)
FP8_EPI_DTYPES = (torch.float32, torch.float16)
FP8_ACC_DTYPES = (torch.float32, torch.float16)
FP4_OUTPUT_DTYPES = (torch.bfloat16, torch.float32, torch.float16)
FP4_EPI_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_FP8_BF16_REFUSAL = {
    torch.bfloat16: (
        "bfloat16 is deliberately unsupported for the FP8 variant (its epilogue has no "
        "bfloat16 store path and would silently miscompute); use float32 or float16"
    )
}

# fp4 kernel: a single problem shape.
FP4_NUM_HEADS = 64
FP4_HEAD_DIM = 128
FP4_MAX_NEXT_N = 4
FP4_SF_VEC_SIZE = 32
FP4_INTERLEAVED_BLOCK_SIZE = 128
# Bytes of scale data per token in kv_fused: one float32 (fp8) or head_dim/32 UE8M0 (fp4).
KV_SCALE_BYTES = 4


@dataclass(frozen=True)
class _Problem:
    """Sizes of one validated call."""

    batch_size: int
    next_n: int
    num_heads: int
    head_dim: int
    num_blocks: int
    block_size: int
    max_seq_len: int

    @property
    def rows(self) -> int:
        return self.batch_size * self.next_n

    @property
    def padded_cols(self) -> int:
        return padded_seq_len(self.max_seq_len)


def _check_common(
    *,
    variant: str,
    q: torch.Tensor,
    head_dim: int,
    kv_fused: object,
    weights: object,
    block_tables: object,
    seq_lens: object,
    max_seq_len: object,
    extra_tensors: dict[str, object],
) -> _Problem:
    """Checks shared by both variants once q's dtype/rank are known."""
    kv_fused = v.check_tensor("kv_fused", kv_fused)
    weights = v.check_tensor("weights", weights)
    block_tables = v.check_tensor("block_tables", block_tables)
    seq_lens = v.check_tensor("seq_lens", seq_lens)
    batch_size, next_n, num_heads = q.shape[:3]

    v.check_dtype("weights", weights, torch.float32)
    v.check_ndim("weights", weights, 2, "[batch_size*next_n, num_heads]")
    v.check_dim("weights", weights, 0, batch_size * next_n, "batch_size*next_n")
    v.check_dim("weights", weights, 1, num_heads, "num_heads (q.shape[2])")
    v.check_block_tables(block_tables, batch_size)
    v.check_seq_lens(seq_lens, batch_size)

    v.check_dtype("kv_fused", kv_fused, torch.uint8)
    row_meaning = "head_dim + 4" if variant == "fp8" else "head_dim/2 + 4"
    v.check_ndim("kv_fused", kv_fused, 4, f"[num_blocks, block_size, 1, {row_meaning}]")
    v.check_dim("kv_fused", kv_fused, 2, 1, "1 (a single KV head)")
    value_bytes = head_dim if variant == "fp8" else head_dim // 2
    v.check_dim(
        "kv_fused",
        kv_fused,
        3,
        value_bytes + KV_SCALE_BYTES,
        f"{row_meaning} (head_dim={head_dim})",
    )
    block_size = v.check_block_size(kv_fused)
    v.check_kv_fused_blocks_contiguous(kv_fused)
    v.check_kv_fused_block_stride(kv_fused)

    v.check_head_geometry(num_heads, head_dim, next_n)
    if variant == "fp8":
        _check_fp8_shared_memory_fit(num_heads, head_dim, next_n)

    v.check_supported_device_type("q", q)
    v.check_same_device(
        "q",
        q,
        kv_fused=kv_fused,
        weights=weights,
        block_tables=block_tables,
        seq_lens=seq_lens,
        **extra_tensors,
    )
    v.check_int("max_seq_len", max_seq_len, minimum=0)
    return _Problem(
        batch_size=batch_size,
        next_n=next_n,
        num_heads=num_heads,
        head_dim=head_dim,
        num_blocks=kv_fused.shape[0],
        block_size=block_size,
        max_seq_len=max_seq_len,
    )


def _check_fp8_shared_memory_fit(num_heads: int, head_dim: int, next_n: int) -> None:
    """The spec's last head-geometry restriction: q's two slots plus at least two KV stages
    must fit one SM90 CTA's shared memory.

    Not while torch.compile traces: with dynamic shapes (`dynamic=True`) these sizes can be
    symbols, which the shared-memory sizing cannot take, and dynamo cannot trace it anyway.
    The custom op then runs the check itself, on the real sizes, whenever the compiled code
    runs (`custom_ops.fp8_paged_mqa_logits_into`), so the error still comes on the first call.
    """
    if not torch.compiler.is_compiling():
        fp8_sm90.check_shared_memory_fit(num_heads, head_dim, next_n)


def _check_call_outputs(
    problem: _Problem,
    q: torch.Tensor,
    output_dtype: torch.dtype,
    schedule_meta: object,
    out: object,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if schedule_meta is not None:
        schedule_meta = v.check_schedule_meta(schedule_meta, q)
    if out is not None:
        out = v.check_out(
            out,
            rows=problem.rows,
            padded_cols=problem.padded_cols,
            output_dtype=output_dtype,
            q=q,
        )
    v.check_output_span(problem.rows, problem.padded_cols, out)
    return schedule_meta, out


@torch.compiler.assume_constant_result
def _cuda_arch_error(op: str, device: torch.device) -> str:
    """`check_cuda_arch`'s message for `device`, or "" for an SM90 GPU.

    Marked as a constant result so that torch.compile runs it once while tracing (dynamo
    cannot trace the capability query) and keeps the answer, which never changes for a
    device; tensor guards already pin the device.
    """
    try:
        v.check_cuda_arch(op, device)
    except RuntimeError as err:
        return str(err)
    return ""


def _device_data_checks_wanted() -> bool:
    """Whether to run the opt-in `FLASHINFER_VALIDATE_INPUTS` checks on this call.

    Never while torch.compile traces the op (they copy device data to the host and branch
    on it, which would break the graph) nor during CUDA-graph capture.
    """
    if torch.compiler.is_compiling():
        return False
    return v.validate_inputs_enabled() and not v.graph_capture_active()


# Argument signatures (dtype, device, shape and strides of every tensor plus the scalar
# arguments) that passed validation, with their problem sizes. Every check in
# `validate` reads only that metadata (data-dependent checks are the opt-in validate mode,
# run per call in `_run`), so a call with a known signature skips the Python checks, which
# cost more host time than the launches themselves.
_VALIDATED: dict[tuple, _Problem] = {}
# _NEGATED_VIEWS: a negated view (`is_neg()`) has the metadata of a plain tensor, so the
# signature does not tell them apart; `v.check_tensor` refuses one. The public functions also
# test weights and out on every call, the float tensors a negated view can come from in
# public PyTorch (the `.imag` of a `conj()` view); the others would need `torch._neg_view`.
_VALIDATED_LIMIT = 1024
_SCALAR_TYPES = frozenset({bool, int, float, str, torch.dtype, type(None)})


def _signature(
    variant: str, tensors: tuple, scalars: tuple, optional_tensors: tuple
) -> tuple | None:
    """The memo key of a call: the variant, (dtype, device, shape, strides) of every tensor,
    (type, value) of every scalar argument (so True and 1 differ), None for an absent optional
    tensor. None under torch.compile (dynamo guards the metadata itself) or when an argument
    has an unexpected type (the checks will name it). Written out per argument kind, not with
    isinstance per argument: this runs on every eager call (~4 us instead of ~6 us on a
    desktop CPU)."""
    if torch.compiler.is_compiling():
        return None
    parts: list = [variant]
    try:
        for t in tensors:
            parts.append((t.dtype, t.device, t.shape, t.stride()))
        for t in optional_tensors:
            parts.append(None if t is None else (t.dtype, t.device, t.shape, t.stride()))
    except (AttributeError, TypeError, RuntimeError, NotImplementedError):
        return None  # not a tensor, or a layout without strides: the checks will name it
    for value in scalars:
        kind = type(value)
        if kind not in _SCALAR_TYPES:
            return None
        parts.append((kind, value))
    return tuple(parts)


def _memoizable(key: tuple | None) -> bool:
    """Whether a validated signature may be remembered. Not when a tensor's strides are all 0
    (an `expand()`ed tensor): a sparse COO tensor of the same dtype, device and shape reports
    the same strides, and must still meet the dense-layout check."""
    if key is None:
        return False
    for part in key:
        if type(part) is tuple and len(part) == 4 and part[3] and not any(part[3]):
            return False
    return True


def _validated(validate: Callable[[], _Problem], key: tuple | None) -> _Problem:
    """`validate()`'s problem sizes, memoised by the arguments' signature `key`."""
    problem = _VALIDATED.get(key) if key is not None else None
    if problem is None:
        problem = validate()
        if _memoizable(key):
            if len(_VALIDATED) >= _VALIDATED_LIMIT:
                _VALIDATED.clear()
            _VALIDATED[key] = problem
    return problem


class _EagerCall:
    """The whole eager CUDA call of one validated argument signature.

    It holds what the signature fixes (output geometry, the prepared kernel launch of
    `launcher.prepare_*`), so a repeated call is: output storage, one launch, one view. The
    public functions look it up before anything else; only the opt-in validate mode, read on
    every call, sends a known signature back through `_run`. Through `torch.library` the
    same call would cost about 100 us more on the H200 (2026-11-29, cProfile:
    `torch._library.custom_ops.backend_impl`) and buy nothing outside a torch.compile trace.
    """

    __slots__ = ("_device", "_dtype", "_run", "_storage_shape", "_view_shape", "_view_stride")

    def __init__(
        self,
        run: Callable[..., None],
        problem: _Problem,
        storage: torch.Tensor,
        allocates: bool,
    ) -> None:
        self._run = run
        self._view_shape = (problem.rows, problem.max_seq_len)
        # The row stride is part of the signature (out's, or the fresh storage's padded width).
        self._view_stride = (storage.stride(0), 1)
        self._storage_shape = (problem.rows, problem.padded_cols) if allocates else None
        self._dtype, self._device = storage.dtype, storage.device

    def __call__(
        self, tensors: tuple, schedule_meta: torch.Tensor | None, out: torch.Tensor | None
    ) -> torch.Tensor:
        storage = out
        if storage is None:
            storage = torch.empty(self._storage_shape, dtype=self._dtype, device=self._device)
        self._run(*tensors, storage, schedule_meta)
        # The same view as storage[:rows, :max_seq_len] (offset kept), in one call.
        return storage.as_strided(self._view_shape, self._view_stride)


_EAGER_CALLS: dict[tuple, _EagerCall] = {}


def _eager_call(key: tuple | None) -> _EagerCall | None:
    """The remembered eager call for `key`, unless validate mode wants the data checks."""
    eager = _EAGER_CALLS.get(key) if key is not None else None
    if eager is None or v.validate_inputs_enabled():
        return None
    return eager


def _run(
    op: str,
    variant: str,
    problem: _Problem,
    key: tuple | None,
    *,
    tensors: tuple,
    schedule_meta: torch.Tensor | None,
    out: torch.Tensor | None,
    output_dtype: torch.dtype,
    prepare: Callable[[torch.Tensor], Callable[..., None]],
    compute: Callable[[torch.Tensor], None],
) -> torch.Tensor:
    """Opt-in device-data checks, output allocation, then the kernel: eager CUDA calls launch
    `prepare(storage)` directly and remember it under `key`; CPU calls and torch.compile
    traces go through the custom op (`compute(storage)`).

    `tensors` are the op's input tensors in launch order: q first, then block_tables and
    seq_lens as the last two.
    """
    q, block_tables, seq_lens = tensors[0], tensors[-2], tensors[-1]
    if _device_data_checks_wanted():
        v.check_device_data(
            seq_lens=seq_lens,
            block_tables=block_tables,
            num_blocks=problem.num_blocks,
            block_size=problem.block_size,
            max_seq_len=problem.max_seq_len,
            schedule_meta=schedule_meta,
            next_n=problem.next_n,
            variant=variant,
        )
    if q.device.type == "cuda":
        arch_error = _cuda_arch_error(op, q.device)
        if arch_error:
            raise RuntimeError(arch_error)
    storage = out
    if storage is None:
        storage = torch.empty(
            problem.rows, problem.padded_cols, dtype=output_dtype, device=q.device
        )
    logits = storage[: problem.rows, : problem.max_seq_len]
    # Nothing to launch. An empty pool leaves a valid call only zero-length requests, whose
    # rows are never written (and TMA cannot describe a pool of no blocks). On CPU the
    # reference still runs, so a length that would read a block is refused as elsewhere.
    if problem.rows == 0 or (problem.num_blocks == 0 and q.is_cuda):
        return logits
    if q.is_cuda and not torch.compiler.is_compiling():
        run = prepare(storage)
        run(*tensors, storage, schedule_meta)
        if _memoizable(key):
            if len(_EAGER_CALLS) >= _VALIDATED_LIMIT:
                _EAGER_CALLS.clear()
            _EAGER_CALLS[key] = _EagerCall(run, problem, storage, allocates=out is None)
    else:
        compute(storage)
    return logits


def fp8_paged_mqa_logits(
    q: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    *,
    output_dtype: torch.dtype = torch.float32,
    epi_dtype: torch.dtype = torch.float32,
    acc_dtype: torch.dtype = torch.float32,
    schedule_meta: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 paged MQA logits (the DeepSeek-V3.2 lightning indexer) for NVIDIA Hopper (SM90).

    Scores every KV position of a paged FP8 cache against each request's draft queries:

        logits[b*next_n + t, p] = scale[p] * sum_h weights[b*next_n + t, h]
                                           * relu(q[b, t, h, :] . k[p, :])

    The per-head dot product accumulates over `head_dim` on the tensor cores in `acc_dtype`;
    the ReLU, the weight multiply and the head sum run in `epi_dtype`, the head sum is
    multiplied by the token's scale in float32, and the result is rounded to `output_dtype`
    when stored. The ReLU acts on
    each head separately, before the weighted sum, so negative weights can make a logit
    negative. `next_n = q.shape[1]` is the number of query positions per request (the
    speculative/MTP draft depth, 1 for plain decode); slot `t = 0` is the oldest draft
    position and `t = next_n - 1` the newest, and `seq_lens[b]` is the KV length the newest
    slot sees.

    CPU tensors run the float64 reference (`fp8_paged_mqa_logits_reference`) through the
    same validation, then round to `output_dtype`; `epi_dtype`/`acc_dtype` are checked but do
    not change the CPU result. CUDA tensors run the SM90 kernel. Either runs inside the
    custom op `torch.ops.flashinfer_attn_scores.fp8_paged_mqa_logits_into` (which writes into
    the padded storage), so `torch.compile(fullgraph=True)` traces through this function.

    Example (an excerpt of the spec's example, renamed; `device="cpu"` runs the reference;
    `values`, `scales`, `q` and `weights` as in the [quickstart](../quickstart.md), which
    runs whole):

        B, next_n, num_heads, head_dim = 2, 3, 64, 128
        block_size, max_seq_len = 32, 8000
        seq_lens = torch.tensor([3000, 8000], dtype=torch.int32, device=device)
        width = flashinfer_attn_scores.min_block_table_width(max_seq_len, block_size)  # 250
        block_tables = torch.arange(B * width, dtype=torch.int32, device=device).view(B, width)
        kv_fused = flashinfer_layouts.pack_fp8_kv_cache(values, scales)  # or the torch.cat recipe
        out = torch.empty(B * next_n, flashinfer_attn_scores.padded_seq_len(max_seq_len),
                          dtype=torch.float32, device=device)
        logits = flashinfer_attn_scores.fp8_paged_mqa_logits(
            q, kv_fused, weights, block_tables, seq_lens, max_seq_len, out=out)  # [6, 8000]

    Args:
        q: `[batch_size, next_n, num_heads, head_dim]` float8_e4m3fn queries.
        kv_fused: `[num_blocks, block_size, 1, head_dim + 4]` uint8 paged KV pool. The shape
            only fixes sizes: each block's `block_size * (head_dim + 4)` bytes are two
            contiguous regions, not per-token rows. Bytes `[0, block_size*head_dim)` hold the
            FP8 values token-major (token `i` at `i*head_dim`); bytes
            `[block_size*head_dim, end)` hold one little-endian float32 scale per token (token
            `i`'s at `block_size*head_dim + 4*i`). For `block_size=32, head_dim=128`: values in
            `[0, 4096)`, scales in `[4096, 4224)`. Build it with
            `flashinfer_layouts.pack_fp8_kv_cache`. Each block must be contiguous in memory;
            the pitch between blocks (`stride(0)`) is free as long as blocks do not overlap
            and it is a multiple of 16 bytes (one layer of a layer-interleaved cache is
            fine). On CUDA the pool must start at a 16-byte aligned address.
        weights: `[batch_size*next_n, num_heads]` float32 per-head mixing weights; row
            `b*next_n + t` pairs with `q[b, t]` (a `[B, next_n, H]` tensor passes as
            `w.view(B * next_n, H)`). Cast internally when `epi_dtype` is float16.
        block_tables: `[batch_size, max_blocks_per_seq]` int32 physical block ids into
            `kv_fused`'s dim 0, on q's device. Entries of a row must be contiguous
            (`stride(1) == 1`); the row stride is free, so `block_tables[::next_n]` works
            without a copy. The width must be at least
            `min_block_table_width(max(seq_lens), block_size)`; row `b` is read only for its
            first `ceil(seq_lens[b] / block_size)` entries, the rest may hold anything. A
            narrower table is an out-of-bounds device read (undefined behaviour), not a
            checked error.
        seq_lens: `[batch_size]` int32 KV length per request, on q's device, any stride (so
            `seq_lens[::next_n]` works without a copy). No entry may exceed `max_seq_len`
            (DeepGEMM calls this `context_lens`).
        max_seq_len: int, the logits' column count, `>= max(seq_lens)`. A smaller value is an
            out-of-bounds device write (undefined behaviour), not a checked error. On CUDA,
            both this and the table width are checked, on the host, only when the environment
            variable `FLASHINFER_VALIDATE_INPUTS=1` is set (read on each call; CPU tensors,
            which run the reference, are always checked); the check is a
            development aid and is skipped during CUDA-graph capture and in code traced by
            `torch.compile` (it copies device data to the host, which would break the
            graph), so validate in eager mode.
        output_dtype: float32 (default) or float16. bfloat16 is refused on purpose: the FP8
            epilogue has no bfloat16 store path. `fp4_paged_mqa_logits` defaults to bfloat16,
            so pass `output_dtype` explicitly in code that calls both.
        epi_dtype: Epilogue dtype, float32 (default) or float16. float16 halves epilogue
            traffic but saturates above 65504 in magnitude, so long sequences can overflow to
            inf where float32 would not. On SM90 it is 4-6 % faster at next_n 2-4 (the same
            at next_n 1); the docs' performance page has the figures.
        acc_dtype: Tensor-core accumulator dtype, float32 (default) or float16. With a float16
            epilogue as well, 5-16 % faster than the defaults at next_n 2-4 on SM90, at the
            cost of the accumulator's rounding (see the docs' numerics page).
        schedule_meta: Optional `[num_sms + 1, 2]` int32 contiguous CTA schedule on q's device,
            from `compute_paged_mqa_logits_schedule(seq_lens, device=q.device, next_n=next_n,
            variant="fp8")`. Leave it None (recommended): the logits kernel then derives the
            same schedule from `seq_lens` itself on every call (no extra launch), which is
            also what CUDA-graph capture needs. A supplied schedule is
            valid only while the contents of `seq_lens` and the device's SM count are
            unchanged (a fixed batch size is not enough); recompute it into the same buffer
            whenever they change. A stale schedule can hang the kernel;
            `FLASHINFER_VALIDATE_INPUTS=1` compares it with a fresh one.
        out: Optional output storage, PyTorch `out=` style: on q's device, dtype
            `output_dtype`, 2-D with at least `batch_size*next_n` rows and
            `padded_seq_len(max_seq_len)` columns (the kernel writes the padding columns too),
            rows contiguous (`stride(1) == 1`) and not overlapping
            (`stride(0) >= padded_seq_len(max_seq_len)`; a row slice of a wider buffer is
            fine, an `expand()`ed or `as_strided()` overlapping buffer is not). Only the first
            `batch_size*next_n` rows are written. Required for CUDA-graph capture; one
            address-stable max-batch buffer can serve every capture.

    Returns:
        `[batch_size*next_n, max_seq_len]` tensor of `output_dtype`, always a view of the
        padded storage (`out` when given, else a fresh allocation). Row `b*next_n + t` is
        meaningful for positions `0 .. seq_lens[b] - next_n + t` inclusive (the newest slot
        sees the whole sequence, each earlier one one position fewer). Later columns and the
        padding are unspecified: mask them (see `reference.valid_mask`) before e.g. a top-k.
        Rows of a request with `seq_lens[b] == 0` are never written. `batch_size == 0` gives
        an empty `[0, max_seq_len]` view.

    Raises:
        TypeError: An argument has the wrong Python type or a tensor the wrong dtype
            (q float8_e4m3fn; kv_fused uint8; weights float32; block_tables, seq_lens,
            schedule_meta int32; out output_dtype), or a dtype argument is not a
            `torch.dtype`.
        ValueError: A rank, shape, device, stride or value violates the contract:
            inconsistent batch_size/next_n/num_heads/head_dim between the tensors,
            `kv_fused.shape[2] != 1` or `kv_fused.shape[3] != head_dim + 4`, `head_dim` not a
            multiple of 32, `num_heads` not a multiple of 4, `next_n*num_heads` not a multiple
            of 8 in [8, 256], block size not 32/64/128, tensors on different devices, an
            unsupported `output_dtype`/`epi_dtype`/`acc_dtype`, `max_seq_len < 0`, a
            `schedule_meta` or `out` of the wrong shape or layout, an output span of 2^31
            elements or more, or (with `FLASHINFER_VALIDATE_INPUTS=1`) a violated device-data
            precondition or stale schedule.
        RuntimeError: The tensors are on a GPU other than SM90 (compute capability 9.0), or
            on a device type other than CUDA/CPU.

    Note:
        CUDA graphs: pass an address-stable `out` sized with `padded_seq_len()`, keep every
        input at a static address, and leave `schedule_meta=None`; the kernel then derives
        the schedule from the current `seq_lens` on every replay. With a caller-managed schedule, recompute it into the same buffer before each
        replay whose `seq_lens` contents changed.

        The kernel is launched with programmatic dependent launch (PDL): its launch and
        prologue may overlap the kernel before it in the stream, and it waits for that kernel
        to complete before it reads any input or writes `out`. `FLASHINFER_PDL=0` (read when
        an argument signature is first seen) launches it without.

    Restrictions of the current kernel (a future kernel may relax them without changing the
    signature): `head_dim % 32 == 0`, `num_heads % 4 == 0`, `next_n * num_heads` a multiple
    of 8 in [8, 256], block size 32, 64 or 128, and `batch_size*next_n *
    padded_seq_len(max_seq_len) < 2**31` (with `out`, also `batch_size*next_n *
    out.stride(0) < 2**31`) because the output is indexed with 32-bit offsets. `head_dim`,
    `num_heads` and `next_n` must fit an SM90 CTA's shared memory (two q slots and at least
    two KV stages); the largest `head_dim` that fits, by `next_n * num_heads`: 8: 1600,
    16: 1440, 32: 1184, 64: 896, 128: 576, 192: 416, 256: 352.
    """
    op = "fp8_paged_mqa_logits"
    tensors = (q, kv_fused, weights, block_tables, seq_lens)
    key = _signature(
        "fp8", tensors, (max_seq_len, output_dtype, epi_dtype, acc_dtype), (schedule_meta, out)
    )
    if key is not None and (weights.is_neg() or (out is not None and out.is_neg())):
        key = None  # validate, which refuses it (see _NEGATED_VIEWS)
    eager = _eager_call(key)
    if eager is not None:
        return eager(tensors, schedule_meta, out)

    def validate() -> _Problem:
        v.check_tensor("q", q)
        v.check_dtype("q", q, torch.float8_e4m3fn)
        v.check_ndim("q", q, 4, "[batch_size, next_n, num_heads, head_dim]")
        problem = _check_common(
            variant="fp8",
            q=q,
            head_dim=q.shape[3],
            kv_fused=kv_fused,
            weights=weights,
            block_tables=block_tables,
            seq_lens=seq_lens,
            max_seq_len=max_seq_len,
            extra_tensors={},
        )
        v.check_dtype_choice("output_dtype", output_dtype, FP8_OUTPUT_DTYPES, _FP8_BF16_REFUSAL)
        v.check_dtype_choice("epi_dtype", epi_dtype, FP8_EPI_DTYPES)
        v.check_dtype_choice("acc_dtype", acc_dtype, FP8_ACC_DTYPES)
        _check_call_outputs(problem, q, output_dtype, schedule_meta, out)
        return problem

    def prepare(storage: torch.Tensor) -> Callable[..., None]:
        return launcher.prepare_fp8_paged_mqa_logits(
            *tensors,
            storage,
            schedule_meta,
            output_dtype=output_dtype,
            epi_dtype=epi_dtype,
            acc_dtype=acc_dtype,
            # Validated on q's device, and every tensor's device is in the signature key.
            devices_checked=True,
        )

    def compute(storage: torch.Tensor) -> None:
        custom_ops.fp8_paged_mqa_logits_into(
            *tensors,
            max_seq_len,
            storage,
            schedule_meta,
            output_dtype,
            epi_dtype,
            acc_dtype,
        )

    return _run(
        op,
        "fp8",
        _validated(validate, key),
        key,
        tensors=tensors,
        schedule_meta=schedule_meta,
        out=out,
        output_dtype=output_dtype,
        prepare=prepare,
        compute=compute,
    )


def fp4_paged_mqa_logits(
    q: torch.Tensor,
    q_sf: torch.Tensor,
    kv_fused: torch.Tensor,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    *,
    sf_vec_size: int = 32,
    output_dtype: torch.dtype = torch.bfloat16,
    epi_dtype: torch.dtype = torch.float32,
    is_kv_sf_interleaved: bool = False,
    schedule_meta: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP4 (MXFP4) paged MQA logits (the DeepSeek-V3.2 lightning indexer) for NVIDIA Hopper.

    Scores every KV position of a paged MXFP4 cache against each request's draft queries:

        logits[b*next_n + t, p] = sum_h weights[b*next_n + t, h] * relu(q[b, t, h, :] . k[p, :])

    `q` and `k` are E2M1 values multiplied by their UE8M0 group scales (one per 32 elements).
    Those scales are folded into the dequantised operands, so unlike the FP8 variant there is
    no per-token factor: a scale that varies along the dot product cannot be pulled out of it.
    The dot product accumulates in float32 (fixed: no `acc_dtype`); the ReLU, the weight
    multiply and the head sum run in `epi_dtype`, and the result is rounded to `output_dtype`
    when stored. The ReLU acts on each head before the weighted sum, so negative weights can
    make a logit negative. `next_n = q.shape[1]` (1..4) is the number of query positions per
    request; slot `t = next_n - 1` is the newest and sees all `seq_lens[b]` positions. On SM90
    every `next_n` is one pass over the KV.

    CPU tensors run the float64 reference (`fp4_paged_mqa_logits_reference`) through the
    same validation, then round to `output_dtype`; `epi_dtype` is checked but does not change
    the CPU result. CUDA tensors run the SM90 kernel. Either runs inside the custom op
    `torch.ops.flashinfer_attn_scores.fp4_paged_mqa_logits_into`, so
    `torch.compile(fullgraph=True)` traces through this function.

    Example (an excerpt of the spec's example, renamed, with the paging of the fp8 example;
    zero-filled tensors are valid placeholders for a shape check, real callers quantise with
    `flashinfer_layouts.quantize_mxfp4_q` and `flashinfer_layouts.quantize_mxfp4_kv_cache`;
    the [quickstart](../quickstart.md) runs whole):

        q = torch.zeros(B, next_n, 64, 64, dtype=torch.uint8, device=device)
        q_sf = torch.zeros(B, next_n, 64, dtype=torch.int32, device=device)
        kv_fused = torch.zeros(num_blocks, 32, 1, 68, dtype=torch.uint8, device=device)
        logits = flashinfer_attn_scores.fp4_paged_mqa_logits(
            q, q_sf, kv_fused, weights, block_tables, seq_lens, max_seq_len)
        # [B*next_n, max_seq_len] bfloat16

    Args:
        q: `[batch_size, next_n, num_heads, head_dim/2]` uint8, two E2M1 values per byte:
            byte `j` of a head's row holds element `2j` in the low nibble (bits 0-3) and
            element `2j + 1` in the high nibble (bits 4-7).
        q_sf: `[batch_size, next_n, num_heads]` int32 packed UE8M0 scales, one int32 per
            (token, head) holding `head_dim / sf_vec_size = 4` scale bytes: byte `k` (the k-th
            least significant, little-endian) is the biased exponent scaling elements
            `[k*32, (k+1)*32)`. Equivalently a `[B, next_n, H, 4]` uint8 tensor viewed as int32.
        kv_fused: `[num_blocks, block_size, 1, head_dim/2 + 4]` uint8 paged KV pool. Each
            block's bytes are two contiguous regions, not per-token rows: bytes
            `[0, block_size*head_dim/2)` hold the packed values token-major (token `i` at
            `i*head_dim/2`, same nibble rule as `q`); the remaining `4*block_size` bytes hold
            4 UE8M0 scale bytes per token, byte `k` of a token scaling its elements
            `[32k, 32k+32)`, in token order (or the interleaved order, see
            `is_kv_sf_interleaved`). For `block_size=32, head_dim=128`: values in `[0, 2048)`,
            scales in `[2048, 2176)`. Build it with
            `flashinfer_layouts.quantize_mxfp4_kv_cache`. Each block must be contiguous in
            memory; the pitch between blocks (`stride(0)`) is free as long as blocks do not
            overlap and it is a multiple of 16 bytes. On CUDA the pool must start at a
            16-byte aligned address.
        weights: `[batch_size*next_n, num_heads]` float32 per-head mixing weights; row
            `b*next_n + t` pairs with `q[b, t]`. Cast internally when `epi_dtype` is float16
            or bfloat16.
        block_tables: `[batch_size, max_blocks_per_seq]` int32 physical block ids into
            `kv_fused`'s dim 0, on q's device, `stride(1) == 1` with a free row stride
            (`block_tables[::next_n]` works without a copy). The width must be at least
            `min_block_table_width(max(seq_lens), block_size)`; row `b` is read only for its
            first `ceil(seq_lens[b] / block_size)` entries. A narrower table is an
            out-of-bounds device read (undefined behaviour), not a checked error.
        seq_lens: `[batch_size]` int32 KV length per request, on q's device, any stride. No
            entry may exceed `max_seq_len`.
        max_seq_len: int, the logits' column count, `>= max(seq_lens)`; a smaller value is an
            out-of-bounds device write. Set `FLASHINFER_VALIDATE_INPUTS=1` (read on each call,
            skipped during CUDA-graph capture and in code traced by `torch.compile`) to have
            these preconditions checked on CUDA; CPU tensors, which run the reference, are
            always checked.
        sf_vec_size: FP4 values per UE8M0 scale; must be 32. Fixes the packing of both `q_sf`
            and the cache's scale bytes.
        output_dtype: bfloat16 (default), float32 or float16. The FP8 variant defaults to
            float32, so pass it explicitly in code that calls both.
        epi_dtype: Epilogue dtype, float32 (default), float16 or bfloat16. float16 saturates
            above 65504 in magnitude, so long sequences can overflow to inf. On SM90 the
            float32 default is also the fastest (the 16-bit epilogues first bring each head
            score to its true scale in float32).
        is_kv_sf_interleaved: False (default) when each block's scales are in token order.
            True when they are split into 4 equal runs interleaved round-robin, so slot `k`
            holds the scales of token `(k % 4) * (block_size // 4) + k // 4`; only allowed
            with block size 128. It describes how the cache was written.
        schedule_meta: Optional `[num_sms + 1, 2]` int32 contiguous CTA schedule on q's device,
            from `compute_paged_mqa_logits_schedule(seq_lens, device=q.device,
            next_n=next_n, variant="fp4")` with this call's `next_n`. Leave it None
            (recommended, and what CUDA-graph capture needs). Reusable only while the
            contents of `seq_lens` and the SM count are unchanged; a stale or mismatched
            schedule passes the shape checks but can hang the kernel
            (`FLASHINFER_VALIDATE_INPUTS=1` detects it).
        out: Optional output storage with the same rules as for `fp8_paged_mqa_logits`: on q's
            device, dtype `output_dtype`, 2-D, at least `batch_size*next_n` rows and
            `padded_seq_len(max_seq_len)` columns, `stride(1) == 1`,
            `stride(0) >= padded_seq_len(max_seq_len)`. Only the first `batch_size*next_n`
            rows are written. Required for CUDA-graph capture.

    Returns:
        `[batch_size*next_n, max_seq_len]` tensor of `output_dtype`, a view of the padded
        storage (`out` when given). Row `b*next_n + t` is meaningful for positions
        `0 .. seq_lens[b] - next_n + t` inclusive; later columns and the padding are
        unspecified. Rows of a request with `seq_lens[b] == 0` are never written.
        `batch_size == 0` gives an empty `[0, max_seq_len]` view.

    Raises:
        TypeError: An argument has the wrong Python type or a tensor the wrong dtype (q and
            kv_fused uint8; q_sf, block_tables, seq_lens, schedule_meta int32; weights
            float32; out output_dtype), or a dtype argument is not a `torch.dtype`.
        ValueError: A rank, shape, device, stride or value violates the contract:
            inconsistent sizes between the tensors, `num_heads != 64`, `head_dim != 128`,
            `next_n` outside 1..4, `sf_vec_size != 32`, `kv_fused.shape[3] != head_dim/2 + 4`,
            block size not 32/64/128, `is_kv_sf_interleaved=True` with a block size other than
            128, an unsupported `output_dtype`/`epi_dtype`, `max_seq_len < 0`, a bad
            `schedule_meta` or `out`, an output span of 2^31 elements or more, or (with
            `FLASHINFER_VALIDATE_INPUTS=1`) a violated device-data precondition or stale
            schedule.
        RuntimeError: The tensors are on a GPU other than SM90 (compute capability 9.0), or
            on a device type other than CUDA/CPU.

    Note:
        CUDA graphs: pass an address-stable `out` sized with `padded_seq_len()`, keep `q`,
        `q_sf`, `kv_fused`, `weights`, `seq_lens` and `block_tables` at static addresses and
        leave `schedule_meta=None`; the kernel then derives the schedule from the current
        `seq_lens` on every replay.

        Launched with programmatic dependent launch like `fp8_paged_mqa_logits`
        (`FLASHINFER_PDL=0` turns it off).

    Restrictions of the current kernel: `num_heads == 64`, `head_dim == 128`, `next_n` in
    1..4, `sf_vec_size == 32`, block size 32, 64 or 128, interleaved scales only at block size
    128, and `batch_size*next_n * padded_seq_len(max_seq_len) < 2**31` (with `out`, also
    `batch_size*next_n * out.stride(0) < 2**31`).
    """
    op = "fp4_paged_mqa_logits"
    if isinstance(q_sf, torch.Tensor) and q_sf.dim() == 4 and q_sf.shape[3] == 1:
        # The spec's recipe, a [B, next_n, H, 4] uint8 tensor .view(torch.int32), has this shape.
        q_sf = q_sf.squeeze(3)
    tensors = (q, q_sf, kv_fused, weights, block_tables, seq_lens)
    key = _signature(
        "fp4",
        tensors,
        (max_seq_len, sf_vec_size, output_dtype, epi_dtype, is_kv_sf_interleaved),
        (schedule_meta, out),
    )
    if key is not None and (weights.is_neg() or (out is not None and out.is_neg())):
        key = None  # validate, which refuses it (see _NEGATED_VIEWS)
    eager = _eager_call(key)
    if eager is not None:
        return eager(tensors, schedule_meta, out)

    def validate() -> _Problem:
        v.check_tensor("q", q)
        v.check_tensor("q_sf", q_sf)
        v.check_dtype("q", q, torch.uint8)
        v.check_ndim("q", q, 4, "[batch_size, next_n, num_heads, head_dim/2] (two FP4 per byte)")
        batch_size, next_n, num_heads, half_dim = q.shape
        head_dim = 2 * half_dim
        v.check_dtype("q_sf", q_sf, torch.int32)
        v.check_ndim("q_sf", q_sf, 3, "[batch_size, next_n, num_heads] (or [..., 1])")
        v.check_dim("q_sf", q_sf, 0, batch_size, "batch_size (q.shape[0])")
        v.check_dim("q_sf", q_sf, 1, next_n, "next_n (q.shape[1])")
        v.check_dim("q_sf", q_sf, 2, num_heads, "num_heads (q.shape[2])")
        if num_heads != FP4_NUM_HEADS:
            raise ValueError(
                f"num_heads (q.shape[2]) must be {FP4_NUM_HEADS} for the FP4 kernel, got {num_heads}"
            )
        if head_dim != FP4_HEAD_DIM:
            raise ValueError(
                f"head_dim (2 * q.shape[3]) must be {FP4_HEAD_DIM} for the FP4 kernel, got "
                f"{head_dim} (q shape {list(q.shape)})"
            )
        if not 1 <= next_n <= FP4_MAX_NEXT_N:
            raise ValueError(
                f"next_n (q.shape[1]) must be in 1..{FP4_MAX_NEXT_N} for the FP4 kernel, got {next_n}"
            )
        v.check_int("sf_vec_size", sf_vec_size)
        if sf_vec_size != FP4_SF_VEC_SIZE:
            raise ValueError(f"sf_vec_size must be {FP4_SF_VEC_SIZE}, got {sf_vec_size}")
        problem = _check_common(
            variant="fp4",
            q=q,
            head_dim=head_dim,
            kv_fused=kv_fused,
            weights=weights,
            block_tables=block_tables,
            seq_lens=seq_lens,
            max_seq_len=max_seq_len,
            extra_tensors={"q_sf": q_sf},
        )
        v.check_bool("is_kv_sf_interleaved", is_kv_sf_interleaved)
        if is_kv_sf_interleaved and problem.block_size != FP4_INTERLEAVED_BLOCK_SIZE:
            raise ValueError(
                f"is_kv_sf_interleaved=True requires block_size {FP4_INTERLEAVED_BLOCK_SIZE}, "
                f"got block_size {problem.block_size} (kv_fused.shape[1])"
            )
        v.check_dtype_choice("output_dtype", output_dtype, FP4_OUTPUT_DTYPES)
        v.check_dtype_choice("epi_dtype", epi_dtype, FP4_EPI_DTYPES)
        _check_call_outputs(problem, q, output_dtype, schedule_meta, out)
        return problem

    def prepare(storage: torch.Tensor) -> Callable[..., None]:
        return launcher.prepare_fp4_paged_mqa_logits(
            *tensors,
            storage,
            schedule_meta,
            output_dtype=output_dtype,
            epi_dtype=epi_dtype,
            is_kv_sf_interleaved=is_kv_sf_interleaved,
            sf_vec_size=sf_vec_size,
            # Validated on q's device, and every tensor's device is in the signature key.
            devices_checked=True,
        )

    def compute(storage: torch.Tensor) -> None:
        custom_ops.fp4_paged_mqa_logits_into(
            *tensors,
            max_seq_len,
            storage,
            schedule_meta,
            sf_vec_size,
            output_dtype,
            epi_dtype,
            is_kv_sf_interleaved,
        )

    return _run(
        op,
        "fp4",
        _validated(validate, key),
        key,
        tensors=tensors,
        schedule_meta=schedule_meta,
        out=out,
        output_dtype=output_dtype,
        prepare=prepare,
        compute=compute,
    )


@dataclass(frozen=True)
class PagedMqaLogitsConfig:
    """One kernel specialisation compiled by `precompile_paged_mqa_logits`."""

    variant: str
    block_size: int
    next_n: int
    num_heads: int
    head_dim: int
    output_dtype: torch.dtype
    epi_dtype: torch.dtype
    acc_dtype: torch.dtype
    is_kv_sf_interleaved: bool


_DEFAULT_OUTPUT_DTYPES = {
    "fp8": (torch.float32,),
    "fp4": (torch.bfloat16, torch.float32),
}


def _check_int_tuple(name: str, values: object, allowed: Callable[[int], str | None]) -> tuple:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise TypeError(f"{name} must be a non-empty sequence of ints, got {values!r}")
    for value in values:
        v.check_int(f"{name} entry", value)
        problem = allowed(value)
        if problem:
            raise ValueError(f"{name} entry {value}: {problem}")
    return tuple(values)


def _check_dtype_tuple(name: str, values: object) -> tuple:
    if isinstance(values, torch.dtype) or not isinstance(values, Sequence) or not values:
        raise TypeError(f"{name} must be a non-empty sequence of torch.dtype, got {values!r}")
    for value in values:
        if not isinstance(value, torch.dtype):
            raise TypeError(f"{name} entries must be torch.dtype, got {value!r}")
    return tuple(values)


def _paged_configs(
    variants: tuple,
    output_dtypes: tuple | None,
    block_sizes: tuple,
    next_ns: tuple,
    num_heads: int,
    head_dim: int,
    epi_dtypes: tuple,
    acc_dtypes: tuple,
) -> list[PagedMqaLogitsConfig]:
    """Expand the requested grid, checking every combination against the ops' restrictions."""
    configs: list[PagedMqaLogitsConfig] = []
    for variant in variants:
        outs = output_dtypes if output_dtypes is not None else _DEFAULT_OUTPUT_DTYPES[variant]
        if variant == "fp8":
            allowed_out, allowed_epi, allowed_acc = (
                FP8_OUTPUT_DTYPES,
                FP8_EPI_DTYPES,
                FP8_ACC_DTYPES,
            )
            heads, dim = num_heads, head_dim
        else:
            allowed_out, allowed_epi, allowed_acc = (
                FP4_OUTPUT_DTYPES,
                FP4_EPI_DTYPES,
                (torch.float32,),
            )
            heads, dim = FP4_NUM_HEADS, FP4_HEAD_DIM
        for dtype in outs:
            refusal = _FP8_BF16_REFUSAL if variant == "fp8" else None
            v.check_dtype_choice(f"output_dtypes ({variant})", dtype, allowed_out, refusal)
        for dtype in epi_dtypes:
            v.check_dtype_choice(f"epi_dtypes ({variant})", dtype, allowed_epi)
        accs = acc_dtypes if variant == "fp8" else (torch.float32,)
        for dtype in accs:
            v.check_dtype_choice(f"acc_dtypes ({variant})", dtype, allowed_acc)
        for next_n in next_ns:
            if variant == "fp4" and next_n > FP4_MAX_NEXT_N:
                raise ValueError(
                    f"next_ns entry {next_n}: fp4 supports next_n 1..{FP4_MAX_NEXT_N}; "
                    "pass variants=('fp8',) or drop it"
                )
            v.check_head_geometry(heads, dim, next_n)
            if variant == "fp8":
                _check_fp8_shared_memory_fit(heads, dim, next_n)
        for block_size, next_n, out_dtype, epi, acc in itertools.product(
            block_sizes, next_ns, outs, epi_dtypes, accs
        ):
            interleaved = (False, True) if variant == "fp4" and block_size == 128 else (False,)
            configs.extend(
                PagedMqaLogitsConfig(
                    variant=variant,
                    block_size=block_size,
                    next_n=next_n,
                    num_heads=heads,
                    head_dim=dim,
                    output_dtype=out_dtype,
                    epi_dtype=epi,
                    acc_dtype=acc,
                    is_kv_sf_interleaved=inter,
                )
                for inter in interleaved
            )
    return configs


def precompile_paged_mqa_logits(
    device: torch.device | str | int | None = None,
    variants: Sequence[str] = ("fp8", "fp4"),
    output_dtypes: Sequence[torch.dtype] | None = None,
    batch_sizes: Sequence[int] | None = None,
    *,
    block_sizes: Sequence[int] = (32, 64, 128),
    next_ns: Sequence[int] = (1, 2, 3, 4),
    num_heads: int = 64,
    head_dim: int = 128,
    epi_dtypes: Sequence[torch.dtype] = (torch.float32,),
    acc_dtypes: Sequence[torch.dtype] = (torch.float32,),
) -> list[PagedMqaLogitsConfig]:
    """Pre-compile paged MQA logits kernels for common static configs.

    Kernels are compiled at run time (NVRTC, through `flashinfer_jit`) the first time a
    configuration is used and then kept in the on-disk kernel cache. Call this once during
    deployment setup so that no serving request pays for compilation. Kernels are compiled
    for CUDA devices only: on a CPU device (or with no GPU present and `device=None`) the
    arguments are validated and nothing is compiled.

    The grid is every combination of `variants x block_sizes x next_ns x output dtypes x
    epi_dtypes x acc_dtypes` (acc only for fp8), plus the interleaved scale order for fp4 at
    block size 128. fp8 uses `num_heads x head_dim`; fp4 always uses its fixed 64 x 128.

    Args:
        device: Target device. None means the current CUDA device when one is available,
            else the CPU.
        variants: Which precisions to build, a subset of `("fp8", "fp4")`. A deployment
            usually runs one indexer precision; pass e.g. `("fp8",)`.
        output_dtypes: Output dtypes to build for every selected variant. None (default)
            means float32 for fp8 and both bfloat16 and float32 for fp4.
        batch_sizes: Accepted for source compatibility with FlashInfer's signature; the SM90
            kernels do not specialise on batch size, so the values are only validated
            (positive ints).
        block_sizes: KV block sizes to build, each 32, 64 or 128.
        next_ns: Draft depths to build (fp4 supports 1..4).
        num_heads: fp8 head count (a multiple of 4); fp4 is fixed at 64.
        head_dim: fp8 head dimension (a multiple of 32); fp4 is fixed at 128.
        epi_dtypes: Epilogue dtypes to build.
        acc_dtypes: fp8 accumulator dtypes to build.

    Returns:
        The configurations compiled, in build order: an empty list on a CPU device.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: A requested configuration violates the ops' restrictions, or `device`
            does not name a CPU or visible CUDA device (`flashinfer_schedule.resolve_device`).
        RuntimeError: The target is a GPU other than SM90.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    target = resolve_device(device)
    if target.type not in v.SUPPORTED_DEVICE_TYPES:
        raise ValueError(f"device must be a CUDA or CPU device, got {target}")

    if isinstance(variants, str) or not isinstance(variants, Sequence) or not variants:
        raise TypeError(f"variants must be a non-empty sequence of str, got {variants!r}")
    for variant in variants:
        if variant not in ("fp8", "fp4"):
            raise ValueError(f"variants entries must be 'fp8' or 'fp4', got {variant!r}")
    if output_dtypes is not None:
        output_dtypes = _check_dtype_tuple("output_dtypes", output_dtypes)
    if batch_sizes is not None:
        _check_int_tuple("batch_sizes", batch_sizes, lambda b: None if b >= 1 else "must be >= 1")
    block_sizes = _check_int_tuple(
        "block_sizes",
        block_sizes,
        lambda b: None if b in v.SUPPORTED_BLOCK_SIZES else f"must be in {v.SUPPORTED_BLOCK_SIZES}",
    )
    next_ns = _check_int_tuple("next_ns", next_ns, lambda n: None if n >= 1 else "must be >= 1")
    v.check_int("num_heads", num_heads)
    v.check_int("head_dim", head_dim)
    configs = _paged_configs(
        tuple(variants),
        output_dtypes,
        block_sizes,
        next_ns,
        num_heads,
        head_dim,
        _check_dtype_tuple("epi_dtypes", epi_dtypes),
        _check_dtype_tuple("acc_dtypes", acc_dtypes),
    )
    if target.type == "cpu":
        return []
    v.check_cuda_arch("precompile_paged_mqa_logits", target)
    launcher.compile_paged_mqa_logits_kernels(configs, target)
    return configs
