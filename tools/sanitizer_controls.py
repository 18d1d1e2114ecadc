"""Planted bugs each compute-sanitizer tool must report: is a clean sanitizer run a real check?

    python tools/sanitizer_controls.py [--only memcheck-store-past-out,synccheck-syncwarp-mask] [--timeout 150]
    python tools/sanitizer_controls.py --kernels ""      # no kernel filter: every kernel checked
    python tools/sanitizer_controls.py --list
    python tools/sanitizer_controls.py --compile-only   # CPU: each bug compiles, changes the cubin

"0 errors" from compute-sanitizer is only a verdict if the tool saw the kernels' accesses. The
GPU sessions run the tools with `--kernel-name kns=paged_mqa_logits` (only the logits kernels
and the schedule kernel instrumented, PyTorch's own kernels run at full speed: the check that
makes large batches affordable, from more than 240 s to about 20 s for 14 calls), so this tool
plants one bug per tool in a copy of the kernel sources, runs the random calls that reach it
under that tool with the same filter, and expects a report:

- memcheck: the fp8 epilogue writes each request's rows one request further down, so the last
  request's rows fall past the end of `out` (run without PyTorch's caching allocator, so
  every tensor is its own allocation with exact bounds);
- racecheck: the CTA-wide scan of the in-kernel schedule (more than 128 requests) reads the
  other warps' sums from shared memory without the barrier after their writes;
- synccheck: in the one-warp scan of the in-kernel schedule (up to 128 requests) the whole warp
  reaches a `__syncwarp` whose mask leaves out lanes 16-31. (synccheck checks barriers:
  `__syncthreads`, `__syncwarp` and their cooperative-groups forms. A `__shfl_sync` under such
  a mask, tried first, went unreported: shuffles are not what it checks.)

Each bug is a `kernel_mutants.Mutant` applied to a copy of the repository (the repository is
never edited). Per control the copy's configurations are compiled first by a plain run (its
result ignored: a planted bug may or may not change the output), then the same calls run under
the tool. A control that reports is "reported"; one that runs and reports nothing is SILENT,
which means clean runs of that tool over these kernels prove nothing. Exit status 0 when every
control reports, 1 otherwise, 2 without an SM90 GPU or compute-sanitizer.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kernel_mutants import (
    COMMON,
    FP8,
    Mutant,
    apply,
    check_applies,
    compile_only,
    copy_tree,
    run_in_tree,
    tree_env,
)


@dataclass(frozen=True)
class Control:
    tool: str  # compute-sanitizer --tool
    mutant: Mutant
    calls: tuple[str, ...]  # tools/random_cases.py arguments whose calls reach the edit
    no_caching_allocator: bool = False


def _random_calls(fp8: int, fp4: int, batches: str, first_seed: int) -> tuple[str, ...]:
    return (
        "--fp8", str(fp8), "--fp4", str(fp4), "--batches", batches,
        "--first-seed", str(first_seed), "--chunk", "1",
    )  # fmt: skip


CONTROLS = [
    Control(
        "memcheck",
        Mutant(
            "memcheck-store-past-out",
            FP8,
            "request_out = out + (static_cast<long long>(b) * NEXT_N + (quad >> 1)) * out_stride;",
            "request_out = out + (static_cast<long long>(b + 1) * NEXT_N + (quad >> 1)) * out_stride;",
            ("fp8",),
            ("fp8",),
            "the last request's rows are written past the end of out",
        ),
        _random_calls(6, 0, "small", 6100000),
        no_caching_allocator=True,
    ),
    Control(
        "racecheck",
        Mutant(
            "racecheck-scan-without-barrier",
            COMMON,
            "if (lane == 31) warp_sums[warp] = inclusive;\n  __syncthreads();\n",
            "if (lane == 31) warp_sums[warp] = inclusive;\n",
            ("fp8", "fp4"),
            ("fp8", "fp4"),
            "B > 128, in-kernel schedule: warp 0 reads the warps' sums before they are written",
        ),
        _random_calls(8, 0, "large", 6200000),
    ),
    Control(
        "synccheck",
        Mutant(
            "synccheck-syncwarp-mask",
            COMMON,
            "b = __shfl_sync(0xffffffffu, b, holder);",
            "__syncwarp(0x0000ffffu);\n    b = __shfl_sync(0xffffffffu, b, holder);",
            ("fp8", "fp4"),
            ("fp8", "fp4"),
            "B <= 128, in-kernel schedule: lanes 16-31 reach a __syncwarp whose mask leaves them out",
        ),
        _random_calls(6, 0, "small", 6300000),
    ),
]

# "ERROR SUMMARY: 3 errors" (memcheck, synccheck); "RACECHECK SUMMARY: 2 hazards displayed (2
# errors, 0 warnings)" (racecheck).
SUMMARY = re.compile(r"(?:ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: (\d+) hazard)")
# The first line of a report ("========= Invalid __global__ write of size 4 bytes", "=========
# Error: Race reported between ...", "========= Barrier error detected ...").
FIRST_REPORT = re.compile(r"^=+ +(Invalid|Error|ERROR:|Barrier|Race|Warning)")


def reported(log: str) -> int | None:
    """Errors (or hazards) in a compute-sanitizer log's first summary line; None without one."""
    match = SUMMARY.search(log)
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


