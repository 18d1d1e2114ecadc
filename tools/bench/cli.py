"""Command line and driver: build each case, check it, time it, report."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import torch
from flashinfer_attn_scores.paged_mqa_logits import fp8_sm90

from .check import ReplayCheck, check_case
from .compare import compare_report
from .data import GIB, CaseData, CaseTooLarge, build_case
from .gather import KINDS, GatherCeiling, PagedGather, geometry_for
from .host_time import BATCH as HOST_BATCH
from .host_time import BLOCK_SIZE as HOST_BLOCK_SIZE
from .host_time import LENGTH as HOST_LENGTH
from .host_time import NEXT_N as HOST_NEXT_N
from .host_time import TARGET_US as HOST_TARGET_US
from .host_time import HostTime, host_cpu, host_time_table, measure_host_times
from .models import work_model
from .ops import op_call
from .report import (
    ERROR,
    FAIL,
    KERNEL_NOT_BUILT,
    PASS,
    TOO_LARGE,
    CaseResult,
    environment,
    table_header,
    table_row,
    write_json,
    write_plots,
)
from .shapes import ACC_DTYPES, DEFAULT_DTYPE, EPI_DTYPES, OPS, IndexerShape, cpu_grid, gpu_grid
from .tables import load_results, markdown_report, merge_runs
from .timing import (
    copy_bandwidth,
    settle,
    time_graph_replays,
    time_host,
    time_single_replays,
)

JSON_NAME = "results.json"
# The gather ceiling is a steadier measurement than an op: fewer samples are enough.
GATHER_MIN_SAMPLES = 10
GATHER_BUDGET_S = 0.15


def _parse_ops(text: str) -> list[str]:
    ops = [op.strip() for op in text.split(",") if op.strip()]
    unknown = [op for op in ops if op not in OPS]
    if not ops or unknown:
        raise argparse.ArgumentTypeError(
            f"--ops takes a comma-separated subset of {','.join(OPS)}; got {text!r}"
        )
    return ops


def _parse_ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python tools/bench",
        description=(
            "Check and time the paged MQA logits ops over the benchmark grid (docs/performance.md). "
            "Without an SM90 GPU, runs the CPU reference path on small shapes to exercise the "
            "pipeline."
        ),
    )
    parser.add_argument("--quick", action="store_true", help="a small slice of the grid")
    parser.add_argument(
        "--small-batch-only",
        action="store_true",
        help="only the grid's small-batch shapes (B <= 8, L <= 16k), each also timed one call "
        "per graph replay",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        help="directory for results.json and the plots (default: bench-results)",
    )
    parser.add_argument(
        "--ops", type=_parse_ops, default=list(OPS), help="comma-separated ops (default: fp8,fp4)"
    )
    parser.add_argument(
        "--next-n", type=_parse_ints, metavar="N,...", help="only these next_n (e.g. 1,2)"
    )
    parser.add_argument(
        "--block-sizes", type=_parse_ints, metavar="BS,...", help="only these block sizes"
    )
    parser.add_argument(
        "--no-gather",
        action="store_true",
        help="skip the per-case paged-gather ceiling kernel (GPU only)",
    )
    parser.add_argument(
        "--no-host-time",
        action="store_true",
        help="skip the host time of one eager call (GPU only)",
    )
    parser.add_argument(
        "--host-time-only",
        action="store_true",
        help="measure only the host time of one eager call, not the grid",
    )
    parser.add_argument(
        "--markdown",
        type=Path,
        metavar="RESULTS.json",
        help="print the markdown tables of a results.json (no benchmark is run)",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="RESULTS.json",
        help="print one results.json joining runs split by --ops (no benchmark is run)",
    )
    parser.add_argument(
        "--compare",
        type=Path,
        nargs=2,
        metavar=("OLD.json", "NEW.json"),
        help="print new / old time ratios of the cases two results.json share, by op, next_n "
        "and B x L (no benchmark is run)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu"),
        default="auto",
        help="auto: the SM90 GPU if there is one, else the CPU reference path; cpu: always CPU",
    )
    parser.add_argument(
        "--epi-dtype",
        choices=sorted({d for dtypes in EPI_DTYPES.values() for d in dtypes}),
        default=DEFAULT_DTYPE,
        help="every case's epi_dtype (default float32; bfloat16 is fp4's only)",
    )
    parser.add_argument(
        "--acc-dtype",
        choices=sorted({d for dtypes in ACC_DTYPES.values() for d in dtypes}),
        default=DEFAULT_DTYPE,
        help="every fp8 case's acc_dtype (default float32; fp4 always accumulates in float32)",
    )
    args = parser.parse_args(argv)
    for op in args.ops:
        for flag, value, allowed in (
            ("--epi-dtype", args.epi_dtype, EPI_DTYPES[op]),
            ("--acc-dtype", args.acc_dtype, ACC_DTYPES[op]),
        ):
            if value not in allowed:
                parser.error(
                    f"{flag} {value} does not apply to {op} (it takes {', '.join(allowed)}); "
                    f"pass --ops without {op}"
                )
    return args


def pick_device(choice: str) -> tuple[torch.device, str | None]:
    """The device to benchmark on, and why it is not an SM90 GPU (None when it is)."""
    if choice == "cpu":
        return torch.device("cpu"), "--device cpu was given"
    if not torch.cuda.is_available():
        return torch.device("cpu"), "no CUDA device is available"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        name = torch.cuda.get_device_name()
        return torch.device("cpu"), f"found {name} (compute capability {major}.{minor})"
    return torch.device("cuda", torch.cuda.current_device()), None


def measure_copy(device: torch.device) -> float:
    """Copy bandwidth now, bytes/s (the gather ceiling is measured per case)."""
    if device.type != "cuda":
        return copy_bandwidth(device, 64 << 20, repeats=5)
    free_bytes, _ = torch.cuda.mem_get_info(device)
    copy = copy_bandwidth(device, min(GIB, free_bytes // 4))
    torch.cuda.empty_cache()
    return copy


def run_ceilings(copy_start: float, copy_end: float | None = None) -> dict[str, float | None]:
    """The run's ceilings: "copy" is the larger of the copy bandwidth measured before and after
    the grid, so every fraction is of the higher reading. On one H200 two runs minutes apart
    read 4.00 and 4.18 TB/s (2026-12-01), as large as the gaps the fractions are read for."""
    copy = copy_start if copy_end is None else max(copy_start, copy_end)
    return {"copy": copy, "copy_start": copy_start, "copy_end": copy_end}


def time_gather(
    case: CaseData, kind: str, device: torch.device, programmatic: bool | None = None
) -> GatherCeiling:
    """Time one read-only gather kernel (`bench.gather.KINDS`) on the case's own pool, tables
    and lengths, replaying every rotation set like the op, so its pages come from HBM too.
    `programmatic`: launch with programmatic dependent launch; None, as the ops launch."""
    shape = case.shape
    geometry = geometry_for(shape.op, shape.block_size, shape.head_dim)
    if programmatic is None:
        programmatic = fp8_sm90.programmatic_launch_enabled()
    gather = PagedGather(geometry, device, kind, programmatic=programmatic)
    calls = [
        gather.launcher(case.kv_fused, inputs.block_tables, inputs.seq_lens) for inputs in case.sets
    ]
    timing = time_graph_replays(calls, min_samples=GATHER_MIN_SAMPLES, budget_s=GATHER_BUDGET_S)
    return GatherCeiling(
        geometry.bytes_read(case.seq_lens), timing, gather.grid, kind, programmatic
    )


def measure_gather(case: CaseData, device: torch.device) -> GatherCeiling:
    """The case's gather ceiling: the faster of the two gather kernels."""
    return min(
        (time_gather(case, kind, device) for kind in KINDS),
        key=lambda ceiling: ceiling.timing.median_us,
    )


