import bisect

import pytest
import torch
from flashinfer_schedule import (
    DEFAULT_CPU_NUM_SMS,
    SCHEDULE_REQUEST_ENTRY_UNITS,
    compute_paged_mqa_logits_schedule,
    passes_per_token,
)

TOKENS_PER_UNIT = 64  # the policy's segment size, restated here on purpose
ENTRY_UNITS = 4  # the policy's charge for entering a request, restated here on purpose


def unit_counts(lens: list[int], passes: int = 1) -> list[int]:
    return [-(-max(n, 0) // TOKENS_PER_UNIT) * passes for n in lens]


def split_starts(total: int, num_sms: int) -> list[int]:
    """Virtual start of every SM and the end: sizes differ by at most one, larger first."""
    base, extra = divmod(total, num_sms)
    starts, g = [], 0
    for i in range(num_sms + 1):
        starts.append(g)
        g += base + (1 if i < extra else 0)
    return starts


def loop_schedule(
    lens: list[int], num_sms: int, passes: int = 1, entry: int = ENTRY_UNITS
) -> list[tuple[int, int]]:
    """Independent reference: walk requests and SM start points with two pointers over the
    virtual positions (`entry` per non-empty request, then one per unit)."""
    costs = [u + entry if u > 0 else 0 for u in unit_counts(lens, passes)]
    rows, b, begin = [], 0, 0
    for g in split_starts(sum(costs), num_sms):
        while b < len(costs) and begin + costs[b] <= g:
            begin += costs[b]
            b += 1
        rows.append((b, max(0, g - begin - entry)) if b < len(costs) else (len(costs), 0))
    return rows


def expanded_schedule(lens: list[int], num_sms: int, entry: int = ENTRY_UNITS) -> list:
    """A second reference for small cases: list every virtual position with the unit that
    holds it (a request's entry positions belong to its unit 0) and read the SM starts off."""
    owners = []
    for b, units in enumerate(unit_counts(lens)):
        if units:
            owners += [(b, 0)] * entry + [(b, u) for u in range(units)]
    return [
        owners[g] if g < len(owners) else (len(lens), 0) for g in split_starts(len(owners), num_sms)
    ]


def schedule_rows(lens, num_sms, **kw):
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    sched = compute_paged_mqa_logits_schedule(seq_lens, num_sms=num_sms, **kw)
    assert sched.dtype == torch.int32 and sched.shape == (num_sms + 1, 2)
    return [tuple(r) for r in sched.tolist()]


def check_each_unit_goes_to_its_last_position(lens, rows, num_sms):
    """The rows tile every unit once, in order, and unit u of request b belongs to the SM whose
    even share of the virtual positions holds the unit's last position."""
    units = unit_counts(lens)
    first_unit = [0]  # global index of each request's unit 0
    for u in units:
        first_unit.append(first_unit[-1] + u)
    global_rows = []
    for b, u in rows:
        if b == len(lens):
            assert u == 0
        else:
            assert 0 <= u < units[b], f"row ({b}, {u}) points outside request {b}'s units"
        global_rows.append(first_unit[b] + u)
    assert global_rows[0] == 0 and global_rows[-1] == first_unit[-1]
    assert global_rows == sorted(global_rows)
    costs = [u + ENTRY_UNITS if u else 0 for u in units]
    starts = split_starts(sum(costs), num_sms)
    begin = 0
    for b, count in enumerate(units):
        for u in range(count):
            last = begin + ENTRY_UNITS + u  # the unit's last (for u > 0 its only) position
            sm = bisect.bisect_right(starts, last) - 1  # the last SM starting at or before it
            g = first_unit[b] + u
            assert global_rows[sm] <= g < global_rows[sm + 1], (b, u, sm)
        begin += costs[b]


def test_the_entry_charge_is_the_measured_one():
    assert SCHEDULE_REQUEST_ENTRY_UNITS == ENTRY_UNITS


def test_hand_computed_small_case():
    # units 2, 0, 5 -> costs 6, 0, 9 (4 entry positions each), total 15 over 4 SMs: 4, 4, 4, 3,
    # starts 0, 4, 8, 12, 15. Position 4 is request 0's unit 0 (entry 0-3, unit 0 at 4), so
    # SM 0 holds only entry positions and starts where SM 1 does. Position 8 is request 2's
    # entry (6-9), 12 its unit 2 (10 + 2).
    assert schedule_rows([100, 0, 300], 4) == [(0, 0), (0, 0), (2, 0), (2, 2), (3, 0)]


def test_hand_computed_two_requests():
    # 10 units each -> costs 14, 14, total 28 over 4 SMs: 7 each, starts 0, 7, 14, 21, 28.
    # SM 0 and SM 2 pay an entry and stream 3 units, SM 1 and SM 3 stream 7.
    assert schedule_rows([640, 640], 4) == [(0, 0), (0, 3), (1, 0), (1, 3), (2, 0)]


def test_hand_computed_three_requests():
    # 8 units each -> costs 12, 12, 12, total 36 over 4 SMs: 9 each, starts 0, 9, 18, 27, 36.
    # SM 0 streams units 0-4 of request 0; SM 1 units 5-7 of request 0 and 0-1 of request 1
    # (5 units and a switch); SM 2 units 2-7 of request 1, charged request 2's entry positions
    # 24-26; SM 3 starts on request 2's last entry position (27) and
    # streams all 8 of its units. Without the charge, 6 units each and SMs 1 and 2 switch.
    rows = schedule_rows([512, 512, 512], 4)
    assert rows == [(0, 0), (0, 5), (1, 2), (2, 0), (3, 0)]


def test_hand_computed_zero_lengths_between():
    # units 0, 1, 0, 0, 2, 0 -> costs 0, 5, 0, 0, 6, 0, total 11 over 3 SMs: 4, 4, 3, starts 0,
    # 4, 8, 11; positions 0 and 4 are request 1's, 8 is request 4's entry.
    assert schedule_rows([0, 64, 0, 0, 65, 0], 3) == [(1, 0), (1, 0), (4, 0), (6, 0)]


def test_hand_computed_fewer_positions_than_sms():
    # costs 5, 5 over 12 SMs: one position each for SMs 0-9; SMs 4 and 9 hold the units.
    rows = schedule_rows([1, 64], 12)
    assert rows == [(0, 0)] * 5 + [(1, 0)] * 5 + [(2, 0)] * 3


def test_all_zero_lengths_give_sentinel_rows():
    assert schedule_rows([0, 0, 0], 4) == [(3, 0)] * 5


def test_empty_batch_gives_sentinel_rows():
    assert schedule_rows([], 3) == [(0, 0)] * 4


def test_one_huge_request():
    # ceil((2**31 - 1) / 64) = 2**25 units, cost 2**25 + 4 = 33554436 over 132 SMs: 254200
    # each and the first 36 SMs one more. Row i is unit g(i) - 4, g(i) = 254200 i + min(i, 36).
    rows = schedule_rows([2**31 - 1], 132)
    assert rows[0] == (0, 0)
    assert rows[1] == (0, 254197)
    assert rows[36] == (0, 9151232)
    assert rows[37] == (0, 9405432)
    assert rows[131] == (0, 33300232)
    assert rows[132] == (1, 0)


def test_negative_lengths_count_as_empty():
    assert schedule_rows([-5, 64], 2) == schedule_rows([0, 64], 2)
    # Past -63 the unit count itself is negative, not 0 as for -5.
    lens = [-200, 64, -(2**31), 300, -64]
    assert schedule_rows(lens, 3) == schedule_rows([max(n, 0) for n in lens], 3)


@pytest.mark.parametrize("batch_size", [1, 7, 31, 32, 33, 63, 64, 65, 127, 128, 256, 2048, 12288])
@pytest.mark.parametrize("num_sms", [1, 5, 132])
def test_matches_loop_reference(batch_size, num_sms):
    gen = torch.Generator().manual_seed(1000 * batch_size + num_sms)
    lens = torch.randint(0, 5000, (batch_size,), generator=gen, dtype=torch.int32)
    # Make a third of the requests empty so boundaries land on zero-length requests.
    lens[torch.rand(batch_size, generator=gen) < 0.33] = 0
    lens_list = lens.tolist()
    rows = schedule_rows(lens_list, num_sms)
    assert rows == loop_schedule(lens_list, num_sms)
    assert rows == expanded_schedule(lens_list, num_sms)
    check_each_unit_goes_to_its_last_position(lens_list, rows, num_sms)


def test_large_batch_100k():
    gen = torch.Generator().manual_seed(7)
    lens = torch.randint(0, 300, (100_000,), generator=gen, dtype=torch.int32).tolist()
    rows = schedule_rows(lens, 132)
    assert rows == loop_schedule(lens, 132)
    check_each_unit_goes_to_its_last_position(lens, rows, 132)


@pytest.mark.parametrize(("variant", "next_n"), [("fp8", 1), ("fp8", 2), ("fp4", 4)])
def test_every_variant_uses_one_pass_today(variant, next_n):
    lens = [100, 0, 3000, 77]
    assert passes_per_token(variant, next_n) == 1
    assert schedule_rows(lens, 8, next_n=next_n, variant=variant) == loop_schedule(lens, 8)


def test_strided_seq_lens_match_contiguous_copy():
    gen = torch.Generator().manual_seed(3)
    base = torch.randint(0, 3000, (3 * 40,), generator=gen, dtype=torch.int32)
    strided = base[::3]
    assert not strided.is_contiguous()
    got = compute_paged_mqa_logits_schedule(strided, num_sms=16)
    assert got.tolist() == [list(r) for r in loop_schedule(strided.tolist(), 16)]


def test_cpu_default_num_sms():
    sched = compute_paged_mqa_logits_schedule(torch.tensor([10, 20], dtype=torch.int32))
    assert DEFAULT_CPU_NUM_SMS == 132
    assert sched.shape == (133, 2)
    assert sched.device.type == "cpu"


def test_cuda_sm_count_is_queried_once_per_device(monkeypatch):
    """The SM count is read from the driver once per device index, then remembered."""
    from types import SimpleNamespace

    from flashinfer_schedule import device_num_sms, schedule

    queries = []

    def properties(index):
        queries.append(index)
        return SimpleNamespace(multi_processor_count=100 + index)

    monkeypatch.setattr(schedule, "_SM_COUNTS", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    counts = [device_num_sms(torch.device("cuda", i)) for i in (0, 1, 0, 1, 1)]
    assert counts == [100, 101, 100, 101, 101]
    assert queries == [0, 1]


def test_out_is_written_in_place_and_returned():
    lens = [100, 0, 300]
    out = torch.full((5, 2), -7, dtype=torch.int32)
    got = compute_paged_mqa_logits_schedule(
        torch.tensor(lens, dtype=torch.int32), "cpu", num_sms=4, out=out
    )
    assert got is out
    assert [tuple(r) for r in out.tolist()] == loop_schedule(lens, 4)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"variant": "fp16"}, ValueError, "variant must be one of"),
        ({"next_n": 0}, ValueError, "next_n must be >= 1, got 0"),
        ({"next_n": True}, TypeError, "next_n must be an int"),
        ({"next_n": 5, "variant": "fp4"}, ValueError, r"next_n must be in 1\.\.4"),
        ({"num_sms": 0}, ValueError, r"num_sms must be in 1\.\.2147483647 .*got 0"),
        ({"num_sms": 4.0}, TypeError, "num_sms must be an int"),
        ({"num_sms": "4"}, TypeError, "num_sms must be an int or None, got str"),
        ({"num_sms": 2**31}, ValueError, r"num_sms must be in 1\.\.2147483647 .*got 2147483648"),
        ({"num_sms": 2**40}, ValueError, "num_sms must be in 1"),
        ({"device": 3.5}, TypeError, "device must be a torch.device"),
        ({"device": "meta"}, ValueError, "expected a CUDA or CPU device"),
        ({"out": torch.zeros(5, 2, dtype=torch.int64)}, TypeError, "out must have dtype"),
        ({"out": torch.zeros(4, 2, dtype=torch.int32)}, ValueError, r"out must have shape"),
        ({"out": torch.zeros(2, 5, dtype=torch.int32).t()}, ValueError, "contiguous"),
        ({"out": torch.zeros(5, 2, dtype=torch.int32, device="meta")}, ValueError, "target device"),
        ({"out": [[0, 0]]}, TypeError, "out must be a torch.Tensor"),
        (
            {"out": torch.zeros(5, 2, dtype=torch.int32).to_sparse()},
            TypeError,
            r"out must be a dense \(torch.strided\) tensor, got layout torch.sparse_coo",
        ),
        ({"variant": None}, TypeError, r"variant must be a str, .*got NoneType \(None\)"),
        ({"variant": 8}, TypeError, r"variant must be a str, .*got int \(8\)"),
        ({"next_n": torch.tensor(2)}, TypeError, r"next_n must be an int, got torch\.Tensor"),
        (
            {"num_sms": torch.tensor(4)},
            TypeError,
            r"num_sms must be an int or None, got torch\.Tensor",
        ),
    ],
)
def test_argument_errors(kwargs, error, match):
    kwargs = {"num_sms": 4, **kwargs}
    with pytest.raises(error, match=match):
        compute_paged_mqa_logits_schedule(torch.tensor([1, 2], dtype=torch.int32), **kwargs)


