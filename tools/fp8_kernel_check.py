"""Bring-up harness for the SM90 FP8 logits kernel: correctness sweep plus quick timings.

Calls the launcher directly (below the public API) so a kernel change can be checked in one
device call even while the API layer is changing:

    PYTHONPATH=packages/jit/src:packages/schedule/src:packages/layouts/src:packages/attn-scores/src \
        python tools/fp8_kernel_check.py [--quick]

Every case: fresh random data, shuffled physical blocks, zero-length requests between
non-empty ones, NaN-poisoned output; the float64 reference is computed here, independently
of the package's reference module. Prints one line per case and a timing table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import math
import sys
from collections.abc import Callable

import torch
from bench.timing import settle, time_single_replays
from flashinfer_attn_scores.paged_mqa_logits import fp8_sm90
from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask
from flashinfer_jit.compiler import compile_kernel
from flashinfer_jit.errors import KernelCompileError
from flashinfer_schedule import compute_paged_mqa_logits_schedule, padded_seq_len


def make_timing_case(batch, next_n, heads, head_dim, block_size, lens, pool_blocks):
    """Large case built on the GPU: random non-NaN FP8 bytes in a pool of `pool_blocks` blocks."""
    dev = "cuda"
    width = max((n + block_size - 1) // block_size for n in lens)
    kv_fused = torch.empty(pool_blocks, block_size, 1, head_dim + 4, dtype=torch.uint8, device=dev)
    kv_fused.random_(0, 256).bitwise_and_(0x77)  # in place: no second pool-sized tensor
    table = (
        torch.randperm(pool_blocks, device=dev)[: batch * width].view(batch, width).to(torch.int32)
    )
    q = torch.randn(batch, next_n, heads, head_dim, device=dev).to(torch.float8_e4m3fn)
    weights = torch.randn(batch * next_n, heads, device=dev)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    return dict(q=q, kv_fused=kv_fused, weights=weights, block_tables=table, seq_lens=seq_lens)


def make_case(batch, next_n, heads, head_dim, block_size, lens, gen, device, pool_factor=1):
    lens_t = torch.tensor(lens, dtype=torch.int32)
    blocks_per_req = [(n + block_size - 1) // block_size for n in lens]
    width = max(1, max(blocks_per_req))
    num_blocks = max(1, sum(blocks_per_req)) * pool_factor
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.randint(
        0, num_blocks, (batch, width), generator=gen, dtype=torch.int32
    )  # junk past each length
    used = 0
    for b, nb in enumerate(blocks_per_req):
        table[b, :nb] = perm[used : used + nb].to(torch.int32)
        used += nb
    k = torch.randn(num_blocks, block_size, head_dim, generator=gen) * 2
    k_fp8 = k.to(torch.float8_e4m3fn)
    scales = torch.rand(num_blocks, block_size, generator=gen) * 0.5 + 0.01
    kv_fused = torch.cat(
        [k_fp8.view(torch.uint8).flatten(1), scales.view(torch.uint8).flatten(1)], dim=1
    ).view(num_blocks, block_size, 1, head_dim + 4)
    q = (torch.randn(batch, next_n, heads, head_dim, generator=gen) * 2).to(torch.float8_e4m3fn)
    weights = torch.randn(batch * next_n, heads, generator=gen)
    return dict(
        q=q.to(device),
        kv_fused=kv_fused.to(device),
        weights=weights.to(device),
        block_tables=table.to(device),
        seq_lens=lens_t.to(device),
        k=k_fp8.double(),
        scales=scales.double(),
    )


def reference(case, max_seq_len, abs_weights=False):
    """float64 logits; with abs_weights, the size of the summed head terms (error scale)."""
    q, w = case["q"].cpu().double(), case["weights"].cpu().double()
    if abs_weights:
        w = w.abs()
    batch, next_n, _, _ = q.shape
    out = torch.full((batch * next_n, max_seq_len), float("nan"), dtype=torch.float64)
    block_size = case["k"].shape[1]
    for b, n in enumerate(case["seq_lens"].cpu().tolist()):
        if n == 0:
            continue
        nb = (n + block_size - 1) // block_size
        ids = case["block_tables"][b, :nb].cpu().long()
        k = case["k"][ids].reshape(-1, case["k"].shape[-1])[:n]
        s = case["scales"][ids].reshape(-1)[:n]
        scores = torch.einsum("thd,pd->thp", q[b], k).clamp_min(0)
        logits = torch.einsum("thp,th->tp", scores, w[b * next_n : (b + 1) * next_n]) * s
        out[b * next_n : (b + 1) * next_n, :n] = logits
    return out


def run_kernel(
    case, max_seq_len, out_dtype=torch.float32, epi=torch.float32, acc=torch.float32, extra_cols=0
):
    rows = case["q"].shape[0] * case["q"].shape[1]
    storage = torch.full(
        (rows, padded_seq_len(max_seq_len) + extra_cols),
        float("nan"),
        dtype=out_dtype,
        device="cuda",
    )
    fp8_sm90.launch(
        case["q"],
        case["kv_fused"],
        case["weights"],
        case["block_tables"],
        case["seq_lens"],
        storage,
        None,
        **length_limit(fp8_sm90.prepare, {"storage": storage}),
        output_dtype=out_dtype,
        epi_dtype=epi,
        acc_dtype=acc,
    )
    return storage


def check(case, max_seq_len, storage, tol):
    ref = reference(case, max_seq_len)
    size = reference(case, max_seq_len, abs_weights=True)
    got = storage[:, :max_seq_len].double().cpu()
    next_n = case["q"].shape[1]
    worst = 0.0
    for b, n in enumerate(case["seq_lens"].cpu().tolist()):
        for t in range(next_n):
            row = b * next_n + t
            if n == 0:
                if not torch.isnan(storage[row].double().cpu()).all():
                    return False, f"row {row} of a zero-length request was written"
                continue
            r, g = ref[row, :n], got[row, :n]
            if torch.isnan(g).any():
                return False, f"row {row}: {int(torch.isnan(g).sum())} unwritten/NaN of {n}"
            err = ((g - r).abs().max() / size[row, :n].max().clamp_min(1e-30)).item()
            worst = max(worst, err)
    return worst <= tol, f"max err / row magnitude = {worst:.2e}"


def correctness(quick: bool) -> bool:
    gen = torch.Generator().manual_seed(1234)
    ok_all = True
    lens_mix = [1, 0, 127, 128, 129, 0, 256, 257, 1000, 64, 63, 3000]
    shapes = [(64, 128, n) for n in (1, 2, 3, 4)] + [
        (32, 128, 4),
        (32, 128, 6),
        (32, 128, 8),
        (64, 64, 1),
        (16, 128, 1),
        (8, 96, 1),
        (4, 128, 2),
        (64, 256, 1),
    ]
    dtypes = [
        (torch.float32,) * 3,
        (torch.float16, torch.float32, torch.float32),
        (torch.float32, torch.float16, torch.float32),
        (torch.float32, torch.float32, torch.float16),
        (torch.float16,) * 3,
    ]
    for block_size in (32, 64, 128):
        for heads, head_dim, next_n in shapes:
            for out_dtype, epi, acc in dtypes if (heads, head_dim) == (64, 128) else dtypes[:1]:
                if quick and (out_dtype, epi, acc) != dtypes[0] and block_size != 64:
                    continue
                lens = [
                    int(x)
                    for x in torch.tensor(lens_mix)[torch.randperm(len(lens_mix), generator=gen)]
                ]
                case = make_case(len(lens), next_n, heads, head_dim, block_size, lens, gen, "cuda")
                max_seq_len = max(lens) + 77
                tol = 2e-3 if (epi, acc, out_dtype) == (torch.float32,) * 3 else 2e-2
                try:
                    storage = run_kernel(case, max_seq_len, out_dtype, epi, acc, extra_cols=5)
                    torch.cuda.synchronize()
                    ok, msg = check(case, max_seq_len, storage, tol)
                    again = run_kernel(case, max_seq_len, out_dtype, epi, acc, extra_cols=5)
                    # Only the spec's valid region: past a request's length the last unit's
                    # columns are unspecified (with block size 32 a unit's second box is not
                    # loaded past the end, so those rows hold whatever the stage held before).
                    valid = valid_mask(case["seq_lens"], next_n, storage.shape[1])
                    if ok and not torch.equal(storage[valid], again[valid]):
                        ok, msg = False, "not bitwise deterministic"
                except Exception as e:  # report and continue the sweep
                    ok, msg = False, f"{type(e).__name__}: {e}"
                ok_all &= ok
                print(
                    f"{'ok  ' if ok else 'FAIL'} bs={block_size:3d} H={heads:2d} D={head_dim:3d} next_n={next_n} out={out_dtype} epi={epi} acc={acc}: {msg}",
                    flush=True,
                )
    return ok_all


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read plus written per second (median of eager copies).

    Timed eagerly: a captured-graph replay of the same copy measured only 2.7 TB/s on the
    H200 (2026-11-29), against 4.1 TB/s eager, so graphs are not used for this ceiling.
    """
    src = torch.empty(256 * 1024**2, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for i in range(30):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        stop.record()
        stop.synchronize()
        if i >= 10:  # clocks ramped up
            times.append(start.elapsed_time(stop) / 1e3)
    times.sort()
    return 2 * src.numel() * src.element_size() / times[len(times) // 2]


def timing(quick: bool):
    rows = []
    copy_bw = copy_bandwidth()
    print(f"device copy bandwidth: {copy_bw / 1e12:.2f} TB/s", flush=True)
    grid = [(1, 4096), (8, 16384), (64, 16384), (128, 4096), (128, 65536)]
    for next_n in (1, 2, 4):
        for block_size in (64,) if quick else (32, 64, 128):
            for batch, avg in grid[-2:] if quick else grid:
                case, total = timing_case(next_n, block_size, batch, avg, seed=7)
                t = bench(fp8_call(case, None))
                nbytes = total * (132 + 4 * next_n)
                rows.append(
                    (
                        next_n,
                        block_size,
                        batch,
                        avg,
                        t * 1e6,
                        nbytes / t / 1e9,
                        nbytes / t / copy_bw,
                    )
                )
                del case
    print(f"device copy bandwidth again: {copy_bandwidth() / 1e12:.2f} TB/s")
    experiments(copy_bw)
    print("\nnext_n  bs     B      L     time_us    GB/s   frac_copy")
    for r in rows:
        print(f"{r[0]:6d} {r[1]:4d} {r[2]:5d} {r[3]:6d} {r[4]:10.1f} {r[5]:8.0f} {r[6]:8.2f}")


# Drop-a-stage / change-a-knob variants at large shapes: where does the time go? Variants that
# compute the logits are compared bitwise with the production kernel's output.
EXPERIMENTS = [
    ("production", ()),
    ("no MMA/epilogue", (("EXP_SKIP_MATH", 1),)),
    ("no MMA", (("EXP_SKIP_MMA", 1),)),
    ("no epilogue", (("EXP_SKIP_EPILOGUE", 1),)),
    ("relu on the ALU pipe", (("RELU_FMA", 0),)),
    ("relu split between pipes", (("RELU_FMA", 2),)),
    ("3 consumer warpgroups", (("NUM_CONSUMERS", 3),)),
    ("5 consumers, 2 producers", (("NUM_CONSUMERS", 5),)),
    ("6 consumer warpgroups", (("NUM_CONSUMERS", 6),)),
]
EXPERIMENT_SHAPES = [
    (1, 64, 128, 65536),
    (2, 64, 128, 65536),
    (1, 32, 128, 32768),
    (3, 64, 64, 32768),
    (4, 64, 64, 32768),
    (4, 128, 128, 32768),
]
# Small batches: the kernel deriving its own schedule (schedule_meta=None) against the separate
# schedule kernel launched in the same graph (what every call did before).
SMALL_SHAPES = [
    (1, 64, 1, 4096),
    (1, 64, 1, 65536),
    (1, 64, 8, 4096),
    (1, 64, 8, 65536),
    (2, 64, 1, 4096),
    (1, 64, 64, 4096),
    (1, 64, 128, 16384),
    (4, 64, 1, 4096),
]


def fits_shared_memory(config) -> bool:
    """Whether the configuration fits a CTA (an experiment's NUM_STAGES is not checked by the
    launcher's pipeline policy)."""
    if not getattr(config, "fits", True):
        return False
    size = getattr(config, "shared_memory_bytes", None)
    return size is None or size(config.stages) <= fp8_sm90.SM90_SHARED_MEMORY_LIMIT


def compiles_without_spills(spec) -> bool:
    try:
        return not compile_kernel(spec, "sm_90a").spills
    except KernelCompileError:  # e.g. too few registers for the accumulator
        return False


def draw_lengths(batch, avg, seed):
    """Request lengths uniform in 0.7..1.3 of `avg`, and their sum."""
    gen = torch.Generator().manual_seed(seed)
    lens = [int(x) for x in (torch.rand(batch, generator=gen) * 0.6 + 0.7) * avg]
    return lens, sum(lens)


def timing_case(next_n, block_size, batch, avg, seed=3):
    lens, total = draw_lengths(batch, avg, seed)
    width = max(lens) // block_size + 1
    pool_blocks = max(batch * width, math.ceil(max(2e9, 2 * total * 132) / (block_size * 132)))
    case = make_timing_case(batch, next_n, 64, 128, block_size, lens, pool_blocks)
    case["storage"] = torch.empty(batch * next_n, padded_seq_len(max(lens)), device="cuda")
    return case, total


def length_limit(prepare, case) -> dict:
    """`max_seq_len` for a timing case's launch: the storage's padded width, at least every
    length, so the kernel clamps none. Empty for the launchers of trees before 2026-12-06,
    which take no such argument (`tools/tree_ab.py` runs older trees with these tools)."""
    if "max_seq_len" not in inspect.signature(prepare).parameters:
        return {}
    return {"max_seq_len": case["storage"].shape[1]}


def fp8_call(
    case,
    schedule,
    experiment=(),
    schedule_rows_out=None,
    epi_dtype=torch.float32,
    acc_dtype=torch.float32,
):
    return functools.partial(
        fp8_sm90.launch,
        case["q"],
        case["kv_fused"],
        case["weights"],
        case["block_tables"],
        case["seq_lens"],
        case["storage"],
        schedule,
        **length_limit(fp8_sm90.prepare, case),
        output_dtype=torch.float32,
        epi_dtype=epi_dtype,
        acc_dtype=acc_dtype,
        experiment=experiment,
        schedule_rows_out=schedule_rows_out,
    )


def experiments(copy_bw: float, which: str = "all") -> None:
    single = SINGLE_EXPERIMENTS.get(which)
    if single is not None:
        single(copy_bw)
        return
    if which != "small":
        large_experiments(copy_bw)
    if which != "large":
        small_batch_experiments()


@dataclasses.dataclass(frozen=True)
class KernelUnderTest:
    """What the variant table needs to know about one kernel."""

    variant: str  # the schedule helper's variant name: "fp8" or "fp4"
    make_case: Callable  # (next_n, block_size, batch, avg) -> (case, total tokens)
    config: Callable  # (block_size, next_n, experiment) -> kernel config
    call: Callable  # (case, schedule, experiment) -> the launch, as a zero-argument callable
    bytes_per_token: int  # KV bytes per token, outputs (4 B float32 per draft slot) aside
    label: str = ""  # the table header's name where it is not `variant` (another epilogue)


# Seconds of back-to-back calls of a variant before it is timed (--preheat): the GPU then sits
# at its power cap, as under a serving load, instead of at the boost clock of a short burst.
PREHEAT_S = 0.0


def preheat(call) -> str:
    """Run `call` back to back for PREHEAT_S seconds; the SM clock and power after it."""
    import time

    began = time.perf_counter()
    while time.perf_counter() - began < PREHEAT_S:
        for _ in range(50):
            call()
        torch.cuda.synchronize()
    return gpu_state() if PREHEAT_S > 0 else ""


def variant_table(kernel: KernelUnderTest, shapes, variants, copy_bw: float) -> None:
    """Time every variant at every shape; variants that compute logits are compared bitwise
    with the first one (production) on the valid region."""
    print(
        f"\n{kernel.label or kernel.variant} variant             next_n  bs     B      L  time_us  frac_copy  tokens/us"
    )
    for next_n, block_size, batch, avg in shapes:
        case, total = kernel.make_case(next_n, block_size, batch, avg)
        schedule = compute_paged_mqa_logits_schedule(
            case["seq_lens"], next_n=next_n, variant=kernel.variant
        )
        label = f"{next_n:6d} {block_size:3d} {batch:5d} {avg:6d}"
        reference = None
        settle(torch.device("cuda"))  # as the benchmark does before timing (bench/timing.py)
        for name, experiment in variants:
            config = kernel.config(block_size, next_n, experiment)
            # PRODUCER_REGS variants spill in the producer warps by design (their consumers'
            # unit path is checked with tools/unit_path.py).
            spills_allowed = "PRODUCER_REGS" in dict(experiment)
            if not fits_shared_memory(config) or not (
                spills_allowed or compiles_without_spills(config.spec)
            ):
                print(f"{name:24s} {label}   (spills or does not fit)")
                continue
            case["storage"].fill_(float("nan"))
            state = preheat(kernel.call(case, schedule, experiment))
            t = bench(kernel.call(case, schedule, experiment))
            nbytes = total * (kernel.bytes_per_token + 4 * next_n)
            check = ""
            if not any(knob.startswith("EXP_") for knob, _ in experiment):
                # Only positions < seq_len are defined: the padding columns of a request's last
                # unit hold whatever the stage held before, which depends on the stage count.
                valid = valid_mask(case["seq_lens"].cpu(), next_n, case["storage"].shape[1])
                got = case["storage"].cpu()[valid]
                if reference is None:
                    reference = got
                    check = f"{int(torch.isnan(got).sum())} NaN"
                else:
                    same = torch.equal(got, reference)
                    check = "bitwise = production" if same else "DIFFERS from production"
            print(
                f"{name:24s} {label} {t * 1e6:8.1f} {nbytes / t / copy_bw:9.2f}"
                f" {total / t / 1e6:10.0f}  {check}" + (f"  [{state}]" if state else "")
            )
        del case


FP8 = KernelUnderTest(
    "fp8",
    timing_case,
    lambda block_size, next_n, experiment: fp8_sm90.fp8_config(
        block_size, 128, 64, next_n, *(torch.float32,) * 3, experiment
    ),
    fp8_call,
    132,
)


def fp8_gaussian_case(next_n, block_size, batch, avg, seed=3):
    """timing_case's shapes with the benchmark's kind of KV rows (quantised Gaussian; their
    generator's seed is quantised_gaussian_kv's, not `seed`)."""
    case, total = timing_case(next_n, block_size, batch, avg, seed)
    quantised_gaussian_kv(case["kv_fused"])
    return case, total


FP8_GAUSSIAN = dataclasses.replace(FP8, make_case=fp8_gaussian_case, label="fp8, Gaussian data,")
FP8_F16_GAUSSIAN = dataclasses.replace(
    FP8_GAUSSIAN,
    label="fp8, float16 epilogue and accumulator, Gaussian data,",
    config=lambda block_size, next_n, experiment: fp8_sm90.fp8_config(
        block_size, 128, 64, next_n, torch.float32, torch.float16, torch.float16, experiment
    ),
    call=functools.partial(fp8_call, epi_dtype=torch.float16, acc_dtype=torch.float16),
)
# fp8 at the cap with either accumulator (run with --preheat 2): how much of a call's energy
# the MMAs and the epilogue take with float32 and with float16 accumulation, beside fp4's tables
# (fp4's accumulator is float32 by the spec).
FP8_ACC_POWER_VARIANTS = EXPERIMENTS[:4]  # production and the three stage drops
FP8_ACC_POWER_SHAPES = [(2, 64, 128, 65536), (3, 64, 128, 32768), (4, 64, 64, 65536)]


def large_experiments(copy_bw: float) -> None:
    variant_table(FP8, EXPERIMENT_SHAPES, EXPERIMENTS, copy_bw)


def interleaved(*variants, rounds: int = 2):
    """A/B(/C...) variants, each timed `rounds` times: all of them in order, then all again."""
    return [(f"{name}{', again' * r}", knobs) for r in range(rounds) for name, knobs in variants]


RELU_PIPE_VARIANTS = interleaved(
    ("relu x + |x| (FMA pipe)", ()), ("relu FMNMX (ALU pipe)", (("RELU_FMA", 0),))
)
RELU_PIPE_SHAPES = [
    (2, 64, 128, 65536),
    (3, 64, 64, 32768),
    (4, 64, 64, 32768),
    (2, 128, 128, 32768),
]

# fp8 next_n 2 (N 128) with 3 consumer warpgroups (152 registers each, room for the unit's
# weights in registers) against production's 4 (104 registers). Measured 2026-11-30: 3 are
# 2.5-5 % slower.
N2_CONSUMER_VARIANTS = interleaved(
    ("4 consumers (production)", ()), ("3 consumers", (("NUM_CONSUMERS", 3),))
)
N2_CONSUMER_SHAPES = [(2, 64, 128, 65536), (2, 128, 128, 32768), (2, 32, 64, 32768)]

# Weights of the first G 8-column groups held in registers per request (WEIGHT_REGS=G, capped
# at N / 8) instead of loaded per unit; "spills" where they do not fit. Production holds every
# group where at most two consumer warpgroups run (next_n 4 at H 64), none elsewhere.
WEIGHT_REG_VARIANTS = interleaved(
    ("production", ()),
    ("weights loaded per unit", (("WEIGHT_REGS", 0),)),
    ("weights in regs, G 8", (("WEIGHT_REGS", 8),)),
    ("weights in regs, G 12", (("WEIGHT_REGS", 12),)),
)
WEIGHT_REG_SHAPES = [
    (4, 64, 1, 4096),
    (4, 64, 8, 4096),
    (4, 64, 8, 65536),
    (2, 64, 128, 65536),
    (4, 64, 64, 32768),
    (4, 128, 128, 32768),
    (4, 128, 128, 65536),
]

# One MMA commit group instead of two at N > 128, now that next_n 4 holds its weights in
# registers (two groups read the KV tile twice from shared memory).
HALVES_VARIANTS = interleaved(("production", ()), ("one MMA group", (("MMA_HALVES", 1),)))
HALVES_SHAPES = [(3, 64, 64, 32768), (4, 64, 64, 32768), (4, 128, 128, 32768), (4, 32, 128, 32768)]

# Two MMA commit groups at N <= 128 (next_n 1-2), where production runs one. Measured in the
# fourth round for fp8 only (A read twice from shared memory: slower at N = 128); fp4 feeds A
# from registers, so the second group re-reads nothing (twenty-seventh round).
LOW_N_HALVES_VARIANTS = interleaved(("production", ()), ("two MMA groups", (("MMA_HALVES", 2),)))
LOW_N_HALVES_FP4_SHAPES = [
    (1, 64, 128, 65536),
    (1, 32, 128, 32768),
    (2, 64, 128, 65536),
    (2, 128, 128, 65536),
]
LOW_N_HALVES_FP8_SHAPES = [(2, 64, 128, 65536)]

# next_n 2 with fewer consumer warpgroups and, in the registers that frees, every weight group
# (measured 2026-11-30, seventeenth round: none faster than production, in bursts or at the cap).
N2_WEIGHT_VARIANTS = interleaved(
    ("4 consumers (production)", ()),
    ("3 consumers", (("NUM_CONSUMERS", 3),)),
    ("3 consumers, weights in regs", (("NUM_CONSUMERS", 3), ("WEIGHT_REGS", 16))),
    ("2 consumers, weights in regs", (("NUM_CONSUMERS", 2), ("WEIGHT_REGS", 16))),
)
N2_WEIGHT_SHAPES = [
    (2, 64, 128, 65536),
    (2, 128, 128, 32768),
    (2, 64, 64, 16384),
    (2, 32, 64, 32768),
]

# Where the power goes at the 700 W cap (run with --preheat): each row prints the SM clock the
# variant settles at. A variant that drops a stage and runs at a higher clock frees that much
# power; the production row's clock is what the whole kernel leaves.
POWER_VARIANTS = interleaved(
    ("production", ()),
    ("no MMA/epilogue", (("EXP_SKIP_MATH", 1),)),
    ("no MMA", (("EXP_SKIP_MMA", 1),)),
    ("no epilogue", (("EXP_SKIP_EPILOGUE", 1),)),
    ("relu on the ALU pipe", (("RELU_FMA", 0),)),
)
POWER_SHAPES = [
    (1, 64, 128, 65536),
    (2, 64, 128, 65536),
    (4, 64, 64, 32768),
]

# The load path alone against the whole kernel at fp8 next_n 1 (>= 4M tokens, every block
# size; next_n 2 and a mid-size shape besides), for comparison with tools/read_rate.py's rates
# in the same session.
# With EXP_STORES the logits are computed but not stored (1), or stored into 512 columns that
# stay in L2 (2): what the output stores cost at DRAM.
LOAD_PATH_VARIANTS = interleaved(
    ("production", ()),
    ("no MMA/epilogue", (("EXP_SKIP_MATH", 1),)),
    ("no stores", (("EXP_STORES", 1),)),
    ("stores into L2", (("EXP_STORES", 2),)),
)
LOAD_PATH_SHAPES = [
    (1, 32, 128, 65536),
    (1, 64, 128, 65536),
    (1, 128, 128, 65536),
    (2, 64, 128, 65536),
    (1, 64, 64, 16384),
]

# Pipeline depth: production's 12 stages against 16 and 20 (a multiple of the 4 producer warps
# and the consumer count; next_n 3's three consumers need 12 or 24), three interleaved rounds,
# large and mid-size shapes.
STAGE_VARIANTS = interleaved(
    ("12 stages (production)", ()),
    ("16 stages", (("NUM_STAGES", 16),)),
    ("20 stages", (("NUM_STAGES", 20),)),
    rounds=3,
)
STAGE_SHAPES = [
    (1, 64, 128, 65536),
    (2, 64, 128, 65536),
    (1, 32, 128, 32768),
    (1, 64, 64, 4096),
    (2, 64, 128, 16384),
    (2, 128, 128, 32768),
    (4, 64, 64, 32768),
]

# The MXFP4 kernel's variants (same idea; "no decode" feeds the packed bytes to the MMA).
FP4_EXPERIMENTS = [
    ("production", ()),
    ("no MMA/decode/epilogue", (("EXP_SKIP_MATH", 1),)),
    ("no decode", (("EXP_SKIP_DECODE", 1),)),
    ("no MMA", (("EXP_SKIP_MMA", 1),)),
    ("no epilogue", (("EXP_SKIP_EPILOGUE", 1),)),
    ("no decode, no epilogue", (("EXP_SKIP_DECODE", 1), ("EXP_SKIP_EPILOGUE", 1))),
    ("relu on the ALU pipe", (("RELU_FMA", 0),)),
    ("relu split between pipes", (("RELU_FMA", 2),)),
    ("3 consumer warpgroups", (("NUM_CONSUMERS", 3),)),
    ("5 consumers, 2 producers", (("NUM_CONSUMERS", 5),)),
    ("5 consumers, 1 producer", (("NUM_CONSUMERS", 5), ("NUM_PRODUCERS", 1))),
    ("2 producer warps", (("NUM_PRODUCERS", 2),)),
]
FP4_SHAPES = [(1, 64, 128, 65536), (2, 64, 128, 65536), (4, 64, 64, 32768), (1, 128, 128, 65536)]
# fp4 pipeline depth. Unit k goes to producer warp k % 4 and consumer k % C, so with 16 stages
# and 4 consumers each consumer has 4 stages of 4.3 KB in flight; the consumers' waits for full
# stages (EXP_PHASES, 2026-11-30: 434 of 1922 cycles per unit at next_n 1) suggested too few.
# Written when next_n 1 ran 4 consumers with 16 stages; "5 consumers, 20 stages" has been
# production at next_n 1 since (2026-11-30), so there the first row repeats it.
# A count that is not a multiple of both role counts fails to compile and is skipped.
FP4_STAGE_VARIANTS = interleaved(
    ("production", ()),
    ("24 stages", (("NUM_STAGES", 24),)),
    ("32 stages", (("NUM_STAGES", 32),)),
    ("5 consumers, 20 stages", (("NUM_CONSUMERS", 5), ("NUM_STAGES", 20))),
    ("5 consumers, 40 stages", (("NUM_CONSUMERS", 5), ("NUM_STAGES", 40))),
)
# fp4 next_n 2 with a fourth consumer warpgroup: 112 registers each once the producers give
# back all but 32 (they spill there; the consumers' unit path does not).
FP4_N2_CONSUMER_VARIANTS = interleaved(
    ("production (3 consumers)", ()),
    ("4 consumers, producers 32", (("NUM_CONSUMERS", 4), ("PRODUCER_REGS", 32))),
    (
        "4 consumers, 16 stages",
        (("NUM_CONSUMERS", 4), ("PRODUCER_REGS", 32), ("NUM_STAGES", 16)),
    ),
    ("3 consumers, producers 32", (("PRODUCER_REGS", 32),)),
)
FP4_N2_CONSUMER_SHAPES = [
    (2, 64, 128, 65536),
    (2, 32, 128, 65536),
    (2, 128, 128, 65536),
    (2, 64, 64, 32768),
]
FP4_STAGE_SHAPES = [
    (1, 64, 128, 65536),
    (1, 32, 128, 32768),
    (2, 64, 128, 65536),
    (4, 64, 64, 32768),
]


def fp4_timing_case(next_n, block_size, batch, avg, seed=3):
    """Random packed E2M1 bytes with UE8M0 scales in [120, 134) (no overflow anywhere)."""
    lens, total = draw_lengths(batch, avg, seed)
    width = max(lens) // block_size + 1
    pool_blocks = max(batch * width, math.ceil(2e9 / (block_size * 68)))
    dev = "cuda"
    kv = torch.randint(0, 256, (pool_blocks, block_size * 68), dtype=torch.uint8, device=dev)
    kv[:, block_size * 64 :] = torch.randint(
        120, 134, (pool_blocks, block_size * 4), dtype=torch.uint8, device=dev
    )
    sf = torch.randint(120, 134, (batch, next_n, 64, 4), dtype=torch.uint8, device=dev)
    case = dict(
        q=torch.randint(0, 256, (batch, next_n, 64, 64), dtype=torch.uint8, device=dev),
        q_sf=sf.view(torch.int32).view(batch, next_n, 64),
        kv_fused=kv.view(pool_blocks, block_size, 1, 68),
        weights=torch.randn(batch * next_n, 64, device=dev),
        block_tables=torch.randperm(pool_blocks, device=dev)[: batch * width]
        .view(batch, width)
        .to(torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
        storage=torch.empty(batch * next_n, padded_seq_len(max(lens)), device=dev),
    )
    return case, total


def fp4_gaussian_case(next_n, block_size, batch, avg, seed=3):
    """fp4_timing_case's shapes with the benchmark's kind of data (tools/bench/data.py):
    Gaussian q and K rows quantised to MXFP4, the pool chunk by chunk."""
    import flashinfer_layouts

    case, total = fp4_timing_case(next_n, block_size, batch, avg, seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    quantised_gaussian_kv(case["kv_fused"], "fp4", gen)
    q = torch.randn(batch, next_n, 64, 128, generator=gen, device="cuda")
    case["q"], case["q_sf"] = flashinfer_layouts.quantize_mxfp4_q(q)
    return case, total


def fp4_call(
    case,
    schedule,
    experiment=(),
    schedule_rows_out=None,
    epi_dtype=torch.float32,
    is_kv_sf_interleaved=False,
):
    from flashinfer_attn_scores.paged_mqa_logits import fp4_sm90

    return functools.partial(
        fp4_sm90.launch,
        case["q"],
        case["q_sf"],
        case["kv_fused"],
        case["weights"],
        case["block_tables"],
        case["seq_lens"],
        case["storage"],
        schedule,
        **length_limit(fp4_sm90.prepare, case),
        output_dtype=torch.float32,
        epi_dtype=epi_dtype,
        is_kv_sf_interleaved=is_kv_sf_interleaved,
        experiment=experiment,
        schedule_rows_out=schedule_rows_out,
    )


def fp4_sm90_config(block_size, next_n, experiment, epi_dtype):
    from flashinfer_attn_scores.paged_mqa_logits import fp4_sm90

    return fp4_sm90.fp4_config(block_size, next_n, torch.float32, epi_dtype, False, experiment)


def fp4_config(block_size, next_n, experiment):
    return fp4_sm90_config(block_size, next_n, experiment, torch.float32)


FP4 = KernelUnderTest("fp4", fp4_timing_case, fp4_config, fp4_call, 68)
FP4_BF16_EPI = dataclasses.replace(
    FP4,
    label="fp4, bfloat16 epilogue,",
    config=lambda block_size, next_n, experiment: fp4_sm90_config(
        block_size, next_n, experiment, torch.bfloat16
    ),
    call=functools.partial(fp4_call, epi_dtype=torch.bfloat16),
)
FP4_GAUSSIAN = dataclasses.replace(FP4, make_case=fp4_gaussian_case, label="fp4, Gaussian data,")
FP4_BF16_EPI_GAUSSIAN = dataclasses.replace(
    FP4_BF16_EPI, make_case=fp4_gaussian_case, label="fp4, bfloat16 epilogue, Gaussian data,"
)

# Where fp4's time goes under a sustained load (run with --preheat 2): each row
# prints the SM clock and power the variant settles at, with the float32 epilogue and with the
# bfloat16 one (the head sum on the tensor cores). In bursts the bfloat16 epilogue issues 23-41 %
# fewer consumer instructions and takes 0.95-1.06x the float32 time (forty-ninth round): a row
# below 1980 MHz is held by the 700 W cap, and a variant that drops a stage and gains clock
# shows what that stage costs in power.
FP4_POWER_VARIANTS = FP4_EXPERIMENTS[:5]  # production and the four stage drops
FP4_POWER_SHAPES = [(2, 64, 128, 65536), (3, 64, 128, 32768), (4, 64, 64, 65536)]
# The same on the benchmark's kind of data (the tensor cores' energy depends on the bits they
# multiply), next_n 1 besides.
FP4_GAUSSIAN_POWER_SHAPES = [(1, 64, 128, 65536), *FP4_POWER_SHAPES]
# The |x| epilogue's best case at the cap (run with --preheat 2): its head terms alone, one FFMA
# each (EXP_ABS_TERMS, wrong logits), without the extra MMA columns the real design needs. The
# unit path (block 64, float32 output, NVRTC 13.5) drops 235 -> 205, 297 -> 235, 446 -> 350 and
# 493 -> 365 instructions at next_n 1-4. In bursts (twenty-sixth round) the terms alone bought
# 1.5-6 %; at the cap fp4 next_n 2-4 needs up to 11 % less time for its 0.75 target.
FP4_ABS_TERM_VARIANTS = interleaved(
    ("production", ()), ("|x| terms alone", (("EXP_ABS_TERMS", 1),))
)


def fp4_experiments(copy_bw: float) -> None:
    variant_table(FP4, FP4_SHAPES, FP4_EXPERIMENTS, copy_bw)


# Consumer warpgroup counts at next_n 3, where both kernels have had 2 (production first).
CONSUMER_COUNTS = [
    ("production", ()),
    ("2 consumer warpgroups", (("NUM_CONSUMERS", 2),)),
    ("3 consumer warpgroups", (("NUM_CONSUMERS", 3),)),
]
CONSUMER_SHAPES = [(3, 64, 128, 65536), (3, 64, 64, 32768)]


def consumer_count_experiments(copy_bw: float) -> None:
    variant_table(FP8, CONSUMER_SHAPES, CONSUMER_COUNTS, copy_bw)
    variant_table(FP4, CONSUMER_SHAPES, CONSUMER_COUNTS, copy_bw)


def gpu_state(fields: str = "clocks.sm,power.draw") -> str:
    """nvidia-smi's reading of `fields` now (SM clock in MHz and power draw in W unless asked
    for more), or why it could not be read."""
    import subprocess

    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"


def quantised_gaussian_kv(
    kv_fused: torch.Tensor,
    op: str = "fp8",
    gen: torch.Generator | None = None,
    chunk_blocks: int = 4096,
) -> None:
    """Overwrite `kv_fused` (`op`'s layout, head_dim 128) with quantised Gaussian K rows, the
    benchmark's data (`bench.data`'s block builder), chunk by chunk; `gen` defaults to seed 11
    on the pool's device."""
    from bench.data import _random_kv_blocks
    from bench.shapes import IndexerShape

    if gen is None:
        gen = torch.Generator(device=kv_fused.device).manual_seed(11)
    blocks, block_size = kv_fused.shape[:2]
    shape = IndexerShape(op, batch=1, avg_len=block_size, next_n=1, block_size=block_size)
    for start in range(0, blocks, chunk_blocks):
        stop = min(blocks, start + chunk_blocks)
        new_blocks = _random_kv_blocks(shape, stop - start, gen, kv_fused.device)
        kv_fused[start:stop] = new_blocks.view(kv_fused[start:stop].shape)


# The one shape the data, harness-gap and sustained-load experiments time.
ONE_SHAPE = (1, 64, 128, 65536)  # next_n, block size, batch, average length


def shape_label(shape) -> str:
    return "fp8, next_n {}, block {}, B {}, L {}".format(*shape)


def one_shape_call(shape=ONE_SHAPE):
    """The variant harness's case at `shape`, its production fp8 launch with a precomputed
    schedule, and the bytes it moves: (case, tokens, call, bytes)."""
    next_n = shape[0]
    case, total = timing_case(*shape)
    schedule = compute_paged_mqa_logits_schedule(case["seq_lens"], next_n=next_n)
    return case, total, fp8_call(case, schedule), total * (132 + 4 * next_n)


def kv_data_experiments(copy_bw: float, shape=ONE_SHAPE) -> None:
    """Production fp8 on two kinds of KV bytes at one large shape: the variant tables' random
    bytes (& 0x77: positive, small) and the benchmark's quantised Gaussian rows. A
    data-dependent power limit would show as a lower SM clock after a burst of calls."""
    case, total, call, nbytes = one_shape_call(shape)
    print(
        f"\nkv data ({shape_label(shape)})   time_us  frac_copy  tokens/us  clock, power after 400 calls"
    )
    for name in ("random bytes & 0x77", "quantised Gaussian rows"):
        if name.startswith("quantised"):
            quantised_gaussian_kv(case["kv_fused"])
        t = bench(call)
        for _ in range(400):
            call()
        clocks = gpu_state()
        torch.cuda.synchronize()
        print(
            f"{name:58s} {t * 1e6:8.1f} {nbytes / t / copy_bw:9.2f} {total / t / 1e6:10.0f}  {clocks}"
        )


def harness_gap_experiments(copy_bw: float, shape=ONE_SHAPE) -> None:
    """The variant tables read 5-10 % more tokens/us than tools/bench at the same shape. Time
    one shape through both harnesses' inputs and timers, and with the schedule precomputed or
    computed inside the call, to find which difference costs the time."""
    import flashinfer_attn_scores
    from bench.data import build_case
    from bench.ops import op_call
    from bench.shapes import IndexerShape
    from bench.timing import time_graph_replays

    next_n, block_size, batch, avg = shape
    bench_case = build_case(
        IndexerShape("fp8", batch, avg, next_n, block_size), torch.device("cuda")
    )
    inputs = bench_case.sets[0]
    bench_total = sum(bench_case.seq_lens)
    bench_as_dict = dict(
        q=inputs.q,
        kv_fused=bench_case.kv_fused,
        weights=inputs.weights,
        block_tables=inputs.block_tables,
        seq_lens=inputs.seq_lens,
        storage=inputs.out,
    )
    variant_case, variant_total = timing_case(next_n, block_size, batch, avg)
    # The variant harness's data with the benchmark's lengths (its pool and tables otherwise).
    lens_case = make_timing_case(
        batch, next_n, 64, 128, block_size, bench_case.seq_lens, variant_case["kv_fused"].shape[0]
    )
    lens_case["storage"] = torch.empty_like(inputs.out)

    def public(case, max_len, schedule):
        return lambda: flashinfer_attn_scores.fp8_paged_mqa_logits(
            case["q"],
            case["kv_fused"],
            case["weights"],
            case["block_tables"],
            case["seq_lens"],
            max_len,
            schedule_meta=schedule,
            out=case["storage"],
        )

    def given(case):
        return compute_paged_mqa_logits_schedule(case["seq_lens"], next_n=next_n)

    variant_max = max(int(x) for x in variant_case["seq_lens"].tolist())
    rows = [
        (
            "variant data, launch, given schedule",
            variant_case,
            variant_total,
            fp8_call(variant_case, given(variant_case)),
        ),
        (
            "variant data, public, schedule None",
            variant_case,
            variant_total,
            public(variant_case, variant_max, None),
        ),
        (
            "variant data, public, given schedule",
            variant_case,
            variant_total,
            public(variant_case, variant_max, given(variant_case)),
        ),
        (
            "variant pool, bench lengths, launch",
            lens_case,
            bench_total,
            fp8_call(lens_case, given(lens_case)),
        ),
        (
            "bench data, launch, given schedule",
            bench_as_dict,
            bench_total,
            fp8_call(bench_as_dict, given(bench_as_dict)),
        ),
        (
            "bench data, public, schedule None",
            bench_as_dict,
            bench_total,
            public(bench_as_dict, bench_case.max_seq_len, None),
        ),
        (
            "bench data, public, given schedule",
            bench_as_dict,
            bench_total,
            public(bench_as_dict, bench_case.max_seq_len, given(bench_as_dict)),
        ),
    ]
    print(
        f"\nharness gap ({shape_label(shape)})"
        "        tokens  pool GB  1/graph us  bench-timer us  tokens/us (bench timer)"
    )
    for name, case, total, call in rows:
        pool_gb = case["kv_fused"].numel() / 1e9
        alone = bench(call) * 1e6
        timed = time_graph_replays([call]).median_us
        print(
            f"{name:58s} {total:9d} {pool_gb:8.2f} {alone:11.1f} {timed:15.1f} {total / timed:10.0f}"
        )
    # What tools/bench itself times: every rotation set's call in one graph.
    sets = [op_call(bench_case, inputs) for inputs in bench_case.sets]
    timed = time_graph_replays(sets).median_us
    name = f"bench data, public, all {len(sets)} rotation sets"
    pool_gb = bench_case.kv_fused.numel() / 1e9
    print(
        f"{name:58s} {bench_total:9d} {pool_gb:8.2f} {'':11s} {timed:15.1f} {bench_total / timed:10.0f}"
    )


# next_n 2, where the consumers are instruction-issue bound, so the SM clock should matter.
ISSUE_BOUND_SHAPE = (2, 64, 128, 65536)


def sustained_load_experiments(
    copy_bw: float, shape=ONE_SHAPE, points_s=(0.0, 5.0, 30.0, 90.0, 180.0)
) -> None:
    """One large fp8 shape on the benchmark's kind of KV data (quantised Gaussian rows), timed
    after the GPU sat idle and again after up to `points_s[-1]` seconds of back-to-back calls
    (the benchmark runs for many minutes), with the copy bandwidth, clocks, power and
    temperatures read at each point: whether a sustained load slows the kernel, the copy, or
    both."""
    import time

    case, _, call, nbytes = one_shape_call(shape)
    quantised_gaussian_kv(case["kv_fused"])
    print(
        f"\nsustained load ({shape_label(shape)}); copy at the start {copy_bw / 1e12:.2f} TB/s\n"
        f"{'':22s} time_us  copy_now  frac_start  frac_now  "
        "sm MHz, mem MHz, W, gpu C, mem C, throttle reasons (before the timing)"
    )
    loaded_s = 0.0
    for total_s in points_s:
        if total_s == 0.0:
            torch.cuda.synchronize()
            time.sleep(3.0)
        began = time.perf_counter()
        while loaded_s + time.perf_counter() - began < total_s:
            for _ in range(50):
                call()
            torch.cuda.synchronize()
        loaded_s = max(loaded_s, total_s)
        state = gpu_state(
            "clocks.sm,clocks.mem,power.draw,temperature.gpu,temperature.memory,"
            "clocks_event_reasons.active"
        )
        t = bench(call, iters=200)
        copy_now = copy_bandwidth()
        name = "after 3 s idle" if total_s == 0.0 else f"after {total_s:.0f} s of calls"
        print(
            f"{name:22s} {t * 1e6:7.1f} {copy_now / 1e12:7.2f} {nbytes / t / copy_bw:10.2f} "
            f"{nbytes / t / copy_now:9.2f}  {state}"
        )


def pool_size_experiments(copy_bw: float) -> None:
    """ONE_SHAPE's lengths with their blocks spread at random over KV pools of growing size
    (the variant tables use about 2 GB, the benchmark 4.4 GB, a serving engine most of the
    GPU's memory), then the 2 GB pool again with 64 GB of other memory allocated and written;
    then fresh 2 GB pools, each timed three times and once more with a new block table: whether
    the spread of the pages, the allocation, the table or the moment moves the time."""
    next_n, block_size, batch, avg = ONE_SHAPE
    lens, total = draw_lengths(batch, avg, seed=3)
    width = max(lens) // block_size + 1
    token_bytes = 132
    nbytes = total * (token_bytes + 4 * next_n)

    def pool_case(pool_gb: float) -> tuple[dict, Callable]:
        pool_blocks = max(batch * width, math.ceil(pool_gb * 1e9 / (block_size * token_bytes)))
        case = make_timing_case(batch, next_n, 64, 128, block_size, lens, pool_blocks)
        case["storage"] = torch.empty(batch * next_n, padded_seq_len(max(lens)), device="cuda")
        schedule = compute_paged_mqa_logits_schedule(case["seq_lens"], next_n=next_n)
        return case, lambda: bench(fp8_call(case, schedule))

    print(f"\npool size ({shape_label(ONE_SHAPE)})      pool_GB  time_us  frac_copy  tokens/us")

    def timed(pool_gb: float, label: str) -> None:
        case, time_it = pool_case(pool_gb)
        t = time_it()
        gb = case["kv_fused"].numel() / 1e9
        print(
            f"{label:36s} {gb:8.1f} {t * 1e6:8.1f} {nbytes / t / copy_bw:9.2f} {total / t / 1e6:10.0f}"
        )
        del case, time_it
        torch.cuda.empty_cache()

    for pool_gb in (0.0, 2.0, 4.4, 8.0, 16.0, 32.0, 64.0):
        timed(pool_gb, "pool only" if pool_gb else "pool = the table's blocks")
    other = torch.empty(64 * 1024**3, dtype=torch.uint8, device="cuda").fill_(1)
    timed(2.0, "pool, 64 GB of other memory written")
    del other
    torch.cuda.empty_cache()
    timed(2.0, "pool only, again")

    print("\nfresh 2 GB pools: three timings, then a new table over the same pool (us)")
    for attempt in range(6):
        case, time_it = pool_case(2.0)
        times = [time_it() * 1e6 for _ in range(3)]
        table = case["block_tables"]  # a new shuffle of the same pool, same shape
        order = torch.randperm(case["kv_fused"].shape[0], device="cuda")[: table.numel()]
        case["block_tables"] = order.view_as(table).to(torch.int32)
        times.append(time_it() * 1e6)
        where = case["kv_fused"].data_ptr()
        print(
            f"allocation {attempt}: "
            + "  ".join(f"{t:6.1f}" for t in times)
            + f"   pool at 0x{where:x}"
        )
        del case, time_it
        torch.cuda.empty_cache()


def after_free_experiments(copy_bw: float) -> None:
    """ONE_SHAPE on one pool that stays allocated, timed every ~0.2 s for 3 s after other
    memory is allocated and written, and after that memory is freed (`empty_cache`, so the
    driver gets it back): whether freeing memory slows the kernel for a while."""
    import time

    _, _, call, _ = one_shape_call()  # the call holds the case's tensors
    print(f"\nafter a free ({shape_label(ONE_SHAPE)}): time_us at ~0.2 s intervals")
    print(f"{'steady':34s} " + " ".join(f"{bench(call) * 1e6:6.1f}" for _ in range(4)))

    def series(label: str) -> None:
        began = time.perf_counter()
        samples = []
        while time.perf_counter() - began < 3.0:
            samples.append(f"{bench(call) * 1e6:6.1f}")
            time.sleep(0.15)
        print(f"{label:34s} " + " ".join(samples))

    for gib in (64, 8):
        other = torch.empty(gib * 1024**3, dtype=torch.uint8, device="cuda").fill_(1)
        torch.cuda.synchronize()
        series(f"{gib} GiB allocated and written")
        del other
        torch.cuda.empty_cache()
        series(f"{gib} GiB freed")
        time.sleep(3.0)
        series(f"{gib} GiB freed, 3 s later")


def small_batch_experiments() -> None:
    print(
        "\nsmall batch variant      next_n  bs     B      L  1/graph  32/graph (us per call; "
        "1/graph: one call per graph replay, the host launch hidden, L2-warm)"
    )
    for next_n, block_size, batch, avg in SMALL_SHAPES:
        case, _ = timing_case(next_n, block_size, batch, avg)
        in_kernel = fp8_call(case, None)

        def separate(case=case, next_n=next_n):
            schedule = compute_paged_mqa_logits_schedule(case["seq_lens"], next_n=next_n)
            fp8_call(case, schedule)()

        variants = [
            ("in the kernel", in_kernel),
            ("separate kernel", separate),
            ("exit at once", fp8_call(case, None, (("EXP_EXIT", 1),))),
            ("exit after schedule", fp8_call(case, None, (("EXP_EXIT", 2),))),
            (
                "exit after given rows",
                fp8_call(
                    case,
                    compute_paged_mqa_logits_schedule(case["seq_lens"], next_n=next_n),
                    (("EXP_EXIT", 2),),
                ),
            ),
            ("no MMA/epilogue", fp8_call(case, None, (("EXP_SKIP_MATH", 1),))),
        ]
        for name, call in variants:
            alone = time_single_replays(call, cold=False, samples=10).median_us * 1e-6
            stream = bench(call, iters=20, calls_per_graph=32)
            print(
                f"{name:24s} {next_n:6d} {block_size:3d} {batch:5d} {avg:6d} {alone * 1e6:8.1f}"
                f" {stream * 1e6:8.1f}"
            )
        del case


# The in-kernel schedule's cost by batch size: B <= 32 one warp with a request per lane,
# B <= 128 one warp with up to 4 per lane, larger B the block-wide scan.
SCHEDULE_PATH_SHAPES = [
    (1, 64, 1, 4096),
    (1, 64, 8, 4096),
    (1, 64, 33, 4096),
    (1, 64, 64, 4096),
    (1, 64, 128, 4096),
    (2, 64, 128, 4096),
    (1, 64, 129, 4096),
    (1, 64, 256, 4096),
]


def schedule_path_experiments() -> None:
    """Per call, the schedule derived in the call: whole calls (1 and 32 per graph) and calls
    that exit as soon as their rows are known (EXP_EXIT=2, 32 per graph)."""
    print("\nschedule path  next_n  bs     B      L  1/graph 32/graph  rows only")
    for next_n, block_size, batch, avg in SCHEDULE_PATH_SHAPES:
        case, _ = timing_case(next_n, block_size, batch, avg)
        settle(torch.device("cuda"))
        call = fp8_call(case, None)
        alone, stream = bench(call), bench(call, iters=20, calls_per_graph=32)
        rows_only = bench(fp8_call(case, None, (("EXP_EXIT", 2),)), iters=20, calls_per_graph=32)
        path = "block" if batch > 128 else "warp x4" if batch > 32 else "warp"
        print(
            f"{path:13s} {next_n:6d} {block_size:3d} {batch:5d} {avg:6d} {alone * 1e6:8.1f}"
            f" {stream * 1e6:8.1f} {rows_only * 1e6:10.2f}"
        )
        del case


TIMESTAMP_SHAPES = [
    (1, 64, 8, 16384),
    (1, 64, 64, 4096),
    (1, 64, 128, 4096),
    (1, 64, 128, 16384),
    (1, 64, 128, 65536),
    (2, 64, 128, 16384),
]


def stamped_call(next_n, block_size, batch, avg):
    """The variant harness's case with the EXP_TIMESTAMPS launch (the schedule derived in the
    call): (case, the stamps it writes, per CTA, the call, its consumer warpgroups)."""
    case, _ = timing_case(next_n, block_size, batch, avg)
    ctas = torch.cuda.get_device_properties(0).multi_processor_count
    stamps = torch.zeros(ctas, 8, dtype=torch.int64, device="cuda")
    call = fp8_call(case, None, (("EXP_TIMESTAMPS", 1),), schedule_rows_out=stamps)
    return case, stamps, call, FP8.config(block_size, next_n, ()).consumers


PHASE_SHAPES = [(1, 64, 128, 65536), (2, 64, 128, 65536), (4, 64, 64, 32768)]
PHASE_VARIANTS = [("production", ()), ("16 stages", (("NUM_STAGES", 16),))]


def phase_experiments(
    copy_bw: float, kernel=None, shapes=PHASE_SHAPES, variants=PHASE_VARIANTS, calls: int = 5
) -> None:
    """Where the roles' time goes (EXP_PHASES), in SM cycles per unit, summed over every CTA.
    Consumer warpgroups: waiting between units (full barrier, walk, q of a new request),
    issuing the MMAs, waiting for them, the rest of the epilogue. Producer warps: waiting for a
    free stage, looking up the blocks and issuing the copies, entering new requests (q
    staging). 32-bit sums: a role's run must stay under 2^32 cycles. Last call of `calls` in
    a stream (after --preheat); the time is `bench` without the knob. For the MXFP4 kernel
    (kernel=FP4) the consumers' "issue" phase also reads the stage and decodes it."""
    kernel = kernel or FP8
    print(
        f"\n{kernel.variant} role phases, SM cycles per unit (EXP_PHASES)\n"
        "variant      next_n bs     B      L  time_us | consumer: wait  issue  mma_wait  epilogue"
        "  total | producer: empty_wait  issue  requests | SM cycles/unit"
    )
    ctas = torch.cuda.get_device_properties(0).multi_processor_count
    for next_n, block_size, batch, avg in shapes:
        case, _ = kernel.make_case(next_n, block_size, batch, avg)
        for name, knobs in variants:
            settle(torch.device("cuda"))
            preheat(kernel.call(case, None, knobs))
            t = bench(kernel.call(case, None, knobs))
            phases = torch.zeros(ctas, 128, dtype=torch.int64, device="cuda")
            call = kernel.call(case, None, (*knobs, ("EXP_PHASES", 1)), schedule_rows_out=phases)
            preheat(call)
            for _ in range(calls):
                call()
            torch.cuda.synchronize()
            config = kernel.config(block_size, next_n, knobs)
            p = phases.view(ctas, 16, 8).double().cpu()  # kPhaseSlotsPerCta, 8 per role
            cons = p[:, : config.consumers, :5]
            prod = p[:, 8 : 8 + config.pipeline.producers, :4]  # from kProducerPhaseSlots
            units = float(cons[..., 4].sum())
            consumer = [float(cons[..., i].sum()) / units for i in range(4)]
            producer = [float(prod[..., i].sum()) / float(prod[..., 3].sum()) for i in range(3)]
            # Each consumer's phases add up to its whole run; the longest is about the kernel.
            sm_cycles = float(cons[..., :4].sum(dim=2).max()) / (units / ctas)
            print(
                f"{name:12s} {next_n:6d} {block_size:2d} {batch:5d} {avg:6d} {t * 1e6:8.1f} |"
                f" {consumer[0]:14.0f} {consumer[1]:6.0f} {consumer[2]:9.0f} {consumer[3]:9.0f}"
                f" {sum(consumer):6.0f} | {producer[0]:20.0f} {producer[1]:6.0f} {producer[2]:9.0f}"
                f" | {sm_cycles:6.0f}"
            )
        del case


# The small-batch target's shapes: where the time of a call alone goes.
SMALL_TIMESTAMP_SHAPES = [
    (1, 64, 1, 4096),
    (1, 64, 1, 16384),
    (1, 64, 8, 4096),
    (2, 64, 1, 4096),
]


def timestamp_experiments(runs: int = 5, shapes=TIMESTAMP_SHAPES) -> None:
    """Per-CTA globaltimer readings (EXP_TIMESTAMPS): when each CTA starts, knows its rows and
    finishes, relative to the first CTA's start, median over `runs` calls (in a stream, so
    the previous call's pages may still sit in L2)."""
    print(
        "\nper-CTA timeline (us from the first CTA's start; CTA ends = last consumer exit)\n"
        "next_n bs     B      L  units/CTA  start max  rows med  end min  end med  end p90  end max"
    )
    for next_n, block_size, batch, avg in shapes:
        case, stamps, call, consumers = stamped_call(next_n, block_size, batch, avg)
        ctas = stamps.shape[0]
        rows = []
        for _ in range(runs + 1):
            stamps.zero_()
            call()
            torch.cuda.synchronize()
            raw = stamps.cpu()
            t = (raw - raw[:, 0].min()).double() / 1e3  # exact before the cast
            start = t[:, 0].min()
            end = t[:, 3 : 3 + consumers].amax(dim=1) - start
            quantiles = torch.quantile(end, torch.tensor([0.0, 0.5, 0.9, 1.0], dtype=torch.float64))
            first = [float((t[:, 0] - start).max()), float((t[:, 1] - start).median())]
            rows.append([*first, *quantiles.tolist()])
        median = torch.tensor(rows[1:]).median(dim=0).values.tolist()
        units = (batch * avg) / 64 / ctas
        print(
            f"{next_n:6d} {block_size:2d} {batch:5d} {avg:6d} {units:10.0f} "
            + " ".join(f"{x:9.2f}" for x in median)
        )
        del case


# The timestamp shapes but B 8, which leaves a CTA too few units to have a pace.
SM_SHAPES = TIMESTAMP_SHAPES[1:]


def sm_rate_experiments(calls: int = 40) -> None:
    """Is a CTA's pace a property of its SM? Per CTA, the time from knowing its rows to its
    last consumer's exit (EXP_TIMESTAMPS) over the call's median, placed by %smid, over
    `calls` calls with L2 flushed in between. Reports whether blockIdx -> SM stays the same,
    the split-half correlation of the per-SM means (near 1: the same SMs are slow every
    call), their range, and the SMs more than 5 % faster than the median SM."""
    ctas = torch.cuda.get_device_properties(0).multi_processor_count
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(
        "\nper-SM pace (CTA time / call median, by %smid)\n"
        "next_n bs     B      L  same SMs  split-half r  SM mean min  max  per-call max/median"
    )
    for next_n, block_size, batch, avg in SM_SHAPES:
        case, stamps, call, consumers = stamped_call(next_n, block_size, batch, avg)
        if consumers > 4:
            raise RuntimeError("the SM id is stamped only with at most 4 consumer warpgroups")
        call()
        pace = torch.zeros(calls, ctas, dtype=torch.float64)
        placements, worst = [], []
        for c in range(calls):
            flush.fill_(c)
            call()
            torch.cuda.synchronize()
            raw = stamps.cpu()
            t = (raw - raw[:, 0].min()).double()  # exact before the cast; slot 7 (%smid) apart
            streaming = t[:, 3 : 3 + consumers].amax(dim=1) - t[:, 1]
            sm = raw[:, 7].long()
            if int(sm.max()) >= ctas:  # PTX allows gaps in %smid; none seen on the H200
                raise RuntimeError(f"%smid {int(sm.max())} >= {ctas} SMs: index by rank instead")
            pace[c, sm] = streaming / streaming.median()
            placements.append(sm)
            worst.append(float(pace[c].max()))
        same = sum(torch.equal(p, placements[0]) for p in placements) / calls
        mean = pace.mean(dim=0)
        r = torch.corrcoef(torch.stack([pace[0::2].mean(0), pace[1::2].mean(0)]))[0, 1]
        print(
            f"{next_n:6d} {block_size:2d} {batch:5d} {avg:6d} {same:9.2f} {float(r):13.3f}"
            f" {float(mean.min()):12.3f} {float(mean.max()):5.3f} {sorted(worst)[calls // 2]:20.3f}"
        )
        fast = (mean < 0.95).nonzero().flatten().tolist()
        print(f"    SMs more than 5 % faster than the median: {len(fast)}: {fast}")
        del case


def profile_one(
    next_n, block_size, batch, avg, kernel="fp8", experiment=(), epi_dtype=torch.float32
):
    under_test = FP4 if kernel == "fp4" else FP8
    case, _ = under_test.make_case(next_n, block_size, batch, avg)
    call = under_test.call(case, None, experiment, epi_dtype=epi_dtype)
    for _ in range(3):
        call()
    torch.cuda.synchronize()


def bench(fn, iters=50, calls_per_graph=1):
    """Median seconds per call over graph replays of `calls_per_graph` back-to-back calls.

    With one call per graph the figure includes the host's graph-launch latency (the GPU idles
    until the launch arrives); several calls per graph give the GPU time per call in a stream
    of calls (the inputs are then L2-warm after the first call if they fit in L2).
    """
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        with torch.cuda.graph(g, stream=s):
            for _ in range(calls_per_graph):
                fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / calls_per_graph)
    times.sort()
    return times[len(times) // 2]


# The --experiments choices that run one table (or one measurement) on its own; "all", "large"
# and "small" are the large-shape variant table and the small-batch one.
SINGLE_EXPERIMENTS: dict[str, Callable[[float], None]] = {
    "fp4": fp4_experiments,
    "relu-pipes": lambda copy_bw: variant_table(FP8, RELU_PIPE_SHAPES, RELU_PIPE_VARIANTS, copy_bw),
    "weight-regs": lambda copy_bw: variant_table(
        FP8, WEIGHT_REG_SHAPES, WEIGHT_REG_VARIANTS, copy_bw
    ),
    "halves": lambda copy_bw: variant_table(FP8, HALVES_SHAPES, HALVES_VARIANTS, copy_bw),
    "halves-low-n": lambda copy_bw: (
        variant_table(FP4, LOW_N_HALVES_FP4_SHAPES, LOW_N_HALVES_VARIANTS, copy_bw),
        variant_table(FP8, LOW_N_HALVES_FP8_SHAPES, LOW_N_HALVES_VARIANTS, copy_bw),
    ),
    "phases": phase_experiments,
    "fp4-phases": lambda copy_bw: phase_experiments(
        copy_bw,
        FP4,
        [(1, 64, 128, 65536), (2, 64, 128, 65536), (4, 64, 64, 32768)],
        [("production", ())],
    ),
    "n2-weights": lambda copy_bw: variant_table(FP8, N2_WEIGHT_SHAPES, N2_WEIGHT_VARIANTS, copy_bw),
    "power": lambda copy_bw: variant_table(FP8, POWER_SHAPES, POWER_VARIANTS, copy_bw),
    "fp4-power": lambda copy_bw: (
        variant_table(FP4, FP4_POWER_SHAPES, FP4_POWER_VARIANTS, copy_bw),
        variant_table(FP4_BF16_EPI, FP4_POWER_SHAPES, FP4_POWER_VARIANTS, copy_bw),
    ),
    "fp8-power-acc": lambda copy_bw: tuple(
        variant_table(kernel, FP8_ACC_POWER_SHAPES, FP8_ACC_POWER_VARIANTS, copy_bw)
        for kernel in (FP8_GAUSSIAN, FP8_F16_GAUSSIAN)
    ),
    "fp4-abs-power": lambda copy_bw: variant_table(
        FP4_GAUSSIAN, FP4_GAUSSIAN_POWER_SHAPES, FP4_ABS_TERM_VARIANTS, copy_bw
    ),
    "fp4-power-gaussian": lambda copy_bw: tuple(
        variant_table(kernel, FP4_GAUSSIAN_POWER_SHAPES, FP4_POWER_VARIANTS, copy_bw)
        for kernel in (FP4_GAUSSIAN, FP4_BF16_EPI_GAUSSIAN)
    ),
    "stages": lambda copy_bw: variant_table(FP8, STAGE_SHAPES, STAGE_VARIANTS, copy_bw),
    "fp4-stages": lambda copy_bw: variant_table(FP4, FP4_STAGE_SHAPES, FP4_STAGE_VARIANTS, copy_bw),
    "fp4-n2-consumers": lambda copy_bw: variant_table(
        FP4, FP4_N2_CONSUMER_SHAPES, FP4_N2_CONSUMER_VARIANTS, copy_bw
    ),
    "load-path": lambda copy_bw: variant_table(FP8, LOAD_PATH_SHAPES, LOAD_PATH_VARIANTS, copy_bw),
    "n2-consumers": lambda copy_bw: variant_table(
        FP8, N2_CONSUMER_SHAPES, N2_CONSUMER_VARIANTS, copy_bw
    ),
    "consumers": consumer_count_experiments,
    "data": kv_data_experiments,
    "data-n2": lambda copy_bw: kv_data_experiments(copy_bw, ISSUE_BOUND_SHAPE),
    "gap": harness_gap_experiments,
    "gap-n2": lambda copy_bw: harness_gap_experiments(copy_bw, ISSUE_BOUND_SHAPE),
    "sustained": sustained_load_experiments,
    "sustained-n2": lambda copy_bw: sustained_load_experiments(
        copy_bw, ISSUE_BOUND_SHAPE, (0.0, 2.0, 10.0, 30.0)
    ),
    "pool": pool_size_experiments,
    "free": after_free_experiments,
    "timestamps": lambda copy_bw: timestamp_experiments(),
    "small-timestamps": lambda copy_bw: timestamp_experiments(shapes=SMALL_TIMESTAMP_SHAPES),
    "schedule-path": lambda copy_bw: schedule_path_experiments(),
    "sm": lambda copy_bw: sm_rate_experiments(),
}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--profile", action="store_true", help="one large launch, for ncu")
    parser.add_argument(
        "--profile-shape", default="1,64,128,32768", help="next_n,block_size,batch,avg_len"
    )
    parser.add_argument("--profile-kernel", choices=["fp8", "fp4"], default="fp8")
    parser.add_argument(
        "--profile-epi",
        choices=["float32", "float16", "bfloat16"],
        default="float32",
        help="epi_dtype of the profiled launch (bfloat16: fp4 only)",
    )
    parser.add_argument(
        "--profile-experiment",
        default="",
        help="knobs of the profiled launch, e.g. EXP_SKIP_DECODE=1,EXP_SKIP_EPILOGUE=1",
    )
    parser.add_argument(
        "--experiments",
        choices=["all", "large", "small", *SINGLE_EXPERIMENTS],
        help="only the variant tables (large shapes, small-batch schedule variants, or both)",
    )
    parser.add_argument(
        "--preheat",
        type=float,
        default=0.0,
        help="seconds of back-to-back calls before each variant table row (power-capped clock)",
    )
    args = parser.parse_args()
    PREHEAT_S = args.preheat
    if args.profile and args.profile_kernel == "fp8" and args.profile_epi == "bfloat16":
        parser.error("--profile-epi bfloat16 is fp4's only (fp8 takes float32 or float16)")
    if args.profile:
        knobs = tuple(
            (name, int(value))
            for name, value in (kv.split("=") for kv in args.profile_experiment.split(",") if kv)
        )
        profile_one(
            *map(int, args.profile_shape.split(",")),
            kernel=args.profile_kernel,
            experiment=knobs,
            epi_dtype=getattr(torch, args.profile_epi),
        )
        sys.exit(0)
    if args.experiments:
        experiments(copy_bandwidth(), args.experiments)
        sys.exit(0)
    ok = correctness(args.quick)
    if not args.no_timing:
        timing(args.quick)
    sys.exit(0 if ok else 1)
