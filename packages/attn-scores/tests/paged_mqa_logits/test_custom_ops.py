"""The `torch.library` custom ops behind the public logits functions, and torch.compile.

`torch.compile(fullgraph=True)` must trace through the public functions (validation and
output allocation in Python, the computation as one opaque custom op) and give the same
bits as eager. CPU tests use the reference path; the `gpu` ones run the SM90 kernel.
"""

from __future__ import annotations

import re

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import (
    accumulation_error,
    assert_rows_close,
    make_fp4_case,
    make_fp8_case,
)
from flashinfer_attn_scores.paged_mqa_logits import custom_ops, dispatch
from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask
from test_gpu import VARIANTS

FP8_OP = "fp8_paged_mqa_logits_into"
FP4_OP = "fp4_paged_mqa_logits_into"
# Zero-length requests between others: their rows must stay untouched in both modes.
LENGTHS = [37, 0, 300, 5]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch (no cached graphs or recompile limits carried over)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class GraphRecorder:
    """A torch.compile backend that keeps the FX graphs dynamo hands it and runs them as is."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        self.graphs.append(gm)
        return gm.forward


def poisoned(rows: int, cols: int, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    return torch.full((rows, cols), float("nan"), dtype=dtype, device=device)


def assert_same_valid_region(compiled: torch.Tensor, eager: torch.Tensor, seq_lens, next_n):
    assert compiled.shape == eager.shape and compiled.dtype == eager.dtype
    mask = valid_mask(seq_lens.cpu(), next_n, eager.shape[1]).to(eager.device)
    assert mask.any()
    assert torch.isfinite(compiled[mask]).all(), "a valid element was not written"
    assert torch.equal(compiled[mask], eager[mask])


def assert_empty_rows_untouched(storage: torch.Tensor, seq_lens, next_n):
    for b, length in enumerate(seq_lens.tolist()):
        if length == 0:
            assert torch.isnan(storage[b * next_n : (b + 1) * next_n]).all()


# ---------------------------------------------------------------------------------------------
# Registration


def test_ops_are_listed_under_torch_ops_namespace():
    namespace = torch.ops.flashinfer_attn_scores
    for name, mutated_index in ((FP8_OP, 6), (FP4_OP, 7)):
        schema = getattr(namespace, name).default._schema
        assert schema.name == f"flashinfer_attn_scores::{name}"
        assert schema.returns == []
        mutated = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
        assert mutated == ["out_storage"]
        assert schema.arguments[mutated_index].name == "out_storage"
        # dtype arguments travel as torch.dtype (ScalarType), not as int codes.
        assert "ScalarType output_dtype, ScalarType epi_dtype" in str(schema)
    assert (
        custom_ops.fp8_paged_mqa_logits_into._opoverload
        is namespace.fp8_paged_mqa_logits_into.default
    )


def spy_on(monkeypatch, name: str) -> list:
    """Record the arguments of every call of `custom_ops.<name>` (then run it)."""
    calls = []
    original = getattr(custom_ops, name)

    def spy(*args):
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(custom_ops, name, spy)
    return calls


def test_eager_public_call_dispatches_through_the_custom_op(monkeypatch):
    calls = spy_on(monkeypatch, FP8_OP)
    case = make_fp8_case(LENGTHS, next_n=2, seed=11)
    out = poisoned(case.rows, fa.padded_seq_len(case.max_seq_len), torch.float16)
    # Each dtype argument its own value (the CPU op ignores epi_dtype and acc_dtype, so only
    # the recorded arguments show two of them swapped).
    fa.fp8_paged_mqa_logits(
        *case.fp8_args(), output_dtype=torch.float16, acc_dtype=torch.float16, out=out
    )
    assert len(calls) == 1
    assert calls[0][6] is out  # the caller's storage itself, not a copy
    assert calls[0][5] == case.max_seq_len and calls[0][7] is None  # no schedule_meta
    assert calls[0][8:] == (torch.float16, torch.float32, torch.float16)


def test_eager_public_fp4_call_dispatches_through_the_custom_op(monkeypatch):
    calls = spy_on(monkeypatch, FP4_OP)
    case = make_fp4_case(LENGTHS, next_n=2, block_size=128, interleaved=True, seed=12)
    out = poisoned(case.rows, fa.padded_seq_len(case.max_seq_len), torch.float32)
    fa.fp4_paged_mqa_logits(
        *case.fp4_args(),
        output_dtype=torch.float32,
        epi_dtype=torch.bfloat16,
        is_kv_sf_interleaved=True,
        out=out,
    )
    assert len(calls) == 1
    assert all(a is b for a, b in zip(calls[0][:6], case.fp4_args()[:6], strict=True))
    assert calls[0][6] == case.max_seq_len and calls[0][7] is out and calls[0][8] is None
    assert calls[0][9:] == (32, torch.float32, torch.bfloat16, True)


# ---------------------------------------------------------------------------------------------
# torch.compile on CPU


@pytest.mark.parametrize("output_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_out", [False, True])
def test_fp8_compiled_fullgraph_matches_eager(with_out, output_dtype):
    next_n = 2
    case = make_fp8_case(LENGTHS, next_n=next_n, seed=21 + with_out)
    cols = fa.padded_seq_len(case.max_seq_len) + 256  # a wider buffer than needed

    def call(q, kv_fused, weights, block_tables, seq_lens, out):
        return fa.fp8_paged_mqa_logits(
            q,
            kv_fused,
            weights,
            block_tables,
            seq_lens,
            case.max_seq_len,
            output_dtype=output_dtype,
            out=out,
        )

    eager_out = poisoned(case.rows + 1, cols, output_dtype) if with_out else None
    compiled_out = poisoned(case.rows + 1, cols, output_dtype) if with_out else None
    eager = call(*case.fp8_args()[:5], eager_out)
    compiled = torch.compile(call, fullgraph=True)(*case.fp8_args()[:5], compiled_out)

    assert_same_valid_region(compiled, eager, case.seq_lens, next_n)
    mask = valid_mask(case.seq_lens, next_n, case.max_seq_len)
    tol = 1e-6 if output_dtype == torch.float32 else 1e-3
    assert_rows_close(compiled, case.expected(), mask, tol)
    if with_out:
        assert compiled.data_ptr() == compiled_out.data_ptr()
        assert torch.equal(compiled_out[: case.rows, : case.max_seq_len][mask], eager[mask])
        assert torch.isnan(compiled_out[case.rows :]).all(), "a row past batch*next_n written"
        assert_empty_rows_untouched(compiled_out, case.seq_lens, next_n)


@pytest.mark.parametrize("with_out", [False, True])
def test_fp4_compiled_fullgraph_matches_eager(with_out):
    next_n = 3
    case = make_fp4_case(LENGTHS, next_n=next_n, block_size=64, seed=31 + with_out)
    cols = fa.padded_seq_len(case.max_seq_len)

    def call(q, q_sf, kv_fused, weights, block_tables, seq_lens, out):
        return fa.fp4_paged_mqa_logits(
            q, q_sf, kv_fused, weights, block_tables, seq_lens, case.max_seq_len, out=out
        )

    eager_out = poisoned(case.rows, cols, torch.bfloat16) if with_out else None
    compiled_out = poisoned(case.rows, cols, torch.bfloat16) if with_out else None
    eager = call(*case.fp4_args()[:6], eager_out)
    compiled = torch.compile(call, fullgraph=True)(*case.fp4_args()[:6], compiled_out)

    assert compiled.dtype == torch.bfloat16
    assert_same_valid_region(compiled, eager, case.seq_lens, next_n)
    mask = valid_mask(case.seq_lens, next_n, case.max_seq_len)
    assert_rows_close(compiled, case.expected(), mask, 1e-2)  # one bfloat16 rounding
    if with_out:
        assert compiled.data_ptr() == compiled_out.data_ptr()
        assert_empty_rows_untouched(compiled_out, case.seq_lens, next_n)


def test_graph_holds_the_custom_op_and_no_reference_math():
    case = make_fp8_case(LENGTHS, next_n=1, seed=41)
    recorder = GraphRecorder()

    def call(*args):
        return fa.fp8_paged_mqa_logits(*args, case.max_seq_len)

    compiled = torch.compile(call, backend=recorder, fullgraph=True)(*case.fp8_args()[:5])
    assert len(recorder.graphs) == 1
    code = recorder.graphs[0].code
    assert f"flashinfer_attn_scores.{FP8_OP}" in code
    # The reference's per-request loop reads seq_lens on the host; it must not be traced.
    assert "repeat_interleave" not in code and "float64" not in code
    assert_same_valid_region(compiled, call(*case.fp8_args()[:5]), case.seq_lens, 1)


def test_new_shapes_recompile_without_graph_breaks():
    # The second distinct max_seq_len / batch size makes dynamo retrace with symbolic sizes.
    compiled = torch.compile(fa.fp8_paged_mqa_logits, fullgraph=True)
    for seed, lens in enumerate([[37, 0, 300, 5], [700, 12], [1, 64, 65]]):
        case = make_fp8_case(lens, next_n=2, seed=50 + seed)
        got = compiled(*case.fp8_args())
        assert got.shape == (case.rows, case.max_seq_len)
        assert_same_valid_region(got, fa.fp8_paged_mqa_logits(*case.fp8_args()), case.seq_lens, 2)


# Batches of three sizes, none equal to another of the call's sizes (dynamo would otherwise
# tie them by duck sizing and retrace once), with their own max_seq_len.
DYNAMIC_BATCHES = ([37, 0, 400, 5, 90], [700, 12, 3, 0, 9, 1, 60], [1, 64, 65, 129, 0, 7, 8, 11, 5])


DYNAMIC_NEXT_N = {"fp8": 2, "fp4": 3}


def dynamic_case(variant: str, lens: list[int], seed: int, **kwargs):
    next_n = DYNAMIC_NEXT_N[variant]
    if variant == "fp8":  # a parametric head geometry, every size of it a symbol in the trace
        return make_fp8_case(lens, next_n=next_n, num_heads=20, head_dim=96, seed=seed, **kwargs)
    return make_fp4_case(lens, next_n=next_n, block_size=64, seed=seed, **kwargs)


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_dynamic_shapes_compile_once_and_match_eager(variant):
    """torch.compile(dynamic=True): one graph for every batch size and max_seq_len, with the
    sizes as symbols through the validation, the output allocation and the op's fake."""
    from torch._dynamo.testing import CompileCounterWithBackend

    kind = VARIANTS[variant]
    op = kind.op
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(op, backend=counter, fullgraph=True, dynamic=True)
    for seed, lens in enumerate(DYNAMIC_BATCHES):
        case = dynamic_case(variant, lens, seed=100 + seed)
        args = kind.args(case)
        cols = fa.padded_seq_len(case.max_seq_len) + 64 * seed  # out's pitch varies too
        out = poisoned(case.rows + 1 + seed, cols, kind.output_dtype)
        got = compiled(*args, out=out)
        assert got.shape == (case.rows, case.max_seq_len) and got.data_ptr() == out.data_ptr()
        next_n = DYNAMIC_NEXT_N[variant]
        assert_same_valid_region(got, op(*args), case.seq_lens, next_n)
        assert torch.isnan(out[case.rows :]).all(), "a row past batch*next_n written"
        assert_empty_rows_untouched(out, case.seq_lens, next_n)
    assert counter.frame_count == 1


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_max_seq_len_multiples_of_256_add_at_most_one_dynamic_graph(variant):
    """Where `max_seq_len` is a multiple of 256 the returned view of the padded storage is
    contiguous, and the compiled graph guards on that (PyTorch's AOT stage): one more graph,
    as quickstart.md says, and no more for further lengths (found by a review; with a warm
    AOTAutograd cache it may not show at all)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    kind = VARIANTS[variant]
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(kind.op, backend=counter, fullgraph=True, dynamic=True)
    for seed, max_seq_len in enumerate([300, 700, 1024, 2000, 4096, 2304]):
        case = dynamic_case(variant, [37, 0, 300, 5, 9], seed=140 + seed, max_seq_len=max_seq_len)
        got = compiled(*kind.args(case))
        assert got.shape == (case.rows, max_seq_len)
        assert_same_valid_region(
            got, kind.op(*kind.args(case)), case.seq_lens, DYNAMIC_NEXT_N[variant]
        )
    assert counter.frame_count <= 2


@pytest.mark.parametrize("unbacked", ["batch", "pool"])
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_unbacked_batch_and_pool_sizes_trace_and_match_eager(variant, unbacked):
    """Sizes marked unbacked (vLLM's "unbacked" dynamic-shapes mode) must trace: found by a
    review, the shape checks and the nothing-to-launch test branched on them."""
    from torch._dynamo.decorators import mark_unbacked

    if variant == "fp8":
        case = make_fp8_case(LENGTHS, next_n=2, seed=63)
        op, args, pool = fa.fp8_paged_mqa_logits, case.fp8_args(), 1
    else:
        case = make_fp4_case(LENGTHS, next_n=2, block_size=64, seed=64)
        op, args, pool = fa.fp4_paged_mqa_logits, case.fp4_args(), 2
    batched = [i for i, a in enumerate(args[:-1]) if i != pool and a.shape[0] == len(LENGTHS)]
    for index in batched if unbacked == "batch" else [pool]:
        mark_unbacked(args[index], 0)
    compiled = torch.compile(op, fullgraph=True, backend="eager")(*args)
    assert_same_valid_region(compiled, op(*args), case.seq_lens, 2)


def test_a_new_head_geometry_does_not_recompile():
    """fp8 calls of three (num_heads, head_dim) pairs run one dynamic graph: the checks
    format a traced size only when they raise (printing one specialises the graph to it)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(fa.fp8_paged_mqa_logits, backend=counter, fullgraph=True, dynamic=True)
    for seed, (num_heads, head_dim) in enumerate([(20, 96), (12, 128), (28, 64)]):
        case = make_fp8_case(
            [37, 0, 90], next_n=2, num_heads=num_heads, head_dim=head_dim, seed=120 + seed
        )
        got = compiled(*case.fp8_args())
        assert_same_valid_region(got, fa.fp8_paged_mqa_logits(*case.fp8_args()), case.seq_lens, 2)
    assert counter.frame_count == 1


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_out", [False, True])
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_max_seq_len_read_from_seq_lens_inside_the_compiled_function(variant, with_out, device):
    """`max_seq_len = int(seq_lens.max())` inside the compiled function (with dynamo's
    `capture_scalar_outputs`) is a size known only at run time: the size checks become runtime
    assertions instead of guards dynamo cannot build, and each call matches eager at the
    host value, in one graph for every batch."""
    from torch._dynamo.testing import CompileCounterWithBackend

    kind = VARIANTS[variant]
    next_n = DYNAMIC_NEXT_N[variant]
    counter = CompileCounterWithBackend("inductor")

    def call(*args, out=None):
        seq_lens = args[-1]
        return kind.op(*args, int(seq_lens.max().item()), out=out)

    compiled = torch.compile(call, backend=counter, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        for seed, lens in enumerate(([37, 0, 400, 5, 90], [9, 700, 0, 1, 60])):
            case = dynamic_case(variant, lens, seed=140 + seed).to(device)
            args = kind.args(case)[:-1]  # without max_seq_len
            out = None
            if with_out:
                cols = fa.padded_seq_len(max(lens))
                out = poisoned(case.rows, cols, kind.output_dtype, device)
            got = compiled(*args, out=out)
            assert got.shape == (case.rows, max(lens))
            if out is not None:
                assert got.data_ptr() == out.data_ptr()
                assert_empty_rows_untouched(out, case.seq_lens, next_n)
            assert_same_valid_region(got, kind.op(*args, max(lens)), case.seq_lens, next_n)
        if with_out:
            # Eager's length-dependent out check, now at run time: an out wide enough for
            # max_seq_len (700) but not for the padded row (768) the kernel may write.
            narrow = poisoned(case.rows, max(lens) + 4, kind.output_dtype, device)
            with pytest.raises(RuntimeError):
                compiled(*args, out=narrow)
            assert torch.isnan(narrow).all(), "a refused call wrote into out"
    assert counter.frame_count == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_out", [False, True])
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_one_row_with_max_seq_len_read_inside_the_compiled_function(variant, with_out, device):
    """Batch 1, next_n 1 (a single-request decode step) with `max_seq_len` read from
    `seq_lens` in the compiled function. Inductor (torch 2.13) failed to schedule the op on a
    fresh `torch.empty(1, n)` of data-dependent width (KeyError 'op<k>'); the storage is now
    allocated with explicit strides."""
    kind = VARIANTS[variant]

    def call(*args, out=None):
        return kind.op(*args, int(args[-1].max().item()), out=out)

    compiled = torch.compile(call, fullgraph=True)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        for seed, length in enumerate((300, 77)):
            if variant == "fp8":
                case = make_fp8_case([length], num_heads=64, head_dim=128, seed=160 + seed)
            else:
                case = make_fp4_case([length], block_size=64, seed=160 + seed)
            case = case.to(device)
            args = kind.args(case)[:-1]
            out = None
            if with_out:
                out = poisoned(1, fa.padded_seq_len(length), kind.output_dtype, device)
            got = compiled(*args, out=out)
            assert got.shape == (1, length)
            if out is not None:
                assert got.data_ptr() == out.data_ptr()
            assert_same_valid_region(got, kind.op(*args, length), case.seq_lens, 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_out_and_schedule_made_inside_the_compiled_function(variant, device):
    """The whole serving step in one graph: `max_seq_len` read from `seq_lens`, the block
    table narrowed to `min_block_table_width` of it, `out` sized with `padded_seq_len` of it
    and the schedule built, all inside the compiled function. The table and out checks must
    not branch on those widths, which have no value while tracing."""
    kind = VARIANTS[variant]
    next_n = DYNAMIC_NEXT_N[variant]

    def step(*args):
        seq_lens = args[-1]
        longest = int(seq_lens.max().item())
        table_index = kind.table_index
        block_size = args[kind.kv_index].shape[1]
        args = list(args)
        args[table_index] = args[table_index][:, : fa.min_block_table_width(longest, block_size)]
        schedule = fa.compute_paged_mqa_logits_schedule(
            seq_lens, device=seq_lens.device, next_n=next_n, variant=variant
        )
        out = torch.empty(
            args[0].shape[0] * next_n,
            fa.padded_seq_len(longest),
            dtype=kind.output_dtype,
            device=seq_lens.device,
        )
        return kind.op(*args, longest, schedule_meta=schedule, out=out)

    compiled = torch.compile(step, fullgraph=True)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        for seed, lens in enumerate(([37, 0, 400, 5, 90], [9, 700, 0, 1, 60])):
            case = dynamic_case(variant, lens, seed=170 + seed).to(device)
            args = kind.args(case)[:-1]
            got = compiled(*args)
            assert got.shape == (case.rows, max(lens))
            assert got.stride(0) == fa.padded_seq_len(max(lens))
            assert_same_valid_region(got, kind.op(*args, max(lens)), case.seq_lens, next_n)


@pytest.mark.parametrize("device", DEVICES)
def test_a_negative_max_seq_len_read_from_device_data_raises_when_run(device):
    """The `max_seq_len >= 0` check of a data-dependent value runs with the compiled code."""
    case = dynamic_case("fp8", [37, 0, 400], seed=150).to(device)

    def call(*args):
        seq_lens = args[-1]
        return fa.fp8_paged_mqa_logits(*args, int((seq_lens.max() - 1000).item()))

    compiled = torch.compile(call, fullgraph=True)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        with pytest.raises(RuntimeError, match=r">= 0"):
            compiled(*case.fp8_args()[:-1])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda q, kv, w, table, lens: fa.fp8_paged_mqa_logits(
                q, kv, w, table, lens, lens.max()
            ),
            "max_seq_len must be an int, got torch.Tensor of dtype torch.int32, ",
        ),
        (
            lambda q, kv, w, table, lens: fa.padded_seq_len(lens.max()),
            "max_seq_len must be an int, got torch.Tensor of dtype torch.int32, ",
        ),
        (
            lambda q, kv, w, table, lens: fa.compute_paged_mqa_logits_schedule(lens, variant=lens),
            "variant must be a str, one of ('fp8', 'fp4'), got torch.Tensor of dtype torch.int32",
        ),
        (
            lambda q, kv, w, table, lens: fa.fp8_paged_mqa_logits(
                q, kv, w, table, lens, 64, output_dtype=lens
            ),
            "output_dtype must be a torch.dtype, got torch.Tensor of dtype torch.int32",
        ),
    ],
)
def test_a_tensor_given_for_a_python_value_is_named_under_fullgraph(call, message):
    """The TypeError names the tensor by dtype and rank: its repr would read device data,
    which dynamo refuses ("repr() on tensor"), hiding the TypeError behind its own error.
    The messages are matched as formatted (dynamo's report also quotes the source line)."""
    args = make_fp8_case([40, 3], next_n=1, num_heads=8, head_dim=128, seed=112).fp8_args()[:5]
    with pytest.raises(TypeError, match=re.escape(message)):
        call(*args)
    for dynamic in (False, True):
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported, match=re.escape(message)) as info:
            torch.compile(call, fullgraph=True, dynamic=dynamic)(*args)
        assert "repr() on tensor" not in str(info.value)


