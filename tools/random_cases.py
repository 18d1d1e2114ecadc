"""Many more seeded random calls than the GPU test suite runs (SM90 GPU only).

    python tools/random_cases.py [--fp8 400] [--fp4 300] [--first-seed 100000] [--shapes wide]
    python tools/random_cases.py --fp8-seeds 3706131,3706245 --shapes wide   # chosen seeds only
    python tools/random_cases.py --fp8 100 --fp4 60 --batches large   # 48-513 requests per call
    python tools/random_cases.py --fp8 0 --fp4 500 --scales wide       # fp4 scales far from 1
    python tools/random_cases.py --fp8 300 --fp4 200 --layouts wide    # tensors placed oddly
    python tools/random_cases.py --fp8 300 --fp4 200 --replays 4       # CUDA graph, new lengths
    python tools/random_cases.py --fp8 300 --fp4 300 --time-limit 120  # no call starts after 120 s

Each seed draws a whole call exactly as `test_gpu_random_cases.py` does (batch size, length
mix, block size, next_n, head shape and dtypes, strided views, a given or derived schedule,
`out=` or not) and checks it against the same independent float64 expectation with the same
tolerance. The suite runs 32 fp8 and 20 fp4 seeds; this widens the search. `--shapes wide`
draws fp8's (num_heads, head_dim, next_n) from everything the contract admits on SM90
(`draw_wide_head_shape`: next_n * num_heads any multiple of 8 up to 256, head_dim up to what
fits the shared memory) instead of the suite's seven head shapes; nearly every seed is then a
configuration of its own, compiled first. `--batches large` draws 48-513 requests per call
instead of 1-40 (`BATCH_MODES`). `--scales wide` also draws fp4 scales far below or above 1
and draft slots whose q scales differ (`draw_wide_fp4_scales`). `--layouts wide` also draws
where the tensors sit: the KV blocks in one layer of a layer-interleaved pool, tables and `out`
starting inside wider buffers, q / weights / q_sf misaligned or sliced (`draw_wide_layouts`).
`--replays K` then captures each call in a CUDA graph (a given schedule's computation with
it) and replays it K times with new lengths written into `seq_lens` (all empty, half empty,
every table row full, one request grown to max_seq_len, block edges, ...) and, in about half
the replays, new data in the other inputs, each replay checked (`draw_replays`). The seeds
run in chunks of
`--chunk` calls; every kernel configuration a chunk needs is compiled first, in parallel
(`flashinfer_jit.precompile`), so a run cut short by a timeout has checked every chunk before
the one it was in. (Compiled all at once, the configurations of 4000 wide seeds took about
270 s of a 300 s run on the H200 machine.) `--time-limit S` starts no call after S seconds and
still prints the summary (and runs the schedule comparisons). The fp8 and fp4 seeds are
interleaved in proportion (`interleave`), so a run stopped early has checked the first seeds of
each op, and the summary says which.
`--schedules N` also compares the schedule helper on CUDA with its CPU version, bit for bit,
for N random length vectors (batch 1..20000, zeros, huge lengths, negative entries, strided
views, the device's SM count or another). Prints one line per failing seed (enough to rerun
it) and a summary.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
PROGRESS_EVERY = 50  # calls between progress lines
sys.path.insert(0, str(ROOT / "packages/attn-scores/tests/paged_mqa_logits"))

from flashinfer_attn_scores.paged_mqa_logits import PagedMqaLogitsConfig, launcher  # noqa: E402
from flashinfer_schedule import compute_paged_mqa_logits_schedule  # noqa: E402
from test_gpu_random_cases import check_random_call, draw_call  # noqa: E402

FP4_NUM_HEADS, FP4_HEAD_DIM = 64, 128
FP4_SEED_OFFSET = 500000  # fp4 seed = first seed + this + index, apart from fp8's


def kernel_config(variant: str, call: dict) -> PagedMqaLogitsConfig:
    """The kernel specialisation `call` launches (what precompile would build for it)."""
    if variant == "fp8":
        output_dtype, epi_dtype, acc_dtype = call["dtypes"]
        heads, head_dim, interleaved = call["num_heads"], call["head_dim"], False
    else:
        (output_dtype, epi_dtype), acc_dtype = call["dtypes"], torch.float32
        heads, head_dim, interleaved = FP4_NUM_HEADS, FP4_HEAD_DIM, call["interleaved"]
    return PagedMqaLogitsConfig(
        variant=variant,
        block_size=call["block_size"],
        next_n=call["next_n"],
        num_heads=heads,
        head_dim=head_dim,
        output_dtype=output_dtype,
        epi_dtype=epi_dtype,
        acc_dtype=acc_dtype,
        is_kv_sf_interleaved=interleaved,
    )


def random_lengths(rng: random.Random) -> torch.Tensor:
    """A length vector of a random batch size and mix."""
    batch = rng.choice(
        [1, 2, 31, 32, 33, 127, 128, 129, rng.randint(1, 300), rng.randint(1, 20000)]
    )
    typical = rng.choice([1, 64, 4096, 70000])
    lens = [rng.randint(0, typical) for _ in range(batch)]
    for _ in range(rng.choice([0, 0, 1, 3])):
        lens[rng.randrange(batch)] = rng.choice([0, -5, rng.randint(1, 5_000_000)])
    if rng.random() < 0.2:
        lens = [0 if rng.random() < 0.5 else x for x in lens]
    return torch.tensor(lens, dtype=torch.int32)


def check_schedule(seed: int, device_sms: int) -> None:
    """CUDA schedule == CPU schedule, bit for bit, for one random length vector."""
    rng = random.Random(seed)
    lens = random_lengths(rng)
    variant = rng.choice(["fp8", "fp4"])
    next_n = rng.randint(1, 4)
    num_sms = rng.choice([device_sms, device_sms, 1, rng.randint(1, 400)])
    strided = rng.random() < 0.3
    on_gpu = lens.repeat_interleave(2).cuda()[::2] if strided else lens.cuda()
    got = compute_paged_mqa_logits_schedule(on_gpu, next_n=next_n, variant=variant, num_sms=num_sms)
    expected = compute_paged_mqa_logits_schedule(
        lens, next_n=next_n, variant=variant, num_sms=num_sms
    )
    if not torch.equal(got.cpu(), expected):
        rows = (got.cpu() != expected).any(dim=1).nonzero().flatten().tolist()
        raise AssertionError(
            f"batch {lens.numel()}, {variant} next_n {next_n}, {num_sms} SMs: rows {rows[:5]} differ"
        )


def compile_for(
    runs: list[tuple[str, int]], shapes: str, batches: str, done: set[PagedMqaLogitsConfig]
) -> None:
    """Compile and load every kernel configuration these (variant, seed) calls launch that is
    not in `done` yet, and add them to it."""
    wanted = {
        kernel_config(variant, draw_call(seed, variant, shapes, batches)) for variant, seed in runs
    }
    configs = sorted(wanted - done, key=str)
    if not configs:
        return
    began = time.perf_counter()
    launcher.compile_paged_mqa_logits_kernels(configs, torch.device("cuda"))
    done.update(configs)
    print(
        f"{len(configs)} kernel configurations compiled and loaded in {time.perf_counter() - began:.0f} s",
        flush=True,
    )


def interleave(*lists: list) -> list:
    """Merge the lists so that every prefix of the result holds about the same share of each
    list as the whole does, each list's own order kept (fp8 and fp4 calls, so that a run cut
    short by `--time-limit` has checked both ops)."""
    keyed = [
        ((position + 0.5) / len(items), which, position)
        for which, items in enumerate(lists)
        for position in range(len(items))
    ]
    return [lists[which][position] for _, which, position in sorted(keyed)]


def planned_runs(first_seed: int, fp8: int, fp4: int) -> list[tuple[str, int]]:
    """The (variant, seed) calls of `--fp8 fp8 --fp4 fp4 --first-seed first_seed`, interleaved."""
    return interleave(
        [("fp8", first_seed + i) for i in range(fp8)],
        [("fp4", first_seed + FP4_SEED_OFFSET + i) for i in range(fp4)],
    )


def check_calls(
    runs: list[tuple[str, int]],
    check: Callable[[str, int], object],
    compile_chunk: Callable[[list[tuple[str, int]]], object],
    *,
    chunk: int,
    max_failures: int,
    time_limit: float,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[int, list[str]]:
    """Check `runs` in order, `chunk` at a time, each chunk compiled for first; return how many
    calls were checked and one line per failing call. A failure is reported and the run goes
    on, unless it is the `max_failures`-th (0: no such limit); no call starts once `time_limit`
    seconds have passed (0: no limit)."""
    failures: list[str] = []
    began = clock()
    checked = 0
    for done, (variant, seed) in enumerate(runs, 1):
        if time_limit and clock() - began >= time_limit:
            print(f"stopped at the time limit ({time_limit:g} s)", flush=True)
            break
        if (done - 1) % chunk == 0:
            compile_chunk(runs[done - 1 : done - 1 + chunk])
        checked = done
        try:
            check(variant, seed)
        except Exception as exc:  # every failure is reported; only max_failures stops the run
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
            failures.append(f"FAIL {variant} seed {seed}: {detail[0][:300]}")
            print(failures[-1], flush=True)
            if len(failures) == max_failures:
                print(f"stopped after {len(failures)} failing call(s) (--max-failures)")
                break
        if done % PROGRESS_EVERY == 0 and done < len(runs):
            # A run cut short by a timeout still says how far it got.
            print(
                f"checked {done} of {len(runs)} calls, {len(failures)} failed, last seed "
                f"{variant} {seed}, {clock() - began:.0f} s",
                flush=True,
            )
    return checked, failures


def seed_ranges(runs: list[tuple[str, int]]) -> str:
    """'fp8 A-B, fp4 C-D' for checked (variant, seed) calls whose seeds run consecutively per
    variant, as `interleave` leaves any prefix of the planned runs."""
    parts = []
    for variant in ("fp8", "fp4"):
        seeds = [seed for kind, seed in runs if kind == variant]
        parts.append(f"{variant} {seeds[0]}-{seeds[-1]}" if seeds else f"{variant} none")
    return ", ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp8", type=int, default=400, help="fp8 seeds to run")
    parser.add_argument("--fp4", type=int, default=300, help="fp4 seeds to run")
    parser.add_argument("--schedules", type=int, default=0, help="random schedule comparisons")
    parser.add_argument("--first-seed", type=int, default=100000)
    parser.add_argument(
        "--shapes", choices=("suite", "wide"), default="suite", help="fp8 head shapes to draw"
    )
    parser.add_argument(
        "--batches",
        choices=("small", "large"),
        default="small",
        help="batch sizes to draw: 1-40 or 48-513 requests",
    )
    parser.add_argument(
        "--scales",
        choices=("suite", "wide"),
        default="suite",
        help="fp4 scales to draw: the suite's, or also far from 1 and differing between draft"
        " slots (draw_wide_fp4_scales)",
    )
    parser.add_argument(
        "--layouts",
        choices=("suite", "wide"),
        default="suite",
        help="where the inputs and out sit in memory: the suite's, or also a layer of an"
        " interleaved pool, offset tables and out, misaligned or sliced operands"
        " (draw_wide_layouts)",
    )
    parser.add_argument(
        "--replays",
        type=int,
        default=0,
        help="capture each call in a CUDA graph and replay it this many times with new lengths"
        " and, about half the time, new data (draw_replays)",
    )
    parser.add_argument(
        "--chunk", type=int, default=500, help="calls compiled for, then checked, at a time"
    )
    parser.add_argument(
        "--fp8-seeds",
        help="comma-separated fp8 seeds to run instead of --fp8 and --fp4 (for example the"
        " seeds of a compute-sanitizer run)",
    )
    parser.add_argument(
        "--max-failures",
        type=int,
        default=0,
        help="stop after this many failing calls (0: run every seed; tools/kernel_mutants.py"
        " stops at the first)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=0,
        help="seconds after which no further call starts (0: none); the schedule comparisons"
        " and the summary still run, so a run sized past its budget still reports",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("random_cases: needs an SM90 GPU")
        return 2
    if args.fp8_seeds:
        runs = [("fp8", int(seed)) for seed in args.fp8_seeds.split(",")]
    else:
        runs = planned_runs(args.first_seed, args.fp8, args.fp4)
    if args.chunk < 1:
        parser.error(f"--chunk must be at least 1, got {args.chunk}")
    if args.replays < 0:
        parser.error(f"--replays must be 0 or more, got {args.replays}")
    if args.replays and os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        # Seen under compute-sanitizer: every capture that allocated failed.
        parser.error(
            "--replays captures CUDA graphs, and a capture cannot allocate without PyTorch's"
            " caching allocator: unset PYTORCH_NO_CUDA_MEMORY_CACHING"
        )
    if args.max_failures < 0:
        parser.error(f"--max-failures must be 0 or more, got {args.max_failures}")
    if args.time_limit < 0:
        parser.error(f"--time-limit must be 0 or more, got {args.time_limit}")
    compiled: set[PagedMqaLogitsConfig] = set()
    began = time.perf_counter()
    checked, failures = check_calls(
        runs,
        lambda variant, seed: check_random_call(
            variant, seed, args.shapes, args.batches, args.scales, args.layouts, args.replays
        ),
        lambda chunk: compile_for(chunk, args.shapes, args.batches, compiled),
        chunk=args.chunk,
        max_failures=args.max_failures,
        time_limit=args.time_limit,
    )
    device_sms = torch.cuda.get_device_properties(0).multi_processor_count
    schedule_failures = 0
    for seed in range(args.first_seed, args.first_seed + args.schedules):
        try:
            check_schedule(seed, device_sms)
        except Exception as exc:  # every failure is reported; none stops the run
            schedule_failures += 1
            print(f"FAIL schedule seed {seed}: {str(exc)[:300]}", flush=True)
    if args.schedules:
        print(
            f"schedules: {args.schedules - schedule_failures} of {args.schedules} equal to the CPU's"
        )
    passed = checked - len(failures)
    fp8_runs = sum(variant == "fp8" for variant, _ in runs[:checked])
    seeds = f"seeds {args.fp8_seeds}" if args.fp8_seeds else f"seeds from {args.first_seed}"
    if checked < len(runs):
        print(f"stopped early: {checked} of the {len(runs)} planned calls checked")
        if not args.fp8_seeds:
            print(f"checked seeds: {seed_ranges(runs[:checked])}")
    print(
        f"random cases: {passed} of {checked} passed ({fp8_runs} fp8, {checked - fp8_runs} fp4,"
        f" {seeds}, {args.shapes} shapes, {args.batches} batches, {args.scales} scales, {args.layouts} layouts, {args.replays} graph replays each) in {time.perf_counter() - began:.0f} s,"
        " compilation included"
    )
    return 0 if not failures and not schedule_failures else 1


if __name__ == "__main__":
    sys.exit(main())
