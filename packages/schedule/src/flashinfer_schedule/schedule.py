"""CTA work schedule of the persistent paged MQA logits kernels.

Policy (the SM90 kernels consume exactly this). Its constants are defined in this module and
reach the kernels as compile-time defines, except that the 64-token unit is also the logits
kernels' tile, WGMMA's M (`kTile` in `flashinfer_attn_scores`' `paged_mqa_common.cuh`), a
hardware size the kernels state themselves; a test there checks that the two agree.

* Each request `b` is cut into work units of `SCHEDULE_TOKENS_PER_UNIT` (64) KV tokens, and a
  unit is visited `passes_per_token(variant, next_n)` times, so the request contributes
  `units_b = ceil(seq_lens[b] / 64) * passes` units. A zero-length request contributes none.
* Entering a request costs a CTA about as much as streaming a few units (its block-table
  row and first pages are dependent reads), so every non-empty request is charged
  `cost_b = units_b + SCHEDULE_REQUEST_ENTRY_UNITS` virtual units: `E` virtual units of
  entry, then one per unit. Unit 0 spans the entry and its own virtual unit.
* The `total = sum_b cost_b` virtual units, taken in request order, are split into `num_sms`
  contiguous ranges whose sizes differ by at most one (the first `total % num_sms` SMs take
  one more). SM `i` starts at virtual position `g_i = (total // num_sms) * i +
  min(i, total % num_sms)` and stops where SM `i + 1` starts.
* Row `i` of the schedule is the unit holding position `g_i`: `(b, max(0, g_i - begin_b - E))`
  for the request `b` with `begin_b <= g_i < begin_b + cost_b` (`begin_b` the sum of the
  earlier requests' costs), so zero-length requests are skipped. Equivalently, each unit goes
  to the SM whose range holds the unit's last virtual position. `g_i == total` is written as
  `(batch_size, 0)`, which is also the sentinel in the last row `num_sms`.

A CTA whose range crosses into another request therefore streams about `E` units fewer than
one that stays inside a request: with an even split of plain units, the CTAs that switch
requests set the call's time (kernel notes, thirty-fourth round).

Picture (`num_sms = 4`, `E = 2`, units per request `[2, 0, 5]`, costs `[4, 0, 7]`, total 11,
split 3/3/3/2; `e` marks an entry position, a digit the unit a position belongs to):

    virtual       0  1  2  3 | 4  5  6  7  8  9 10 | end
    request b     0  0  0  0 | 2  2  2  2  2  2  2 |
    unit          e  e  0  1 | e  e  0  1  2  3  4 |
    SM            0  0  0  1   1  1  2  2  2  3  3
    rows          (0,0)   (0,1)   (2,0)   (2,3)   (3,0)

SM 0 streams unit (0, 0), SM 1 unit (0, 1) (and pays for request 2's entry, which it never
makes), SM 2 units 0-2 and SM 3 units 3-4 of request 2.
"""

from __future__ import annotations

import torch
from flashinfer_jit.op_args import (
    check_int,
    describe,
    inference_out_error,
    int_hint,
    numpy_int_as_int,
    shown,
    sizes,
    strides,
    type_name,
)
from flashinfer_jit.tracing import plain_eager

__all__ = [
    "DEFAULT_CPU_NUM_SMS",
    "SCHEDULE_REQUEST_ENTRY_UNITS",
    "SCHEDULE_TOKENS_PER_UNIT",
    "compute_paged_mqa_logits_schedule",
    "device_num_sms",
    "passes_per_token",
    "resolve_device",
]

SCHEDULE_TOKENS_PER_UNIT = 64
"""KV tokens per schedule work unit. The logits kernels' tile (`kTile`, WGMMA's M) is this
size too; `flashinfer_attn_scores`' launchers import it from here."""

SCHEDULE_REQUEST_ENTRY_UNITS = 4
"""Virtual units charged for entering a non-empty request (the policy in this module's
docstring, shown under "CTA schedule"). A request switch inside a CTA's run cost the H200's
fp8 kernel 0.5-1.0 us of streaming (about 2-4 units at next_n 1); charging 3-4 units measured
best (kernel notes, thirty-fourth round)."""