# Refused Python-number arguments; under dynamic=True each is symbolic while dynamo traces.
SYMBOLIC_ARGUMENT_ERRORS = [
    (
        lambda args, n: fa.compute_paged_mqa_logits_schedule(args[4], next_n=n),
        0,
        "next_n must be >= 1, got 0",
    ),
    (
        lambda args, n: fa.compute_paged_mqa_logits_schedule(args[4], next_n=n, variant="fp4"),
        5,
        "next_n must be in 1..4 for variant='fp4', got 5",
    ),
    (
        lambda args, n: fa.compute_paged_mqa_logits_schedule(args[4], num_sms=n),
        0,
        "num_sms must be in 1..2147483647 (2**31 - 1), got 0",
    ),
    (lambda args, n: torch.zeros(fa.padded_seq_len(n)), -1, "max_seq_len must be >= 0, got -1"),
    (
        lambda args, n: torch.zeros(fa.min_block_table_width(10, n)),
        0,
        "block_size must be >= 1, got 0",
    ),
    (lambda args, n: fa.fp8_paged_mqa_logits(*args, n), -1, "max_seq_len must be >= 0, got -1"),
    (
        lambda args, n: fa.fp8_paged_mqa_logits(*args, n),
        300.0,
        "max_seq_len must be an int, got float (300.0)",
    ),
]


