"""The eager call path without a GPU: the remembered call of a validated signature, its
output view, what makes a signature new, and the custom ops' CUDA functions forwarding every
argument to the launcher (replaced here by a recorder).

On the GPU, test_gpu_eager_calls.py runs the same path against the reference.
"""

from __future__ import annotations

import pytest
import torch
from attn_scores_cases import make_fp4_case, make_fp8_case
from flashinfer_attn_scores import _validation as v
from flashinfer_attn_scores.paged_mqa_logits import custom_ops, dispatch, launcher
from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask


def _problem(rows: int, max_seq_len: int) -> dispatch.Problem:
    return dispatch.Problem(
        batch_size=rows,
        next_n=1,
        num_heads=64,
        head_dim=128,
        num_blocks=4,
        block_size=64,
        max_seq_len=max_seq_len,
    )


def _recording_run(calls: list):
    def run(*args):
        calls.append(args)

    return run


def test_remembered_call_launches_into_the_callers_out_and_returns_the_sliced_view():
    buffer = torch.zeros(9, 640)
    out = buffer[2:]  # a row slice: the view must keep its storage offset
    problem = _problem(rows=3, max_seq_len=300)
    calls = []
    tensors = tuple(torch.ones(k) for k in range(1, 6))  # q, kv_fused, weights, tables, lens
    schedule = torch.zeros(133, 2, dtype=torch.int32)
    check_out = dispatch.OutCheck(
        "fp8", problem.rows, problem.padded_cols, (*tensors, schedule), out
    )
    eager = dispatch.EagerCall(_recording_run(calls), problem, out, check_out)
    version = out._version
    got = eager(tensors, schedule, out)
    assert out._version > version  # autograd sees the in-place write, as through the op
    assert len(calls) == 1
    assert calls[0][:5] == tensors and calls[0][5] is out and calls[0][6] is schedule
    expected = out[:3, :300]
    assert got.shape == expected.shape and got.stride() == expected.stride()
    assert got.data_ptr() == expected.data_ptr()
    assert got.storage_offset() == expected.storage_offset() == 2 * 640
    got.fill_(7.0)
    assert torch.equal(buffer[2:5, :300], torch.full((3, 300), 7.0))
    assert buffer[2:5, 300:].abs().sum() == 0 and buffer[:2].abs().sum() == 0


def test_remembered_call_refuses_an_out_that_overlaps_an_input():
    problem = _problem(rows=3, max_seq_len=300)
    width = problem.padded_cols  # out's written region: its first 3 * width elements
    buffer = torch.zeros(4 * width)
    out = buffer[: 3 * width].view(3, width)
    tensors = tuple(torch.ones(k) for k in range(1, 6))
    check_out = dispatch.OutCheck("fp8", problem.rows, problem.padded_cols, (*tensors, None), out)
    calls = []
    eager = dispatch.EagerCall(_recording_run(calls), problem, out, check_out)
    weights = buffer[3 * width - 1 : 3 * width + 2]  # its first element is out's last written
    with pytest.raises(ValueError, match=r"out overlaps weights: .* lie there"):
        eager((tensors[0], tensors[1], weights, tensors[3], tensors[4]), None, out)
    assert calls == []
    eager((tensors[0], tensors[1], buffer[3 * width :][:3], tensors[3], tensors[4]), None, out)
    assert len(calls) == 1  # the next element on is fine


def test_an_input_ending_at_outs_first_element_overlaps_and_one_ending_before_it_does_not():
    """The other edge: an input's last element on out's first (refused), and an input
    that ends where out begins (no byte shared: accepted)."""
    problem = _problem(rows=3, max_seq_len=300)
    width = problem.padded_cols
    buffer = torch.zeros(3 + 3 * width)
    out = buffer[3:].view(3, width)
    tensors = tuple(torch.ones(k) for k in range(1, 6))
    check_out = dispatch.OutCheck("fp8", problem.rows, problem.padded_cols, (*tensors, None), out)
    calls = []
    eager = dispatch.EagerCall(_recording_run(calls), problem, out, check_out)
    with pytest.raises(ValueError, match=r"out overlaps weights: .* lie there"):
        eager((tensors[0], tensors[1], buffer[1:4], tensors[3], tensors[4]), None, out)
    assert calls == []
    eager((tensors[0], tensors[1], buffer[:3], tensors[3], tensors[4]), None, out)
    assert len(calls) == 1