def check(control: Control, sanitizer: str, kernels: str, timeout: float, logs: Path | None):
    """Run one control in a mutated copy of the repository. Returns (verdict, detail, s)."""
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sanitizer-control-") as folder:
        tree = Path(folder)
        copy_tree(tree)
        apply(control.mutant, tree)
        env = tree_env(tree)
        calls = [sys.executable, "tools/random_cases.py", *control.calls]
        run_in_tree(calls, tree, env, timeout)  # compiles the copy's configurations; result ignored
        if control.no_caching_allocator:
            env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
        command = [sanitizer, "--tool", control.tool, "--report-api-errors", "no"]
        if kernels:
            command += ["--kernel-name", f"kns={kernels}"]
        output, returncode = run_in_tree([*command, *calls], tree, env, timeout)
    if logs is not None:
        (logs / f"{control.mutant.name}.log").write_text(output)
    seconds = time.perf_counter() - began
    count = reported(output)
    if count is None:
        why = f"no result within {timeout:.0f} s" if returncode is None else "no summary line"
        return "error", why, seconds
    if count == 0:
        return "SILENT", "0 reported", seconds
    first = next((line for line in output.splitlines() if FIRST_REPORT.search(line)), "")
    return "reported", f"{count}: {first.lstrip('= ').strip()[:160]}", seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the controls and exit")
    parser.add_argument(
        "--compile-only",
        action="store_true",
        help="compile each planted bug for sm_90a (NVRTC, no GPU) and check it changes the cubin",
    )
    parser.add_argument("--only", help="comma-separated control names")
    parser.add_argument(
        "--kernels",
        default="paged_mqa_logits",
        help='compute-sanitizer --kernel-name kns= substring ("" checks every kernel)',
    )
    parser.add_argument("--timeout", type=float, default=150, help="seconds per run")
    parser.add_argument("--logs", type=Path, help="folder for each control's sanitizer log")
    args = parser.parse_args()
    controls = CONTROLS
    if args.only is not None:
        wanted = {name.strip() for name in args.only.split(",") if name.strip()}
        unknown = sorted(wanted - {c.mutant.name for c in CONTROLS})
        if not wanted or unknown:
            parser.error(f"--only: no control named {', '.join(unknown) or repr(args.only)}")
        controls = [c for c in CONTROLS if c.mutant.name in wanted]
    for control in controls:
        check_applies(control.mutant)
    if args.list:
        for control in controls:
            print(f"{control.mutant.name:32} {control.tool:10} {control.mutant.catch}")
        return 0
    if args.compile_only:
        return compile_only([control.mutant for control in controls])
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("sanitizer_controls: needs an SM90 GPU")
        return 2
    sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not Path(sanitizer).exists():
        print("sanitizer_controls: compute-sanitizer not found on PATH or in /usr/local/cuda/bin")
        return 2
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for control in controls:
        verdict, detail, seconds = check(control, sanitizer, args.kernels, args.timeout, args.logs)
        rows.append((control, verdict, detail, seconds))
        print(f"{verdict:8} {control.mutant.name} ({seconds:.0f} s) {detail}", flush=True)
    print(f"\nkernel filter: {f'kns={args.kernels}' if args.kernels else 'none'}")
    print("| control | tool | result | s | planted bug / first report |")
    print("|---|---|---|---|---|")
    for control, verdict, detail, seconds in rows:
        text = f"{control.mutant.catch}; {detail}".replace("|", "\\|")
        print(f"| {control.mutant.name} | {control.tool} | {verdict} | {seconds:.0f} | {text} |")
    return 0 if all(verdict == "reported" for _, verdict, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
