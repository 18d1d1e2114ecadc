"""The same call on CPU and CUDA tensors behaves the same (SM90 GPU).

Both ops run the float64 reference for CPU tensors and the SM90 kernel for CUDA tensors
behind one validation, so a call must either raise the same exception, with the same message
apart from device names, on both devices, or return results that agree within the GPU
suite's kernel tolerance (the CPU result is the float64 reference rounded to the output
dtype), leaving the same parts of a NaN-poisoned `out` untouched.

Each entry of MUTATIONS changes one argument of a valid call (or a consistent pair, where a
valid call needs it): a dtype, rank, size, layout (strides, expand, step slices, storage
offsets), Python type, keyword argument, `out=` or `schedule_meta` variant, batch 0, all
lengths zero. The mutated arguments are built once on the CPU and reproduced on the GPU view
for view (`same_view_on`), then the call runs on both devices.

Documented differences, asserted as such instead of counted as failures:

1. CUDA refuses a `kv_fused` whose address is not 16-byte aligned (the kernel reads it with
   TMA); the CPU reference accepts it (`cuda=` in the table).
2. The device-data preconditions (lengths in [0, max_seq_len], the table wide enough, block
   ids read inside the pool) are always checked on the CPU (the reference raises) but on
   CUDA only with FLASHINFER_VALIDATE_INPUTS=1. Mutations that break them run on both
   devices in validate mode, and on the CPU alone without it (`validate=True`); a CUDA call
   that breaks them without validate mode would access memory out of bounds and never runs.
   A stale caller schedule is likewise only caught in validate mode (it can leave logits wrong
   or unwritten on CUDA).
3. A pool of zero blocks with nonzero lengths: the CPU raises; on CUDA the contract leaves it
   undefined (no kernel runs and the rows stay unwritten); without validate mode it runs on
   the CPU only (`cuda_runs=False`).
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import flashinfer_attn_scores as fa
import numpy as np
import pytest
import torch
from attn_scores_cases import (
    accumulation_error,
    assert_rows_close,
    make_fp4_case,
    make_fp8_case,
)
from flashinfer_attn_scores.paged_mqa_logits import fp8_sm90
from flashinfer_attn_scores.paged_mqa_logits.reference import (
    fp4_paged_mqa_logits_reference,
    fp8_paged_mqa_logits_reference,
    valid_mask,
)
from test_gpu import tolerance

pytestmark = pytest.mark.gpu

GPU = "cuda"
VALIDATE = "FLASHINFER_VALIDATE_INPUTS"

# Around block and tile edges, an empty request between non-empty ones.
LENS = [1, 127, 0, 129, 300]
MAX_SEQ_LEN = 320
NEXT_N = 2

# The base case of each variant: make_*_case and its parameters.
CASES = {
    "fp8": (make_fp8_case, {"num_heads": 64, "head_dim": 128, "block_size": 64, "seed": 1}),
    # A parametric geometry.
    "fp8_small": (make_fp8_case, {"num_heads": 8, "head_dim": 32, "block_size": 32, "seed": 2}),
    "fp4": (make_fp4_case, {"block_size": 64, "seed": 3}),
}
ALL = tuple(CASES)
FP8 = ("fp8", "fp8_small")
FP4 = ("fp4",)
MAIN = ("fp8", "fp4")  # kernel configurations of their own (dtypes): the two DeepSeek shapes

POSITIONAL = {
    "fp8": ("q", "kv_fused", "weights", "block_tables", "seq_lens", "max_seq_len"),
    "fp4": ("q", "q_sf", "kv_fused", "weights", "block_tables", "seq_lens", "max_seq_len"),
}
OPS = {"fp8": fa.fp8_paged_mqa_logits, "fp4": fa.fp4_paged_mqa_logits}
REFERENCES = {"fp8": fp8_paged_mqa_logits_reference, "fp4": fp4_paged_mqa_logits_reference}
DEFAULT_OUTPUT_DTYPE = {"fp8": torch.float32, "fp4": torch.bfloat16}
# The CPU result is the float64 reference rounded once to the output dtype: at most this
# fraction of the element, which is at most the row's largest sum of |head terms|.
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
EXTRA_POSITIONAL = "*extra positional"  # an args key: values appended to the positional ones
AUTO = "default out"  # the base `out`: a NaN-poisoned buffer sized for the (mutated) call


def family(variant: str) -> str:
    return "fp4" if variant == "fp4" else "fp8"


class Args(dict):
    """A call's arguments by parameter name, with the variant they are for."""

    def __init__(self, variant: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.variant = variant


@dataclass(frozen=True)
class OnDevice:
    """An argument made on each device from that device's other arguments (a schedule, a
    tensor on the other device), instead of copied from the CPU."""

    make: Callable[[torch.device, Args], object]


@dataclass(frozen=True)
class Expect:
    """Success (`error` None), or an exception of type `error` whose message matches."""

    error: type[Exception] | None = None
    match: str = ""

    def check(self, where: str, outcome: object) -> None:
        if self.error is None:
            assert not isinstance(outcome, Exception), f"{where}: {describe(outcome)}"
        else:
            assert isinstance(outcome, self.error), f"{where}: {describe(outcome)}"
            assert re.search(self.match, str(outcome)), f"{where}: {describe(outcome)}"


OK = Expect()


def raises(error: type[Exception], match: str) -> Expect:
    return Expect(error, match)


class Length(int):
    """An int subclass, as a typed config field may hold (the API asks for an int)."""


# ------------------------------------------------------------------ arguments and views


def base_args(variant: str, lens=LENS, **changes) -> Args:
    """The valid call of `variant` (a fresh case), `changes` to its case parameters."""
    make, params = CASES[variant]
    params = {"next_n": NEXT_N, "max_seq_len": MAX_SEQ_LEN, "spare_blocks": 5, **params}
    case = make(lens, **{**params, **changes})
    args = Args(variant, {name: getattr(case, name) for name in POSITIONAL[family(variant)]})
    args["out"] = AUTO
    return args


def default_out(args: Args):
    """A NaN-poisoned `out` for the call, or None where the call has no such shape."""
    q, max_seq_len = args.get("q"), args.get("max_seq_len")
    dtype = args.get("output_dtype", DEFAULT_OUTPUT_DTYPE[family(args.variant)])
    if (
        isinstance(q, torch.Tensor)
        and q.dim() == 4
        and isinstance(max_seq_len, (int, np.integer))
        and not isinstance(max_seq_len, bool)
        and 0 <= max_seq_len <= 2**16
        and dtype in UNIT_ROUNDOFF
    ):
        # All NaN, taller and wider than needed: assert_written_only_where_allowed reads
        # every element outside the writable region as NaN.
        rows, cols = q.shape[0] * q.shape[1] + 2, fa.padded_seq_len(int(max_seq_len)) + 256
        return nan_buffer(rows, cols, dtype=dtype)
    return None


def mutated_args(variant: str, name: str) -> Args:
    args = base_args(variant)
    args.update(MUTATIONS[name].change(args))
    if args.get("out") is AUTO:
        args["out"] = default_out(args)
    return args


def same_view_on(value: object, device: torch.device) -> object:
    """`value` on `device` as the same view of a copy of its whole storage: shape, strides and
    storage offset kept (`to()` would make a step slice or an expand() contiguous), so the
    address keeps its alignment modulo 16; the neg bit, requires_grad and the Parameter type
    with it. Tensors that share a storage no longer share it there. Non-tensors and meta
    tensors stay as they are; other non-strided tensors (sparse) go through `to()`."""
    if not isinstance(value, torch.Tensor) or value.device.type == "meta":
        return value
    if value.layout != torch.strided:
        return value.to(device)
    raw = torch.empty(0, dtype=torch.uint8).set_(value.untyped_storage())
    storage = raw.to(device, copy=True).untyped_storage()
    moved = torch.empty(0, dtype=value.dtype, device=device).set_(
        storage, value.storage_offset(), value.shape, value.stride()
    )
    assert (moved.stride(), moved.storage_offset()) == (value.stride(), value.storage_offset())
    assert moved.data_ptr() % 16 == value.data_ptr() % 16
    if value.is_neg():
        moved = torch._neg_view(moved)
    if value.requires_grad:
        moved.requires_grad_()
    if isinstance(value, torch.nn.Parameter):
        moved = torch.nn.Parameter(moved, requires_grad=value.requires_grad)
    return moved


def on_device(args: Args, device: torch.device) -> Args:
    moved = Args(args.variant, {name: same_view_on(value, device) for name, value in args.items()})
    for name, value in moved.items():
        if isinstance(value, OnDevice):
            moved[name] = value.make(device, moved)
    return moved


def other_device(device: torch.device) -> torch.device:
    return torch.device(GPU) if device.type == "cpu" else torch.device("cpu")


def with_offset(t: torch.Tensor, elements: int) -> torch.Tensor:
    """The same values starting `elements` into a buffer."""
    buffer = torch.zeros(t.numel() + elements, dtype=t.dtype, device=t.device)
    view = buffer[elements:].view(t.shape)
    return view.copy_(t)


def step_copy(t: torch.Tensor, dim: int, step: int = 2) -> torch.Tensor:
    """The same values as every `step`-th entry along `dim` of a larger buffer."""
    shape = list(t.shape)
    shape[dim] *= step
    index = [slice(None)] * t.dim()
    index[dim] = slice(None, None, step)
    return torch.zeros(shape, dtype=t.dtype)[tuple(index)].copy_(t)


def column_major(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def pitched(kv_fused: torch.Tensor, extra_bytes: int) -> torch.Tensor:
    """The same blocks in a pool view whose pitch is `extra_bytes` wider than a block."""
    num_blocks, block_bytes = kv_fused.shape[0], kv_fused[0].numel()
    storage = torch.zeros(num_blocks, block_bytes + extra_bytes, dtype=torch.uint8)
    storage[:, :block_bytes] = kv_fused.reshape(num_blocks, block_bytes)
    return storage[:, :block_bytes].view(kv_fused.shape)


def layer_of_cache(kv_fused: torch.Tensor, layers: int = 2, layer: int = 1) -> torch.Tensor:
    """The same blocks as layer `layer` of a layer-interleaved cache (pitch `layers` blocks)."""
    num_blocks, block_bytes = kv_fused.shape[0], kv_fused[0].numel()
    cache = torch.zeros(num_blocks, layers, block_bytes, dtype=torch.uint8)
    cache[:, layer] = kv_fused.reshape(num_blocks, block_bytes)
    return cache[:, layer].view(kv_fused.shape)


def nan_buffer(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


def out_dtype(a: Args) -> torch.dtype:
    return a.get("output_dtype", DEFAULT_OUTPUT_DTYPE[family(a.variant)])


def out_shape(a: Args) -> tuple[int, int]:
    """(batch_size*next_n, padded_seq_len(max_seq_len)) of the valid call."""
    return a["q"].shape[0] * a["q"].shape[1], fa.padded_seq_len(a["max_seq_len"])


def schedule(transform=lambda s: s, lens=None) -> OnDevice:
    """The call's schedule built on each device (its shape follows the device's SM count),
    from `lens` where given (stale), then `transform`ed."""

    def make(device: torch.device, a: Args):
        source = a["seq_lens"] if lens is None else lens.to(device)
        fresh = fa.compute_paged_mqa_logits_schedule(
            source, device, next_n=a["q"].shape[1], variant=family(a.variant)
        )
        return transform(fresh)

    return OnDevice(make)


def table_with(a: Args, row: int, column: int, value: int) -> dict:
    table = a["block_tables"].clone()
    table[row, column] = value
    return {"block_tables": table}


def lens_with(a: Args, request: int, length: int, *more: tuple[int, int]) -> dict:
    """seq_lens with `request`'s length set to `length`, and each further (request, length)."""
    lens = a["seq_lens"].clone()
    for r, n in ((request, length), *more):
        lens[r] = n
    return {"seq_lens": lens}


def on_other_device(name: str) -> Callable[[Args], dict]:
    """Argument `name` on the device other than the call's."""

    def change(a: Args) -> dict:
        value = a[name] if name != "out" else nan_buffer(*out_shape(a), dtype=out_dtype(a))
        return {name: OnDevice(lambda device, _: value.to(other_device(device)))}

    return change


def fp8_too_wide_head(a: Args) -> Args:
    _, next_n, num_heads, _ = a["q"].shape
    return base_args(a.variant, head_dim=fp8_sm90.largest_fitting_head_dim(num_heads, next_n) + 32)


BLOCK_PITCH = r"kv_fused blocks must not overlap and must start at multiples of 16 bytes"
BAD_BLOCK = r"block_tables\[\d+, \d+\] = -?\d+ is not a block of kv_fused"  # validate mode
BAD_BLOCK_CPU = r"block_tables\[\d+, \d+\] = -?\d+ is outside kv_fused's"  # the reference
UNALIGNED_POOL = r"kv_fused must start at a 16-byte aligned address on CUDA"


@dataclass(frozen=True)
class Mutation:
    """`change(args)` returns the arguments to replace in a fresh valid call; `expect` is the
    outcome on both devices. `validate`: run both in validate mode (a device-data
    precondition is broken, difference 2), and the CPU alone without it, expecting
    `unvalidated_cpu` there. `cuda`: CUDA's documented outcome where it differs from the
    CPU's (difference 1). `cuda_runs=False`: undefined behaviour on CUDA (difference 3)."""

    change: Callable[[Args], dict]
    expect: Expect
    variants: tuple[str, ...] = ALL
    validate: bool = False
    unvalidated_cpu: Expect | None = None
    cuda: Expect | None = None
    cuda_runs: bool = True


M = Mutation
MUTATIONS: dict[str, Mutation] = {
    # ---- q
    "q_none": M(lambda a: {"q": None}, raises(TypeError, "q must be a torch.Tensor, got NoneType")),
    "q_float16": M(
        lambda a: {"q": a["q"].view(torch.uint8).to(torch.float16)},
        raises(TypeError, r"q must have dtype torch\.\w+, got torch.float16"),
    ),
    "q_rank_3": M(lambda a: {"q": a["q"][0]}, raises(ValueError, "q must be 4-D")),
    "q_one_request_more": M(
        lambda a: {"q": torch.cat([a["q"], a["q"][:1]])},
        raises(ValueError, r"(weights|q_sf)\.shape\[0\] must be batch_size"),
    ),
    "q_head_dim_halved": M(
        lambda a: {"q": a["q"][..., : a["q"].shape[3] // 2]},
        raises(ValueError, r"kv_fused.shape\[3\] must be head_dim \+ 4|must be 128 for the FP4"),
    ),
    "q_on_meta": M(
        lambda a: {"q": a["q"].to("meta")},
        raises(RuntimeError, "q is on a 'meta' device; supported are CUDA tensors"),
    ),
    # Succeed: the kernel reads q as aligned 16-byte vectors, so these are copied first.
    "q_storage_offset_1": M(lambda a: {"q": with_offset(a["q"], 1)}, OK),
    "q_every_second_element": M(lambda a: {"q": step_copy(a["q"], 3)}, OK),
    "q_slot_expanded": M(lambda a: {"q": a["q"][:, :1].expand(a["q"].shape)}, OK),
    # ---- the fp8 kernel's geometry (rebuilt cases)
    "fp8_num_heads_6": M(
        lambda a: base_args(a.variant, num_heads=6),
        raises(ValueError, r"num_heads \(q.shape\[2\]\) must be a positive multiple of 4"),
        FP8,
    ),
    "fp8_head_dim_48": M(
        lambda a: base_args(a.variant, head_dim=48),
        raises(ValueError, r"head_dim \(q.shape\[3\]\) must be a positive multiple of 32, got 48"),
        FP8,
    ),
    "fp8_more_than_256_rows": M(
        lambda a: base_args(a.variant, next_n=256 // a["q"].shape[2] + 1),
        raises(ValueError, r"next_n \* num_heads must be a multiple of 8 in \[8, 256\]"),
        FP8,
    ),
    "fp8_head_dim_past_shared_memory": M(
        fp8_too_wide_head, raises(ValueError, "does not fit the SM90 kernel's shared memory"), FP8
    ),
    "block_size_16": M(
        lambda a: base_args(a.variant, block_size=16),
        raises(ValueError, r"block_size \(kv_fused.shape\[1\]\) must be one of \(32, 64, 128\)"),
    ),
    # ---- fp4: q_sf, the fixed shape, sf_vec_size, is_kv_sf_interleaved
    "fp4_num_heads_32": M(
        lambda a: {
            "q": a["q"][:, :, :32],
            "q_sf": a["q_sf"][..., :32],
            "weights": a["weights"][:, :32],
        },
        raises(ValueError, r"num_heads \(q.shape\[2\]\) must be 64 for the FP4 kernel, got 32"),
        FP4,
    ),
    "fp4_next_n_5": M(
        lambda a: base_args(a.variant, next_n=5),
        raises(ValueError, r"next_n \(q.shape\[1\]\) must be in 1..4 for the FP4 kernel, got 5"),
        FP4,
    ),
    "q_sf_recipe_shape": M(lambda a: {"q_sf": a["q_sf"][..., None]}, OK, FP4),
    "q_sf_as_uint8_bytes": M(
        lambda a: {"q_sf": a["q_sf"][..., None].view(torch.uint8)},
        raises(TypeError, "q_sf must have dtype torch.int32, got torch.uint8"),
        FP4,
    ),
    "q_sf_one_slot": M(
        lambda a: {"q_sf": a["q_sf"][:, :1]},
        raises(ValueError, r"q_sf.shape\[1\] must be next_n \(q.shape\[1\]\) = 2, got 1"),
        FP4,
    ),
    "q_sf_storage_offset_1": M(lambda a: {"q_sf": with_offset(a["q_sf"], 1)}, OK, FP4),
    "q_sf_every_second_head": M(lambda a: {"q_sf": step_copy(a["q_sf"], 2)}, OK, FP4),
    "sf_vec_size_16": M(
        lambda a: {"sf_vec_size": 16}, raises(ValueError, "sf_vec_size must be 32, got 16"), FP4
    ),
    "sf_vec_size_float": M(
        lambda a: {"sf_vec_size": 32.0},
        raises(TypeError, r"sf_vec_size must be an int, got float \(32.0\)"),
        FP4,
    ),
    "interleaved_int": M(
        lambda a: {"is_kv_sf_interleaved": 1},
        raises(TypeError, r"is_kv_sf_interleaved must be a bool, got int \(1\)"),
        FP4,
    ),
    "interleaved_at_block_size_64": M(
        lambda a: {"is_kv_sf_interleaved": True},
        raises(ValueError, "is_kv_sf_interleaved=True requires block_size 128, got block_size 64"),
        FP4,
    ),
    "interleaved_pool": M(
        lambda a: {
            **base_args(a.variant, block_size=128, interleaved=True),
            "is_kv_sf_interleaved": True,
        },
        OK,
        FP4,
    ),
    "acc_dtype_given_to_fp4": M(
        lambda a: {"acc_dtype": torch.float32},
        raises(TypeError, "got an unexpected keyword argument 'acc_dtype'"),
        FP4,
    ),
    # ---- kv_fused
    "kv_fused_numpy": M(
        lambda a: {"kv_fused": a["kv_fused"].numpy()},
        raises(TypeError, "kv_fused must be a torch.Tensor, got numpy.ndarray"),
    ),
    "kv_fused_int8": M(
        lambda a: {"kv_fused": a["kv_fused"].view(torch.int8)},
        raises(TypeError, "kv_fused must have dtype torch.uint8, got torch.int8"),
    ),
    "kv_fused_rank_3": M(
        lambda a: {"kv_fused": a["kv_fused"][:, :, 0]}, raises(ValueError, "kv_fused must be 4-D")
    ),
    "kv_fused_two_heads": M(
        lambda a: {"kv_fused": torch.cat([a["kv_fused"]] * 2, dim=2)},
        raises(
            ValueError,
            r"kv_fused.shape\[2\] must be the KV head count \(MQA: one KV head\) = 1, got 2",
        ),
    ),
    "kv_fused_block_bytes_strided": M(
        lambda a: {"kv_fused": step_copy(a["kv_fused"], 3)},
        raises(ValueError, "kv_fused must store each block's bytes contiguously"),
    ),
    "kv_fused_pitch_8_bytes_wider": M(
        lambda a: {"kv_fused": pitched(a["kv_fused"], 8)}, raises(ValueError, BLOCK_PITCH)
    ),
    "kv_fused_blocks_expanded": M(
        lambda a: {"kv_fused": a["kv_fused"][:1].expand(a["kv_fused"].shape)},
        raises(ValueError, BLOCK_PITCH),
    ),
    "kv_fused_on_meta": M(
        lambda a: {"kv_fused": a["kv_fused"].to("meta")},
        raises(ValueError, "kv_fused must be on q's device cpu, got meta"),
    ),
    "kv_fused_pitch_16_bytes_wider": M(lambda a: {"kv_fused": pitched(a["kv_fused"], 16)}, OK),
    "kv_fused_layer_of_interleaved_cache": M(
        lambda a: {"kv_fused": layer_of_cache(a["kv_fused"])}, OK
    ),
    "kv_fused_storage_offset_16": M(lambda a: {"kv_fused": with_offset(a["kv_fused"], 16)}, OK),
    "kv_fused_spare_blocks_appended": M(
        lambda a: {"kv_fused": torch.cat([a["kv_fused"], torch.zeros_like(a["kv_fused"][:7])])},
        OK,
    ),
    # Difference 1: TMA needs a 16-byte aligned pool; the CPU has no such need.
    "kv_fused_storage_offset_8": M(
        lambda a: {"kv_fused": with_offset(a["kv_fused"], 8)},
        OK,
        cuda=raises(ValueError, UNALIGNED_POOL),
    ),
    # Difference 2: a pool too small for the block ids read.
    "kv_fused_one_block": M(
        lambda a: {"kv_fused": a["kv_fused"][:1]},
        raises(ValueError, BAD_BLOCK),
        validate=True,
        unvalidated_cpu=raises(ValueError, BAD_BLOCK_CPU),
    ),
    # Difference 3: no blocks at all, nonzero lengths. Undefined on CUDA without validate
    # mode; in validate mode both devices refuse it before any launch.
    "kv_fused_no_blocks": M(
        lambda a: {"kv_fused": a["kv_fused"][:0]},
        raises(ValueError, r"is outside kv_fused's \[0, 0\) blocks"),
        cuda_runs=False,
    ),
    "kv_fused_no_blocks_validated": M(
        lambda a: {"kv_fused": a["kv_fused"][:0]},
        raises(ValueError, BAD_BLOCK + r": block ids read for seq_lens\[0\] = 1 .* = 0\)"),
        validate=True,
        unvalidated_cpu=raises(ValueError, r"is outside kv_fused's \[0, 0\) blocks"),
    ),
    "kv_fused_no_blocks_all_requests_empty": M(
        lambda a: {**base_args(a.variant, lens=[0, 0, 0]), "kv_fused": a["kv_fused"][:0]}, OK
    ),
    # ---- weights
    "weights_float16": M(
        lambda a: {"weights": a["weights"].half()},
        raises(TypeError, "weights must have dtype torch.float32, got torch.float16"),
    ),
    "weights_rank_3": M(
        lambda a: {"weights": a["weights"].view(len(LENS), NEXT_N, -1)},
        raises(ValueError, "weights must be 2-D"),
    ),
    "weights_one_row_short": M(
        lambda a: {"weights": a["weights"][:-1]},
        raises(
            ValueError,
            r"weights.shape\[0\] must be batch_size\*next_n \(q.shape\[0\]\*q.shape\[1\]\) = 10, got 9",
        ),
    ),
    "weights_half_the_heads": M(
        lambda a: {"weights": a["weights"][:, : a["weights"].shape[1] // 2]},
        raises(ValueError, r"weights.shape\[1\] must be num_heads \(q.shape\[2\]\)"),
    ),
    "weights_on_the_other_device": M(
        on_other_device("weights"),
        raises(ValueError, "weights must be on q's device (cpu|cuda:0), got (cpu|cuda:0)"),
    ),
    "weights_every_second_row": M(lambda a: {"weights": step_copy(a["weights"], 0)}, OK),
    "weights_column_major": M(lambda a: {"weights": column_major(a["weights"])}, OK),
    "weights_storage_offset_1": M(lambda a: {"weights": with_offset(a["weights"], 1)}, OK),
    "weights_row_expanded": M(
        lambda a: {"weights": a["weights"][:1].expand(a["weights"].shape)}, OK
    ),
    # A negated view (torch._neg_view) holds -weights in memory, which a kernel would read.
    "weights_neg_view": M(
        lambda a: {"weights": torch._neg_view(a["weights"])},
        raises(TypeError, r"weights is a negated view \(is_neg\(\) is True\)"),
    ),
    "out_neg_view": M(
        lambda a: {"out": torch._neg_view(nan_buffer(*out_shape(a), dtype=out_dtype(a)))},
        raises(TypeError, r"out is a negated view \(is_neg\(\) is True\)"),
    ),
    "weights_parameter_requiring_grad": M(
        lambda a: {"weights": torch.nn.Parameter(a["weights"].clone())}, OK
    ),
    # ---- block_tables
    "block_tables_int64": M(
        lambda a: {"block_tables": a["block_tables"].long()},
        raises(TypeError, "block_tables must have dtype torch.int32, got torch.int64"),
    ),
    "block_tables_rank_1": M(
        lambda a: {"block_tables": a["block_tables"].flatten()},
        raises(ValueError, "block_tables must be 2-D"),
    ),
    "block_tables_one_row_more": M(
        lambda a: {"block_tables": torch.cat([a["block_tables"], a["block_tables"][:1]])},
        raises(ValueError, r"block_tables.shape\[0\] must be batch_size \(q.shape\[0\]\) = 5"),
    ),
    "block_tables_entries_strided": M(
        lambda a: {"block_tables": step_copy(a["block_tables"], 1)},
        raises(ValueError, r"block_tables must have contiguous rows \(stride\(1\) == 1\)"),
    ),
    "block_tables_row_strided": M(
        lambda a: {"block_tables": a["block_tables"].repeat_interleave(2, dim=0)[::2]}, OK
    ),
    "block_tables_wider": M(
        lambda a: {"block_tables": torch.cat([a["block_tables"], a["block_tables"] * 0 - 7], 1)},
        OK,
    ),
    "block_tables_storage_offset_1": M(
        lambda a: {"block_tables": with_offset(a["block_tables"], 1)}, OK
    ),
    # Entries that are never read (the empty request's row) may hold anything.
    "block_tables_garbage_where_unread": M(lambda a: table_with(a, 2, 0, 2**31 - 1), OK),
    # Difference 2: block ids read outside the pool, a table too narrow.
    "block_tables_negative_id_read": M(
        lambda a: table_with(a, 1, 0, -1),
        raises(ValueError, r"block_tables\[1, 0\] = -1 is not a block of kv_fused"),
        validate=True,
        unvalidated_cpu=raises(ValueError, r"block_tables\[1, 0\] = -1 is outside"),
    ),
    "block_tables_id_past_the_pool_read": M(
        lambda a: table_with(a, 3, 1, a["kv_fused"].shape[0]),
        raises(ValueError, r"block_tables\[3, 1\] = \d+ is not a block of kv_fused"),
        validate=True,
        unvalidated_cpu=raises(ValueError, r"block_tables\[3, 1\] = \d+ is outside"),
    ),
    "block_tables_one_column": M(
        lambda a: {"block_tables": a["block_tables"][:, :1]},
        raises(ValueError, r"block_tables has 1 columns but max\(seq_lens\) = 300"),
        validate=True,
        unvalidated_cpu=raises(ValueError, r"block_tables has 1 columns but seq_lens\[1\] = 127"),
    ),
    # ---- seq_lens
    "seq_lens_list": M(
        lambda a: {"seq_lens": LENS}, raises(TypeError, "seq_lens must be a torch.Tensor, got list")
    ),
    "seq_lens_int64": M(
        lambda a: {"seq_lens": a["seq_lens"].long()},
        raises(TypeError, "seq_lens must have dtype torch.int32, got torch.int64"),
    ),
    "seq_lens_rank_2": M(
        lambda a: {"seq_lens": a["seq_lens"][None]}, raises(ValueError, "seq_lens must be 1-D")
    ),
    "seq_lens_one_short": M(
        lambda a: {"seq_lens": a["seq_lens"][:-1]},
        raises(ValueError, r"seq_lens.shape\[0\] must be batch_size \(q.shape\[0\]\) = 5, got 4"),
    ),
    "seq_lens_sparse": M(
        lambda a: {"seq_lens": a["seq_lens"].to_sparse()},
        raises(TypeError, "seq_lens must be a dense .* got layout torch.sparse_coo"),
    ),
    "seq_lens_every_second_element": M(
        lambda a: {"seq_lens": a["seq_lens"].repeat_interleave(2)[::2]}, OK
    ),
    "seq_lens_storage_offset_3": M(lambda a: {"seq_lens": with_offset(a["seq_lens"], 3)}, OK),
    "seq_lens_all_zero": M(lambda a: {"seq_lens": torch.zeros_like(a["seq_lens"])}, OK),
    "seq_lens_all_zero_expanded": M(
        lambda a: {"seq_lens": torch.zeros(1, dtype=torch.int32).expand(len(LENS))}, OK
    ),
    "seq_lens_all_zero_table_width_0": M(
        lambda a: {
            "seq_lens": torch.zeros_like(a["seq_lens"]),
            "block_tables": a["block_tables"][:, :0],
        },
        OK,
    ),
    # Difference 2: lengths outside [0, max_seq_len] or past the table's blocks.
    "seq_lens_negative": M(
        lambda a: lens_with(a, 0, -1),
        raises(ValueError, r"seq_lens\[0\] = -1 is negative"),
        validate=True,
        unvalidated_cpu=raises(ValueError, r"seq_lens\[0\] = -1 must be in \[0, max_seq_len"),
    ),
    # Two negative lengths, the later one lower: the first one is named.
    "seq_lens_two_negative": M(
        lambda a: lens_with(a, 1, -2, (3, -9)),
        raises(ValueError, r"seq_lens\[1\] = -2 is negative"),
        validate=True,
        unvalidated_cpu=raises(ValueError, r"seq_lens\[1\] = -2 must be in \[0, max_seq_len"),
    ),
    "seq_lens_past_max_seq_len": M(
        lambda a: lens_with(a, 4, MAX_SEQ_LEN + 1),
        raises(ValueError, r"max\(seq_lens\) = 321 \(request 4\) exceeds max_seq_len = 320"),
        validate=True,
        unvalidated_cpu=raises(ValueError, r"seq_lens\[4\] = 321 must be in \[0, max_seq_len"),
    ),
    "seq_lens_past_the_table_row": M(
        lambda a: lens_with(a, 1, 200),
        raises(ValueError, r"block_tables\[1, \d+\] = -1000000 is not a block of kv_fused"),
        validate=True,
        unvalidated_cpu=raises(ValueError, r"block_tables\[1, \d+\] = -1000000 is outside"),
    ),
    # ---- max_seq_len
    "max_seq_len_none": M(
        lambda a: {"max_seq_len": None},
        raises(TypeError, r"max_seq_len must be an int, got NoneType \(None\)"),
    ),
    "max_seq_len_float": M(
        lambda a: {"max_seq_len": float(MAX_SEQ_LEN)},
        raises(TypeError, "max_seq_len must be an int, got float"),
    ),
    # numpy integers are integers (the schedule helpers take them too); numpy bools are not.
    "max_seq_len_numpy_int": M(lambda a: {"max_seq_len": np.int64(MAX_SEQ_LEN)}, OK),
    "max_seq_len_numpy_int32": M(lambda a: {"max_seq_len": np.int32(MAX_SEQ_LEN)}, OK),
    "max_seq_len_numpy_bool": M(
        lambda a: {"max_seq_len": np.bool_(True)},
        raises(TypeError, r"max_seq_len must be an int, got numpy\.bool"),
    ),
    "max_seq_len_negative": M(
        lambda a: {"max_seq_len": -1}, raises(ValueError, "max_seq_len must be >= 0, got -1")
    ),
    "max_seq_len_span_2_31": M(
        lambda a: {"max_seq_len": 2**31}, raises(ValueError, r"output too large: .* < 2\*\*31")
    ),
    "max_seq_len_int_subclass": M(lambda a: {"max_seq_len": Length(MAX_SEQ_LEN)}, OK),
    "max_seq_len_larger": M(lambda a: {"max_seq_len": 1000}, OK),
    "max_seq_len_0_all_requests_empty": M(
        lambda a: {"seq_lens": torch.zeros_like(a["seq_lens"]), "max_seq_len": 0}, OK
    ),
    # Difference 2.
    "max_seq_len_below_the_longest": M(
        lambda a: {"max_seq_len": 200},
        raises(ValueError, r"max\(seq_lens\) = 300 \(request 4\) exceeds max_seq_len = 200"),
        validate=True,
        unvalidated_cpu=raises(ValueError, r"seq_lens\[4\] = 300 must be in \[0, max_seq_len"),
    ),
    # ---- batch 0
    "batch_0": M(lambda a: base_args(a.variant, lens=[]), OK),
    "batch_0_no_blocks": M(
        lambda a: {**base_args(a.variant, lens=[]), "kv_fused": a["kv_fused"][:0]}, OK
    ),
    # ---- dtype arguments
    "output_dtype_float16": M(lambda a: {"output_dtype": torch.float16}, OK, MAIN),
    "epi_dtype_float16": M(lambda a: {"epi_dtype": torch.float16}, OK, MAIN),
    "fp8_acc_dtype_float16": M(lambda a: {"acc_dtype": torch.float16}, OK, ("fp8",)),
    "fp4_output_dtype_float32": M(lambda a: {"output_dtype": torch.float32}, OK, FP4),
    "fp4_epi_dtype_bfloat16": M(lambda a: {"epi_dtype": torch.bfloat16}, OK, FP4),
    "fp8_output_dtype_bfloat16": M(
        lambda a: {"output_dtype": torch.bfloat16},
        raises(ValueError, "got torch.bfloat16: bfloat16 is deliberately unsupported"),
        FP8,
    ),
    "output_dtype_float64": M(
        lambda a: {"output_dtype": torch.float64},
        raises(ValueError, r"output_dtype must be one of \(.*\), got torch.float64"),
    ),
    "output_dtype_string": M(
        lambda a: {"output_dtype": "float32"},
        raises(TypeError, r"output_dtype must be a torch.dtype, got str \('float32'\)"),
    ),
    # ---- out
    "out_none": M(lambda a: {"out": None}, OK),
    "out_exact": M(lambda a: {"out": nan_buffer(*out_shape(a), dtype=out_dtype(a))}, OK),
    "out_row_slice_of_a_wider_buffer": M(
        lambda a: {
            "out": nan_buffer(out_shape(a)[0] + 7, out_shape(a)[1] + 64, dtype=out_dtype(a))[
                3 : 3 + out_shape(a)[0]
            ]
        },
        OK,
    ),
    "out_column_slice_of_a_wider_buffer": M(
        lambda a: {
            "out": nan_buffer(out_shape(a)[0], 2 * out_shape(a)[1], dtype=out_dtype(a))[
                :, : out_shape(a)[1]
            ]
        },
        OK,
    ),
    "out_storage_offset_7": M(
        lambda a: {
            "out": nan_buffer(7 + out_shape(a)[0] * out_shape(a)[1], dtype=out_dtype(a))[7:].view(
                out_shape(a)
            )
        },
        OK,
    ),
    # The op has no backward: autograd would take the logits for a view of out's old values.
    "out_requires_grad": M(
        lambda a: {"out": nan_buffer(*out_shape(a), dtype=out_dtype(a)).requires_grad_()},
        raises(RuntimeError, r"out requires grad \(requires_grad=True\) while grad mode is on"),
    ),
    "out_and_output_dtype_float16": M(
        lambda a: {
            "output_dtype": torch.float16,
            "out": nan_buffer(*out_shape(a), dtype=torch.float16),
        },
        OK,
        MAIN,
    ),
    "out_float64": M(
        lambda a: {"out": nan_buffer(*out_shape(a), dtype=torch.float64)},
        raises(TypeError, r"out must have dtype output_dtype = torch\.\w+, got torch.float64"),
    ),
    "out_float16_for_the_default_output_dtype": M(
        lambda a: {"out": nan_buffer(*out_shape(a), dtype=torch.float16)},
        raises(TypeError, r"out must have dtype output_dtype = torch\.\w+, got torch.float16"),
    ),
    "out_one_row_short": M(
        lambda a: {"out": nan_buffer(out_shape(a)[0] - 1, out_shape(a)[1], dtype=out_dtype(a))},
        raises(ValueError, r"out must have at least batch_size\*next_n = 10 rows"),
    ),
    "out_max_seq_len_columns": M(
        lambda a: {"out": nan_buffer(out_shape(a)[0], MAX_SEQ_LEN, dtype=out_dtype(a))},
        raises(ValueError, r"out must have at least padded_seq_len\(max_seq_len\) = 512 columns"),
    ),
    "out_entries_strided": M(
        lambda a: {
            "out": nan_buffer(out_shape(a)[0], 2 * out_shape(a)[1], dtype=out_dtype(a))[:, ::2]
        },
        raises(ValueError, r"out must have contiguous rows \(stride\(1\) == 1\)"),
    ),
    "out_row_expanded": M(
        lambda a: {"out": nan_buffer(1, out_shape(a)[1], dtype=out_dtype(a)).expand(out_shape(a))},
        raises(ValueError, r"out rows must not overlap: .* got strides \(0, 1\)"),
    ),
    "out_as_strided_pitch": M(
        lambda a: {
            "out": nan_buffer(out_shape(a)[0] * out_shape(a)[1], dtype=out_dtype(a)).as_strided(
                out_shape(a), (128, 1)
            )
        },
        raises(ValueError, r"out rows must not overlap: .* got strides \(128, 1\)"),
    ),
    "out_rank_1": M(
        lambda a: {"out": nan_buffer(out_shape(a)[0] * out_shape(a)[1], dtype=out_dtype(a))},
        raises(ValueError, "out must be 2-D"),
    ),
    "out_list": M(
        lambda a: {"out": [0.0]}, raises(TypeError, "out must be a torch.Tensor, got list")
    ),
    "out_on_the_other_device": M(
        on_other_device("out"),
        raises(ValueError, "out must be on q's device (cpu|cuda:0), got (cpu|cuda:0)"),
    ),
    # ---- schedule_meta (built per device: its row count is the device's SM count + 1)
    "schedule_given": M(lambda a: {"schedule_meta": schedule()}, OK),
    "schedule_storage_offset_1": M(
        lambda a: {"schedule_meta": schedule(lambda s: with_offset(s, 1))}, OK
    ),
    "schedule_int64": M(
        lambda a: {"schedule_meta": schedule(lambda s: s.long())},
        raises(TypeError, "schedule_meta must have dtype torch.int32, got torch.int64"),
    ),
    "schedule_expanded": M(
        lambda a: {"schedule_meta": schedule(lambda s: s[:1].expand(s.shape))},
        raises(ValueError, "schedule_meta must be contiguous"),
    ),
    "schedule_one_row_short": M(
        lambda a: {"schedule_meta": schedule(lambda s: s[:-1])},
        raises(ValueError, r"schedule_meta must have shape \[num_sms \+ 1, 2\]"),
    ),
    "schedule_on_the_other_device": M(
        lambda a: {"schedule_meta": schedule(lambda s: s.to(other_device(s.device)))},
        raises(ValueError, "schedule_meta must be on q's device (cpu|cuda:0), got (cpu|cuda:0)"),
    ),
    # A stale schedule can leave CUDA's logits wrong or unwritten: only validate mode may see one
    # on CUDA.
    "schedule_stale": M(
        lambda a: {"schedule_meta": schedule(lens=lens_with(a, 4, 64)["seq_lens"])},
        raises(ValueError, "schedule_meta is stale: row"),
        validate=True,
        unvalidated_cpu=OK,
    ),
    "validate_mode_on_a_valid_call": M(
        lambda a: {"schedule_meta": schedule()}, OK, validate=True, unvalidated_cpu=OK
    ),
    # ---- the Python call itself
    "unknown_keyword": M(
        lambda a: {"foo": 1}, raises(TypeError, "got an unexpected keyword argument 'foo'")
    ),
    "extra_positional": M(
        lambda a: {EXTRA_POSITIONAL: (torch.float32,)},
        raises(TypeError, r"takes \d positional arguments but \d positional arguments"),
    ),
}


# ------------------------------------------------------------------ calling and comparing


def call(args: Args) -> torch.Tensor | Exception:
    """The op on `args`: its result, or the exception it raised (after a synchronize, so an
    asynchronous CUDA error is raised here)."""
    names = POSITIONAL[family(args.variant)]
    positional = [args[name] for name in names] + list(args.get(EXTRA_POSITIONAL, ()))
    keywords = {k: v for k, v in args.items() if k not in names and k != EXTRA_POSITIONAL}
    try:
        result = OPS[family(args.variant)](*positional, **keywords)
        if result.is_cuda:
            torch.cuda.synchronize(result.device)
        return result
    except Exception as err:
        return err


def describe(outcome: object) -> str:
    if isinstance(outcome, Exception):
        return f"raised {type(outcome).__name__}: {outcome}"
    return f"returned a {list(outcome.shape)} {outcome.dtype} tensor"


def raised_by_the_reference(err: Exception) -> bool:
    """Whether `err` comes from the reference's precondition checks (not the validation)."""
    frames = traceback.extract_tb(err.__traceback__)
    return any(frame.filename.endswith("reference.py") for frame in frames)


DEVICE_NAME = re.compile(r"\b(?:cuda(?::\d+)?|cpu)\b")


def normalised(message: str) -> str:
    message = DEVICE_NAME.sub("<device>", message)
    if message.startswith("schedule_meta must have shape"):
        # The expected row count is the device's SM count + 1, the CPU's being the H200's 132
        # (flashinfer_schedule.DEFAULT_CPU_NUM_SMS): equal on an H200, legitimately different
        # on an SM90 GPU with another SM count.
        message = re.sub(r"\d+", "<n>", message)
    return message


def assert_written_only_where_allowed(out: torch.Tensor, seq_lens, next_n: int, cols: int):
    """Every element of `out`'s whole storage is still NaN except in the first `cols`
    (padded) columns of the rows of non-empty requests, which the kernel may write."""
    out = out.detach()
    whole = torch.empty(0, dtype=out.dtype, device=out.device).set_(out.untyped_storage())
    allowed = torch.zeros(whole.shape, dtype=torch.bool, device=out.device)
    written = (seq_lens.cpu().to(torch.int64) > 0).repeat_interleave(next_n)
    rows = written.nonzero().flatten().to(out.device)
    allowed.as_strided(out.shape, out.stride(), out.storage_offset())[rows, :cols] = True
    assert torch.isnan(whole[~allowed]).all(), "written outside the rows of non-empty requests"


def magnitudes(args: Args) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference with |weights| (the row bound's size), and with the signs of q's and the
    cache's values cleared too: sum_h |w_h| sum_d |q_hd| |k_d| (* scale), what the tensor
    cores' accumulation error scales with (assert_rows_close's dot_magnitude)."""
    variant = family(args.variant)
    values = {name: args[name] for name in POSITIONAL[variant]}
    keywords = {}
    if variant == "fp4":
        keywords["is_kv_sf_interleaved"] = args.get("is_kv_sf_interleaved", False)
        if values["q_sf"].dim() == 4:  # the recipe's [..., 1] shape, squeezed by the op
            values["q_sf"] = values["q_sf"].squeeze(3)
    reference = REFERENCES[variant]
    sign_bits_clear = 0x7F if variant == "fp8" else 0x77  # E4M3: bit 7; E2M1: bit 3 per nibble
    with torch.no_grad():
        values["weights"] = values["weights"].abs()
        magnitude = reference(**values, **keywords)
        q, kv = values["q"], values["kv_fused"]
        values["q"] = (q.view(torch.uint8) & sign_bits_clear).view(q.dtype)
        num_blocks, block_size, _, row_bytes = kv.shape
        value_bytes = block_size * (row_bytes - 4)  # then the scale region, left as it is
        blocks = kv.reshape(num_blocks, block_size * row_bytes).clone()
        blocks[:, :value_bytes] &= sign_bits_clear
        values["kv_fused"] = blocks.view(kv.shape)
        dots = reference(**values, **keywords)
    return magnitude, dots


def assert_same_results(args: Args, cuda_args: Args, cpu, cuda) -> None:
    view = (cpu.shape, cpu.dtype, cpu.stride(), cpu.storage_offset())
    assert view == (cuda.shape, cuda.dtype, cuda.stride(), cuda.storage_offset())
    assert cuda.device.type == GPU
    q, seq_lens, max_seq_len = args["q"], args["seq_lens"], args["max_seq_len"]
    next_n = q.shape[1]
    for device_args, result in ((args, cpu), (cuda_args, cuda)):
        out = device_args.get("out")
        if isinstance(out, torch.Tensor):
            start = (result.untyped_storage().data_ptr(), result.storage_offset())
            assert start == (out.untyped_storage().data_ptr(), out.storage_offset()), "not out"
            padded = fa.padded_seq_len(max_seq_len)
            assert_written_only_where_allowed(out, seq_lens, next_n, padded)
    output_dtype = cpu.dtype
    epi_dtype = args.get("epi_dtype", torch.float32)
    acc_dtype = args.get("acc_dtype", torch.float32)
    rel = tolerance(output_dtype, epi_dtype, acc_dtype) + UNIT_ROUNDOFF[output_dtype]
    magnitude, dots = magnitudes(args)
    mask = valid_mask(seq_lens.cpu(), next_n, max_seq_len)
    expected = cpu.detach().to(torch.float64)
    head_dim = 128 if family(args.variant) == "fp4" else q.shape[-1]
    accumulation = accumulation_error(acc_dtype, head_dim)
    assert_rows_close(cuda, expected, mask, rel, magnitude, dots, accumulation)


PARAMS = [(variant, name) for name, m in MUTATIONS.items() for variant in m.variants]


@pytest.mark.parametrize(("variant", "name"), PARAMS, ids=[f"{v}-{n}" for v, n in PARAMS])
def test_cpu_and_cuda_agree(variant, name, monkeypatch):
    mutation = MUTATIONS[name]
    built = mutated_args(variant, name)  # on the CPU, then reproduced view for view on each
    args, cuda_args = on_device(built, torch.device("cpu")), on_device(built, torch.device(GPU))
    if mutation.validate:
        monkeypatch.setenv(VALIDATE, "1")
    else:
        monkeypatch.delenv(VALIDATE, raising=False)

    cpu = call(args)
    mutation.expect.check("CPU", cpu)
    if mutation.cuda_runs:
        if isinstance(cpu, Exception) and not mutation.validate and raised_by_the_reference(cpu):
            pytest.fail(f"{name} breaks a device-data precondition: it needs validate=True")
        cuda = call(cuda_args)
        if mutation.cuda is not None:  # a documented difference
            mutation.cuda.check("CUDA", cuda)
        elif isinstance(cpu, Exception) or isinstance(cuda, Exception):
            if not (isinstance(cpu, Exception) and isinstance(cuda, Exception)):
                pytest.fail(f"{name}: the CPU {describe(cpu)}, but CUDA {describe(cuda)}")
            assert type(cuda) is type(cpu), f"{name}: CPU {describe(cpu)}, CUDA {describe(cuda)}"
            assert normalised(str(cuda)) == normalised(str(cpu)), f"{name}: messages differ"
        else:
            assert_same_results(args, cuda_args, cpu, cuda)

    if mutation.validate:  # the CPU reference checks the preconditions all the same
        monkeypatch.delenv(VALIDATE)
        mutation.unvalidated_cpu.check("CPU without validate mode", call(args))