def _bytes_of(t: torch.Tensor, offset: int) -> set[int]:
    """Every byte of `t`'s elements, `offset` bytes past a base, by enumeration."""
    index = torch.zeros((), dtype=torch.int64)
    for n, s in zip(t.shape, t.stride(), strict=True):
        index = index[..., None] + torch.arange(n) * s
    size = t.element_size()
    return {offset + i * size + b for i in index.flatten().tolist() for b in range(size)}


def test_the_exact_overlap_test_agrees_with_enumerated_bytes():
    """`meets_written_rows` against a brute-force set intersection, over random strided inputs
    (expanded, transposed, gapped, of 1-8 byte elements) near out's rows."""
    gen = torch.Generator().manual_seed(7)
    dtypes = (torch.uint8, torch.int16, torch.float32, torch.float64)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high, (), generator=gen))

    meets = misses = 0
    for _ in range(3000):
        rows, width = draw(1, 4), draw(1, 40)
        pitch = width + draw(0, 30)
        written = {k * pitch + j for k in range(rows) for j in range(width)}
        ndim = draw(1, 4)
        shape = tuple(draw(1, 5) for _ in range(ndim))
        stride = tuple(draw(0, 9) for _ in range(ndim))
        span = 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
        t = torch.empty(span, dtype=dtypes[draw(0, 4)]).as_strided(shape, stride)
        offset = draw(-120, rows * pitch + 20)
        expected = bool(_bytes_of(t, offset) & written)
        got = v.meets_written_rows(t, offset, pitch, width, rows)
        assert got == expected, (shape, stride, t.dtype, offset, pitch, width, rows)
        meets, misses = meets + expected, misses + (not expected)
    assert meets > 500 and misses > 500  # both verdicts drawn often


def test_contiguous_dimensions_are_walked_as_one_run_and_too_many_runs_are_refused(monkeypatch):
    """A block-pitched pool is one run per block (its inner dimensions merged); past the
    walking limit the extents decide, and the error says the elements were not compared."""
    monkeypatch.setattr(v, "_EXACT_OVERLAP_RUNS", 4)
    pool = torch.empty(4, 8, 1, 12, dtype=torch.uint8)  # contiguous: one run
    assert v.meets_written_rows(pool, 1000, 64, 16, 2) is False
    pitched = torch.empty(4, 128, dtype=torch.uint8)[:, :96].view(4, 8, 1, 12)  # 4 runs
    assert v.meets_written_rows(pitched, -96, 128, 32, 1) is False  # block 0 ends at out's start
    assert v.meets_written_rows(pitched, -95, 128, 32, 1) is True
    strided = pitched[:, :, :, ::2]  # 192 one-byte runs
    assert v.meets_written_rows(strided, 0, 128, 32, 1) is None
    error = v.out_overlap_error("kv_fused", 0, 1, 32, 128, 0, 480, exact=False)
    assert "too many separate runs of bytes (over 4)" in str(error)
    assert "lie there" not in str(error)


