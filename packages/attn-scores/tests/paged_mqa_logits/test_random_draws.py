"""The random-call generator's wide head shapes, fp4 scales and layouts (CPU): every draw is a
call the contract admits, and the draws reach the corners the fixed lists of the suite do not.
Also: CI's compile check covers every parametric shape the GPU tests run."""

import itertools
import random

import flashinfer_attn_scores as fa
import torch
from attn_scores_cases import expected_logits, make_fp8_case
from flashinfer_attn_scores.paged_mqa_logits import fp8_sm90
from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask
from test_gpu import PARAMETRIC_SHAPES, STRADDLING_HEADS
from test_gpu_random_cases import (
    BATCH_MODES,
    FP8_HEAD_SHAPES,
    OPERAND_PLACEMENTS,
    REPLAY_MIXES,
    build_case,
    draw_call,
    draw_replays,
    draw_wide_head_shape,
    laid_out_inputs,
    write_fresh_data,
)


def test_wide_head_shapes_are_admitted_and_spread():
    shapes = [draw_wide_head_shape(random.Random(seed)) for seed in range(3000)]
    for num_heads, head_dim, next_n in shapes:
        n = next_n * num_heads
        assert num_heads % 4 == 0 and head_dim % 32 == 0 and n % 8 == 0 and 8 <= n <= 256
        assert fp8_sm90.fits_shared_memory(head_dim, num_heads, next_n)
    assert max(n for _, _, n in shapes) >= 32
    assert max(d for _, d, _ in shapes) > 1024
    assert any(h & (h - 1) for h, _, _ in shapes)  # not a power of two
    assert len(set(shapes)) > 1000


def test_wide_draw_changes_only_the_head_shape():
    for seed in range(50):
        suite, wide = draw_call(seed, "fp8"), draw_call(seed, "fp8", "wide")
        assert (suite["num_heads"], suite["head_dim"]) in FP8_HEAD_SHAPES or suite["num_heads"] == 8
        for key in ("lens", "block_size", "max_seq_len", "strided", "use_out", "dtypes"):
            assert suite[key] == wide[key]


def test_batch_modes():
    """Small draws stay at 1-40 requests; large ones reach past the in-kernel schedule's
    one-warp scan (128 requests) and stay small enough for the host's float64 expectation."""
    for variant in ("fp8", "fp4"):
        small = [draw_call(seed, variant) for seed in range(300)]
        large = [draw_call(seed, variant, batches="large") for seed in range(300)]
        assert {len(c["lens"]) for c in small} <= set(BATCH_MODES["small"][0])
        assert {len(c["lens"]) for c in large} == set(BATCH_MODES["large"][0])
        assert max(sum(c["lens"]) for c in large) < 1_500_000
        assert sum(sum(c["lens"]) > 100_000 for c in large) > 30
        assert any(c["lens"].count(0) > 10 for c in large)
        assert {c["block_size"] for c in large} == {32, 64, 128}
        assert {c["next_n"] for c in large} == {1, 2, 3, 4}


def test_cpu_path_takes_wide_shapes():
    """The CPU op (validation, then the float64 reference) against the independent
    expectation, for a few wide draws."""
    for seed in range(6):
        num_heads, head_dim, next_n = draw_wide_head_shape(random.Random(seed))
        case = make_fp8_case(
            [0, 5, 70],
            next_n=next_n,
            num_heads=num_heads,
            head_dim=head_dim,
            block_size=32,
            max_seq_len=80,
            seed=seed,
        )
        got = fa.fp8_paged_mqa_logits(
            case.q, case.kv_fused, case.weights, case.block_tables, case.seq_lens, case.max_seq_len
        )
        expected = expected_logits(
            case.q64,
            case.k64,
            case.token_scale64,
            case.weights,
            case.block_tables,
            case.seq_lens,
            case.max_seq_len,
        )
        mask = valid_mask(case.seq_lens, next_n, case.max_seq_len)
        torch.testing.assert_close(got[mask].double(), expected[mask], rtol=1e-6, atol=1e-6)


