"""How a validated paged MQA logits call runs: the eager CUDA launch, remembered per argument
signature, or the custom op (CPU, torch.compile).

A repeated eager call with a known signature costs one signature, one dictionary lookup, the
output storage, one prepared launch and one view (`EagerCall`); everything else runs once per
signature.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from flashinfer_jit.op_args import decided, inference_out_error
from flashinfer_jit.tracing import plain_eager

from .. import _validation as v
from .problem import Problem


@torch.compiler.assume_constant_result
def cuda_arch_error(op: str, device: torch.device) -> str:
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


def device_data_checks_wanted() -> bool:
    """Whether to run the opt-in `FLASHINFER_VALIDATE_INPUTS` checks on this call.

    Never under a tracer (`plain_eager`: torch.compile, `make_fx`, a `FakeTensorMode`, a
    `torch.func` transform; the checks copy device data to the host and branch on it, which
    a trace cannot follow and fake tensors do not hold) nor during CUDA-graph capture. Also
    skipped under a TorchDispatchMode that does not trace (`FlopCounterMode`, debug modes):
    `plain_eager` cannot tell those apart from the tracing ones.
    """
    if not plain_eager():
        return False
    return v.validate_inputs_enabled() and not v.graph_capture_active()


# Argument signatures (dtype, device, shape and strides of every tensor plus the scalar
# arguments) that passed validation, with their problem sizes. Every check in
# `validate` reads only that metadata (data-dependent checks are the opt-in validate mode,
# run per call in `run`), so a call with a known signature skips the Python checks, which
# cost more host time than the launches themselves.
_VALIDATED: dict[tuple, Problem] = {}
_VALIDATED_LIMIT = 1024
_SCALAR_TYPES = frozenset({bool, int, float, str, torch.dtype, type(None)})


def signature(
    variant: str,
    tensors: tuple,
    scalars: tuple,
    optional_tensors: tuple,
    negatable: tuple = (),
) -> tuple | None:
    """The memo key of a call: the variant, (dtype, device, shape, strides) of every tensor,
    (type, value) of every scalar argument (so True and 1 differ), None for an absent optional
    tensor. None under a tracer (`plain_eager`; dynamo guards the metadata itself) or when
    an argument has an unexpected type (the checks will name it). A tensor subclass outside
    any mode gets the key of a plain tensor of its metadata: a FakeTensor then fails loudly at
    its first `data_ptr()`, and a Parameter is launched like any tensor. Written out per
    argument kind, not with isinstance per argument: this runs on every eager call (6.2 ->
    4.3 us per key and lookup on a desktop CPU when the change was made).

    Also None when a tensor of `negatable` (None entries allowed) is a negated view
    (`is_neg()`): it has the metadata of a plain tensor, so the key cannot tell them apart, and
    the validation it is sent back to refuses it. The public functions pass weights and out,
    the float tensors public PyTorch can hand over negated (the `.imag` of a `conj()` view);
    the others would need `torch._neg_view`."""
    if not plain_eager():
        return None
    parts: list = [variant]
    try:
        for t in tensors:
            parts.append((t.dtype, t.device, t.shape, t.stride()))
        for t in optional_tensors:
            parts.append(None if t is None else (t.dtype, t.device, t.shape, t.stride()))
        for t in negatable:
            if t is not None and t.is_neg():
                return None
    except (AttributeError, TypeError, RuntimeError, NotImplementedError):
        return None  # not a tensor, or a layout without strides: the checks will name it
    for value in scalars:
        kind = type(value)
        if kind not in _SCALAR_TYPES:
            return None
        parts.append((kind, value))
    return tuple(parts)


def memoizable(key: tuple | None) -> bool:
    """Whether a validated signature may be remembered. The key holds no layout (reading it
    would cost every call), so not when a tensor's strides are those another layout reports
    for the same dtype, device and shape, which must still meet the dense-layout check: all 0
    (an `expand()`ed tensor; sparse COO reports that too) or (1, 0, ..., 0) (mkldnn)."""
    if key is None:
        return False
    for part in key:
        if type(part) is tuple and len(part) == 4 and part[3]:
            strides = part[3]
            if not any(strides[1:]) and (strides[0] == 0 or (strides[0] == 1 and len(strides) > 1)):
                return False
    return True


def validated(validate: Callable[[], Problem], key: tuple | None) -> Problem:
    """`validate()`'s problem sizes, memoised by the arguments' signature `key`."""
    problem = _VALIDATED.get(key) if key is not None else None
    if problem is None:
        problem = validate()
        if memoizable(key):
            if len(_VALIDATED) >= _VALIDATED_LIMIT:
                _VALIDATED.clear()
            _VALIDATED[key] = problem
    return problem


# The op's input tensors as `run` receives them (launch order), then schedule_meta.
INPUT_NAMES = {
    "fp8": ("q", "kv_fused", "weights", "block_tables", "seq_lens", "schedule_meta"),
    "fp4": ("q", "q_sf", "kv_fused", "weights", "block_tables", "seq_lens", "schedule_meta"),
}


_UNKNOWN = object()  # no verdict yet (a verdict may be None or False)


class OutCheck:
    """Refuses an `out` whose written rows share memory with an input, an inference-tensor
    `out` outside inference mode, which the direct CUDA launch would otherwise write (the
    custom op refuses it), and an `out` that requires grad while grad mode is on.

    The byte extents of the written rows and of every input are fixed by the argument
    signature, so a call first only compares addresses (0.7 us on a desktop CPU). Where two
    extents meet, the elements are compared exactly (an input may sit in the unwritten tail
    of a wide-pitch `out`'s rows); that verdict depends only on the input's offset from `out`,
    and is remembered by it."""

    __slots__ = ("_checked", "_geometry", "_verdicts", "_written")

    def __init__(
        self, variant: str, rows: int, padded_cols: int, inputs: tuple, out: torch.Tensor
    ) -> None:
        self._written = v.out_written_bytes(out, rows, padded_cols)
        size = out.element_size()
        self._geometry = (out.stride(0) * size, padded_cols * size, rows)
        extents = (v.byte_extent(t) for t in inputs)
        named = zip(range(len(inputs)), INPUT_NAMES[variant], extents, strict=True)
        self._checked = tuple(entry for entry in named if entry[2])
        self._verdicts: dict[tuple[int, int], bool | None] = {}

    def __call__(self, inputs: tuple, out: torch.Tensor) -> None:
        if out.requires_grad and torch.is_grad_enabled():  # first, as in validation
            raise v.grad_out_error()
        self.refuse_overlap(inputs, out)
        if out.is_inference() and not torch.is_inference_mode_enabled():
            raise inference_out_error()

    def refuse_overlap(self, inputs: tuple, out: torch.Tensor) -> None:
        """Raise ValueError where out's written rows share memory with one of `inputs`."""
        start = out.data_ptr()
        end = start + self._written
        for index, name, extent in self._checked:
            first = inputs[index].data_ptr()
            if first >= end or start >= first + extent:
                continue
            meets = self._meets(index, inputs, first - start)
            if meets is not False:
                pitch, width, rows = self._geometry
                exact = meets is not None
                raise v.out_overlap_error(name, start, rows, width, pitch, first, extent, exact)

    def _meets(self, index: int, inputs: tuple, offset: int) -> bool | None:
        key = (index, offset)
        verdicts = self._verdicts
        verdict = verdicts.get(key, _UNKNOWN)  # one lookup: another thread may clear between two
        if verdict is not _UNKNOWN:
            return verdict
        pitch, width, rows = self._geometry
        verdict = v.meets_written_rows(inputs[index], offset, pitch, width, rows)
        if len(verdicts) >= 64:  # another thread may clear it too: the local is what counts
            verdicts.clear()
        verdicts[key] = verdict
        return verdict


def _storages_apart(out: torch.Tensor, inputs: tuple) -> bool:
    """True when the memory of out's storage meets no input's storage (then no element can
    overlap; where storages meet, OutCheck compares the elements)."""
    storage = out.untyped_storage()
    start = storage.data_ptr()
    end = start + storage.nbytes()
    for t in inputs:
        if t is None:
            continue
        other = t.untyped_storage()
        first = other.data_ptr()
        if first < end and start < first + other.nbytes():
            return False
    return True


def check_op_out(
    variant: str, inputs: tuple, out_storage: torch.Tensor, rows: int, padded_cols: int
) -> None:
    """The custom op's own check of the storage it writes, at run time: no overlap with an
    input and no inference tensor outside inference mode. The public function checks a
    caller's `out` only in eager calls (a trace has no addresses, and dynamo cannot trace
    `is_inference()`), so a torch.compile'd or AOTInductor-packaged call would otherwise
    write an `out` that aliases an input while other CTAs still read it. `out_storage` has
    already passed the op's size check; its first `padded_cols` columns of `rows` rows are
    what the kernel may write."""
    if not _storages_apart(out_storage, inputs):  # 0.9 us on a CPU test host; OutCheck 7 us
        OutCheck(variant, rows, padded_cols, inputs, out_storage).refuse_overlap(
            inputs, out_storage
        )
    if out_storage.is_inference() and not torch.is_inference_mode_enabled():
        raise inference_out_error()


class EagerCall:
    """The whole eager CUDA call of one validated argument signature.

    It holds what the signature fixes (output geometry, the prepared kernel launch of
    `launcher.prepare_*`, the overlap check of a given `out`), so a repeated call is: output
    storage (or out's checks), one launch, one view. The public functions look it up before
    anything else; only the opt-in validate mode, read on every call, sends a known signature
    back through `run`. Through `torch.library` the
    same call would cost about 100 us more on the H200 (2026-11-29, cProfile:
    `torch._library.custom_ops.backend_impl`) and buy nothing outside a torch.compile trace.
    """

    __slots__ = (
        "_check_out",
        "_device",
        "_dtype",
        "_run",
        "_storage_shape",
        "_view_shape",
        "_view_stride",
    )

    def __init__(
        self,
        run: Callable[..., None],
        problem: Problem,
        storage: torch.Tensor,
        check_out: OutCheck | None,
    ) -> None:
        self._run = run
        self._check_out = check_out
        allocates = check_out is None
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
        else:
            self._check_out((*tensors, schedule_meta), out)
            # As the custom op would: autograd sees out change in place.
            torch.autograd.graph.increment_version(out)
        self._run(*tensors, storage, schedule_meta)
        # The same view as storage[:rows, :max_seq_len] (offset kept), in one call.
        return storage.as_strided(self._view_shape, self._view_stride)


_EAGER_CALLS: dict[tuple, EagerCall] = {}


def eager_call(key: tuple | None) -> EagerCall | None:
    """The remembered eager call for `key`, unless validate mode wants the data checks."""
    eager = _EAGER_CALLS.get(key) if key is not None else None
    if eager is None or v.validate_inputs_enabled():
        return None
    return eager


def run(
    op: str,
    variant: str,
    problem: Problem,
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
    if device_data_checks_wanted():
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
        arch_error = cuda_arch_error(op, q.device)
        if arch_error:
            raise RuntimeError(arch_error)
    check_out = None
    eager = plain_eager()
    if out is not None and eager:  # a trace has no addresses
        inputs = (*tensors, schedule_meta)
        check_out = OutCheck(variant, problem.rows, problem.padded_cols, inputs, out)
        check_out(inputs, out)
    storage = out
    if storage is None:
        # Strides given, not derived: torch.compile's Inductor (2.13) fails to schedule a
        # mutating custom op on torch.empty(1, n) when n comes from device data (KeyError
        # 'op<k>' in compute_ancestors); the stride it derives for the one row is Max(1, n).
        storage = torch.empty_strided(
            (problem.rows, problem.padded_cols),
            (problem.padded_cols, 1),
            dtype=output_dtype,
            device=q.device,
        )
    # Nothing to launch. An empty pool leaves a valid call only zero-length requests, whose
    # rows are never written (and TMA cannot describe a pool of no blocks). On CPU the
    # reference still runs, so a length that would read a block is refused as elsewhere.
    # Decided here where the sizes have values; a size a trace cannot decide (unbacked) goes
    # to the op, which skips the launch itself then.
    if not (
        decided(problem.rows == 0, False) or (q.is_cuda and decided(problem.num_blocks == 0, False))
    ):
        if q.is_cuda and eager:
            launch = prepare(storage)
            if out is not None:
                torch.autograd.graph.increment_version(out)
            launch(*tensors, storage, schedule_meta)
            if memoizable(key):
                if len(_EAGER_CALLS) >= _VALIDATED_LIMIT:
                    _EAGER_CALLS.clear()
                _EAGER_CALLS[key] = EagerCall(launch, problem, storage, check_out)
        else:
            compute(storage)
    # The view after the write: under torch.compile and torch.no_grad() a view taken before
    # the custom op's in-place write to an `out` that requires grad fails AOTAutograd ("a view
    # was created in no_grad mode and its base ... modified inplace").
    # narrow, not a slice: under torch.compile a slice to a max_seq_len read from device data
    # has a size dynamo must bound with a new symbol (torch 2.11); narrow's size is the length.
    return storage.narrow(0, 0, problem.rows).narrow(1, 0, problem.max_seq_len)