@pytest.mark.parametrize(
    ("seq_lens", "error", "match"),
    [
        (
            torch.tensor([1, 2], dtype=torch.int64),
            TypeError,
            "seq_lens must have dtype torch.int32",
        ),
        (torch.ones(2, 2, dtype=torch.int32), ValueError, "seq_lens must be 1-D"),
        ([1, 2], TypeError, "seq_lens must be a torch.Tensor"),
        (
            torch.tensor([1, 2], dtype=torch.int32).to_sparse(),
            TypeError,
            r"seq_lens must be a dense \(torch.strided\) tensor, got layout torch.sparse_coo",
        ),
    ],
)
def test_seq_lens_errors(seq_lens, error, match):
    with pytest.raises(error, match=match):
        compute_paged_mqa_logits_schedule(seq_lens, num_sms=4)


def _length_mix(kind: str, batch_size: int, gen: torch.Generator) -> torch.Tensor:
    lens = torch.randint(1, 20000, (batch_size,), generator=gen, dtype=torch.int32)
    if kind == "all_zero":
        lens.zero_()
    elif kind == "half_zero":
        lens[torch.randperm(batch_size, generator=gen)[: batch_size // 2]] = 0
    elif kind == "one_huge":
        lens = torch.randint(0, 3, (batch_size,), generator=gen, dtype=torch.int32)
        lens[int(torch.randint(0, batch_size, (1,), generator=gen))] = 4_000_000
    elif kind == "every_fifth_zero":
        lens[::5] = 0
    return lens


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kind", ["random", "all_zero", "half_zero", "one_huge", "every_fifth_zero"]
)
@pytest.mark.parametrize("batch_size", [1, 7, 31, 32, 33, 63, 64, 65, 127, 128, 256, 2048, 12288])
@pytest.mark.parametrize("variant,next_n", [("fp8", 1), ("fp8", 3), ("fp4", 4)])
def test_cuda_matches_cpu_bitwise(batch_size, kind, variant, next_n):
    gen = torch.Generator().manual_seed(batch_size * 7 + len(kind))
    lens = _length_mix(kind, batch_size, gen)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    got = compute_paged_mqa_logits_schedule(lens.cuda(), next_n=next_n, variant=variant)
    assert got.device.type == "cuda" and got.shape == (num_sms + 1, 2)
    expected = compute_paged_mqa_logits_schedule(
        lens, num_sms=num_sms, next_n=next_n, variant=variant
    )
    assert torch.equal(got.cpu(), expected)


@pytest.mark.gpu
def test_cuda_strided_seq_lens_and_other_sm_counts():
    gen = torch.Generator().manual_seed(5)
    wide = torch.randint(0, 9000, (300, 3), generator=gen, dtype=torch.int32)
    strided = wide.cuda()[:, 1]  # stride 3
    for num_sms in (1, 7, 132, 1000):
        got = compute_paged_mqa_logits_schedule(strided, num_sms=num_sms)
        expected = compute_paged_mqa_logits_schedule(wide[:, 1].contiguous(), num_sms=num_sms)
        assert torch.equal(got.cpu(), expected), num_sms


@pytest.mark.gpu
def test_cuda_graph_replay_follows_new_lengths():
    gen = torch.Generator().manual_seed(11)
    lens = torch.randint(1, 9000, (64,), generator=gen, dtype=torch.int32).cuda()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(num_sms + 1, 2, dtype=torch.int32, device="cuda")
    compute_paged_mqa_logits_schedule(lens, out=out)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        compute_paged_mqa_logits_schedule(lens, out=out)
    new_lens = torch.randint(0, 30000, (64,), generator=gen, dtype=torch.int32)
    lens.copy_(new_lens.cuda())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), compute_paged_mqa_logits_schedule(new_lens, num_sms=num_sms))