def test_compile_check_covers_the_parametric_shapes():
    """Every (num_heads, head_dim, next_n) of test_gpu.py's parametric tests is among the
    configurations `flashinfer_jit compile-check` builds, so a spill there fails CI."""
    compiled = {spec.label for spec in fp8_sm90.all_kernel_specs()}
    f32 = torch.float32
    for num_heads, head_dim, next_n in PARAMETRIC_SHAPES:
        for block_size in (32, 64, 128):
            config = fp8_sm90.fp8_config(block_size, head_dim, num_heads, next_n, f32, f32, f32)
            assert config.spec.label in compiled, config.spec.label


def test_compile_check_covers_the_straddling_heads_at_every_epilogue_dtype():
    """The shapes where a column group holds two draft slots' heads compile at every epilogue
    and accumulator dtype (their 16-bit epilogue takes its own branch)."""
    compiled = {spec.label for spec in fp8_sm90.all_kernel_specs()}
    dtypes = (torch.float32, torch.float16)
    for next_n, num_heads in STRADDLING_HEADS:
        assert num_heads % 8 == 4
        for epi_dtype, acc_dtype in itertools.product(dtypes, dtypes):
            config = fp8_sm90.fp8_config(
                64, 128, num_heads, next_n, torch.float32, epi_dtype, acc_dtype
            )
            assert config.spec.label in compiled, config.spec.label


WIDE_SCALE_KEYS = ("exponent_range", "q_slot_exponent_shifts")


def test_wide_scales_change_only_fp4_scales():
    """`scales="wide"` draws after every other draw: the rest of each call is the suite's for
    the same seed (fp8 calls entirely), so earlier seeds keep their meaning."""
    for seed in range(200):
        assert draw_call(seed, "fp8") == draw_call(seed, "fp8", scales="wide")
        suite, wide = draw_call(seed, "fp4"), draw_call(seed, "fp4", scales="wide")
        assert "q_slot_exponent_shifts" not in suite
        assert {k: v for k, v in wide.items() if k not in WIDE_SCALE_KEYS} == {
            k: v for k, v in suite.items() if k not in WIDE_SCALE_KEYS
        }


def test_wide_scales_reach_far_scales_and_slots_apart():
    calls = [draw_call(seed, "fp4", scales="wide") for seed in range(600)]
    ranges = {c["exponent_range"] for c in calls}
    assert {(58, 64), (150, 156), (100, 140), (120, 128), (127, 127)} <= ranges
    apart = [c for c in calls if len(set(c["q_slot_exponent_shifts"])) > 1]
    assert len(apart) > 60
    assert {c["next_n"] for c in apart} == {2, 3, 4}
    for c in calls:
        shifts = c["q_slot_exponent_shifts"]
        assert shifts == () or (len(shifts) == c["next_n"] and all(s <= 0 for s in shifts))
        if torch.float16 in c["dtypes"]:  # float16 stays where its 65504 holds the logits
            assert c["exponent_range"] in {(120, 128), (127, 127)}


def test_wide_scale_cases_are_what_was_drawn():
    """The built case carries the drawn scales: slot t's q exponents are the range shifted by
    shifts[t] (q_sf bytes), and every token's k exponents lie in the range (the scale bytes
    after each block's packed values)."""
    checked = 0
    for seed in range(400):
        call = draw_call(seed, "fp4", scales="wide")
        shifts = call["q_slot_exponent_shifts"]
        if not shifts or len(set(shifts)) == 1 or sum(call["lens"]) > 5000:
            continue
        case = build_case(call, "fp4", seed, device="cpu")
        low, high = call["exponent_range"]
        q_exp = case.q_sf.contiguous().view(torch.uint8).view(*case.q_sf.shape, 4).long()
        for t, shift in enumerate(shifts):
            slot = q_exp[:, t]
            assert low + shift <= int(slot.min()) and int(slot.max()) <= high + shift
        k_exp = case.kv_fused.view(case.kv_fused.shape[0], -1)[:, call["block_size"] * 64 :]
        assert low <= int(k_exp.min()) and int(k_exp.max()) <= high
        checked += 1
    assert checked >= 10


