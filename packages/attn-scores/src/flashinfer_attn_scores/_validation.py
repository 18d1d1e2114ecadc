"""Argument checks shared by the attention-score ops.

Two tiers, as DESIGN.md section 3 requires:

* host-side checks (dtype, rank, shape, device, strides, `out=` layout, `schedule_meta`
  shape, the 2^31 output span) run on every call and never touch device memory;
* device-data checks (lengths against `max_seq_len`, table width, block ids, schedule
  freshness) run only when `FLASHINFER_VALIDATE_INPUTS=1` is set at call time, and never
  while a CUDA graph is being captured, because they copy device data to the host.

Every failure of these checks is a `TypeError` (wrong Python type or tensor dtype) or a
`ValueError` (wrong value, shape, layout or device) whose message names the argument and gives
the expected and received values. Tensors on a device the ops cannot run on at all (a GPU other
than SM90, a `meta` tensor outside torch.compile) are refused by the dispatch with a
`RuntimeError`, as the public docstrings say.
"""

from __future__ import annotations

import numbers
import operator
import os

import torch
from flashinfer_jit.op_args import (
    decided,
    describe,
    int_hint,
    require,
    shown,
    sizes,
    strides,
    type_name,
)
from flashinfer_schedule import (
    compute_paged_mqa_logits_schedule,
    device_num_sms,
    min_block_table_width,
)

VALIDATE_ENV_VAR = "FLASHINFER_VALIDATE_INPUTS"
_ENV_TRUE = frozenset({"1", "true", "yes", "on"})

# The kernels index the output with signed 32-bit element offsets.
OUTPUT_SPAN_LIMIT = 2**31

SUPPORTED_BLOCK_SIZES = (32, 64, 128)
HEAD_DIM_MULTIPLE = 32
NUM_HEADS_MULTIPLE = 4
ROW_HEADS_MULTIPLE = 8  # next_n * num_heads, the MMA's M extent
ROW_HEADS_RANGE = (8, 256)

SUPPORTED_DEVICE_TYPES = ("cpu", "cuda")
SUPPORTED_CAPABILITY = (9, 0)


def check_tensor(name: str, value: object) -> torch.Tensor:
    """Raise TypeError unless `value` is a dense (strided) tensor whose memory holds its values.

    A negated view (`is_neg()`, e.g. the `.imag` of a `conj()` view) holds -value in memory:
    the kernels read memory, so it is refused rather than silently negated. Not checked while
    torch.compile traces (dynamo cannot trace `is_neg()`). There the dispatcher resolves a
    negated input before the custom op runs under the `eager` and `aot_eager` backends, but
    Inductor (PyTorch 2.13) ignores the negation bit of a graph input, for plain torch ops
    too (pytorch/pytorch#145093), and the op sees the negated values.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type_name(value)}")
    if value.layout != torch.strided or value.is_nested:
        layout = "nested" if value.is_nested else str(value.layout)
        raise TypeError(f"{name} must be a dense (torch.strided) tensor, got layout {layout}")
    if not torch.compiler.is_compiling() and value.is_neg():
        raise TypeError(
            f"{name} is a negated view (is_neg() is True), whose memory holds the negated "
            f"values; pass {name}.resolve_neg()"
        )
    return value


def check_dtype(name: str, t: torch.Tensor, expected: torch.dtype) -> None:
    if t.dtype != expected:
        raise TypeError(f"{name} must have dtype {expected}, got {t.dtype}")


def check_ndim(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    if t.dim() != ndim:
        raise ValueError(
            f"{name} must be {ndim}-D {layout}, got {t.dim()}-D tensor of shape {sizes(t.shape)}"
        )


def check_dim(name: str, t: torch.Tensor, dim: int, expected: int, meaning: str) -> None:
    """Raise ValueError unless `t.shape[dim] == expected`; `meaning` explains `expected`.
    Through `require`, so that sizes a trace cannot compare (unbacked batch dimensions, as
    `mark_unbacked` makes them) become a run-time assertion instead of a failed trace."""
    require(
        t.shape[dim] == expected,
        lambda: ValueError(
            f"{name}.shape[{dim}] must be {meaning} = {shown(expected)}, "
            f"got {shown(t.shape[dim])} ({name} shape {sizes(t.shape)})"
        ),
    )


def python_int(value: object) -> object:
    """A numpy (or other `numbers.Integral`) integer as the Python int it holds; any other
    value unchanged, for `check_int` to accept or name.

    The public functions apply it to their integer arguments first, so that the argument
    signature, the problem sizes and the custom op all see a plain int. bool stays a bool
    (refused), and so do tensors: a one-element integer tensor has `__index__` too, but
    reading a CUDA one is a host sync.
    """
    if type(value) is int or isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return value
    return operator.index(value)


def check_int(name: str, value: object, *, minimum: int | None = None) -> int:
    """Return `value` as a Python int if it is a Python or numpy integer, else raise
    TypeError; ValueError below `minimum`. The schedule package's integer rule."""
    # bool is an int subclass, but True as a size is always a caller bug. A SymInt is a size
    # read from device data under a non-strict torch.export trace (dynamo's own trace shows
    # it as an int); its bound below becomes a runtime assertion.
    value = python_int(value)
    if not isinstance(value, torch.SymInt) and (
        isinstance(value, bool) or not isinstance(value, int)
    ):
        raise TypeError(f"{name} must be an int, got {describe(value)}{int_hint(value)}")
    if minimum is not None:
        require(
            value >= minimum,
            lambda: ValueError(f"{name} must be >= {minimum}, got {shown(value)}"),
        )
    return value


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {describe(value)}")
    return value