def test_an_input_in_the_unwritten_tail_of_outs_rows_is_accepted():
    """A wide-pitch out writes only the first padded_seq_len columns of each row; weights kept
    in the rest of the same buffer share no byte with what the call writes (their extent does
    cover a written row), and the call gives the logits of a separate out. Moved one column
    into a written row, they are refused."""
    import flashinfer_attn_scores as fa

    case = make_fp8_case([70, 5], next_n=1, num_heads=16, head_dim=64, block_size=64)
    padded = fa.padded_seq_len(case.max_seq_len)
    heads = case.weights.shape[1]
    arena = torch.zeros(case.rows, padded + heads)
    out = arena[:, :padded]
    weights = arena[:, padded:]
    weights.copy_(case.weights)
    args = list(case.fp8_args())
    args[2] = weights
    got = fa.fp8_paged_mqa_logits(*args, out=out)
    expected = fa.fp8_paged_mqa_logits(*case.fp8_args())
    mask = valid_mask(case.seq_lens, 1, case.max_seq_len)
    assert torch.equal(got[mask], expected[mask])
    assert torch.equal(weights, case.weights)  # not written

    wide = torch.zeros(case.rows, padded + heads)
    shifted = wide[
        :, padded - 1 : padded - 1 + heads
    ]  # each row's first weight on out's last column
    shifted.copy_(case.weights)
    args[2] = shifted
    with pytest.raises(ValueError, match=r"out overlaps weights: the call writes 2 row\(s\)"):
        fa.fp8_paged_mqa_logits(*args, out=wide[:, :padded])


@pytest.mark.parametrize("compiled", [False, True])
def test_an_out_that_requires_grad_is_refused_while_grad_mode_is_on(compiled):
    """The op writes out in place and has no backward: autograd would take the logits for a
    view of out's old values (found by a review: out.grad came back non-zero). Refused on the
    first call, on a remembered one and compiled; accepted under torch.no_grad()."""
    import flashinfer_attn_scores as fa

    case = make_fp8_case([70, 5], next_n=1, num_heads=16, head_dim=64, block_size=64)
    padded = fa.padded_seq_len(case.max_seq_len)
    op = (
        torch.compile(fa.fp8_paged_mqa_logits, fullgraph=True)
        if compiled
        else fa.fp8_paged_mqa_logits
    )
    plain = torch.zeros(case.rows, padded)
    op(*case.fp8_args(), out=plain)  # the signature is remembered now (eager)
    leaf = torch.zeros(case.rows, padded, requires_grad=True)
    for _ in range(2):
        with pytest.raises(Exception, match="out requires grad") as raised:
            op(*case.fp8_args(), out=leaf)
        assert compiled or raised.type is RuntimeError
    assert torch.equal(leaf.detach(), torch.zeros_like(plain))  # not written
    mask = valid_mask(case.seq_lens, 1, case.max_seq_len)
    with torch.no_grad():
        got = op(*case.fp8_args(), out=leaf)
        assert torch.equal(got[mask], plain[:, : case.max_seq_len][mask])


def test_a_remembered_call_refuses_a_grad_out_first_as_validation_does():
    """The same arguments raise the same error on a first and on a remembered call: the grad
    refusal before the overlap and inference checks (found by a review)."""
    problem = _problem(rows=3, max_seq_len=300)
    width = problem.padded_cols
    buffer = torch.zeros(4 * width, requires_grad=True)
    out = buffer[: 3 * width].view(3, width)
    tensors = tuple(torch.ones(k) for k in range(1, 6))
    check_out = dispatch.OutCheck("fp8", problem.rows, problem.padded_cols, (*tensors, None), out)
    overlapping = (tensors[0], tensors[1], buffer[3 * width - 1 :], tensors[3], tensors[4], None)
    with pytest.raises(RuntimeError, match="out requires grad"):
        check_out(overlapping, out)
    with torch.no_grad(), pytest.raises(ValueError, match="out overlaps weights"):
        check_out(overlapping, out)


def test_torch_func_transforms_reach_the_custom_op():
    """Under torch.func.grad the call goes through the custom op, whose refusal is PyTorch's
    own, instead of reading addresses of wrapper tensors ("Cannot access data pointer")."""
    import flashinfer_attn_scores as fa

    case = make_fp8_case([70, 5], next_n=1, num_heads=16, head_dim=64, block_size=64)
    q, kv, weights, tables, lens, max_seq_len = case.fp8_args()
    out = torch.zeros(case.rows, fa.padded_seq_len(max_seq_len))

    def total(w: torch.Tensor) -> torch.Tensor:
        return fa.fp8_paged_mqa_logits(q, kv, w, tables, lens, max_seq_len, out=out).sum()

    with pytest.raises(RuntimeError) as raised:
        torch.func.grad(total)(weights)
    assert "data pointer" not in str(raised.value) and "overlaps" not in str(raised.value)