DEFAULT_CPU_NUM_SMS = 132
"""SM count assumed for CPU tensors: an H100 SXM / H200 has 132 SMs. CPU tensors run the
reference, which ignores the schedule, so this only fixes the shape a CPU `schedule_meta`
must have (`[133, 2]`) unless the caller passes `num_sms`."""

SCHEDULE_VARIANTS = ("fp8", "fp4")

# fp4's kernel is specialised for next_n 1..4 only.
_FP4_MAX_NEXT_N = 4

# Rows of the schedule the torch implementation computes at once (its memory beside `out`).
_CPU_ROWS_PER_CHUNK = 1 << 20
# Largest accepted `num_sms`: the CUDA kernel takes it as an int32.
_MAX_NUM_SMS = 2**31 - 1

# Request indices, the sentinel `batch_size` included, are stored as int32.
_MAX_BATCH_SIZE = 2**31 - 1

# Largest `passes` the schedule can store: the unit index within a request is an int32, and a
# request of 2**31 - 1 tokens has ceil((2**31 - 1) / 64) = 2**25 units per pass, so at most
# 2**31 / 2**25 = 64 passes keep every index below 2**31 (and the kernel's int64 sums exact).
# `passes_per_token` returns 1 today; the op's own check enforces this bound.
_MAX_PASSES = 2**31 // -(-(2**31 - 1) // SCHEDULE_TOKENS_PER_UNIT)


def _check_variant_next_n(variant: object, next_n: object) -> int:
    if not isinstance(variant, str):
        raise TypeError(
            f"variant must be a str, one of {SCHEDULE_VARIANTS}, got {describe(variant)}"
        )
    if variant not in SCHEDULE_VARIANTS:
        raise ValueError(f"variant must be one of {SCHEDULE_VARIANTS}, got {variant!r}")
    next_n = check_int("next_n", next_n)
    if next_n < 1:
        raise ValueError(f"next_n must be >= 1, got {shown(next_n)}")
    if variant == "fp4" and next_n > _FP4_MAX_NEXT_N:
        raise ValueError(
            f"next_n must be in 1..{_FP4_MAX_NEXT_N} for variant='fp4', got {shown(next_n)}"
        )
    return next_n


def _check_num_sms(num_sms: object, expected: str = "an int or None") -> int:
    num_sms = check_int("num_sms", num_sms, expected)
    if not 1 <= num_sms <= _MAX_NUM_SMS:
        raise ValueError(f"num_sms must be in 1..{_MAX_NUM_SMS} (2**31 - 1), got {shown(num_sms)}")
    return num_sms


def _check_passes(passes: object) -> int:
    passes = check_int("passes", passes)
    if not 1 <= passes <= _MAX_PASSES:
        raise ValueError(f"passes must be in 1..{_MAX_PASSES}, got {shown(passes)}")
    return passes


def passes_per_token(variant: str, next_n: int) -> int:
    """Return how many times the kernel of a configuration visits each KV work unit.

    On SM90 every supported configuration scores all `next_n` draft positions in a single
    pass over the KV, so this is 1 for every case. It exists so that a future split (for
    example a two-pass fp4 `next_n=4`) changes the schedule in exactly one place.

    Args:
        variant: `"fp8"` or `"fp4"`.
        next_n: Query positions per request (`q.shape[1]`), `>= 1`; `1..4` for fp4.

    Returns:
        The number of passes, currently always 1.

    Raises:
        TypeError: `variant` is not a str, or `next_n` is not an integer (a Python or numpy
            int; a bool is refused).
        ValueError: `variant` is unknown or `next_n` is out of range for it.
    """
    _check_variant_next_n(variant, next_n)
    return 1