@pytest.mark.gpu
@pytest.mark.parametrize("with_out", [False, True])
def test_cuda_schedule_compiles_with_fullgraph(with_out):
    """Under torch.compile the kernel launch goes through the `flashinfer_schedule` custom op
    (dynamo cannot trace the JIT load); the compiled call follows new lengths."""
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count

    def step(seq_lens, out):
        return compute_paged_mqa_logits_schedule(seq_lens, next_n=3, variant="fp8", out=out)

    compiled = torch.compile(step, fullgraph=True)
    gen = torch.Generator().manual_seed(23)
    for batch_size in (5, 300, 300):
        lens = torch.randint(0, 20000, (batch_size,), generator=gen, dtype=torch.int32)
        out = (
            torch.full((num_sms + 1, 2), -7, dtype=torch.int32, device="cuda") if with_out else None
        )
        got = compiled(lens.cuda(), out)
        if with_out:
            assert got.data_ptr() == out.data_ptr()
        expected = compute_paged_mqa_logits_schedule(lens, num_sms=num_sms, next_n=3)
        assert torch.equal(got.cpu(), expected)


@pytest.mark.gpu
def test_opcheck_cuda_schedule_op():
    lens = torch.randint(
        0, 9000, (40,), generator=torch.Generator().manual_seed(3), dtype=torch.int32
    )
    out = torch.empty(8, 2, dtype=torch.int32, device="cuda")
    op = torch.ops.flashinfer_schedule.paged_mqa_logits_schedule_into
    results = torch.library.opcheck(op, (lens.cuda(), 7, 1, out))
    assert all(result == "SUCCESS" for result in results.values()), results