@pytest.mark.parametrize(("call", "value", "message"), SYMBOLIC_ARGUMENT_ERRORS)
def test_a_refused_symbolic_argument_keeps_its_message_under_fullgraph(call, value, message):
    """Dynamo cannot format a symbolic number into an f-string: without `shown` the error
    became "BUILD_STRING type error" and lost its message."""
    args = make_fp8_case([40, 3], next_n=1, num_heads=8, head_dim=128, seed=113).fp8_args()[:5]
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        call(args, value)
    for dynamic in (False, True):
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported, match=re.escape(message)):
            torch.compile(call, fullgraph=True, dynamic=dynamic)(args, value)


def _replaced(args: tuple, index: int, change) -> tuple:
    return (*args[:index], change(args[index]), *args[index + 1 :])


# Refused tensors whose messages print shapes or strides, and what each message must show.
# Under dynamic=True the sizes are symbols while dynamo traces; formatted as a list they read
# "[s48, s91, s88]" or "(s85**2, s85)" unless printed item by item (`op_args.sizes`).
SIZED_TENSOR_ERRORS = [
    (
        lambda a: fa.fp8_paged_mqa_logits(*_replaced(a, 0, lambda q: q[:, 0]), 64),
        "got 3-D tensor of shape [2, 8, 128]",
    ),
    (
        lambda a: fa.fp8_paged_mqa_logits(*_replaced(a, 2, lambda w: w[:, :4].contiguous()), 64),
        "got 4 (weights shape [2, 4])",
    ),
    (
        lambda a: fa.fp8_paged_mqa_logits(
            *_replaced(a, 3, lambda t: torch.stack([t, t], 2)[..., 0]), 64
        ),
        "got strides (4, 2) for shape [2, 2]",
    ),
    (
        lambda a: fa.fp8_paged_mqa_logits(
            *_replaced(a, 1, lambda kv: torch.cat([kv, kv], 3)[..., :132]), 64
        ),
        "got strides (8448, 264, 264, 1) for shape [6, 32, 1, 132]",
    ),
    (
        lambda a: fa.fp8_paged_mqa_logits(*_replaced(a, 4, lambda s: s[:, None]), 64),
        "got 2-D tensor of shape [2, 1]",
    ),
    (lambda a: fa.fp8_paged_mqa_logits(*a, 64, out=torch.zeros(1, 64)), "got shape [1, 64]"),
    (lambda a: fa.fp8_paged_mqa_logits(*a, 64, out=torch.zeros(256, 2).t()), "got strides (1, 2)"),
    (
        lambda a: fa.fp8_paged_mqa_logits(
            *a, 64, schedule_meta=torch.zeros(5, 3, dtype=torch.int32)
        ),
        "got [5, 3]",
    ),
    (
        lambda a: fa.compute_paged_mqa_logits_schedule(a[4][:, None]),
        "got 2-D shape [2, 1]",
    ),
    (
        lambda a: fa.compute_paged_mqa_logits_schedule(
            a[4], num_sms=4, out=torch.zeros(3, 2, dtype=torch.int32)
        ),
        "= [5, 2] (num_sms=4), got [3, 2]",
    ),
]