def resolve_device(device: object) -> torch.device:
    """The `torch.device` a `device` argument names, as the schedule helpers read it (also
    used by `flashinfer_attn_scores.precompile_paged_mqa_logits`).

    Args:
        device: A `torch.device`, a str such as `"cuda:1"` or `"cpu"`, or an int (a CUDA
            index; a numpy integer too, in eager calls). A CUDA device without an index is
            the current one.

    Returns:
        The device, with its index filled in for CUDA. Any device type is returned; callers
        check the types they support.

    Raises:
        TypeError: `device` is of another type (bool included).
        ValueError: It does not parse as a device, CUDA is not available in this process, or
            the CUDA index is not that of a visible device.
    """
    if not isinstance(device, (torch.device, str, int)):
        device = numpy_int_as_int(device)  # a numpy integer as the index it holds
    if isinstance(device, torch.device):
        resolved = device
    elif isinstance(device, (str, int)) and not isinstance(device, bool):
        try:
            # An int is a CUDA index; `torch.device(int)` would ask for the current
            # accelerator instead, and fail on a torch without one before the check below.
            resolved = (
                torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
            )
        except (RuntimeError, ValueError, OverflowError) as err:  # 2**63: "Overflow when unpacking"
            raise ValueError(f"device: cannot parse {device!r} as a torch device ({err})") from err
    else:
        raise TypeError(
            f"device must be a torch.device, str or int, got {describe(device)}{int_hint(device)}"
        )
    if resolved.type == "cuda":
        resolved = _resolve_cuda_device(resolved, device)
    return resolved


@torch.compiler.assume_constant_result
def _visible_cuda_devices() -> int:
    """CUDA devices this process sees, 0 without CUDA. Run once while torch.compile traces a
    caller (dynamo cannot put these int-returning torch.cuda queries in a graph)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _resolve_cuda_device(resolved: torch.device, given: object) -> torch.device:
    # Checked here because torch answers both cases with a bare AssertionError
    # ("Torch not compiled with CUDA enabled", "Invalid device id").
    count = _visible_cuda_devices()
    if count == 0:
        raise ValueError(
            f"device: got {given!r}, but CUDA is not available in this process "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda is not None})"
        )
    if resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    if resolved.index >= count:
        raise ValueError(
            f"device: got {given!r}, but only {count} CUDA device(s) are visible "
            f"(valid indices 0..{count - 1})"
        )
    return resolved


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality where every CPU device is the same one: torch allocates `cpu:1` on
    the one CPU (`torch.empty(1, device="cpu:1").device` is `cpu`)."""
    if a.type != b.type:
        return False
    return a.type == "cpu" or a.index == b.index


# SM count per CUDA device index, fixed for the life of the process: the property query costs
# ~10 us of host time per call on the H200 host (2026-11-29), paid on every logits call. A
# plain dict rather than functools.cache, which torch.compile warns about when it traces the
# public functions (they check a given schedule's shape against this count).
_SM_COUNTS: dict[int, int] = {}


def _cuda_multiprocessors(index: int) -> int:
    if torch.compiler.is_compiling():
        # Dynamo folds the property query to a constant; reading or filling the dict would
        # guard on its contents and recompile once an eager call adds an entry.
        return int(torch.cuda.get_device_properties(index).multi_processor_count)
    count = _SM_COUNTS.get(index)
    if count is None:
        count = int(torch.cuda.get_device_properties(index).multi_processor_count)
        _SM_COUNTS[index] = count
    return count


def device_num_sms(device: torch.device | str | int) -> int:
    """Return the SM count a schedule for `device` is built for.

    Args:
        device: The target device. For a CUDA device this is the GPU's multiprocessor count;
            for the CPU it is `DEFAULT_CPU_NUM_SMS` (132, an H100 SXM / H200), since CPU
            tensors run the reference and only the schedule's shape matters there.

    Returns:
        The number of SMs (rows of the schedule minus one).

    Raises:
        TypeError: `device` is not a device, str or int.
        ValueError: The device type is neither CUDA nor CPU, CUDA is not available, or the
            CUDA device index is not that of a visible device.
    """
    dev = resolve_device(device)
    if dev.type == "cuda":
        return _cuda_multiprocessors(dev.index)
    if dev.type == "cpu":
        return DEFAULT_CPU_NUM_SMS
    raise ValueError(f"device: expected a CUDA or CPU device, got {dev}")