def test_cuda_schedule_op_has_a_fake_kernel():
    """What a trace sees of the CUDA launch: an in-place op whose fake kernel needs no GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = torch.ops.flashinfer_schedule.paged_mqa_logits_schedule_into
    with FakeTensorMode():
        lens = torch.empty(5, dtype=torch.int32, device="cuda")
        out = torch.empty(133, 2, dtype=torch.int32, device="cuda")
        assert op(lens, 132, 1, out) is None
        assert out.shape == (133, 2) and out.device.type == "cuda"


def test_a_dispatch_mode_sees_the_cuda_schedule_as_the_custom_op(monkeypatch):
    """Under FakeTensorMode (and make_fx, any dispatch mode) a direct launch would record an
    output the kernel never wrote; the call must go through the op, whose fake kernel runs."""
    from flashinfer_schedule import _schedule_cuda
    from torch._subclasses.fake_tensor import FakeTensorMode

    def no_launch(*args):
        raise AssertionError("launched the kernel directly under a tracer")

    monkeypatch.setattr(_schedule_cuda, "launch_schedule_kernel", no_launch)
    with FakeTensorMode():
        lens = torch.empty(9, dtype=torch.int32, device="cuda")
        got = compute_paged_mqa_logits_schedule(lens, num_sms=132)
    assert got.shape == (133, 2) and got.device.type == "cuda" and got.dtype == torch.int32


@pytest.mark.gpu
@pytest.mark.parametrize("tracer", ["jit_trace", "make_fx"])
def test_a_traced_cuda_schedule_follows_new_lengths(tracer):
    """The trace records the op, not the `torch.empty` of a direct launch."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(seq_lens):
        return compute_paged_mqa_logits_schedule(seq_lens, next_n=2)

    gen = torch.Generator().manual_seed(31)
    example = torch.randint(0, 9000, (40,), generator=gen, dtype=torch.int32).cuda()
    traced = torch.jit.trace(step, example) if tracer == "jit_trace" else make_fx(step)(example)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    lens = torch.randint(0, 30000, (40,), generator=gen, dtype=torch.int32)
    got = traced(lens.cuda())
    assert torch.equal(
        got.cpu(), compute_paged_mqa_logits_schedule(lens, num_sms=num_sms, next_n=2)
    )