@pytest.mark.parametrize(
    ("call", "sizes"), SIZED_TENSOR_ERRORS, ids=[s[:40] for _, s in SIZED_TENSOR_ERRORS]
)
def test_refused_shapes_print_as_numbers_under_fullgraph(call, sizes):
    """A fullgraph compile's error carries the eager message word for word, sizes included,
    with static and with dynamic shapes."""
    args = make_fp8_case([40, 3], next_n=1, num_heads=8, head_dim=128, seed=115).fp8_args()[:5]
    with pytest.raises(ValueError) as eager:
        call(args)
    message = str(eager.value)
    assert sizes in message
    for dynamic in (False, True):
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported) as compiled:
            torch.compile(call, fullgraph=True, dynamic=dynamic)(args)
        assert message in str(compiled.value), f"dynamic={dynamic}"


def test_a_numpy_integer_under_fullgraph_gets_a_hint():
    """Dynamo traces a numpy scalar as an array, not as `numbers.Integral` (PyTorch 2.13), so
    a fullgraph compile refuses what eager accepts; the error says how to pass it. Without
    fullgraph, dynamo leaves the refused frame to eager, which accepts it."""
    np = pytest.importorskip("numpy")
    args = make_fp8_case([40, 3], next_n=1, num_heads=8, head_dim=128, seed=114).fp8_args()[:5]
    eager = fa.fp8_paged_mqa_logits(*args, np.int64(64))
    hint = "max_seq_len must be an int, got a numpy value; under torch.compile pass numpy"
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=re.escape(hint)):
        torch.compile(fa.fp8_paged_mqa_logits, fullgraph=True)(*args, np.int64(64))
    torch._dynamo.reset()
    compiled = torch.compile(fa.fp8_paged_mqa_logits)(*args, np.int64(64))
    assert_same_valid_region(compiled, eager, args[4], 1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_call_refuses_a_head_geometry_that_does_not_fit(dynamic):
    # At next_n * num_heads = 8 the largest head_dim that fits is 1600.
    case = make_fp8_case([40, 3], next_n=1, num_heads=8, head_dim=1632, seed=111)
    compiled = torch.compile(fa.fp8_paged_mqa_logits, fullgraph=True, dynamic=dynamic)
    with pytest.raises(ValueError, match="largest head_dim that fits is 1600"):
        compiled(*case.fp8_args())
    with pytest.raises(ValueError, match="largest head_dim that fits is 1600"):
        fa.fp8_paged_mqa_logits(*case.fp8_args())


def test_validate_mode_is_skipped_while_compiling(monkeypatch):
    """FLASHINFER_VALIDATE_INPUTS reads device data, which would break the graph."""
    monkeypatch.setenv("FLASHINFER_VALIDATE_INPUTS", "1")
    case = make_fp8_case(LENGTHS, next_n=2, seed=61)
    schedule = fa.compute_paged_mqa_logits_schedule(
        case.seq_lens, device="cpu", next_n=2, variant="fp8"
    )

    def call(*args):
        return fa.fp8_paged_mqa_logits(*args, schedule_meta=schedule)

    compiled = torch.compile(call, fullgraph=True)(*case.fp8_args())
    assert_same_valid_region(compiled, call(*case.fp8_args()), case.seq_lens, 2)

    # Eager still runs the checks: a max_seq_len below max(seq_lens) is caught there.
    short = (*case.fp8_args()[:5], 256)
    with pytest.raises(ValueError, match="exceeds max_seq_len = 256"):
        call(*short)


def test_validate_mode_is_skipped_under_make_fx_and_fake_tensors(monkeypatch):
    """Found by a review: the opt-in checks ran under make_fx and FakeTensorMode (they
    tested only for torch.compile) and failed there on data-dependent shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    monkeypatch.setenv("FLASHINFER_VALIDATE_INPUTS", "1")
    case = make_fp8_case(LENGTHS, next_n=2, seed=62)
    args = case.fp8_args()

    def call(*tensors):
        return fa.fp8_paged_mqa_logits(*tensors, case.max_seq_len)

    for tracing_mode in ("real", "fake", "symbolic"):
        graph = make_fx(call, tracing_mode=tracing_mode)(*args[:5])
        assert_same_valid_region(graph(*args[:5]), call(*args[:5]), case.seq_lens, 2)
    mode = FakeTensorMode()
    with mode:
        fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake_out = fa.fp8_paged_mqa_logits(*fakes)
    assert fake_out.shape == (case.rows, case.max_seq_len)


@pytest.mark.parametrize(
    ("capability", "expect_error"), [((9, 0), False), ((8, 0), True), ((10, 0), True)]
)
def test_cuda_arch_check_traces_as_a_constant(monkeypatch, capability, expect_error):
    # No GPU here: stand in for the device query. Dynamo cannot trace the query itself, so
    # the check runs once at trace time and its message is a constant of the graph.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Stand-in GPU")

    def arch_message_length(x):
        message = dispatch.cuda_arch_error("fp8_paged_mqa_logits", torch.device("cuda", 0))
        return x + len(message)

    x = torch.randn(3)
    got = torch.compile(arch_message_length, fullgraph=True)(x)
    message = dispatch.cuda_arch_error("fp8_paged_mqa_logits", torch.device("cuda", 0))
    assert bool(message) == expect_error
    if expect_error:
        assert f"compute capability {capability[0]}.{capability[1]}" in message
    assert torch.equal(got, x + len(message))


# ---------------------------------------------------------------------------------------------
# opcheck


def test_opcheck_fp8_op():
    case = make_fp8_case(LENGTHS, next_n=2, seed=71)
    out = poisoned(case.rows, fa.padded_seq_len(case.max_seq_len), torch.float32)
    dtypes = (torch.float32, torch.float32, torch.float32)
    # test_schema detects mutations by comparing every input before and after with
    # torch.allclose, which has no CPU kernel for float8_e4m3fn; run it separately below.
    results = torch.library.opcheck(
        custom_ops.fp8_paged_mqa_logits_into,
        (*case.fp8_args(), out, None, *dtypes),
        test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )
    assert set(results.values()) == {"SUCCESS"}
    # The op does no dtype checking and the CPU reference dequantises q with .to(float64),
    # so float32 q holding the same FP8 values exercises the same code for test_schema.
    q_as_float32 = case.q.to(torch.float32)
    args = (q_as_float32, *case.fp8_args()[1:], out, None, *dtypes)
    results = torch.library.opcheck(
        custom_ops.fp8_paged_mqa_logits_into, args, test_utils="test_schema"
    )
    assert results == {"test_schema": "SUCCESS"}


@pytest.mark.parametrize("interleaved", [False, True])
def test_opcheck_fp4_op(interleaved):
    case = make_fp4_case([5, 200], next_n=1, block_size=128, interleaved=interleaved, seed=81)
    out = poisoned(case.rows, fa.padded_seq_len(case.max_seq_len), torch.float16)
    results = torch.library.opcheck(
        custom_ops.fp4_paged_mqa_logits_into,
        (*case.fp4_args(), out, None, 32, torch.float16, torch.float32, interleaved),
    )
    assert set(results) == {
        "test_schema",
        "test_autograd_registration",
        "test_faketensor",
        "test_aot_dispatch_dynamic",
    }
    assert set(results.values()) == {"SUCCESS"}


def _op_call(variant: str, device):
    """A 4-row case (padded width 512), the op's CPU/CUDA entry and its trailing arguments
    (output float32, epilogue float32, and the accumulator or fp4's scale arguments)."""
    if variant == "fp8":
        case = make_fp8_case([40, 300], next_n=2, seed=72).to(device)
        return case, custom_ops.fp8_paged_mqa_logits_into, case.fp8_args(), (torch.float32,) * 3
    case = make_fp4_case([40, 300], next_n=2, block_size=64, seed=82).to(device)
    tail = (32, torch.float32, torch.float32, False)
    return case, custom_ops.fp4_paged_mqa_logits_into, case.fp4_args(), tail


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "storage_shape",
    [(3, 512), (4, 256), (4, 600)],
    ids=["too-few-rows", "too-few-columns", "padded-width-not-reached-by-stride"],
)
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_the_ops_refuse_a_storage_the_kernel_would_overrun(variant, storage_shape, device):
    """What an AOTInductor package can hand the op: it skips export's input guards, so the
    public functions' `out` checks never ran (pytorch/pytorch#141115)."""
    rows, cols = storage_shape
    case, op, args, tail = _op_call(variant, device)
    assert case.rows == 4 and fa.padded_seq_len(case.max_seq_len) == 512
    storage = torch.full((rows, 512 if cols == 600 else cols), 7.0, device=device)
    if cols == 600:  # 512 columns, but a row stride of 300 < 512
        storage = torch.full((rows, 600), 7.0, device=device).as_strided((rows, 512), (300, 1))
    before = storage.clone()
    with pytest.raises(ValueError, match="out must hold batch_size\\*next_n = 4 rows"):
        op(*args, storage, None, *tail)
    assert torch.equal(storage, before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_the_ops_apply_the_output_span_rule(variant, device):
    """A direct call of the op (an AOTInductor package) skipped the public functions' 2^31
    output-span rule (found by an audit), past which the kernels' 32-bit in-row offsets and
    in-kernel schedule sums no longer hold. Two of its branches need no memory: one row whose
    stride reaches 2^31 elements, and no rows under a width of 2^31 columns."""

    def call(lens, max_seq_len=None):
        if variant == "fp8":
            case = make_fp8_case(lens, next_n=1, seed=73).to(device)
            op, args, tail = (
                custom_ops.fp8_paged_mqa_logits_into,
                case.fp8_args(),
                (torch.float32,) * 3,
            )
            where = 5
        else:
            case = make_fp4_case(lens, next_n=1, block_size=64, seed=83).to(device)
            op, args = custom_ops.fp4_paged_mqa_logits_into, case.fp4_args()
            tail, where = (32, torch.float32, torch.float32, False), 6
        if max_seq_len is not None:
            args = (*args[:where], max_seq_len, *args[where + 1 :])
        return case, lambda storage: op(*args, storage, None, *tail)

    case, run = call([10])
    cols = fa.padded_seq_len(case.max_seq_len)
    too_wide = torch.full((cols,), 7.0, device=device).as_strided((1, cols), (2**31, 1))
    with pytest.raises(
        ValueError, match=r"^out too wide: .* = 1 \* 2147483648 = 2147483648 elements"
    ):
        run(too_wide)
    assert (too_wide == 7.0).all()
    just_fits = torch.full((cols,), float("nan"), device=device).as_strided(
        (1, cols), (2**31 - 1, 1)
    )
    run(just_fits)
    assert torch.isfinite(just_fits[0, :10]).all()

    _, run = call([], max_seq_len=2**31 - 1)
    with pytest.raises(
        ValueError, match=r"^max_seq_len too large: padded_seq_len\(max_seq_len\) = 2147483648"
    ):
        run(torch.empty((0, 2**31), device=device))
    _, run = call([], max_seq_len=2**31 - 256)
    run(torch.empty((0, 2**31 - 256), device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_the_ops_refuse_a_storage_of_another_dtype_than_output_dtype(variant, device):
    """An AOTInductor package exported for float32 output handed a float16 `out`: the kernel
    built for float32 would write 4-byte elements into a 2-byte buffer (found by a review)."""
    case, op, args, tail = _op_call(variant, device)
    storage = torch.full((case.rows, 512), 7.0, dtype=torch.float16, device=device)
    before = storage.clone()
    with pytest.raises(
        TypeError, match=r"^out must have dtype output_dtype = torch.float32, got torch.float16$"
    ):
        op(*args, storage, None, *tail)
    assert torch.equal(storage, before)


def _weights_inside(case, args: tuple, variant: str, pitch: int, offset: int, device: str):
    """A storage of `case.rows` rows of 512 columns every `pitch` columns, and the call's
    arguments with `weights` moved into that storage's buffer, `offset` elements in."""
    buffer = torch.full((case.rows * pitch,), 7.0, device=device)
    storage = buffer.as_strided((case.rows, 512), (pitch, 1))
    index = 2 if variant == "fp8" else 3
    weights = args[index]
    moved = buffer[offset : offset + weights.numel()].view(weights.shape).copy_(weights)
    return storage, (*args[:index], moved, *args[index + 1 :])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_the_ops_refuse_a_storage_that_overlaps_an_input(variant, device):
    """What a torch.compile'd call or an AOTInductor package hands the op: the public
    function checks a caller's `out` against the inputs only in eager calls (a trace has no
    addresses), so the op checks at run time (found by a review: the compiled call wrote
    the logits over weights). An input in the unwritten tail of a wide row is fine."""
    case, op, args, tail = _op_call(variant, device)
    storage, moved = _weights_inside(case, args, variant, pitch=512, offset=600, device=device)
    before = storage.clone()
    with pytest.raises(ValueError, match=r"^out overlaps weights: the call writes 4 row"):
        op(*moved, storage, None, *tail)
    assert torch.equal(storage, before)
    # Rows of 512 written every 1024 elements; weights (4 x 64 floats at most) sit in the
    # unwritten second half of the first row.
    storage, moved = _weights_inside(case, args, variant, pitch=1024, offset=512, device=device)
    op(*moved, storage, None, *tail)
    expected = storage.new_full((case.rows, 512), float("nan"))
    op(*args, expected, None, *tail)
    mask = valid_mask(case.seq_lens.cpu(), 2, 512).to(device)
    assert torch.equal(storage[mask], expected[mask])


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_a_compiled_call_refuses_an_out_that_overlaps_an_input(variant):
    case, _, args, _ = _op_call(variant, "cpu")
    storage, moved = _weights_inside(case, args, variant, pitch=512, offset=0, device="cpu")
    op = fa.fp8_paged_mqa_logits if variant == "fp8" else fa.fp4_paged_mqa_logits
    output_dtype = {} if variant == "fp8" else {"output_dtype": torch.float32}
    before = storage.clone()
    compiled = torch.compile(op, backend="eager", fullgraph=True)
    with pytest.raises(ValueError, match=r"^out overlaps weights"):
        compiled(*moved, out=storage, **output_dtype)
    assert torch.equal(storage, before)


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_a_compiled_call_refuses_an_inference_out_outside_inference_mode(variant):
    """Inductor does not keep PyTorch's own refusal of an in-place update of an inference
    tensor (dynamo cannot trace `is_inference()`); the op checks it at run time."""
    case, _, args, _ = _op_call(variant, "cpu")
    op = fa.fp8_paged_mqa_logits if variant == "fp8" else fa.fp4_paged_mqa_logits
    output_dtype = {} if variant == "fp8" else {"output_dtype": torch.float32}
    with torch.inference_mode():
        out = torch.full((case.rows, 512), 7.0)
    compiled = torch.compile(op, fullgraph=True)
    with pytest.raises(RuntimeError, match=r"^out is an inference tensor"):
        compiled(*args, out=out, **output_dtype)
    assert (out == 7.0).all()
    with torch.inference_mode():
        got = compiled(*args, out=out, **output_dtype)
    mask = valid_mask(case.seq_lens, 2, case.max_seq_len)
    assert torch.equal(got[mask], op(*args, **output_dtype)[mask])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_the_cuda_ops_refuse_a_schedule_of_too_few_rows(variant):
    """The kernels read num_sms + 1 schedule rows; an AOTInductor package can hand the op a
    smaller schedule_meta without the public checks."""
    case, op, args, tail = _op_call(variant, "cuda")
    storage = torch.full((case.rows, 512), 7.0, device="cuda")
    short = torch.zeros(5, 2, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"^schedule_meta must have shape \[num_sms \+ 1, 2\]"):
        op(*args, storage, short, *tail)
    assert (storage == 7.0).all()


# ---------------------------------------------------------------------------------------------
# torch.compile on the SM90 kernel


@pytest.mark.gpu
@pytest.mark.parametrize("with_schedule", [False, True])
@pytest.mark.parametrize("with_out", [False, True])
def test_fp8_compiled_fullgraph_matches_eager_on_gpu(with_out, with_schedule):
    next_n = 2
    lens = [1, 127, 0, 256, 257, 1000]
    case = make_fp8_case(
        lens, next_n=next_n, num_heads=64, head_dim=128, block_size=64, seed=91, spare_blocks=16
    ).to("cuda")
    max_seq_len = 1100
    cols = fa.padded_seq_len(max_seq_len)
    schedule = None
    if with_schedule:
        schedule = fa.compute_paged_mqa_logits_schedule(
            case.seq_lens, device=case.q.device, next_n=next_n, variant="fp8"
        )

    def call(q, kv_fused, weights, block_tables, seq_lens, out):
        return fa.fp8_paged_mqa_logits(
            q, kv_fused, weights, block_tables, seq_lens, max_seq_len,
            schedule_meta=schedule, out=out,
        )  # fmt: skip

    def storage():
        return poisoned(case.rows + 2, cols, torch.float32, "cuda") if with_out else None

    eager_out, compiled_out = storage(), storage()
    eager = call(*case.fp8_args()[:5], eager_out)
    compiled = torch.compile(call, fullgraph=True)(*case.fp8_args()[:5], compiled_out)
    torch.cuda.synchronize()

    assert compiled.device == case.q.device
    # The kernel is deterministic, so compiled and eager agree bit for bit.
    assert_same_valid_region(compiled, eager, case.seq_lens, next_n)
    if with_out:
        assert compiled.data_ptr() == compiled_out.data_ptr()
        assert torch.isnan(compiled_out[case.rows :]).all(), "a row past batch*next_n written"
        assert_empty_rows_untouched(compiled_out, case.seq_lens, next_n)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_compiled_with_cuda_graphs_follows_new_seq_lens(variant):
    """torch.compile(mode="reduce-overhead"): inductor records the call into its own CUDA
    graph (the schedule derived inside), and later calls with new length contents replay
    it; each result matches the eager call on the same inputs. Every call gets fresh q, KV,
    weights and block ids (same shapes, written in place), so a replay that computed nothing
    or followed the lengths captured would keep an earlier call's logits and fail."""
    next_n = 2
    capture_lens = [700, 0, 700, 700, 65]
    make = make_fp8_case if variant == "fp8" else make_fp4_case
    extra = dict(num_heads=64, head_dim=128) if variant == "fp8" else {}
    case = make(capture_lens, next_n=next_n, block_size=64, seed=93, spare_blocks=8, **extra)
    case = case.to("cuda")
    max_seq_len = 800
    args = case.fp8_args()[:5] if variant == "fp8" else case.fp4_args()[:6]
    op = VARIANTS[variant].op

    def call(*tensors):
        return op(*tensors, max_seq_len)

    compiled = torch.compile(call, mode="reduce-overhead", fullgraph=True)
    # Each new length fits the blocks the table maps for `capture_lens`. Calls 1-2 warm up
    # and record, with short lengths; the later ones replay, the third growing past them.
    replays = (
        [2, 0, 3, 4, 5],
        [1, 0, 64, 650, 0],
        [700, 0, 700, 700, 65],
        [699, 0, 129, 1, 33],
        [0, 0, 0, 0, 65],
        [700, 0, 700, 700, 65],
    )
    for call_index, lens in enumerate(replays):
        fresh = make(
            capture_lens, next_n=next_n, block_size=64, seed=94 + call_index, spare_blocks=8,
            **extra,
        ).to("cuda")  # fmt: skip
        fresh_args = fresh.fp8_args()[:5] if variant == "fp8" else fresh.fp4_args()[:6]
        for captured, new in zip(args, fresh_args, strict=True):
            captured.copy_(new)
        case.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        got = compiled(*args).clone()  # the graph's output buffer is reused by the next replay
        expected = call(*args)
        torch.cuda.synchronize()
        assert_same_valid_region(got, expected, case.seq_lens, next_n)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_dynamic_shapes_compile_once_and_match_eager_on_gpu(variant):
    """As the CPU test: one dynamic-shape graph for three batch sizes, each result bitwise the
    eager call's and within the GPU suite's bounds of the float64 reference."""
    from test_gpu import tolerance
    from torch._dynamo.testing import CompileCounterWithBackend

    kind = VARIANTS[variant]
    op, output_dtype = kind.op, kind.output_dtype
    next_n = DYNAMIC_NEXT_N[variant]
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(op, backend=counter, fullgraph=True, dynamic=True)
    for seed, lens in enumerate(DYNAMIC_BATCHES):
        case = dynamic_case(variant, lens, seed=120 + seed).to("cuda")
        args = kind.args(case)
        got = compiled(*args)
        eager = op(*args)
        torch.cuda.synchronize()
        assert_same_valid_region(got, eager, case.seq_lens, next_n)
        # Heads as few as 20 and rows of one valid position: the accumulation term of
        # assert_rows_close, as in the random-call tests.
        assert_rows_close(
            got,
            case.expected(),
            valid_mask(case.seq_lens.cpu(), next_n, case.max_seq_len),
            tolerance(output_dtype),
            case.expected(abs_weights=True),
            case.dot_magnitude(),
            accumulation_error(torch.float32, case.k64.shape[-1]),
        )
    assert counter.frame_count == 1


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_weights_that_require_grad_give_a_result_without_grad_fn(variant):
    """Documented under `weights`: the ops have no backward. The values are those of the
    same call with plain weights, and nothing pretends to be differentiable."""
    case, _, args, _ = _op_call(variant, "cpu")
    op = fa.fp8_paged_mqa_logits if variant == "fp8" else fa.fp4_paged_mqa_logits
    index = 2 if variant == "fp8" else 3
    tracked = list(args)
    tracked[index] = args[index].clone().requires_grad_()
    got = op(*tracked)
    assert got.grad_fn is None and not got.requires_grad
    mask = valid_mask(case.seq_lens, 2, case.max_seq_len)
    assert torch.equal(got[mask], op(*args)[mask])


def test_the_op_refuses_an_out_aliasing_an_input_through_another_storage_object():
    """The op's quick test compares the memory of storages, not storage objects: two
    tensors made from one buffer (`torch.frombuffer` twice) share memory but no storage."""
    case, op, args, tail = _op_call("fp8", "cpu")
    memory = bytearray(4 * case.rows * 512)
    storage = torch.frombuffer(memory, dtype=torch.float32).view(case.rows, 512)
    weights = torch.frombuffer(memory, dtype=torch.float32)[: args[2].numel()]
    weights = weights.view(args[2].shape).copy_(args[2])
    assert storage.untyped_storage()._cdata != weights.untyped_storage()._cdata
    with pytest.raises(ValueError, match=r"^out overlaps weights"):
        op(*args[:2], weights, *args[3:], storage, None, *tail)
