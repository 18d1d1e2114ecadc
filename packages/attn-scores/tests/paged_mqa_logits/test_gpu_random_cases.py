"""Seeded random calls of both ops against the independent float64 expectation.

Each seed draws a whole call: batch size, a length mix (zeros, lengths off the block and
tile edges, an occasional long request), block size, next_n, strided `seq_lens` /
`block_tables` views, `max_seq_len` beyond every length, a given or derived schedule, and
`out=` or not; for fp8 also the head shape, the dtypes and a table wider than needed, for
fp4 the dtypes, the spread of the UE8M0 scales and their order. `batches="large"` draws 48-513
requests (the in-kernel schedule's block scan above 128, many request switches per CTA)
instead of 1-40. `layouts="wide"` also draws where the inputs and `out` sit in memory
(`draw_wide_layouts`). `replays=K` then captures the call in a CUDA graph (with a given
schedule, its computation too) and replays it K times after writing new lengths into
`seq_lens`, and for about half the replays new data in every other input (`draw_replays`).
The expectation is `attn_scores_cases.expected_logits` (a per-position gather and a matmul
in float64), not the package's reference; the bound is relative to the row's largest sum of
|head terms|.
"""

from __future__ import annotations

import random

import flashinfer_attn_scores as fa
import pytest
import torch
from attn_scores_cases import (
    UNTOUCHED,
    accumulation_error,
    assert_rows_close,
    make_fp4_case,
    make_fp8_case,
)
from flashinfer_attn_scores.paged_mqa_logits import fp8_sm90
from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask
from test_gpu import (
    FP8_DTYPES,
    absolute_floor,
    assert_nothing_written_around,
    in_another_pool,
    mark_empty_requests,
    poisoned_out,
    tolerance,
)

pytestmark = pytest.mark.gpu

# (num_heads, head_dim) for fp8: DeepSeek's, and others the restrictions admit.
FP8_HEAD_SHAPES = [(64, 128), (64, 128), (32, 128), (16, 64), (8, 32), (64, 64), (4, 160)]


# fp4 (output_dtype, epi_dtype)
FP4_DTYPES = [
    (torch.bfloat16, torch.float32),
    (torch.float32, torch.float32),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16),
]


# Batch sizes and typical lengths of the two batch modes. The large mode stays under about a
# million KV tokens, so the float64 expectation on the host takes seconds, not minutes.
BATCH_MODES = {
    "small": ([1, 2, 3, 5, 8, 13, 24, 40], [1, 40, 300, 1500, 3000]),
    "large": ([48, 100, 128, 129, 200, 257, 513], [40, 300, 1500, 3000]),
}


def draw_lengths(rng: random.Random, batch_size: int, typicals: list[int]) -> list[int]:
    typical = rng.choice(typicals)
    lens = []
    for _ in range(batch_size):
        roll = rng.random()
        if roll < 0.15:
            lens.append(0)
        elif roll < 0.25:
            lens.append(rng.choice([1, 31, 32, 33, 63, 64, 65, 127, 128, 129]))
        else:
            lens.append(rng.randint(1, typical))
    if rng.random() < 0.25:
        lens[rng.randrange(batch_size)] = rng.randint(6000, 12000)  # one long request
    return lens