def test_the_sm_count_table_is_not_touched_while_tracing(monkeypatch):
    """A trace that filled (or read) the per-device SM-count dict would guard on it, and the
    first eager call to add an entry would recompile the graph."""
    from flashinfer_schedule import schedule as schedule_module

    class Properties:
        multi_processor_count = 7

    properties = Properties()
    monkeypatch.setattr(schedule_module, "_SM_COUNTS", {})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: properties)
    compiled = torch.compile(lambda x: x + schedule_module._cuda_multiprocessors(0), fullgraph=True)
    assert compiled(torch.zeros(1)).item() == 7
    assert schedule_module._SM_COUNTS == {}
    assert schedule_module._cuda_multiprocessors(0) == 7  # eager calls still fill it
    assert schedule_module._SM_COUNTS == {0: 7}


def test_cpu_schedule_compiles_with_fullgraph():
    compiled = torch.compile(compute_paged_mqa_logits_schedule, fullgraph=True)
    gen = torch.Generator().manual_seed(29)
    for batch_size in (3, 70):
        lens = torch.randint(0, 20000, (batch_size,), generator=gen, dtype=torch.int32)
        got = compiled(lens, next_n=2, num_sms=11)
        assert torch.equal(got, compute_paged_mqa_logits_schedule(lens, next_n=2, num_sms=11))