def test_cpu_path_takes_wide_scales():
    """The CPU op against the independent expectation for wide-scale draws, each far from 1
    in its own way; the expected logits stay finite and nonzero, inside float32's range."""
    seen = set()
    for seed in range(60):
        call = draw_call(seed, "fp4", scales="wide")
        kind = (call["exponent_range"], len(set(call["q_slot_exponent_shifts"])) > 1)
        if kind in seen or torch.float16 in call["dtypes"]:
            continue
        seen.add(kind)
        call = dict(call, lens=[0, 5, 70], max_seq_len=80, block_size=32, interleaved=False)
        case = build_case(call, "fp4", seed, device="cpu")
        got = fa.fp4_paged_mqa_logits(*case.fp4_args(), output_dtype=torch.float32)
        expected = case.expected()
        mask = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
        values = expected[mask]
        assert torch.isfinite(values).all() and (values != 0).any()
        assert float(values.abs().max()) < 2.0**127
        torch.testing.assert_close(got[mask].double(), values, rtol=1e-6, atol=0.0)
    assert len(seen) >= 5


WIDE_LAYOUT_KEYS = (
    "pool_layers",
    "pool_layer",
    "pool_spare_blocks",
    "table_column_offset",
    "operand_placements",
    "out_row_offset",
)


def test_wide_layouts_change_only_the_layout():
    """`layouts="wide"` draws after every other draw, so the rest of each call is the same
    seed's call without it, with wide scales or without."""
    for seed in range(200):
        for variant in ("fp8", "fp4"):
            for scales in ("suite", "wide"):
                plain = draw_call(seed, variant, scales=scales)
                wide = draw_call(seed, variant, scales=scales, layouts="wide")
                assert {k: v for k, v in wide.items() if k not in WIDE_LAYOUT_KEYS} == plain
                assert set(WIDE_LAYOUT_KEYS) <= set(wide)


def test_wide_layouts_reach_every_placement():
    calls = [draw_call(seed, "fp8", layouts="wide") for seed in range(300)]
    assert {c["pool_layers"] for c in calls} == {1, 2, 3, 4}
    assert all(0 <= c["pool_layer"] < c["pool_layers"] for c in calls)
    assert {c["pool_spare_blocks"] for c in calls} == {0, 5, 3000}
    assert {c["table_column_offset"] for c in calls} == {0, 1, 5}
    assert {c["out_row_offset"] for c in calls} == {0, 1, 3}
    for slot in range(3):
        assert {c["operand_placements"][slot] for c in calls} == set(OPERAND_PLACEMENTS)


def _laid_out_call(variant: str, seed: int) -> tuple[dict, object, dict]:
    call = draw_call(seed, variant, layouts="wide")
    call = dict(call, lens=[0, 5, 70, 33], max_seq_len=80, block_size=32)
    if variant == "fp4":
        call.update(interleaved=False)
    case = build_case(call, variant, seed, device="cpu")
    return call, case, laid_out_inputs(call, case, variant)