def check_dtype_choice(
    name: str,
    value: object,
    allowed: tuple[torch.dtype, ...],
    refused_because: dict[torch.dtype, str] | None = None,
) -> torch.dtype:
    """Check a dtype-valued argument such as `output_dtype` against the supported set."""
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype, got {describe(value)}")
    if value not in allowed:
        why = (refused_because or {}).get(value)
        names = ", ".join(str(d) for d in allowed)
        msg = f"{name} must be one of ({names}), got {value}"
        raise ValueError(f"{msg}: {why}" if why else msg)
    return value


def check_same_device(reference_name: str, reference: torch.Tensor, **tensors: object) -> None:
    """Every tensor in `tensors` (None entries skipped) must be on `reference`'s device."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device != reference.device:
            raise ValueError(
                f"{name} must be on {reference_name}'s device {reference.device}, got {t.device}"
            )


def check_supported_device_type(name: str, t: torch.Tensor) -> None:
    if t.device.type not in SUPPORTED_DEVICE_TYPES:
        raise RuntimeError(
            f"{name} is on a {t.device.type!r} device; supported are CUDA tensors on NVIDIA "
            f"Hopper (SM90) and CPU tensors (which run the float64 reference)"
        )


def check_cuda_arch(op: str, device: torch.device) -> None:
    """Raise RuntimeError unless the CUDA device is an SM90 (compute capability 9.0) GPU."""
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != SUPPORTED_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise RuntimeError(
            f"{op}: {device} ({name}) has compute capability {major}.{minor} (sm_{major}{minor}); "
            f"this build supports NVIDIA Hopper SM90 (compute capability 9.0) only. "
            f"CPU tensors run the reference implementation."
        )


def _of_q(q_shape: tuple | None) -> str:
    # Formatted only on a raising path: printing a traced size specialises the graph to it.
    return "" if q_shape is None else f" (q shape {sizes(q_shape)})"


def check_head_geometry(
    num_heads: int, head_dim: int, next_n: int, *, q_shape: tuple | None = None
) -> None:
    """The MMA tiling restrictions shared by both logits kernels.

    `q_shape` is given for a call (the messages then say which dimension of q holds each value
    and show q's shape); precompile passes none, its values being its own arguments. An fp4
    call has its fixed 64 heads and head_dim 128 checked before, so only fp8 calls (head_dim
    = q.shape[3]) can fail here."""
    if head_dim <= 0 or head_dim % HEAD_DIM_MULTIPLE:
        source = "" if q_shape is None else " (q.shape[3])"
        raise ValueError(
            f"head_dim{source} must be a positive multiple of {HEAD_DIM_MULTIPLE}, "
            f"got {head_dim}{_of_q(q_shape)}"
        )
    if num_heads <= 0 or num_heads % NUM_HEADS_MULTIPLE:
        source = "" if q_shape is None else " (q.shape[2])"
        raise ValueError(
            f"num_heads{source} must be a positive multiple of {NUM_HEADS_MULTIPLE}, "
            f"got {num_heads}{_of_q(q_shape)}"
        )
    rows = next_n * num_heads
    low, high = ROW_HEADS_RANGE
    if rows % ROW_HEADS_MULTIPLE or not low <= rows <= high:
        raise ValueError(
            f"next_n * num_heads must be a multiple of {ROW_HEADS_MULTIPLE} in [{low}, {high}], "
            f"got next_n={next_n} * num_heads={num_heads} = {rows}{_of_q(q_shape)}"
        )


def check_block_size(kv_fused: torch.Tensor) -> int:
    block_size = kv_fused.shape[1]
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(
            f"block_size (kv_fused.shape[1]) must be one of {SUPPORTED_BLOCK_SIZES}, "
            f"got {block_size} (kv_fused shape {sizes(kv_fused.shape)})"
        )
    return block_size


def check_kv_fused_blocks_contiguous(kv_fused: torch.Tensor) -> None:
    """Each block must be one contiguous byte run; the stride between blocks is free."""
    expected = 1
    for dim in (3, 2, 1):
        size = kv_fused.shape[dim]
        if size > 1 and kv_fused.stride(dim) != expected:
            raise ValueError(
                "kv_fused must store each block's bytes contiguously (the kernel reads a block "
                "as one flat byte run): strides of dims 1..3 must be "
                f"({kv_fused.shape[2] * kv_fused.shape[3]}, {kv_fused.shape[3]}, 1), "
                f"got strides {strides(kv_fused.stride())} for shape {sizes(kv_fused.shape)}"
            )
        expected *= size


# The SM90 kernels read a pool with TMA and bulk copies: 16-byte aligned block starts.
KV_BLOCK_STRIDE_MULTIPLE = 16


def check_kv_fused_block_stride(kv_fused: torch.Tensor) -> None:
    """The pitch between blocks (`stride(0)`, in bytes) is free within two rules: blocks do not
    overlap, and each starts 16 bytes after an aligned one (a pool view with a wider pitch,
    such as one layer of a layer-interleaved cache, is fine)."""
    if decided(kv_fused.shape[0] <= 1, False):
        return  # one block: the stride is never used
    block_bytes = kv_fused.shape[1] * kv_fused.shape[2] * kv_fused.shape[3]
    stride = kv_fused.stride(0)
    if stride < block_bytes or stride % KV_BLOCK_STRIDE_MULTIPLE:
        raise ValueError(
            f"kv_fused blocks must not overlap and must start at multiples of "
            f"{KV_BLOCK_STRIDE_MULTIPLE} bytes: stride(0) must be a multiple of "
            f"{KV_BLOCK_STRIDE_MULTIPLE} and >= the block's {block_bytes} bytes, "
            f"got strides {strides(kv_fused.stride())} for shape {sizes(kv_fused.shape)}"
        )


# The kernels take the pool's block count as an int32 (it bounds the block ids they read).
MAX_NUM_BLOCKS = 2**31 - 1


def check_kv_fused_num_blocks(kv_fused: torch.Tensor) -> None:
    """The pool's block count must fit the kernels' int32 argument."""
    require(
        kv_fused.shape[0] <= MAX_NUM_BLOCKS,
        lambda: ValueError(
            f"kv_fused has too many blocks: num_blocks (kv_fused.shape[0]) must be <= 2**31 - 1 "
            f"= {MAX_NUM_BLOCKS} (the kernels take it as an int32), got {kv_fused.shape[0]} "
            f"(kv_fused shape {sizes(kv_fused.shape)})"
        ),
    )


def check_block_tables(block_tables: torch.Tensor, batch_size: int) -> None:
    check_dtype("block_tables", block_tables, torch.int32)
    check_ndim("block_tables", block_tables, 2, "[batch_size, max_blocks_per_seq]")
    check_dim("block_tables", block_tables, 0, batch_size, "batch_size (q.shape[0])")
    # The row stride is free (block_tables[::next_n] is fine); entries within a row must be
    # contiguous. A stride is meaningless for a dimension of size <= 1. The stride is tested
    # first: a table narrowed inside torch.compile to a width read from device data has a
    # width without a value, and its unit stride decides the test without asking for one.
    if block_tables.stride(1) != 1 and block_tables.shape[1] > 1:
        raise ValueError(
            "block_tables must have contiguous rows (stride(1) == 1), "
            f"got strides {strides(block_tables.stride())} for shape {sizes(block_tables.shape)}"
        )


def check_seq_lens(seq_lens: torch.Tensor, batch_size: int) -> None:
    check_dtype("seq_lens", seq_lens, torch.int32)
    check_ndim("seq_lens", seq_lens, 1, "[batch_size]")
    check_dim("seq_lens", seq_lens, 0, batch_size, "batch_size (q.shape[0])")


def check_schedule_meta(schedule_meta: object, q: torch.Tensor) -> torch.Tensor:
    """`schedule_meta` must be `[num_sms + 1, 2]` int32, contiguous, on q's device."""
    t = check_tensor("schedule_meta", schedule_meta)
    check_dtype("schedule_meta", t, torch.int32)
    check_same_device("q", q, schedule_meta=t)
    num_sms = device_num_sms(q.device)
    expected = [num_sms + 1, 2]
    if list(t.shape) != expected:
        raise ValueError(
            f"schedule_meta must have shape [num_sms + 1, 2] = {expected} for {q.device} "
            f"(num_sms={num_sms}), got {sizes(t.shape)}; build it with "
            "compute_paged_mqa_logits_schedule(seq_lens, device=q.device, ...)"
        )
    if not t.is_contiguous():
        raise ValueError(
            f"schedule_meta must be contiguous (strides (2, 1)), got strides {strides(t.stride())}"
        )
    return t


def check_out(
    out: object,
    *,
    rows: int,
    padded_cols: int,
    output_dtype: torch.dtype,
    q: torch.Tensor,
) -> torch.Tensor:
    """Check a caller's `out=` storage against the padded output contract."""
    t = check_tensor("out", out)
    if t.dtype != output_dtype:
        raise TypeError(f"out must have dtype output_dtype = {output_dtype}, got {t.dtype}")
    if t.requires_grad and torch.is_grad_enabled():
        raise grad_out_error()
    check_same_device("q", q, out=t)
    check_ndim("out", t, 2, "[>= batch_size*next_n, >= padded_seq_len(max_seq_len)]")
    if t.shape[0] < rows:
        raise ValueError(
            f"out must have at least batch_size*next_n = {rows} rows, got shape {sizes(t.shape)}"
        )
    require(
        t.shape[1] >= padded_cols,
        lambda: ValueError(
            f"out must have at least padded_seq_len(max_seq_len) = {padded_cols} columns "
            f"(the kernel may write into the padding past max_seq_len), got shape {sizes(t.shape)}"
        ),
    )
    # stride first: under torch.compile an out sized from device data has a width without a
    # value, and its unit stride decides the test without asking for one.
    if t.stride(1) != 1 and t.shape[1] > 1:
        raise ValueError(
            f"out must have contiguous rows (stride(1) == 1), got strides {strides(t.stride())}"
        )
    require(
        t.stride(0) >= padded_cols,
        lambda: ValueError(
            f"out rows must not overlap: stride(0) must be >= padded_seq_len(max_seq_len) = "
            f"{padded_cols}, got strides {strides(t.stride())} for shape {sizes(t.shape)}"
        ),
    )
    return t


def byte_extent(t: torch.Tensor | None) -> int:
    """Bytes from `t`'s first element to one past its last (0 for None or an empty tensor)."""
    if t is None or t.numel() == 0:
        return 0
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return (last + 1) * t.element_size()


def out_written_bytes(out: torch.Tensor, rows: int, padded_cols: int) -> int:
    """Bytes from out's first element to one past the last element a call may write."""
    if rows == 0 or padded_cols == 0:
        return 0
    return ((rows - 1) * out.stride(0) + padded_cols) * out.element_size()


# Beyond this many runs of contiguous bytes an input is not walked (its byte extent meeting
# out's written rows then counts as an overlap). A pool of blocks with a pitch wider than a
# block is one run per block: 2^22 runs take about 0.1 s and 0.2 GB of host memory.
_EXACT_OVERLAP_RUNS = 1 << 22


def meets_written_rows(
    t: torch.Tensor, offset: int, pitch: int, width: int, rows: int
) -> bool | None:
    """Whether an element of `t`, whose first byte lies `offset` bytes past out's first, shares a
    byte with the rows a call writes: bytes [k * pitch, k * pitch + width) for k < `rows`.

    Exact, from `t`'s sizes and strides alone (no data read, any device): a wide-pitch `out`
    leaves the tail of each row unwritten, and an input may live there. `t` is walked as runs
    of contiguous bytes (its innermost dimensions merged while each continues the one inside
    it); None where it has more than `_EXACT_OVERLAP_RUNS` runs and was not walked.
    """
    if rows <= 0 or width <= 0 or t.numel() == 0:
        return False
    pitch = max(pitch, width)  # one row (the only case a narrower pitch passes validation)
    size = t.element_size()
    # Dimensions of one element or stride 0 add no bytes.
    dims = sorted((s * size, n) for n, s in zip(t.shape, t.stride(), strict=True) if n > 1 and s)
    run = size
    while dims and dims[0][0] == run:
        run *= dims.pop(0)[1]
    if torch.Size(n for _, n in dims).numel() > _EXACT_OVERLAP_RUNS:
        return None
    starts = torch.tensor([offset], dtype=torch.int64)
    for step, n in dims:
        starts = (starts[:, None] + torch.arange(n, dtype=torch.int64) * step).flatten()
    row = torch.div(starts, pitch, rounding_mode="floor")
    inside = (row >= 0) & (row < rows) & (starts - row * pitch < width)
    next_row = (row + 1).clamp(min=0)
    reaches_next = (next_row < rows) & (starts + run > next_row * pitch)
    return bool((inside | reaches_next).any())


def out_overlap_error(
    name: str,
    out_start: int,
    rows: int,
    width: int,
    pitch: int,
    first: int,
    extent: int,
    exact: bool = True,
):
    """The ValueError for an `out` whose written rows meet input `name`'s elements (which lie
    in bytes [first, first + extent)), or, where `exact` is false, whose byte ranges meet
    and whose elements were too many to compare: on CUDA other CTAs still read the inputs
    while `out` is written (PyTorch's own out= ops refuse overlap too)."""
    written = (
        f"the call writes {rows} row(s) of {width} bytes every {pitch} bytes from {out_start:#x}"
    )
    elements = f"{name}'s elements (within bytes [{first:#x}, {first + extent:#x}))"
    if exact:
        found = f"{written}, and some of {elements} lie there"
    else:
        found = (
            f"{written}, which meets the byte range of {elements}; {name} has too many separate "
            f"runs of bytes (over {_EXACT_OVERLAP_RUNS}) to compare element by element"
        )
    return ValueError(
        f"out overlaps {name}: {found}; pass an out that shares no memory with the inputs"
    )


def grad_out_error() -> RuntimeError:
    """The error for an `out` that requires grad while grad mode is on. The op writes `out` in
    place and has no backward: autograd would treat the logits as a view of `out`'s old values
    and hand `out` wrong gradients. PyTorch's own out= functions refuse it as well."""
    return RuntimeError(
        "out requires grad (requires_grad=True) while grad mode is on; the op writes out in "
        "place and has no backward, so autograd would take the logits for a view of out's old "
        "values (PyTorch's own out= functions refuse this too); pass an out with "
        "requires_grad=False, or make the call under torch.no_grad()"
    )


def check_output_span(rows: int, padded_cols: int, out: torch.Tensor | None) -> None:
    """The kernels address the output with 32-bit offsets: the span must stay below 2^31."""
    span = rows * padded_cols
    require(
        span < OUTPUT_SPAN_LIMIT,
        lambda: ValueError(
            f"output too large: batch_size*next_n * padded_seq_len(max_seq_len) = "
            f"{rows} * {padded_cols} = {span} elements must be < 2**31"
        ),
    )
    # With no rows the span is 0 whatever the width; the width alone still has to be
    # addressable (and an int64 stride: padded_seq_len(2**63 - 1) is 2**63).
    require(
        padded_cols < OUTPUT_SPAN_LIMIT,
        lambda: ValueError(
            f"max_seq_len too large: padded_seq_len(max_seq_len) = {padded_cols} columns must "
            f"be < 2**31"
        ),
    )
    if out is not None:
        require(
            rows * out.stride(0) < OUTPUT_SPAN_LIMIT,
            lambda: ValueError(
                f"out too wide: batch_size*next_n * out.stride(0) = {rows} * {out.stride(0)} = "
                f"{rows * out.stride(0)} elements must be < 2**31"
            ),
        )


# CPython keeps os.environ's entries in a dict of encoded keys (`os.environ._data`, which
# `os.environ[...] = ...`, `del` and `update` keep in step). An unset variable is one lookup
# there (~0.1 us), where `os.environ.get` raises and catches KeyError inside the mapping
# (~1.7 us here, ~2.5 us on the H200's host), and every eager call reads this variable.
_VALIDATE_ENV_KEY = os.environ.encodekey(VALIDATE_ENV_VAR)


def validate_inputs_enabled() -> bool:
    """True when `FLASHINFER_VALIDATE_INPUTS` is set to 1/true/yes/on (read on every call)."""
    entries = getattr(os.environ, "_data", None)
    if entries is not None and _VALIDATE_ENV_KEY not in entries:
        return False
    return os.environ.get(VALIDATE_ENV_VAR, "").strip().lower() in _ENV_TRUE


def graph_capture_active() -> bool:
    """True while the current CUDA stream is capturing a graph (host reads are illegal)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _validate_error(message: str) -> ValueError:
    return ValueError(f"{message} ({VALIDATE_ENV_VAR}=1 check)")


def _check_lengths_and_table(
    lens: torch.Tensor,
    block_tables: torch.Tensor,
    num_blocks: int,
    block_size: int,
    max_seq_len: int,
) -> None:
    negative = (lens < 0).nonzero()
    if negative.numel():
        b = int(negative[0, 0])
        raise _validate_error(f"seq_lens[{b}] = {int(lens[b])} is negative")
    longest = int(lens.max())
    if longest > max_seq_len:
        b = int(lens.argmax())
        raise _validate_error(
            f"max(seq_lens) = {longest} (request {b}) exceeds max_seq_len = {max_seq_len}; "
            "the kernel would write past the end of each output row"
        )
    width = min_block_table_width(longest, block_size)
    if block_tables.shape[1] < width:
        raise _validate_error(
            f"block_tables has {block_tables.shape[1]} columns but max(seq_lens) = {longest} "
            f"with block_size {block_size} needs min_block_table_width = {width}"
        )
    # Only the first ceil(seq_lens[b] / block_size) entries of row b are ever read.
    table = block_tables[:, :width].to("cpu", torch.int64)
    blocks_used = (lens + block_size - 1) // block_size
    read = torch.arange(width)[None, :] < blocks_used[:, None]
    bad = read & ((table < 0) | (table >= num_blocks))
    if bad.any():
        b, j = (int(i) for i in bad.nonzero()[0])
        raise _validate_error(
            f"block_tables[{b}, {j}] = {int(table[b, j])} is not a block of kv_fused: block ids "
            f"read for seq_lens[{b}] = {int(lens[b])} must be in [0, num_blocks = {num_blocks})"
        )


def check_device_data(
    *,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    num_blocks: int,
    block_size: int,
    max_seq_len: int,
    schedule_meta: torch.Tensor | None,
    next_n: int,
    variant: str,
) -> None:
    """The opt-in checks that read device data (one device-to-host copy of each tensor).

    Callers run this only when `validate_inputs_enabled()` and not `graph_capture_active()`.
    """
    lens = seq_lens.to("cpu", torch.int64)
    if lens.numel():
        _check_lengths_and_table(lens, block_tables, num_blocks, block_size, max_seq_len)
    if schedule_meta is not None:
        fresh = compute_paged_mqa_logits_schedule(
            seq_lens,
            schedule_meta.device,
            next_n=next_n,
            variant=variant,
            num_sms=schedule_meta.shape[0] - 1,
        )
        differs = (fresh != schedule_meta).any(dim=1).nonzero()
        if differs.numel():
            i = int(differs[0, 0])
            raise _validate_error(
                f"schedule_meta is stale: row {i} is {schedule_meta[i].tolist()} but "
                f"compute_paged_mqa_logits_schedule(seq_lens, next_n={next_n}, "
                f"variant={variant!r}) gives {fresh[i].tolist()}; recompute it whenever the "
                "contents of seq_lens change (a stale schedule can leave logits wrong or unwritten)"
            )