def test_a_dynamic_cpu_schedule_compiles_once_for_every_num_sms():
    """Traced in one pass: the eager path's row chunks must not make dynamo specialise on
    num_sms (a loop over range(num_sms + 1) did: three recompiles over these four values)."""
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda lens, n: compute_paged_mqa_logits_schedule(lens, num_sms=n),
        fullgraph=True,
        dynamic=True,
    )
    lens = torch.tensor([100, 0, 300, 70], dtype=torch.int32)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for num_sms in (11, 12, 13, 40):
            got = compiled(lens, num_sms)
            assert torch.equal(got, compute_paged_mqa_logits_schedule(lens, num_sms=num_sms))


def test_more_than_int32_max_requests_is_refused():
    # A stride-0 view: 2**31 entries without allocating them.
    seq_lens = torch.zeros(1, dtype=torch.int32).expand(2**31)
    with pytest.raises(ValueError, match=r"seq_lens must have at most 2147483647 .*got 2147483648"):
        compute_paged_mqa_logits_schedule(seq_lens, num_sms=4)


def test_cpu_index_1_is_the_one_cpu_and_accepts_its_own_result_as_out():
    """torch allocates `cpu:1` on the one CPU; the schedule's result there is a valid `out`."""
    lens = torch.tensor([100, 0, 300], dtype=torch.int32)
    first = compute_paged_mqa_logits_schedule(lens, "cpu:1", num_sms=4)
    assert first.device == torch.device("cpu")
    again = compute_paged_mqa_logits_schedule(lens, "cpu:1", num_sms=4, out=first)
    assert again is first and [tuple(r) for r in first.tolist()] == loop_schedule([100, 0, 300], 4)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_cpu_rows_computed_in_chunks_equal_one_pass(monkeypatch, chunk):
    """The CPU path computes its rows in chunks (bounded memory for huge num_sms)."""
    from flashinfer_schedule import schedule

    gen = torch.Generator().manual_seed(chunk)
    lens = torch.randint(0, 5000, (9,), generator=gen, dtype=torch.int32)
    lens[3] = 0
    whole = compute_paged_mqa_logits_schedule(lens, num_sms=11)
    monkeypatch.setattr(schedule, "_CPU_ROWS_PER_CHUNK", chunk)
    assert torch.equal(compute_paged_mqa_logits_schedule(lens, num_sms=11), whole)
    assert [tuple(r) for r in whole.tolist()] == loop_schedule(lens.tolist(), 11)