def test_remembered_call_refuses_an_inference_out_outside_inference_mode():
    """PyTorch allows no in-place update of an inference tensor outside inference mode; the
    direct CUDA launch must refuse it as the custom op does, and allow it inside the mode."""
    problem = _problem(rows=3, max_seq_len=300)
    with torch.inference_mode():
        out = torch.zeros(3, problem.padded_cols)
    tensors = tuple(torch.ones(k) for k in range(1, 6))
    check_out = dispatch.OutCheck("fp8", problem.rows, problem.padded_cols, (*tensors, None), out)
    calls = []
    eager = dispatch.EagerCall(_recording_run(calls), problem, out, check_out)
    with pytest.raises(RuntimeError, match="out is an inference tensor"):
        eager(tensors, None, out)
    assert calls == []
    with torch.inference_mode():
        eager(tensors, None, out)
    assert len(calls) == 1


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_public_call_refuses_an_inference_out_outside_inference_mode(variant):
    import flashinfer_attn_scores as fa

    if variant == "fp8":
        case = make_fp8_case([70, 0, 5], next_n=2, num_heads=64, head_dim=128, block_size=64)
        op, args, dtype = fa.fp8_paged_mqa_logits, case.fp8_args(), torch.float32
    else:
        case = make_fp4_case([70, 0, 5], next_n=2, block_size=64)
        op, args, dtype = fa.fp4_paged_mqa_logits, case.fp4_args(), torch.bfloat16
    with torch.inference_mode():
        out = torch.full((case.rows, fa.padded_seq_len(case.max_seq_len)), -1.0, dtype=dtype)
    with pytest.raises(RuntimeError, match="out is an inference tensor"):
        op(*args, out=out)
    assert (out == -1).all()
    with torch.inference_mode():
        got = op(*args, out=out)
    mask = valid_mask(case.seq_lens, 2, case.max_seq_len)
    assert torch.equal(got[mask], op(*args)[mask])


def test_remembered_call_without_out_allocates_padded_storage_each_call():
    problem = _problem(rows=2, max_seq_len=1000)
    first = torch.empty(problem.rows, problem.padded_cols, dtype=torch.float16)
    calls = []
    eager = dispatch.EagerCall(_recording_run(calls), problem, first, None)
    a = eager((), None, None)
    b = eager((), None, None)
    storages = [call[0] for call in calls]
    assert [s.shape for s in storages] == [(2, problem.padded_cols)] * 2
    assert all(s.dtype == torch.float16 for s in storages)
    assert storages[0].data_ptr() != storages[1].data_ptr()  # both alive: fresh buffers
    assert a.shape == b.shape == (2, 1000) and a.stride() == (problem.padded_cols, 1)
    assert a.data_ptr() == storages[0].data_ptr()


def test_validate_mode_bypasses_a_remembered_call(monkeypatch):
    key = ("a signature",)
    monkeypatch.setitem(dispatch._EAGER_CALLS, key, "remembered")
    monkeypatch.delenv("FLASHINFER_VALIDATE_INPUTS", raising=False)
    assert dispatch.eager_call(key) == "remembered"
    monkeypatch.setenv("FLASHINFER_VALIDATE_INPUTS", "1")
    assert dispatch.eager_call(key) is None
    assert dispatch.eager_call(None) is None


def _fp8_key(q, kv_fused, weights, block_tables, seq_lens, max_seq_len, out=None, dtype=None):
    dtypes = (dtype or torch.float32, torch.float32, torch.float32)
    tensors = (q, kv_fused, weights, block_tables, seq_lens)
    return dispatch.signature("fp8", tensors, (max_seq_len, *dtypes), (None, out))


