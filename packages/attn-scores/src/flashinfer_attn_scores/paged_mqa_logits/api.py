"""Public paged MQA logits ops: signature, validation, dispatch through the custom ops."""

from __future__ import annotations

from collections.abc import Callable

import torch
from flashinfer_jit.op_args import sizes

from .. import _validation as v
from . import custom_ops, dispatch, launcher
from .precompile import PagedMqaLogitsConfig, precompile_paged_mqa_logits
from .problem import (
    FP4_EPI_DTYPES,
    FP4_HEAD_DIM,
    FP4_INTERLEAVED_BLOCK_SIZE,
    FP4_MAX_NEXT_N,
    FP4_NUM_HEADS,
    FP4_OUTPUT_DTYPES,
    FP4_SF_VEC_SIZE,
    FP8_ACC_DTYPES,
    FP8_BF16_REFUSAL,
    FP8_EPI_DTYPES,
    FP8_OUTPUT_DTYPES,
    Problem,
    check_call_outputs,
    check_common,
)

__all__ = [
    "PagedMqaLogitsConfig",
    "fp4_paged_mqa_logits",
    "fp8_paged_mqa_logits",
    "precompile_paged_mqa_logits",
]


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
    when stored. The tensor cores' float32 accumulation is not IEEE float32 addition: its
    error scales with sum_d |q_hd * k_d|, not with the dot product, and grows slowly with
    `head_dim` (on the H200 up to 2^-12 of that sum at head_dim 128 and 2^-10.9 at 1600; the
    docs' numerics page). The ReLU acts on
    each head separately, before the weighted sum, so negative weights can make a logit
    negative. `next_n = q.shape[1]` is the number of query positions per request (the
    speculative/MTP draft depth, 1 for plain decode); slot `t = 0` is the oldest draft
    position and `t = next_n - 1` the newest, and `seq_lens[b]` is the KV length the newest
    slot sees.

    CPU tensors run the float64 reference (`fp8_paged_mqa_logits_reference`) through the
    same validation, then round once to `output_dtype`; `epi_dtype`/`acc_dtype` are checked
    but do not change the CPU result. CUDA tensors run the SM90 kernel. Either runs inside the
    custom op `torch.ops.flashinfer_attn_scores.fp8_paged_mqa_logits_into` (which writes into
    the padded storage), so `torch.compile(fullgraph=True)` traces through this function.

    Example (an excerpt of the spec's example, renamed; `device="cpu"` runs the reference;
    `values, scales = flashinfer_layouts.quantize_fp8_per_token(k)` for `k` of shape
    `[B * width, block_size, head_dim]`, `q` and `weights` as in the
    [quickstart](../quickstart.md), which runs whole):

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
            `w.view(B * next_n, H)`). Cast internally when `epi_dtype` is float16. Not
            differentiable: the op has no backward, so the result has no `grad_fn` even when
            `weights` (or any input) requires grad.
        block_tables: `[batch_size, max_blocks_per_seq]` int32 physical block ids into
            `kv_fused`'s dim 0, on q's device. Entries of a row must be contiguous
            (`stride(1) == 1`); the row stride is free, so `block_tables[::next_n]` works
            without a copy. The width must be at least
            `min_block_table_width(max(seq_lens), block_size)`; row `b` is read only for its
            first `ceil(seq_lens[b] / block_size)` entries, the rest may hold anything. A
            narrower table is an out-of-bounds device read (undefined behaviour), not a
            checked error. An id outside `[0, num_blocks)` within a request's length is
            outside the contract too: the CPU path and validate mode refuse it (ValueError
            naming the entry); the CUDA kernel reads no page for it (-1, the usual "no
            page" mark, included), so those positions get unspecified values and nothing
            else changes.
        seq_lens: `[batch_size]` int32 KV length per request, on q's device, any stride (so
            `seq_lens[::next_n]` works without a copy). No entry may exceed `max_seq_len`
            (DeepGEMM calls this `context_lens`). Entries must be >= 0: the CPU path and
            validate mode refuse a negative one; the CUDA kernel, which cannot check without
            a host sync, treats it as 0 (its rows are not written) and leaves the other
            requests intact.
        max_seq_len: int, the logits' column count, `>= max(seq_lens)`. A smaller value is
            outside the contract, not a checked error (the spec leaves it undefined): the
            CUDA kernel clamps every length to `max_seq_len`, so a longer request's logits
            stop there and nothing is written outside out's padded rows. On CUDA,
            this, the table width and the block ids are checked, on the host, only when the
            environment variable `FLASHINFER_VALIDATE_INPUTS=1` is set (read on each call;
            CPU tensors, which run the reference, are always checked); the check is a
            development aid and is skipped during CUDA-graph capture, in code traced by
            `torch.compile` and under any other tracer or `TorchDispatchMode` (`make_fx`,
            `FakeTensorMode`, `torch.func` transforms; also `FlopCounterMode`): it copies
            device data to the host, which a trace cannot follow, so validate in plain eager
            mode. Inside a compiled function it may be a value
            read from device data (`int(seq_lens.max())` with dynamo's
            `capture_scalar_outputs`); the checks that depend on it (`>= 0`, `out`'s width,
            the 2^31 span) then run when the compiled code does, as PyTorch runtime
            assertions (RuntimeError naming the failed comparison).
        output_dtype: float32 (default) or float16. bfloat16 is refused on purpose: the FP8
            epilogue has no bfloat16 store path. `fp4_paged_mqa_logits` defaults to bfloat16,
            so pass `output_dtype` explicitly in code that calls both.
        epi_dtype: Epilogue dtype, float32 (default) or float16. float16 rounds each raw
            FP8 dot product q . k (before the token scale) and each weight to float16: a dot
            product from 65520 up is inf however small the logit (with q and K near E4M3's
            full range many are), and weights below 2^-25 become 0. On SM90 it is mostly
            3-13 % faster at next_n 2-4 (the same at next_n 1); the docs' numerics and
            performance pages have the ranges and the figures.
        acc_dtype: Tensor-core accumulator dtype, float32 (default) or float16. With a float16
            epilogue as well, 4-27 % faster than the defaults at next_n 2-4 on SM90, at the
            cost of the accumulator's rounding and range: each dot product of the raw FP8
            values (before the token scale) is summed in float16 and becomes inf once it
            passes 65504, e.g. at head_dim 128 once every |q|, |k| is 24 (K quantised per
            token to E4M3's full range reaches 448). See the docs' numerics page.
        schedule_meta: Optional `[num_sms + 1, 2]` int32 contiguous CTA schedule on q's device,
            from `compute_paged_mqa_logits_schedule(seq_lens, device=q.device, next_n=next_n,
            variant="fp8")`. Leave it None (recommended): the logits kernel then derives the
            same schedule from `seq_lens` itself on every call (no extra launch), which is
            also what CUDA-graph capture needs. A supplied schedule is
            valid only while the contents of `seq_lens` and the device's SM count are
            unchanged (a fixed batch size is not enough); recompute it into the same buffer
            whenever they change. A stale schedule leaves logits wrong or unwritten (the
            spec lets it hang a kernel; this one bounds every walk by `seq_lens` and stays
            inside the problem even for garbage rows); `FLASHINFER_VALIDATE_INPUTS=1`
            compares it with a fresh one.
        out: Optional output storage, PyTorch `out=` style: on q's device, dtype
            `output_dtype`, 2-D with at least `batch_size*next_n` rows and
            `padded_seq_len(max_seq_len)` columns (the kernel may write into the padding
            columns: it stores whole 64-position units),
            rows contiguous (`stride(1) == 1`) and not overlapping
            (`stride(0) >= padded_seq_len(max_seq_len)`; a row slice of a wider buffer is
            fine, an `expand()`ed or `as_strided()` overlapping buffer is not). What a call
            writes (the first `padded_seq_len(max_seq_len)` columns of its rows) must share
            no byte with any input's elements (`ValueError`, checked on every call, under
            torch.compile by the op when it runs; an input in the unwritten tail of a wider
            row is fine in eager calls; under torch.compile give `out` a storage of its own,
            see the quickstart). Only the first
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
            schedule_meta int32; out output_dtype), a dtype argument is not a
            `torch.dtype`, `max_seq_len` is not an integer (a Python or numpy int; a
            bool or a tensor is refused), or a tensor argument (`out` and `schedule_meta`
            included) is a negated view (`is_neg()`, e.g. the `.imag` of a `conj()` view),
            whose memory holds the negated values: pass `t.resolve_neg()`. Checked on every
            call for `weights` and `out` (public PyTorch makes negated views of float tensors
            only); the integer and FP8 tensors, which only the private `torch._neg_view`
            negates, on the first call of an argument signature. Not checked while
            torch.compile traces.
        ValueError: A rank, shape, device, stride or value violates the contract:
            inconsistent batch_size/next_n/num_heads/head_dim between the tensors,
            `kv_fused.shape[2] != 1` or `kv_fused.shape[3] != head_dim + 4`, more than
            2^31 - 1 blocks in `kv_fused` (the kernels' int32 block count), `head_dim` not a
            multiple of 32, `num_heads` not a multiple of 4, `next_n*num_heads` not a multiple
            of 8 in [8, 256], block size not 32/64/128, tensors on different devices, an
            unsupported `output_dtype`/`epi_dtype`/`acc_dtype`, `max_seq_len < 0`, a
            `schedule_meta` or `out` of the wrong shape or layout, an `out` that overlaps an
            input, an output span of 2^31 elements or more or a `padded_seq_len(max_seq_len)`
            of 2^31 or more, or (with `FLASHINFER_VALIDATE_INPUTS=1`) a violated device-data
            precondition or stale schedule.
        RuntimeError: The tensors are on a GPU other than SM90 (compute capability 9.0), or
            on a device type other than CUDA/CPU; or `out` is an inference tensor (created
            under `torch.inference_mode()`) and the call is made outside inference mode,
            where PyTorch allows no in-place update of it; or `out` requires grad while
            grad mode is on (the op has no backward). Under `torch.compile` with unbacked
            (data-dependent) batch or pool sizes, a shape mismatch that the trace cannot
            decide surfaces when the compiled code runs, as PyTorch's runtime assertion
            (RuntimeError naming the failed comparison) instead of the ValueError.

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
    padded_seq_len(max_seq_len) < 2**31` and `padded_seq_len(max_seq_len) < 2**31` (with
    `out`, also `batch_size*next_n * out.stride(0) < 2**31`) because the output is indexed
    with 32-bit offsets. `head_dim`, `num_heads` and `next_n` must fit an SM90 CTA's shared
    memory (two q slots and at least two KV stages); the largest `head_dim` that fits, by `next_n * num_heads`: 8: 1600,
    16: 1440, 32: 1184, 64: 896, 128: 576, 192: 416, 256: 352.
    """
    op = "fp8_paged_mqa_logits"
    if type(max_seq_len) is not int:  # a numpy integer becomes the int it holds
        max_seq_len = v.python_int(max_seq_len)
    tensors = (q, kv_fused, weights, block_tables, seq_lens)
    key = dispatch.signature(
        "fp8",
        tensors,
        (max_seq_len, output_dtype, epi_dtype, acc_dtype),
        (schedule_meta, out),
        negatable=(weights, out),
    )
    eager = dispatch.eager_call(key)
    if eager is not None:
        return eager(tensors, schedule_meta, out)

    def validate() -> Problem:
        v.check_tensor("q", q)
        v.check_dtype("q", q, torch.float8_e4m3fn)
        v.check_ndim("q", q, 4, "[batch_size, next_n, num_heads, head_dim]")
        problem = check_common(
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
        v.check_dtype_choice("output_dtype", output_dtype, FP8_OUTPUT_DTYPES, FP8_BF16_REFUSAL)
        v.check_dtype_choice("epi_dtype", epi_dtype, FP8_EPI_DTYPES)
        v.check_dtype_choice("acc_dtype", acc_dtype, FP8_ACC_DTYPES)
        check_call_outputs(problem, q, output_dtype, schedule_meta, out)
        return problem

    def prepare(storage: torch.Tensor) -> Callable[..., None]:
        return launcher.prepare_fp8_paged_mqa_logits(
            *tensors,
            storage,
            schedule_meta,
            max_seq_len=max_seq_len,
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

    return dispatch.run(
        op,
        "fp8",
        dispatch.validated(validate, key),
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
    same validation, then round once to `output_dtype`; `epi_dtype` is checked but does not
    change the CPU result. CUDA tensors run the SM90 kernel. Either runs inside the custom op
    `torch.ops.flashinfer_attn_scores.fp4_paged_mqa_logits_into`, so
    `torch.compile(fullgraph=True)` traces through this function.

    Example (an excerpt of the spec's example, renamed, with the paging of the fp8 example;
    zero-filled tensors are valid placeholders for a shape check, real callers quantise with
    `flashinfer_layouts.quantize_mxfp4_q` and `flashinfer_layouts.quantize_mxfp4_kv_cache`;
    the [quickstart](../quickstart.md) runs whole):

        q = torch.zeros(B, next_n, 64, 64, dtype=torch.uint8, device=device)
        q_sf = torch.zeros(B, next_n, 64, dtype=torch.int32, device=device)
        kv_fused = torch.zeros(B * width, 32, 1, 68, dtype=torch.uint8, device=device)
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
            or bfloat16. Not differentiable, as for `fp8_paged_mqa_logits`.
        block_tables: `[batch_size, max_blocks_per_seq]` int32 physical block ids into
            `kv_fused`'s dim 0, on q's device, `stride(1) == 1` with a free row stride
            (`block_tables[::next_n]` works without a copy). The width must be at least
            `min_block_table_width(max(seq_lens), block_size)`; row `b` is read only for its
            first `ceil(seq_lens[b] / block_size)` entries. A narrower table is an
            out-of-bounds device read (undefined behaviour), not a checked error; an id
            outside `[0, num_blocks)` within a length is refused on the CPU and in validate
            mode and gets no page read on CUDA, as for the FP8 variant.
        seq_lens: `[batch_size]` int32 KV length per request, on q's device, any stride. No
            entry may exceed `max_seq_len`.
        max_seq_len: int, the logits' column count, `>= max(seq_lens)`; a smaller value is
            outside the contract (the CUDA kernel clamps the lengths to it, as for the FP8
            variant). Set `FLASHINFER_VALIDATE_INPUTS=1` (read on each call,
            skipped during CUDA-graph capture and in code traced by `torch.compile`) to have
            these preconditions checked on CUDA; CPU tensors, which run the reference, are
            always checked. As for the FP8 variant, a compiled function may read it from
            device data (its size checks then run as runtime assertions).
        sf_vec_size: FP4 values per UE8M0 scale; must be 32. Fixes the packing of both `q_sf`
            and the cache's scale bytes.
        output_dtype: bfloat16 (default), float32 or float16. The FP8 variant defaults to
            float32, so pass it explicitly in code that calls both.
        epi_dtype: Epilogue dtype, float32 (default), float16 or bfloat16. float16 rounds
            each head's score (at its true scale), each weight and the sums to float16: a
            score from 65520 up is inf even where its weight would bring the term back into
            range, and weights below 2^-25 become 0. On SM90 keep
            float32: bfloat16 takes about the same time and rounds each head score and weight
            to bfloat16 (then sums in float32 on the tensor cores); float16 is slower (each
            head score is first brought to its true scale in float32).
        is_kv_sf_interleaved: False (default) when each block's scales are in token order.
            True when they are split into 4 equal runs interleaved round-robin, so slot `k`
            holds the scales of token `(k % 4) * (block_size // 4) + k // 4`; only allowed
            with block size 128. It describes how the cache was written.
        schedule_meta: Optional `[num_sms + 1, 2]` int32 contiguous CTA schedule on q's device,
            from `compute_paged_mqa_logits_schedule(seq_lens, device=q.device,
            next_n=next_n, variant="fp4")` with this call's `next_n`. Leave it None
            (recommended, and what CUDA-graph capture needs). Reusable only while the
            contents of `seq_lens` and the SM count are unchanged; a stale schedule passes
            the shape checks and leaves logits wrong or unwritten (the spec lets it hang a
            kernel; this one cannot), `FLASHINFER_VALIDATE_INPUTS=1` detects it. On SM90 the
            schedule does not depend on `variant` or `next_n` (every configuration scores all
            draft slots in one pass over the KV), so one built with other values of those two
            is the same tensor and is not an error.
        out: Optional output storage with the same rules as for `fp8_paged_mqa_logits`: on q's
            device, dtype `output_dtype`, 2-D, at least `batch_size*next_n` rows and
            `padded_seq_len(max_seq_len)` columns, `stride(1) == 1`,
            `stride(0) >= padded_seq_len(max_seq_len)`, what a call writes sharing no byte
            with the inputs.
            Only the first `batch_size*next_n` rows are written. Required for CUDA-graph
            capture.

    Returns:
        `[batch_size*next_n, max_seq_len]` tensor of `output_dtype`, a view of the padded
        storage (`out` when given). Row `b*next_n + t` is meaningful for positions
        `0 .. seq_lens[b] - next_n + t` inclusive; later columns and the padding are
        unspecified. Rows of a request with `seq_lens[b] == 0` are never written.
        `batch_size == 0` gives an empty `[0, max_seq_len]` view.

    Raises:
        TypeError: An argument has the wrong Python type or a tensor the wrong dtype (q and
            kv_fused uint8; q_sf, block_tables, seq_lens, schedule_meta int32; weights
            float32; out output_dtype), a dtype argument is not a `torch.dtype`,
            `max_seq_len` / `sf_vec_size` is not an integer (a Python or numpy int; a bool
            or a tensor is refused), or a tensor argument (`out` and `schedule_meta`
            included) is a negated view (`is_neg()`, e.g. the `.imag` of a `conj()` view),
            whose memory holds the negated values: pass `t.resolve_neg()`. Checked on every
            call for `weights` and `out` (public PyTorch makes negated views of float tensors
            only); the integer tensors, which only the private `torch._neg_view` negates, on
            the first call of an argument signature. Not checked while torch.compile traces.
        ValueError: A rank, shape, device, stride or value violates the contract:
            inconsistent sizes between the tensors, `num_heads != 64`, `head_dim != 128`,
            `next_n` outside 1..4, `sf_vec_size != 32`, `kv_fused.shape[3] != head_dim/2 + 4`,
            block size not 32/64/128, more than 2^31 - 1 blocks in `kv_fused` (the kernels'
            int32 block count), `is_kv_sf_interleaved=True` with a block size other than
            128, an unsupported `output_dtype`/`epi_dtype`, `max_seq_len < 0`, a bad
            `schedule_meta` or `out`, an output span of 2^31 elements or more or a
            `padded_seq_len(max_seq_len)` of 2^31 or more, or (with
            `FLASHINFER_VALIDATE_INPUTS=1`) a violated device-data precondition or stale
            schedule.
        RuntimeError: The tensors are on a GPU other than SM90 (compute capability 9.0), or
            on a device type other than CUDA/CPU; or `out` is an inference tensor (created
            under `torch.inference_mode()`) and the call is made outside inference mode,
            where PyTorch allows no in-place update of it; or `out` requires grad while
            grad mode is on (the op has no backward). Under `torch.compile` with unbacked
            (data-dependent) batch or pool sizes, a shape mismatch that the trace cannot
            decide surfaces when the compiled code runs, as PyTorch's runtime assertion
            (RuntimeError naming the failed comparison) instead of the ValueError.

    Note:
        CUDA graphs: pass an address-stable `out` sized with `padded_seq_len()`, keep `q`,
        `q_sf`, `kv_fused`, `weights`, `seq_lens` and `block_tables` at static addresses and
        leave `schedule_meta=None`; the kernel then derives the schedule from the current
        `seq_lens` on every replay.

        Launched with programmatic dependent launch like `fp8_paged_mqa_logits`
        (`FLASHINFER_PDL=0` turns it off).

    Restrictions of the current kernel: `num_heads == 64`, `head_dim == 128`, `next_n` in
    1..4, `sf_vec_size == 32`, block size 32, 64 or 128, interleaved scales only at block size
    128, `batch_size*next_n * padded_seq_len(max_seq_len) < 2**31` and
    `padded_seq_len(max_seq_len) < 2**31` (with `out`, also `batch_size*next_n *
    out.stride(0) < 2**31`).
    """
    op = "fp4_paged_mqa_logits"
    if type(max_seq_len) is not int:  # numpy integers become the ints they hold
        max_seq_len = v.python_int(max_seq_len)
    if type(sf_vec_size) is not int:
        sf_vec_size = v.python_int(sf_vec_size)
    q_sf_given = q_sf  # what the messages show
    if isinstance(q_sf, torch.Tensor) and q_sf.dim() == 4 and q_sf.shape[3] == 1:
        # The spec's recipe, a [B, next_n, H, 4] uint8 tensor .view(torch.int32), has this shape.
        q_sf = q_sf.squeeze(3)
    tensors = (q, q_sf, kv_fused, weights, block_tables, seq_lens)
    key = dispatch.signature(
        "fp4",
        tensors,
        (max_seq_len, sf_vec_size, output_dtype, epi_dtype, is_kv_sf_interleaved),
        (schedule_meta, out),
        negatable=(weights, out),
    )
    eager = dispatch.eager_call(key)
    if eager is not None:
        return eager(tensors, schedule_meta, out)

    def validate() -> Problem:
        v.check_tensor("q", q)
        v.check_tensor("q_sf", q_sf)
        v.check_dtype("q", q, torch.uint8)
        v.check_ndim("q", q, 4, "[batch_size, next_n, num_heads, head_dim/2] (two FP4 per byte)")
        batch_size, next_n, num_heads, half_dim = q.shape
        head_dim = 2 * half_dim
        if q_sf.dtype == torch.uint8:  # the spec's [..., 4] bytes, not yet viewed as int32
            raise TypeError(
                "q_sf must have dtype torch.int32, got torch.uint8: pass a [batch_size, next_n, "
                "num_heads, 4] uint8 scale tensor as q_sf.view(torch.int32)"
            )
        v.check_dtype("q_sf", q_sf, torch.int32)
        v.check_ndim("q_sf", q_sf, 3, "[batch_size, next_n, num_heads] (or [..., 1])")
        v.check_dim("q_sf", q_sf_given, 0, batch_size, "batch_size (q.shape[0])")
        v.check_dim("q_sf", q_sf_given, 1, next_n, "next_n (q.shape[1])")
        v.check_dim("q_sf", q_sf_given, 2, num_heads, "num_heads (q.shape[2])")
        if num_heads != FP4_NUM_HEADS:
            raise ValueError(
                f"num_heads (q.shape[2]) must be {FP4_NUM_HEADS} for the FP4 kernel, got {num_heads}"
            )
        if head_dim != FP4_HEAD_DIM:
            raise ValueError(
                f"head_dim (2 * q.shape[3]) must be {FP4_HEAD_DIM} for the FP4 kernel, got "
                f"{head_dim} (q shape {sizes(q.shape)})"
            )
        if not 1 <= next_n <= FP4_MAX_NEXT_N:
            raise ValueError(
                f"next_n (q.shape[1]) must be in 1..{FP4_MAX_NEXT_N} for the FP4 kernel, got {next_n}"
            )
        v.check_int("sf_vec_size", sf_vec_size)
        if sf_vec_size != FP4_SF_VEC_SIZE:
            raise ValueError(f"sf_vec_size must be {FP4_SF_VEC_SIZE}, got {v.shown(sf_vec_size)}")
        problem = check_common(
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
        check_call_outputs(problem, q, output_dtype, schedule_meta, out)
        return problem

    def prepare(storage: torch.Tensor) -> Callable[..., None]:
        return launcher.prepare_fp4_paged_mqa_logits(
            *tensors,
            storage,
            schedule_meta,
            max_seq_len=max_seq_len,
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

    return dispatch.run(
        op,
        "fp4",
        dispatch.validated(validate, key),
        key,
        tensors=tensors,
        schedule_meta=schedule_meta,
        out=out,
        output_dtype=output_dtype,
        prepare=prepare,
        compute=compute,
    )