def _check_dense(name: str, t: torch.Tensor) -> None:
    if t.is_nested:  # the older nested layout reports torch.strided, and has no sizes
        raise TypeError(f"{name} must be a dense (torch.strided) tensor, got a nested tensor")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (torch.strided) tensor, got layout {t.layout}")
    # A negated view's memory holds the negated values, which the CUDA kernel would read.
    # (Not while torch.compile traces: dynamo cannot trace is_neg().)
    if not torch.compiler.is_compiling() and t.is_neg():
        raise TypeError(f"{name} is a negated view (is_neg() is True); pass {name}.resolve_neg()")


def _check_seq_lens(seq_lens: object) -> None:
    """What the CUDA kernel reads: a dense 1-D int32 tensor (`const int*` at `b * stride(0)`)
    of at most 2**31 - 1 requests, on a CUDA or CPU device."""
    if not isinstance(seq_lens, torch.Tensor):
        raise TypeError(f"seq_lens must be a torch.Tensor, got {type_name(seq_lens)}")
    _check_dense("seq_lens", seq_lens)
    if seq_lens.device.type not in ("cuda", "cpu"):
        raise ValueError(f"seq_lens must be on a CUDA or CPU device, got {seq_lens.device}")
    if seq_lens.dtype != torch.int32:
        raise TypeError(f"seq_lens must have dtype torch.int32, got {seq_lens.dtype}")
    if seq_lens.dim() != 1:
        raise ValueError(
            f"seq_lens must be 1-D [batch_size], got {seq_lens.dim()}-D shape {sizes(seq_lens.shape)}"
        )
    if seq_lens.shape[0] > _MAX_BATCH_SIZE:
        raise ValueError(
            f"seq_lens must have at most {_MAX_BATCH_SIZE} (2**31 - 1) requests, "
            f"got {seq_lens.shape[0]}"
        )


def _check_out(out: object, num_sms: int, device: torch.device) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type_name(out)}")
    _check_dense("out", out)
    if out.dtype != torch.int32:
        raise TypeError(f"out must have dtype torch.int32, got {out.dtype}")
    expected = (num_sms + 1, 2)
    if tuple(out.shape) != expected:
        raise ValueError(
            f"out must have shape [num_sms + 1, 2] = {sizes((num_sms + 1, 2))} "
            f"(num_sms={shown(num_sms)}), got {sizes(out.shape)}"
        )
    if not out.is_contiguous():
        # Both sizes are >= 2 here, so contiguous means exactly these strides.
        raise ValueError(
            f"out must be contiguous, with strides (2, 1), got strides {strides(out.stride())}"
        )
    if not _same_device(out.device, device):
        raise ValueError(f"out must be on the target device {device}, got {out.device}")
    if plain_eager() and out.is_inference() and not torch.is_inference_mode_enabled():
        raise inference_out_error()  # the direct CUDA launch would write it unnoticed
    return out