def run_case(shape: IndexerShape, device: torch.device, *, gather: bool = True) -> CaseResult:
    """Build, check and (when correct) time one case."""
    try:
        case = build_case(shape, device)
    except CaseTooLarge as exc:
        return CaseResult(shape, TOO_LARGE, detail=str(exc))
    work = work_model(shape, case.seq_lens, case.output_dtype)
    result = CaseResult(shape, PASS, work, rotations=len(case.sets), pool_bytes=case.pool_bytes)
    first = case.sets[0]
    first.out.fill_(float("nan"))
    try:
        logits = op_call(case, first)()
    except NotImplementedError as exc:
        result.status, result.detail = KERNEL_NOT_BUILT, str(exc).splitlines()[0]
        return result
    if device.type == "cuda":
        torch.cuda.synchronize(device)

    result.check = check_case(case, logits)
    if not result.check.passed:
        result.status, result.detail = FAIL, result.check.detail
        return result
    if device.type == "cuda":
        calls = [op_call(case, inputs) for inputs in case.sets]
        # What each timed replay must repeat bit for bit: set 0's checked call, and for the
        # other rotation sets (no float64 reference of their own) one eager call each, now,
        # into outputs poisoned as set 0's was.
        for inputs in case.sets[1:]:
            inputs.out.fill_(float("nan"))
        replays = ReplayCheck(case, [logits, *(call() for call in calls[1:])])
        problem = replays.eager_problem()
        if problem:
            result.status, result.detail = FAIL, problem
            return result
        poison = replays.poison

        def recheck(timed: str, sets: int) -> None:
            mismatch = replays.mismatch(timed, sets)
            if mismatch and result.status == PASS:
                result.status, result.detail = FAIL, mismatch
            result.replays_checked.append(timed)

        settle(device)  # the check's memory would otherwise slow the timing (timing.SETTLE_S)
        if shape.small_batch:
            # First, straight after the settle: timed after the graphs of many calls below,
            # they read up to 1.6x slower on the H200 (2026-11-29, still with windows of
            # different graphs, which drift: see time_single_replays).
            result.single_replay = time_single_replays(calls[0], before_samples=poison(1))
            recheck("one call per replay, after an L2 flush", 1)
            result.single_replay_warm = time_single_replays(
                calls[0], cold=False, before_samples=poison(1)
            )
            recheck("one call per replay, L2-warm", 1)
            settle(device)
        result.timing = time_graph_replays(calls, before_samples=poison(len(calls)))
        if gather:  # straight after the op's timing, as before the replay check (it writes no out)
            try:
                result.gather = measure_gather(case, device)
            except Exception as exc:  # the op's own measurement stands; report the ceiling's
                traceback.print_exc()
                result.gather_error = f"{type(exc).__name__}: {exc}"
        recheck(f"graph of {len(calls)} calls", len(calls))
    else:
        result.timing = time_host(op_call(case, first))
    return result