def test_cpu_device_with_index_accepts_cpu_out():
    lens = [100, 0, 300]
    out = torch.zeros(5, 2, dtype=torch.int32)  # device "cpu", index None
    got = compute_paged_mqa_logits_schedule(
        torch.tensor(lens, dtype=torch.int32), "cpu:0", num_sms=4, out=out
    )
    assert got is out
    assert [tuple(r) for r in out.tolist()] == loop_schedule(lens, 4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without usable CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 1), 0, 1])
def test_cuda_device_without_cuda_is_a_value_error(device):
    with pytest.raises(ValueError, match=r"device: got .*CUDA is not available"):
        compute_paged_mqa_logits_schedule(torch.tensor([1, 2], dtype=torch.int32), device)


def test_a_negated_seq_lens_is_refused():
    lens = torch._neg_view(torch.tensor([-100, -5], dtype=torch.int32))
    with pytest.raises(TypeError, match=r"seq_lens is a negated view .*resolve_neg\(\)"):
        compute_paged_mqa_logits_schedule(lens, "cpu")


@pytest.mark.parametrize("device", [None, "cpu"])
def test_seq_lens_on_a_meta_device_is_a_value_error(device):
    lens = torch.zeros(2, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="seq_lens must be on a CUDA or CPU device, got meta"):
        compute_paged_mqa_logits_schedule(lens, device)


@pytest.mark.parametrize(
    ("device", "error", "match"),
    [
        (True, TypeError, "device must be a torch.device, str or int, got bool"),
        (1.0, TypeError, "device must be a torch.device, str or int, got float"),
        ("xyz", ValueError, "device: cannot parse 'xyz' as a torch device"),
        (-1, ValueError, "device: cannot parse -1 as a torch device"),
    ],
)
def test_resolve_device_names_what_it_cannot_use(device, error, match):
    from flashinfer_schedule import resolve_device

    with pytest.raises(error, match=match):
        resolve_device(device)


def test_resolve_device_returns_other_device_types_for_the_caller_to_refuse():
    from flashinfer_schedule import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("meta")) == torch.device("meta")


@pytest.mark.parametrize("device", ["cuda:2", "cuda:5", torch.device("cuda", 7)])
def test_cuda_device_index_past_device_count_is_a_value_error(monkeypatch, device):
    from flashinfer_schedule import device_num_sms

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    match = r"device: got .*only 2 CUDA device\(s\) are visible \(valid indices 0\.\.1\)"
    with pytest.raises(ValueError, match=match):
        compute_paged_mqa_logits_schedule(torch.tensor([1, 2], dtype=torch.int32), device)
    with pytest.raises(ValueError, match=match):
        device_num_sms(device)