def test_every_metadata_change_is_a_new_signature():
    case = make_fp8_case([40, 70], next_n=1, seed=5)
    args = list(case.fp8_args())
    base = _fp8_key(*args)
    assert base == _fp8_key(*make_fp8_case([40, 70], next_n=1, seed=6).fp8_args())
    weights = args[2]
    variants = {
        "dtype": weights.to(torch.float64),
        "shape": weights[:, :4],
        "stride": weights.t().contiguous().t(),
        "device": weights.to("meta"),
    }
    for what, changed in variants.items():
        other = list(args)
        other[2] = changed
        assert _fp8_key(*other) != base, what
    other = list(args)
    other[-1] += 1  # max_seq_len
    assert _fp8_key(*other) != base
    assert _fp8_key(*args, out=torch.empty(2, 256)) not in (base, None)
    assert _fp8_key(*args, dtype=torch.float16) != base


def test_scalars_of_another_type_are_another_signature():
    case = make_fp8_case([1], next_n=1, seed=7)
    args = list(case.fp8_args())
    args[-1] = 1
    as_int = _fp8_key(*args)
    args[-1] = True  # equal to 1 and hashed alike, but not an int to the checks
    assert _fp8_key(*args) != as_int


def test_arguments_of_unexpected_types_have_no_signature():
    case = make_fp8_case([40], next_n=1, seed=8)
    args = list(case.fp8_args())
    assert _fp8_key(*args[:-1], [1]) is None  # a list: unhashable, left to the checks to name
    assert _fp8_key(args[0].view(torch.uint8).numpy(), *args[1:]) is None  # no .stride()
    assert _fp8_key(*args, out=[0.0]) is None


@pytest.fixture
def recorded(monkeypatch):
    seen = {}

    def record(name):
        def launch(*args, **kwargs):
            seen[name] = (args, kwargs)

        return launch

    monkeypatch.setattr(launcher, "launch_fp8_paged_mqa_logits", record("fp8"))
    monkeypatch.setattr(launcher, "launch_fp4_paged_mqa_logits", record("fp4"))
    return seen


def test_fp8_cuda_kernel_function_forwards_every_argument(recorded):
    case = make_fp8_case([40, 10], next_n=2, seed=0)
    storage = torch.empty(4, 256, dtype=torch.float16)
    schedule = torch.zeros(133, 2, dtype=torch.int32)
    custom_ops.fp8_paged_mqa_logits_into_cuda(
        case.q, case.kv_fused, case.weights, case.block_tables, case.seq_lens, 64,
        storage, schedule, torch.float16, torch.float32, torch.float16,
    )  # fmt: skip
    args, kwargs = recorded["fp8"]
    expected = (case.q, case.kv_fused, case.weights, case.block_tables, case.seq_lens, storage)
    assert all(a is b for a, b in zip(args, expected)) and args[6] is schedule
    assert kwargs == {
        "max_seq_len": 64,
        "output_dtype": torch.float16,
        "epi_dtype": torch.float32,
        "acc_dtype": torch.float16,
    }


def test_fp4_cuda_kernel_function_forwards_every_argument(recorded):
    case = make_fp4_case([40, 10], next_n=2, block_size=128, interleaved=True, seed=0)
    storage = torch.empty(4, 256, dtype=torch.bfloat16)
    custom_ops.fp4_paged_mqa_logits_into_cuda(
        case.q, case.q_sf, case.kv_fused, case.weights, case.block_tables, case.seq_lens, 64,
        storage, None, 32, torch.bfloat16, torch.float16, True,
    )  # fmt: skip
    args, kwargs = recorded["fp4"]
    expected = (
        case.q, case.q_sf, case.kv_fused, case.weights, case.block_tables, case.seq_lens, storage,
    )  # fmt: skip
    assert all(a is b for a, b in zip(args, expected)) and args[7] is None
    assert kwargs == {
        "max_seq_len": 64,
        "sf_vec_size": 32,
        "output_dtype": torch.bfloat16,
        "epi_dtype": torch.float16,
        "is_kv_sf_interleaved": True,
    }