def test_laid_out_inputs_sit_where_drawn():
    """Each tensor `laid_out_inputs` hands over has the drawn layout: the pool's pitch is the
    layer count in blocks, block ids grow by the spare blocks, the table starts inside a wider
    row, and each operand is as its placement says."""
    seen = set()
    for seed in range(40):
        for variant in ("fp8", "fp4"):
            call, case, inputs = _laid_out_call(variant, seed)
            kv, tables = inputs["kv_fused"], inputs["block_tables"]
            block_bytes = case.kv_fused[0].numel()
            assert kv.stride(0) == call["pool_layers"] * block_bytes
            assert kv.shape[0] == case.kv_fused.shape[0] + call["pool_spare_blocks"]
            for b, length in enumerate(call["lens"]):
                used = -(-length // call["block_size"])
                ids = tables[b, :used]
                assert torch.equal(ids, case.block_tables[b, :used] + call["pool_spare_blocks"])
                assert torch.equal(
                    kv[ids.long()], case.kv_fused[case.block_tables[b, :used].long()]
                )
            skip, row_step = call["table_column_offset"], 2 if call["strided"] else 1
            assert tables.stride() == (row_step * (tables.shape[1] + skip), 1)
            assert tables.storage_offset() == skip
            names = ("q", "weights", "q_sf")
            for name, placement in zip(names, call["operand_placements"]):
                if name not in inputs:
                    continue
                t = inputs[name]
                expected_bytes = getattr(case, name).contiguous().view(torch.uint8)
                assert torch.equal(t.contiguous().view(torch.uint8), expected_bytes)
                assert t.is_contiguous() == (placement != "sliced")
                if placement == "misaligned":
                    assert (t.storage_offset() * t.element_size()) % 16 != 0
                seen.add(placement)
    assert seen == set(OPERAND_PLACEMENTS)


def test_cpu_path_takes_wide_layouts():
    """The CPU op on laid-out inputs against the independent expectation."""
    for seed in range(8):
        for variant in ("fp8", "fp4"):
            _, case, inputs = _laid_out_call(variant, seed)
            op = fa.fp8_paged_mqa_logits if variant == "fp8" else fa.fp4_paged_mqa_logits
            got = op(**inputs, max_seq_len=case.max_seq_len, output_dtype=torch.float32)
            expected = case.expected()
            mask = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
            torch.testing.assert_close(got[mask].double(), expected[mask], rtol=1e-6, atol=1e-6)


REPLAY_KEYS = ("capacity", "replay_mixes", "replay_lens", "replay_fresh_data")


def test_replays_draw_last_and_stay_within_capacity():
    """`replays` draws after every other draw (the rest of the call is the seed's call
    without it); each request's capacity lies between its length and max_seq_len, one to
    three requests can grow to max_seq_len, and no replay length passes its capacity."""
    mixes, grown_to_max = set(), 0
    for seed in range(300):
        for variant in ("fp8", "fp4"):
            for layouts in ("suite", "wide"):
                plain = draw_call(seed, variant, layouts=layouts)
                call = draw_call(seed, variant, layouts=layouts, replays=4)
                assert {k: v for k, v in call.items() if k not in REPLAY_KEYS} == plain
                lens, capacity = call["lens"], call["capacity"]
                assert len(capacity) == len(lens)
                assert all(n <= cap <= call["max_seq_len"] for n, cap in zip(lens, capacity))
                assert 1 <= capacity.count(call["max_seq_len"])
                assert len(call["replay_lens"]) == len(call["replay_mixes"]) == 4
                for mix, replay in zip(call["replay_mixes"], call["replay_lens"]):
                    assert len(replay) == len(lens)
                    assert all(0 <= n <= cap for n, cap in zip(replay, capacity)), (seed, mix)
                    if mix == "capture":
                        assert replay == lens
                    if mix == "zeros":
                        assert not any(replay)
                    if mix == "capacity":
                        assert replay == capacity
                    grown_to_max += max(replay) == call["max_seq_len"] > max(lens)
                mixes.update(call["replay_mixes"])
    assert mixes == set(REPLAY_MIXES)
    assert grown_to_max > 100  # replays whose longest request is longer than at capture


def test_replay_cases_map_each_capacity_and_the_cpu_op_follows_new_lengths():
    """A replay case's table maps every request's capacity (the expectation would index a
    garbage entry otherwise) while `seq_lens` holds the capture's lengths; the CPU op,
    called again after the replays' lengths (and once fresh data) are written into the
    laid-out inputs, matches the independent expectation at each."""
    for seed in range(10):
        for variant in ("fp8", "fp4"):
            call = draw_call(seed, variant, layouts="wide" if seed % 2 else "suite", replays=3)
            call = dict(call, lens=[0, 5, 70, 33], max_seq_len=90, block_size=32)
            call.update(draw_replays(random.Random(seed), call, 3))
            if variant == "fp4":
                call.update(interleaved=False)
            case = build_case(call, variant, seed, device="cpu")
            assert case.seq_lens.tolist() == call["lens"]
            for b, cap in enumerate(call["capacity"]):
                assert (case.block_tables[b, : -(-cap // 32)] >= 0).all()
            inputs = laid_out_inputs(call, case, variant)
            first_q = inputs["q"].clone()
            op = fa.fp8_paged_mqa_logits if variant == "fp8" else fa.fp4_paged_mqa_logits
            for replay, lens in enumerate(call["replay_lens"]):
                if replay == 1:  # the second replay also with fresh data
                    case = write_fresh_data(call, variant, seed + 99, inputs, device="cpu")
                    assert not torch.equal(inputs["q"], first_q)
                inputs["seq_lens"].copy_(torch.tensor(lens, dtype=torch.int32))
                case.seq_lens = torch.tensor(lens, dtype=torch.int32)
                got = op(**inputs, max_seq_len=case.max_seq_len, output_dtype=torch.float32)
                mask = valid_mask(case.seq_lens, case.next_n, case.max_seq_len)
                expected = case.expected()
                torch.testing.assert_close(got[mask].double(), expected[mask], rtol=1e-6, atol=1e-6)