def host_time_section(
    ops: list[str], device: torch.device, not_sm90: str | None
) -> tuple[dict[str, object], bool]:
    """Measure and print the host time of one eager call; return its JSON and whether it
    crashed. Without an SM90 GPU it is skipped with the reason."""
    section: dict[str, object] = {
        "target_us": HOST_TARGET_US,
        "problem": {
            "batch": HOST_BATCH,
            "seq_len": HOST_LENGTH,
            "next_n": HOST_NEXT_N,
            "block_size": HOST_BLOCK_SIZE,
            "out": True,
        },
        "cpu": host_cpu(),
    }
    if not_sm90:
        reason = f"needs an SM90 GPU; {not_sm90}"
        print(f"\nhost time of one eager call: skipped ({reason})")
        return {**section, "status": "skipped", "detail": reason, "results": []}, False
    print("\nhost time of one eager call", flush=True)
    try:
        rows: list[HostTime] = measure_host_times(ops, device)
    except Exception as exc:  # report it, keep the grid's results
        traceback.print_exc()
        detail = f"{type(exc).__name__}: {exc}"
        print(f"host time: error: {detail}")
        return {**section, "status": "error", "detail": detail, "results": []}, True
    print(host_time_table(rows), flush=True)
    return {**section, "status": "done", "detail": "", "results": [asdict(r) for r in rows]}, False


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 0 unless a result was wrong or a case crashed."""
    args = parse_args(argv)
    if args.merge is not None:
        try:
            merged = merge_runs([load_results(path) for path in args.merge])
        except ValueError as err:
            print(f"bench --merge: {err}", file=sys.stderr)
            return 2
        print(json.dumps(merged, indent=1))
        return 0
    if args.compare is not None:
        try:
            old, new = (load_results(path) for path in args.compare)
            report = compare_report(old, new)
        except ValueError as err:
            print(f"bench --compare: {err}", file=sys.stderr)
            return 2
        print(report, end="")
        return 0
    if args.markdown is not None:
        try:
            payload = load_results(args.markdown)
        except ValueError as err:
            print(f"bench --markdown: {err}", file=sys.stderr)
            return 2
        print(markdown_report(payload), end="")
        return 0
    device, not_sm90 = pick_device(args.device)
    if not_sm90:
        print(
            f"The kernels need an SM90 (Hopper) GPU; {not_sm90}. Running the CPU reference path "
            "on small shapes to exercise the pipeline: the times below are host wall-clock "
            "times of the reference, NOT kernel measurements."
        )
        shapes = cpu_grid(args.ops, args.quick, args.epi_dtype, args.acc_dtype)
        mode = "cpu-reference"
    else:
        shapes = gpu_grid(args.ops, args.quick, args.epi_dtype, args.acc_dtype)
        mode = "sm90"
        if args.small_batch_only:
            shapes = [shape for shape in shapes if shape.small_batch]
    if args.next_n:
        shapes = [shape for shape in shapes if shape.next_n in args.next_n]
    if args.block_sizes:
        shapes = [shape for shape in shapes if shape.block_size in args.block_sizes]
    if args.host_time_only:
        shapes = []
    if not not_sm90:
        print(f"Benchmarking on {torch.cuda.get_device_name(device)}: {len(shapes)} cases")
    if (args.epi_dtype, args.acc_dtype) != (DEFAULT_DTYPE, DEFAULT_DTYPE):
        print(f"every case with epi_dtype {args.epi_dtype}, acc_dtype {args.acc_dtype}")

    ceilings = run_ceilings(measure_copy(device))
    print(
        f"ceilings: copy {ceilings['copy'] / 1e9:.1f} GB/s (measured again after the grid)"
        + ("" if not_sm90 or args.no_gather else "; paged gather: measured per case")
    )

    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / JSON_NAME
    env = environment(mode, device)
    host_time: dict[str, object] = {"status": "not run (--no-host-time)", "results": []}
    host_time_crashed = False
    # Before the grid: a long grid that runs out of time still leaves this table behind.
    if not args.no_host_time:
        host_time, host_time_crashed = host_time_section(args.ops, device, not_sm90)
        write_json(json_path, env, ceilings, [], complete=False, host_time=host_time)

    results: list[CaseResult] = []
    unbuilt: dict[str, str] = {}
    if shapes:
        print("\n" + table_header(), flush=True)
    for shape in shapes:
        if shape.op in unbuilt:
            result = CaseResult(shape, KERNEL_NOT_BUILT, detail=unbuilt[shape.op])
        else:
            try:
                result = run_case(shape, device, gather=not args.no_gather)
            except Exception as exc:  # one broken case must not lose a long run's other results
                traceback.print_exc()
                result = CaseResult(shape, ERROR, detail=f"{type(exc).__name__}: {exc}")
            if result.status == KERNEL_NOT_BUILT:
                unbuilt[shape.op] = result.detail
            result.derive(ceilings["copy"])
            if device.type == "cuda":
                torch.cuda.empty_cache()
        results.append(result)
        print(table_row(result), flush=True)
        write_json(json_path, env, ceilings, results, complete=False, host_time=host_time)

    ceilings = run_ceilings(ceilings["copy"], measure_copy(device))
    for result in results:
        result.derive(ceilings["copy"])
    print(
        f"\ncopy ceiling: {ceilings['copy_start'] / 1e9:.1f} GB/s before the grid, "
        f"{ceilings['copy_end'] / 1e9:.1f} GB/s after it; the JSON's fractions are of the larger"
        + (
            " (the table above used the first)"
            if ceilings["copy_end"] > ceilings["copy_start"]
            else ""
        )
    )
    write_json(json_path, env, ceilings, results, complete=True, host_time=host_time)
    note = (
        "CPU reference path, NOT kernel performance"
        if not_sm90
        else torch.cuda.get_device_name(device)
    )
    plots = write_plots(args.out, results, note)
    counts = Counter(r.status for r in results)
    print("\n" + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    print(f"wrote {json_path}" + "".join(f", {p}" for p in plots))

    gather_errors = sum(1 for r in results if r.gather_error)
    failed = counts[FAIL] + counts[ERROR] + gather_errors + int(host_time_crashed)
    if failed:
        print(f"{failed} case(s) or measurement(s) failed or crashed", file=sys.stderr)
        return 1
    return 0