def draw_wide_head_shape(rng: random.Random) -> tuple[int, int, int]:
    """(num_heads, head_dim, next_n) from anywhere the fp8 contract admits on SM90: N =
    next_n * num_heads a multiple of 8 in [8, 256], num_heads a multiple of 4, head_dim a
    multiple of 32 up to the largest that fits the shared memory at that N."""
    n = 8 * rng.randint(1, 32)
    num_heads = rng.choice([h for h in range(4, n + 1, 4) if n % h == 0])
    next_n = n // num_heads
    largest = fp8_sm90.largest_fitting_head_dim(num_heads, next_n)
    return num_heads, 32 * rng.randint(1, largest // 32), next_n


def draw_wide_fp4_scales(
    rng: random.Random, dtypes: tuple, next_n: int, exponent_range: tuple[int, int]
) -> dict:
    """fp4's scale draws of `scales="wide"`: every UE8M0 scale far below or above 1 (58-64 or
    150-156, where the output's exponent range holds the logits), and draft slots whose q
    scales are shifted apart by 0 to 10 binades (the suite's draws give every slot the same
    largest q exponent). float16 keeps the suite's ranges, which its 65504 bounds; the shifts
    only lower scales."""
    if torch.float16 not in dtypes:
        exponent_range = rng.choice([exponent_range, (58, 64), (150, 156)])
    shifts: tuple[int, ...] = ()
    if next_n > 1 and exponent_range[0] > 64 and rng.random() < 0.7:
        shifts = tuple(rng.choice([0, 0, -1, -3, -6, -10]) for _ in range(next_n))
    return dict(exponent_range=exponent_range, q_slot_exponent_shifts=shifts)


# How `layouts="wide"` hands over q, weights and (fp4) q_sf: as they are, one element past
# a 16-byte boundary (the launch copies them to an aligned buffer), or as a slice of a wider
# last dimension (not contiguous).
OPERAND_PLACEMENTS = ("contiguous", "misaligned", "sliced")


def draw_wide_layouts(rng: random.Random) -> dict:
    """Where `layouts="wide"` puts a call's tensors: the KV blocks in one layer of a cache of
    1-4 interleaved layers (block pitch of `pool_layers` blocks, `in_another_pool`), above
    `pool_spare_blocks` unused blocks (so every block id grows by that many); the table as a
    column slice starting `table_column_offset` entries into wider rows (its base off a
    16-byte boundary); each dense operand placed per `OPERAND_PLACEMENTS`; and `out` starting
    `out_row_offset` rows into its buffer."""
    layers = rng.choice([1, 2, 3, 4])
    return dict(
        pool_layers=layers,
        pool_layer=rng.randrange(layers),
        pool_spare_blocks=rng.choice([0, 5, 3000]),
        table_column_offset=rng.choice([0, 1, 5]),
        operand_placements=tuple(rng.choice(OPERAND_PLACEMENTS) for _ in range(3)),
        out_row_offset=rng.choice([0, 1, 3]),
    )


def placed(t: torch.Tensor, placement: str) -> torch.Tensor:
    """A copy of `t` placed in memory as `placement` (`OPERAND_PLACEMENTS`) says."""
    if placement == "contiguous":
        return t
    if placement == "misaligned":
        view = torch.empty(t.numel() + 16, dtype=t.dtype, device=t.device)[1 : t.numel() + 1]
        view = view.view(t.shape)
    else:
        wider = torch.empty(*t.shape[:-1], t.shape[-1] + 16, dtype=t.dtype, device=t.device)
        view = wider[..., : t.shape[-1]]
    view.copy_(t)
    return view


def laid_out_inputs(call: dict, case, variant: str) -> dict:
    """The op's tensor arguments for `call` (keyword names of the public functions): the
    case's own tensors, moved and re-viewed as `draw_wide_layouts` drew when the call has
    those draws. The case itself keeps its tensors, which the expectation indexes."""
    tables, lens = strided_views(case) if call["strided"] else (case.block_tables, case.seq_lens)
    inputs = dict(
        q=case.q, kv_fused=case.kv_fused, weights=case.weights, block_tables=tables, seq_lens=lens
    )
    if variant == "fp4":
        inputs["q_sf"] = case.q_sf
    if "pool_layers" not in call:
        return inputs
    layers, block_bytes = call["pool_layers"], case.kv_fused[0].numel()
    pool_blocks = case.kv_fused.shape[0] + call["pool_spare_blocks"]
    kv_fused, moved_tables = in_another_pool(
        case,
        layers=layers,
        layer=call["pool_layer"],
        min_pool_bytes=pool_blocks * layers * block_bytes,
    )
    # The table inside a buffer of wider rows (and twice as many, every second one used, when
    # the call is strided); the -7 entries around it are never read.
    rows, width = moved_tables.shape
    skip, row_step = call["table_column_offset"], 2 if call["strided"] else 1
    buffer = torch.full(
        (rows * row_step, width + skip), -7, dtype=moved_tables.dtype, device=moved_tables.device
    )
    tables = buffer[::row_step, skip:]
    tables.copy_(moved_tables)
    inputs.update(kv_fused=kv_fused, block_tables=tables)
    for name, placement in zip(("q", "weights", "q_sf"), call["operand_placements"]):
        if name in inputs:
            inputs[name] = placed(inputs[name], placement)
    return inputs


# How `draw_replays` draws each replay's lengths, request by request (capacity: the tokens
# its table row maps).
REPLAY_MIXES = {
    "capture": "the lengths the graph was captured with",
    "zeros": "every request empty",
    "half_zero": "each request empty or 1..capacity, even odds",
    "capacity": "every request at its capacity",
    "uniform": "each request 0..capacity",
    "edges": "each request at 0, 1 or a block edge off by one, within its capacity",
    "one_grows": "one request at capacity (up to max_seq_len), the others 0..their capture length",
}


def replay_lengths(
    rng: random.Random, mix: str, lens: list[int], capacity: list[int], block_size: int
) -> list[int]:
    """One replay's lengths by `mix` (`REPLAY_MIXES`); never above a request's capacity."""
    if mix == "capture":
        return list(lens)
    if mix == "zeros":
        return [0] * len(lens)
    if mix == "capacity":
        return list(capacity)
    if mix == "one_grows":
        grown = rng.randrange(len(lens))
        return [
            cap if b == grown else rng.randint(0, n)
            for b, (n, cap) in enumerate(zip(lens, capacity))
        ]
    drawn = []
    for cap in capacity:
        if mix == "half_zero":
            drawn.append(0 if cap == 0 or rng.random() < 0.5 else rng.randint(1, cap))
        elif mix == "uniform":
            drawn.append(rng.randint(0, cap))
        else:  # edges
            edges = [0, 1, block_size - 1, block_size, block_size + 1, 2 * block_size + 1, cap]
            drawn.append(rng.choice([e for e in edges if e <= cap]))
    return drawn


def draw_replays(rng: random.Random, call: dict, count: int) -> dict:
    """What `replays=count` adds to a call: each request's `capacity` (the tokens its table
    row maps: its length, a little more, or max_seq_len for one to three "growers", so a
    replay can move the longest request and the CTA segment boundaries anywhere),
    `replay_lens`, `count` length vectors each drawn by a mix of `REPLAY_MIXES`, and
    `replay_fresh_data`: whether a replay also gets new q, weights, KV values and block ids
    (q_sf for fp4) written into the captured tensors, as the next serving step would."""
    lens, block_size, longest = call["lens"], call["block_size"], call["max_seq_len"]
    growers = set(rng.sample(range(len(lens)), min(len(lens), rng.choice([1, 1, 2, 3]))))
    capacity = [
        longest if b in growers else min(longest, n + rng.choice([0, 0, 1, block_size]))
        for b, n in enumerate(lens)
    ]
    mixes = [rng.choice(list(REPLAY_MIXES)) for _ in range(count)]
    replay_lens = [replay_lengths(rng, mix, lens, capacity, block_size) for mix in mixes]
    fresh_data = [rng.random() < 0.5 for _ in range(count)]
    return dict(
        capacity=capacity,
        replay_mixes=mixes,
        replay_lens=replay_lens,
        replay_fresh_data=fresh_data,
    )


def draw_call(
    seed: int,
    variant: str,
    shapes: str = "suite",
    batches: str = "small",
    scales: str = "suite",
    layouts: str = "suite",
    replays: int = 0,
) -> dict:
    """One random call. `shapes="wide"` draws fp8's head geometry from the whole admitted
    space (`draw_wide_head_shape`) instead of `FP8_HEAD_SHAPES`; every other draw is the same.
    `batches` picks the batch sizes and typical lengths from `BATCH_MODES`; "small" draws what
    every earlier seed drew. `scales="wide"` (fp4) adds `draw_wide_fp4_scales`'s draws after
    all the others, `layouts="wide"` `draw_wide_layouts`'s after those and `replays`
    `draw_replays`'s last, so the rest of the call is the suite's for the same seed."""
    rng = random.Random(seed)
    batch_sizes, typicals = BATCH_MODES[batches]
    batch_size = rng.choice(batch_sizes)
    lens = draw_lengths(rng, batch_size, typicals)
    block_size = rng.choice([32, 64, 128])
    next_n = rng.randint(1, 4)
    longest = max(lens)
    call = dict(
        lens=lens,
        block_size=block_size,
        next_n=next_n,
        max_seq_len=longest + rng.choice([0, 1, 100, 777]),
        extra_table_columns=rng.choice([0, 0, 3]),
        strided=rng.random() < 0.3,
        given_schedule=rng.random() < 0.3,
        use_out=rng.random() < 0.7,
    )
    if variant == "fp8":
        num_heads, head_dim = rng.choice(FP8_HEAD_SHAPES)
        if next_n * num_heads < 8:  # next_n * num_heads must be a multiple of 8 in [8, 256]
            num_heads = 8
        if (next_n * num_heads) % 8:
            next_n = 2 * (next_n // 2) or 2
        dtypes = rng.choice(FP8_DTYPES)
        if shapes == "wide":
            num_heads, head_dim, next_n = draw_wide_head_shape(rng)
        call.update(next_n=next_n, num_heads=num_heads, head_dim=head_dim, dtypes=dtypes)
    else:
        dtypes = rng.choice(FP4_DTYPES)
        # Group scales far apart only where float16 cannot overflow (it saturates at 65504).
        wide = torch.float16 not in dtypes and rng.random() < 0.4
        call.update(
            dtypes=dtypes,
            interleaved=block_size == 128 and rng.random() < 0.5,
            exponent_range=(100, 140) if wide else rng.choice([(120, 128), (127, 127)]),
        )
        if scales == "wide":
            call.update(draw_wide_fp4_scales(rng, dtypes, next_n, call["exponent_range"]))
    if layouts == "wide":
        call.update(draw_wide_layouts(rng))
    if replays:
        call.update(draw_replays(rng, call, replays))
    return call


def build_case(call: dict, variant: str, seed: int, device: str = "cuda"):
    """The call's inputs. With replays drawn, each table row maps the request's capacity
    (so the pool and its values differ from the same seed's call without replays) and
    `seq_lens` holds the lengths of the capture."""
    mapped = call.get("capacity", call["lens"])
    width = None
    if call["extra_table_columns"]:
        needed = max(1, -(-max(mapped) // call["block_size"]))
        width = needed + call["extra_table_columns"]
    case = _build_case(call, variant, seed, mapped, width)
    case.seq_lens = torch.tensor(call["lens"], dtype=torch.int32)
    return case.to(device)


def _build_case(call: dict, variant: str, seed: int, mapped: list[int], width: int | None):
    if variant == "fp8":
        return make_fp8_case(
            mapped,
            next_n=call["next_n"],
            num_heads=call["num_heads"],
            head_dim=call["head_dim"],
            block_size=call["block_size"],
            max_seq_len=call["max_seq_len"],
            spare_blocks=17,
            table_width=width,
            seed=seed,
        )
    return make_fp4_case(
        mapped,
        next_n=call["next_n"],
        block_size=call["block_size"],
        interleaved=call["interleaved"],
        max_seq_len=call["max_seq_len"],
        spare_blocks=17,
        exponent_range=call["exponent_range"],
        q_slot_exponent_shifts=call.get("q_slot_exponent_shifts", ()),
        seed=seed,
    )


def strided_views(case):
    """The same table and lengths as every second row / element of larger tensors."""
    tables = case.block_tables.repeat_interleave(2, dim=0)[::2]
    lens = case.seq_lens.repeat_interleave(2)[::2]
    assert lens.stride(0) == 2 and tables.stride(0) == 2 * case.block_tables.stride(0)
    return tables, lens


@pytest.mark.parametrize("seed", range(32))
def test_random_fp8_call(seed):
    check_random_call("fp8", seed)


@pytest.mark.parametrize("seed", range(20))
def test_random_fp4_call(seed):
    check_random_call("fp4", 1000 + seed)


@pytest.mark.parametrize(
    "variant, seed", [("fp8", 2000 + s) for s in range(10)] + [("fp4", 3000 + s) for s in range(8)]
)
def test_random_call_with_wide_layouts(variant, seed):
    check_random_call(variant, seed, layouts="wide")


# (variant, seed, batches, layouts) of the graph-replay calls: each is captured once and
# replayed with four more length vectors.
GRAPH_REPLAY_CALLS = (
    [("fp8", 4000 + s, "small", "suite") for s in range(8)]
    + [("fp4", 5000 + s, "small", "suite") for s in range(6)]
    + [("fp8", 4100 + s, "small", "wide") for s in range(3)]
    + [("fp4", 5100 + s, "small", "wide") for s in range(2)]
    + [("fp8", 4200, "large", "suite"), ("fp4", 5200, "large", "suite")]
)


@pytest.mark.parametrize("variant, seed, batches, layouts", GRAPH_REPLAY_CALLS)
def test_random_call_replayed_in_a_cuda_graph(variant, seed, batches, layouts):
    check_random_call(variant, seed, batches=batches, layouts=layouts, replays=4)


def test_the_replay_check_fails_when_a_replay_does_nothing(monkeypatch):
    """The replay check is not vacuous: with `CUDAGraph.replay` a no-op, the NaN written
    before each replay stays, and the check must fail on the first replay with a valid
    position."""
    seed = 4000
    assert any(any(lens) for lens in draw_call(seed, "fp8", replays=4)["replay_lens"])
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda self: None)
    with pytest.raises(AssertionError, match="replay"):
        check_random_call("fp8", seed, replays=4)


def check_random_call(
    variant: str,
    seed: int,
    shapes: str = "suite",
    batches: str = "small",
    scales: str = "suite",
    layouts: str = "suite",
    replays: int = 0,
) -> None:
    call = draw_call(seed, variant, shapes, batches, scales, layouts, replays)
    case = build_case(call, variant, seed)
    inputs = laid_out_inputs(call, case, variant)
    output_dtype = call["dtypes"][0]
    out = buffer = None
    skipped_rows = call.get("out_row_offset", 0)
    if call["use_out"]:
        buffer = poisoned_out(case.rows + skipped_rows, case.max_seq_len, output_dtype, 1)
        buffer[:skipped_rows] = UNTOUCHED
        out = buffer[skipped_rows:]
        mark_empty_requests(out, case.seq_lens, case.next_n, case.max_seq_len)

    def launch() -> torch.Tensor:
        """The call; with a given schedule, the schedule helper on the call's lengths first."""
        schedule = None
        if call["given_schedule"]:
            schedule = fa.compute_paged_mqa_logits_schedule(
                inputs["seq_lens"], next_n=case.next_n, variant=variant
            )
        if variant == "fp8":
            _, epi_dtype, acc_dtype = call["dtypes"]
            return fa.fp8_paged_mqa_logits(
                **inputs,
                max_seq_len=case.max_seq_len,
                output_dtype=output_dtype,
                epi_dtype=epi_dtype,
                acc_dtype=acc_dtype,
                schedule_meta=schedule,
                out=out,
            )
        return fa.fp4_paged_mqa_logits(
            **inputs,
            max_seq_len=case.max_seq_len,
            output_dtype=output_dtype,
            epi_dtype=call["dtypes"][1],
            is_kv_sf_interleaved=call["interleaved"],
            schedule_meta=schedule,
            out=out,
        )

    got = launch()
    assert got.shape == (case.rows, case.max_seq_len) and got.dtype == output_dtype
    torch.cuda.synchronize()
    check_output(call, case, variant, got, out, buffer)
    if replays:
        check_graph_replays(call, case, seed, variant, inputs, launch, out, buffer)


def check_output(
    call: dict,
    case,
    variant: str,
    got: torch.Tensor,
    out: torch.Tensor | None,
    buffer: torch.Tensor | None,
    poisoned: bool = False,
) -> None:
    """`got` against the float64 expectation of `case` (at its current `seq_lens`); with
    `out`, nothing written outside the valid region of its buffer. The rows of empty requests
    must still be UNTOUCHED (`mark_empty_requests`) when `out` was given or the output
    `poisoned` before the call."""
    output_dtype, next_n = call["dtypes"][0], case.next_n
    if variant == "fp8":
        _, epi_dtype, acc_dtype = call["dtypes"]
        tol = tolerance(output_dtype, epi_dtype, acc_dtype)
    else:
        epi_dtype, acc_dtype = call["dtypes"][1], torch.float32
        tol = tolerance(output_dtype, epi_dtype)
    expected = case.expected()
    magnitude = case.expected(abs_weights=True)
    # The accumulation term: this generator draws heads as few as 4 and rows of one valid
    # position, where a logit can be a small remainder of large products (see
    # assert_rows_close and accumulation_error).
    dot_magnitude = case.dot_magnitude()
    lens = case.seq_lens.cpu()
    mask = valid_mask(lens, next_n, case.max_seq_len)
    accumulation = accumulation_error(acc_dtype, head_dim=case.k64.shape[-1])
    per_token = {}
    if variant == "fp4":  # tokens up to 40 binades apart in one row (wide scales)
        per_token = {
            "column_scale": case.token_scales(call["interleaved"]),
            "abs_floor": absolute_floor(output_dtype, epi_dtype, case.q64.shape[2]),
        }
    assert_rows_close(got, expected, mask, tol, magnitude, dot_magnitude, accumulation, **per_token)
    padded = fa.padded_seq_len(case.max_seq_len)
    if out is not None:
        skipped_rows = call.get("out_row_offset", 0)
        assert (buffer[:skipped_rows] == UNTOUCHED).all(), "rows before out's first were written"
        assert_nothing_written_around(out.cpu(), case.rows, case.max_seq_len)
    if out is not None or poisoned:
        written = got.as_strided((case.rows, padded), (got.stride(0), 1)).cpu()
        for b, length in enumerate(lens.tolist()):
            if length == 0:
                rows = written[b * next_n : (b + 1) * next_n]
                assert (rows == UNTOUCHED).all(), f"rows of the empty request {b} were written"


def write_fresh_data(call: dict, variant: str, data_seed: int, inputs: dict, device="cuda"):
    """The case of the same call drawn with `data_seed` (same shapes, other values and block
    ids), written into `inputs` laid out as they are, `seq_lens` excepted; returns it."""
    case = build_case(call, variant, data_seed, device=device)
    for name, tensor in laid_out_inputs(call, case, variant).items():
        if name != "seq_lens":
            inputs[name].copy_(tensor)
    return case


def check_graph_replays(
    call: dict,
    case,
    seed: int,
    variant: str,
    inputs: dict,
    launch,
    out: torch.Tensor | None,
    buffer: torch.Tensor | None,
) -> None:
    """Capture `launch` once in a CUDA graph (with a given schedule, the schedule helper's
    kernel too), then for each of `call["replay_lens"]`: write the lengths into the captured
    `seq_lens` (and, where `replay_fresh_data` says so, a fresh case's data into the other
    inputs, laid out alike), NaN into the padded rows the output may take, replay and check.
    Without `out` the output is the graph's own allocation, which every replay rewrites."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = launch()
    padded = fa.padded_seq_len(case.max_seq_len)
    writable = got.as_strided((case.rows, padded), (got.stride(0), 1))
    fresh_data = call["replay_fresh_data"]
    for replay, lens in enumerate(call["replay_lens"]):
        if fresh_data[replay]:
            case = write_fresh_data(call, variant, seed + 7919 * (replay + 1), inputs)
        new_lens = torch.tensor(lens, dtype=torch.int32, device=got.device)
        inputs["seq_lens"].copy_(new_lens)
        case.seq_lens = new_lens
        writable.fill_(float("nan"))
        mark_empty_requests(writable, new_lens, case.next_n, case.max_seq_len)
        graph.replay()
        torch.cuda.synchronize()
        try:
            check_output(call, case, variant, got, out, buffer, poisoned=True)
        except AssertionError as failure:
            mix = call["replay_mixes"][replay]
            data = "fresh data" if fresh_data[replay] else "the same data"
            raise AssertionError(
                f"replay {replay} ({mix} lengths {lens}, {data}): {failure}"
            ) from None