def _check_out_apart(out: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """Refuse an `out` that shares bytes with `seq_lens` (the CUDA kernel writes rows of `out`
    before it has read every length, so its schedule would depend on the overlap)."""
    if seq_lens.numel() == 0 or not plain_eager():  # tracers' tensors have no addresses
        return
    first, last = out.data_ptr(), out.data_ptr() + out.numel() * 4  # contiguous int32
    base, step = seq_lens.data_ptr(), seq_lens.stride(0) * 4
    if step == 0:
        hit = base < last and base + 4 > first
    else:  # the first length ending after `first`, then whether it starts before `last`
        i = max(0, (first - base - 4) // step + 1)
        hit = i < seq_lens.shape[0] and base + i * step < last
    if hit:
        raise ValueError(
            f"out shares memory with seq_lens (out bytes [{first:#x}, {last:#x}), seq_lens "
            f"from {base:#x} with stride {seq_lens.stride(0)}); pass an out of its own"
        )


def _compute_schedule_torch(
    seq_lens: torch.Tensor, num_sms: int, next_n: int, variant: str, out: torch.Tensor
) -> torch.Tensor:
    """Reference implementation of the policy in the module docstring (vectorised, no sync)."""
    passes = passes_per_token(variant, next_n)
    tokens = SCHEDULE_TOKENS_PER_UNIT
    entry = SCHEDULE_REQUEST_ENTRY_UNITS
    # Negative lengths are meaningless; treat them as empty requests rather than letting
    # them cancel other requests' work in the running sum.
    lens = seq_lens.to(torch.int64).clamp_min(0)
    units = (lens + (tokens - 1)) // tokens * passes
    cost = torch.where(units > 0, units + entry, 0)
    cost_end = torch.cumsum(cost, dim=0)  # inclusive prefix sum: end of request b's positions
    total = cost.sum()
    cost_begin = torch.cat([cost_end - cost, total.reshape(1)])

    def rows(first: int, stop: int) -> None:
        sm = torch.arange(first, stop, dtype=torch.int64, device=lens.device)
        start = (total // num_sms) * sm + torch.minimum(sm, total % num_sms)
        # First request whose positions end after `start`: skips zero-length requests, and
        # gives batch_size when `start == total`.
        request = torch.searchsorted(cost_end, start, right=True)
        # The entry positions belong to unit 0; the sentinel's `start - total - entry` is < 0.
        unit = (start - cost_begin[request] - entry).clamp_min(0)
        out[first:stop].copy_(torch.stack([request, unit], dim=1))

    # Eagerly in chunks: a row's int64 temporaries take about 9x its 8 bytes in `out`, which for
    # num_sms near its 2**31 - 1 limit would be tens of GB beside the result. Traced in one
    # pass, so that torch.compile does not specialise on num_sms through the loop.
    if torch.compiler.is_compiling() or num_sms < _CPU_ROWS_PER_CHUNK:
        rows(0, num_sms + 1)
    else:
        for first in range(0, num_sms + 1, _CPU_ROWS_PER_CHUNK):
            rows(first, min(num_sms + 1, first + _CPU_ROWS_PER_CHUNK))
    return out


def _compute_schedule_cuda(
    seq_lens: torch.Tensor, num_sms: int, next_n: int, variant: str, out: torch.Tensor
) -> torch.Tensor:
    """One small CUDA kernel (`csrc/paged_mqa_logits_schedule.cu`), bit-identical to
    `_compute_schedule_torch` and free of host synchronisation (graph-capturable). Under a
    tracer (torch.compile, `torch.jit.trace`, a dispatch mode such as `make_fx`) it goes
    through the custom op of `custom_ops.py`, which the trace records."""
    passes = passes_per_token(variant, next_n)
    if not plain_eager():
        torch.ops.flashinfer_schedule.paged_mqa_logits_schedule_into(seq_lens, num_sms, passes, out)
        return out
    from ._schedule_cuda import launch_schedule_kernel

    return launch_schedule_kernel(
        seq_lens, num_sms, passes, SCHEDULE_TOKENS_PER_UNIT, SCHEDULE_REQUEST_ENTRY_UNITS, out
    )


def compute_paged_mqa_logits_schedule(
    seq_lens: torch.Tensor,
    device: torch.device | str | int | None = None,
    *,
    next_n: int = 1,
    variant: str = "fp8",
    out: torch.Tensor | None = None,
    num_sms: int | None = None,
) -> torch.Tensor:
    """Compute the CTA schedule tensor for paged MQA logits kernels.

    The persistent logits kernels launch one CTA per SM; this tensor tells CTA `i` at which
    `(request, KV segment)` its share of the work starts, and row `i + 1` where it stops.
    Pass the result to `fp8_paged_mqa_logits` / `fp4_paged_mqa_logits` as `schedule_meta` to
    skip the per-call schedule computation. Treat it as opaque: the spec lets it depend on the
    contents of `seq_lens`, on `next_n`, on the variant and on the target device's SM count, so
    recompute it (into the same buffer under CUDA graphs) whenever any of those change. (The
    SM90 policy reads only `seq_lens` and the SM count: every configuration scores all draft
    slots in one pass, so a schedule built with another `next_n` or variant is the same tensor
    and the logits calls accept it, validate mode included.) The spec leaves
    a stale schedule undefined (it may hang another kernel); the SM90 kernels of
    `flashinfer-attn-scores` bound every walk by `seq_lens`, but can leave logits wrong or
    unwritten.

    On CUDA tensors the computation is one small kernel with no host synchronisation, so it
    can be captured in a CUDA graph. On the CPU the same policy runs with plain torch ops and
    gives an identical result for the same `num_sms`. Both trace under
    `torch.compile(fullgraph=True)`: there the CUDA launch is the in-place custom op
    `torch.ops.flashinfer_schedule.paged_mqa_logits_schedule_into`.

    Args:
        seq_lens: `[batch_size]` int32 KV length per request, any stride. Negative entries are
            treated as 0 (they violate the logits kernels' contract anyway).
        device: Target device whose SM count sizes the schedule and on which the result is
            allocated. Defaults to `seq_lens.device`. If it differs from `seq_lens.device`,
            `seq_lens` is copied there first (a host round-trip, not allowed during CUDA-graph
            capture).
        next_n: Query positions per request, the logits call's `q.shape[1]`: `>= 1` for
            `"fp8"`, `1..4` for `"fp4"`. Must match the call the schedule is for.
        variant: `"fp8"` or `"fp4"`, matching the logits function the schedule is for.
        out: Optional `[num_sms + 1, 2]` int32 contiguous tensor on the target device, written
            in place and returned (for CUDA-graph-stable addresses).
        num_sms: Override of the SM count. Defaults to the CUDA device's multiprocessor count,
            or to 132 (`DEFAULT_CPU_NUM_SMS`, an H100 SXM / H200) for the CPU. The logits ops
            only accept a schedule built for their device's own SM count. At most
            2**31 - 1: the CUDA kernel takes the SM count as an int32.

    Returns:
        `[num_sms + 1, 2]` int32 tensor on the target device: row `i < num_sms` is the
        `(request index, 64-token unit index within the request)` where SM `i` starts, and the
        last row is the sentinel `(batch_size, 0)`. SMs left without work (fewer virtual units
        than SMs, a share that holds only a request's entry charge, or all lengths zero)
        start and stop at the same row, `(batch_size, 0)` when nothing is left. The policy
        (an even split of the units plus `SCHEDULE_REQUEST_ENTRY_UNITS` per request) is in
        the docstring of `flashinfer_schedule.schedule`, shown at the head of the API page's
        "CTA schedule" section; treat the rows as opaque all the same.

    Raises:
        TypeError: `seq_lens`/`out` is not a dense tensor of dtype int32, or `variant`/
            `next_n`/`num_sms`/`device` has the wrong type (integers may be Python or numpy
            ints, not bools or tensors).
        ValueError: `seq_lens` is not 1-D or has 2**31 or more entries, `variant` is unknown,
            `next_n` or `num_sms` (1..2**31 - 1) is out of range, `out` has the wrong shape,
            layout or device or shares memory with `seq_lens` (checked on eager calls; a
            trace has no addresses), the device type is neither
            CUDA nor CPU, CUDA is not available, or the CUDA device index is not that of a
            visible device.
        RuntimeError: `out` is an inference tensor and the call is outside inference mode.
    """
    _check_seq_lens(seq_lens)
    next_n = _check_variant_next_n(variant, next_n)
    target = seq_lens.device if device is None else resolve_device(device)
    if target.type not in ("cuda", "cpu"):
        raise ValueError(f"device: expected a CUDA or CPU device, got {target}")
    if num_sms is None:
        num_sms = device_num_sms(target)
    else:
        num_sms = _check_num_sms(num_sms)
    if out is None:
        out = torch.empty(num_sms + 1, 2, dtype=torch.int32, device=target)
    else:
        _check_out(out, num_sms, target)
        if _same_device(seq_lens.device, target):
            _check_out_apart(out, seq_lens)
    if not _same_device(seq_lens.device, target):
        seq_lens = seq_lens.to(target)
    if target.type == "cuda":
        return _compute_schedule_cuda(seq_lens, num_sms, next_n, variant, out)
    return _compute_schedule_torch(seq_lens, num_sms, next_n, variant, out)