def test_public_call_refuses_an_out_that_overlaps_weights():
    import flashinfer_attn_scores as fa

    case = make_fp8_case([70, 5], next_n=1, num_heads=64, head_dim=128, block_size=64)
    padded = fa.padded_seq_len(case.max_seq_len)
    buffer = torch.zeros(case.rows * padded)
    weights = buffer[: case.weights.numel()].view(case.weights.shape).copy_(case.weights)
    out = buffer.view(case.rows, padded)
    args = list(case.fp8_args())
    args[2] = weights
    with pytest.raises(ValueError, match="out overlaps weights"):
        fa.fp8_paged_mqa_logits(*args, out=out)
    fa.fp8_paged_mqa_logits(*args, out=torch.zeros(case.rows, padded))  # disjoint: fine


def test_no_signature_under_a_tracer():
    """Only plain eager calls are remembered (and launched directly on CUDA): under
    make_fx or a FakeTensorMode the call must reach the custom op, or the trace would record
    an output nothing wrote."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    t = torch.ones(3)
    assert dispatch.signature("fp8", (t,), (), ()) is not None
    with FakeTensorMode():
        assert not dispatch.plain_eager()
        assert dispatch.signature("fp8", (t,), (), ()) is None


def test_symbolic_make_fx_records_the_custom_op():
    import flashinfer_attn_scores as fa
    from torch.fx.experimental.proxy_tensor import make_fx

    case = make_fp8_case([70, 0, 5], next_n=1, num_heads=64, head_dim=128, block_size=64)

    def call(*tensors):
        return fa.fp8_paged_mqa_logits(*tensors, case.max_seq_len)

    graph = make_fx(call, tracing_mode="symbolic")(*case.fp8_args()[:5])
    targets = [str(node.target) for node in graph.graph.nodes]
    assert any("fp8_paged_mqa_logits_into" in target for target in targets), targets
    mask = valid_mask(case.seq_lens, 1, case.max_seq_len)  # empty requests' rows: unwritten
    assert torch.equal(graph(*case.fp8_args()[:5])[mask], call(*case.fp8_args()[:5])[mask])


class _ClearedAfterStoring(dict):
    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.clear()


class _ClearedAfterFinding(dict):
    def __contains__(self, key):
        found = super().__contains__(key)
        self.clear()
        return found


@pytest.mark.parametrize("verdicts", [_ClearedAfterStoring, _ClearedAfterFinding])
def test_an_overlap_verdict_survives_another_thread_clearing_the_verdicts(verdicts):
    """The verdict cache is shared by threads calling one remembered signature; a clear by
    another thread between storing or finding a verdict and reading it must not lose it
    (found by two reviews: KeyError from a valid call)."""

    problem = _problem(rows=3, max_seq_len=300)
    width = problem.padded_cols
    tensors = tuple(torch.ones(k) for k in range(1, 6))
    # An input inside the extent of a wide-pitch out's rows, past their written part.
    wide = torch.zeros(3 * 2 * width)
    out = wide.view(3, 2 * width)[:, :width]
    inputs = (tensors[0], tensors[1], wide[width : width + 4], tensors[3], tensors[4], None)
    check_out = dispatch.OutCheck("fp8", problem.rows, problem.padded_cols, inputs, out)
    check_out._verdicts = verdicts()
    check_out(inputs, out)  # no overlap, no error (raised KeyError before)
    if verdicts is _ClearedAfterFinding:  # a second call finds the verdict, then loses it
        dict.__setitem__(check_out._verdicts, (2, width * 4), False)
        check_out(inputs, out)


def test_a_refused_head_dim_adds_no_kernel_configuration():
    """Refused calls (head_dim too large for shared memory) must not grow the config cache."""
    from flashinfer_attn_scores.paged_mqa_logits import fp8_sm90

    before = fp8_sm90.fp8_config.cache_info().currsize
    for head_dim in range(4096, 4096 + 32 * 50, 32):
        with pytest.raises(ValueError, match="does not fit the SM90 kernel's shared memory"):
            fp8_sm90.check_shared_memory_fit(64, head_dim, 1)
    assert fp8_sm90.fp8_config.cache_info().currsize == before