def test_numpy_integers_are_accepted():
    np = pytest.importorskip("numpy")
    lens = [100, 0, 300]
    got = compute_paged_mqa_logits_schedule(
        torch.tensor(lens, dtype=torch.int32), num_sms=np.int64(4), next_n=np.int32(2)
    )
    assert [tuple(r) for r in got.tolist()] == loop_schedule(lens, 4)
    assert passes_per_token("fp4", np.int64(4)) == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_sms": "numpy.bool"}, r"num_sms must be an int or None, got numpy\.bool "),
        ({"num_sms": "numpy.float64"}, r"num_sms must be an int or None, got numpy\.float64 "),
        ({"next_n": "numpy.bool"}, r"next_n must be an int, got numpy\.bool "),
    ],
)
def test_numpy_non_integers_are_refused_with_qualified_type(kwargs, match):
    np = pytest.importorskip("numpy")
    values = {"numpy.bool": np.bool_(True), "numpy.float64": np.float64(4.0)}
    kwargs = {"num_sms": 4, **{k: values[v] for k, v in kwargs.items()}}
    with pytest.raises(TypeError, match=match):
        compute_paged_mqa_logits_schedule(torch.tensor([1, 2], dtype=torch.int32), **kwargs)


def test_builtin_type_names_stay_unqualified():
    with pytest.raises(TypeError, match=r"got float \(4\.0\)"):
        compute_paged_mqa_logits_schedule(torch.tensor([1], dtype=torch.int32), num_sms=4.0)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens", [[2**31 - 1], [2**31 - 1] * 3, [2**31 - 64, 2**31 - 63, 5]], ids=["one", "three", "mix"]
)
@pytest.mark.parametrize("num_sms", [1, 7, 132, 1000])
def test_cuda_matches_cpu_for_lengths_near_int32_max(lens, num_sms):
    # The kernel once formed len + 63 in int, which wrapped for len >= 2**31 - 63.
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    got = compute_paged_mqa_logits_schedule(seq_lens.cuda(), num_sms=num_sms)
    expected = compute_paged_mqa_logits_schedule(seq_lens, num_sms=num_sms)
    assert torch.equal(got.cpu(), expected)
    assert [tuple(r) for r in expected.tolist()] == loop_schedule(lens, num_sms)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens",
    [[2**31 - 1] * 64, [2**31 - 1] * 200, [], [-(2**31), 5, -1, 0, 2**31 - 1, 70]],
    ids=["total-past-2^31", "total-past-2^32-over-200", "empty", "negative"],
)
@pytest.mark.parametrize("num_sms", [1, 132, 1024, 4097])
def test_cuda_matches_cpu_for_large_totals_empty_batches_and_many_sms(lens, num_sms):
    """What no other GPU test reaches (found by an audit): unit totals of 2^31 and more (the
    sums must be 64-bit), B = 0, lengths down to -2^31, and num_sms past 1024 (the sentinel
    rows take more than one pass of the CTA's threads)."""
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    got = compute_paged_mqa_logits_schedule(seq_lens.cuda(), num_sms=num_sms)
    expected = compute_paged_mqa_logits_schedule(seq_lens, num_sms=num_sms)
    assert torch.equal(got.cpu(), expected)


def test_the_schedule_modules_all_is_what_the_package_exports_from_it():
    # docs/api/schedule.md is generated from the package's __all__; the module's own list
    # names the same public names, no more (SCHEDULE_VARIANTS is internal) and no fewer.
    import flashinfer_schedule
    from flashinfer_schedule import schedule

    exported_from_it = sorted(
        name for name in flashinfer_schedule.__all__ if name in vars(schedule)
    )
    assert sorted(schedule.__all__) == exported_from_it
    assert "resolve_device" in schedule.__all__
