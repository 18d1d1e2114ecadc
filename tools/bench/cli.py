"""Command line and driver: build each case, check it, time it, report."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections import Counter
from pathlib import Path

import torch

from .check import check_case
from .data import GIB, CaseTooLarge, build_case
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
from .shapes import OPS, IndexerShape, cpu_grid, gpu_grid
from .timing import copy_bandwidth, gather_copy_bandwidth, time_graph_replays, time_host

JSON_NAME = "results.json"
# The gather ceiling reads fp8 pages of 64 tokens (8448 bytes) from a 2 GiB pool.
GATHER_PAGE_BYTES = 64 * 132


def _parse_ops(text: str) -> list[str]:
    ops = [op.strip() for op in text.split(",") if op.strip()]
    unknown = [op for op in ops if op not in OPS]
    if not ops or unknown:
        raise argparse.ArgumentTypeError(
            f"--ops takes a comma-separated subset of {','.join(OPS)}; got {text!r}"
        )
    return ops


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python tools/bench",
        description=(
            "Check and time the paged MQA logits ops over the PERFORMANCE.md grid. Without an "
            "SM90 GPU, runs the CPU reference path on small shapes to exercise the pipeline."
        ),
    )
    parser.add_argument("--quick", action="store_true", help="a small slice of the grid")
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
        "--device",
        choices=("auto", "cpu"),
        default="auto",
        help="auto: the SM90 GPU if there is one, else the CPU reference path; cpu: always CPU",
    )
    return parser.parse_args(argv)


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


def measure_ceilings(device: torch.device) -> dict[str, float | None]:
    """Copy bandwidth (and, on CUDA, the gather-copy bandwidth) of this run, bytes/s."""
    if device.type != "cuda":
        return {"copy": copy_bandwidth(device, 64 << 20, repeats=5), "gather_copy": None}
    free_bytes, _ = torch.cuda.mem_get_info(device)
    copy_bytes = min(GIB, free_bytes // 4)
    ceilings: dict[str, float | None] = {"copy": copy_bandwidth(device, copy_bytes)}
    pool_pages = min(2 * GIB, free_bytes // 3) // GATHER_PAGE_BYTES
    pool = torch.empty(pool_pages, GATHER_PAGE_BYTES, dtype=torch.uint8, device=device)
    page_ids = torch.randperm(pool_pages, device=device)[: pool_pages // 2]
    ceilings["gather_copy"] = gather_copy_bandwidth(pool, page_ids)
    del pool, page_ids
    torch.cuda.empty_cache()
    return ceilings


def run_case(shape: IndexerShape, device: torch.device) -> CaseResult:
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
        result.timing = time_graph_replays([op_call(case, inputs) for inputs in case.sets])
    else:
        result.timing = time_host(op_call(case, first))
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 0 unless a result was wrong or a case crashed."""
    args = parse_args(argv)
    device, not_sm90 = pick_device(args.device)
    if not_sm90:
        print(
            f"The kernels need an SM90 (Hopper) GPU; {not_sm90}. Running the CPU reference path "
            "on small shapes to exercise the pipeline: the times below are host wall-clock "
            "times of the reference, NOT kernel measurements."
        )
        shapes, mode = cpu_grid(args.ops, args.quick), "cpu-reference"
    else:
        shapes, mode = gpu_grid(args.ops, args.quick), "sm90"
        print(f"Benchmarking on {torch.cuda.get_device_name(device)}: {len(shapes)} cases")

    ceilings = measure_ceilings(device)
    print(
        "ceilings: "
        + ", ".join(f"{name} {value / 1e9:.1f} GB/s" for name, value in ceilings.items() if value)
    )

    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / JSON_NAME
    env = environment(mode, device)
    results: list[CaseResult] = []
    unbuilt: dict[str, str] = {}
    print(table_header(), flush=True)
    for shape in shapes:
        if shape.op in unbuilt:
            result = CaseResult(shape, KERNEL_NOT_BUILT, detail=unbuilt[shape.op])
        else:
            try:
                result = run_case(shape, device)
            except Exception as exc:  # one broken case must not lose a long run's other results
                traceback.print_exc()
                result = CaseResult(shape, ERROR, detail=f"{type(exc).__name__}: {exc}")
            if result.status == KERNEL_NOT_BUILT:
                unbuilt[shape.op] = result.detail
            result.derive(ceilings["copy"], ceilings["gather_copy"])
            if device.type == "cuda":
                torch.cuda.empty_cache()
        results.append(result)
        print(table_row(result), flush=True)
        write_json(json_path, env, ceilings, results, complete=False)

    write_json(json_path, env, ceilings, results, complete=True)
    note = (
        "CPU reference path, NOT kernel performance"
        if not_sm90
        else torch.cuda.get_device_name(device)
    )
    plots = write_plots(args.out, results, note)
    counts = Counter(r.status for r in results)
    print("\n" + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    print(f"wrote {json_path}" + "".join(f", {p}" for p in plots))

    failed = counts[FAIL] + counts[ERROR]
    if failed:
        print(f"{failed} case(s) failed or crashed", file=sys.stderr)
        return 1
    return 0
