"""A/B of the logits kernels of two source trees on one GPU: time and bitwise output.

    python tools/tree_ab.py OLD_ROOT NEW_ROOT [--rounds 2] [--preheat S] [--shapes fp4:1:64:128:65536,...]
    python tools/tree_ab.py OLD_ROOT NEW_ROOT --single [--shapes fp8:1:64:1:4096,...]

OLD_ROOT and NEW_ROOT are checkouts of this repository (for example `git archive HEAD
packages | tar -x -C old`). For every round and tree, a child process imports the packages
from that tree's `packages/*/src`, builds each case from a fixed seed (so both trees see the
same bytes), times it (median of CUDA-graph replays of 4 back-to-back calls, pages from a pool
larger than L2) and hashes the valid region of its output. The trees alternate, so drift of
the GPU clock or of the machine shows up as a difference between rounds of one tree, and
they swap places every round (old first in rounds 1, 3, ..., new first in rounds 2, 4, ...).
At latency-bound shapes one child process differs from the next by more than most kernel
changes: on the H200 (2026-12-02) two trees with bitwise-equal output and one-replay times
within 1 % read fp8 B 1, L 4k at 3.8-3.9 us in some processes and 4.1-4.5 us in others,
whichever tree and position. Use more rounds there, or `--single`. With
`--preheat S` each case first runs back to back for S seconds, so it is timed at the clock the
700 W power cap settles at under a sustained load (the benchmark's long runs see that clock;
short bursts run at up to 1980 MHz). The table printed last gives each tree's time per round, new / old of the best rounds, and
whether the outputs of the two trees are bitwise equal.

A shape is `op:next_n:block_size:batch:avg_len[:dtypes]` with op fp8 or fp4 (float32 output;
the fp4 case's scales are in [120, 134)). `dtypes` picks the epilogue: `f32` (the default),
`f16`, `bf16` (fp4 only), `f16acc16` (fp8: float16 epilogue and accumulator) or `f32acc16`
(fp8: float32 epilogue over a float16 accumulator); a further
field `sfi` (fp4, block size 128) reads the KV scales in the interleaved order
(`is_kv_sf_interleaved=True`), e.g. `fp4:1:128:128:65536:sfi` or `fp4:1:128:128:65536:f16:sfi`.

`--single` times the small-batch target's way instead: the benchmark's case of that shape
(`tools/bench`, default dtypes, its first rotation set), one call per CUDA-graph replay
(`bench.timing.time_single_replays`), once after an L2 flush (everything cold) and once
replayed over and over (L2-warm); the hash covers that set's valid region.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

SINGLE_SHAPES = (
    "fp8:1:64:1:4096",
    "fp8:1:64:8:16384",
    "fp8:2:64:1:4096",
    "fp4:1:64:1:4096",
)
DEFAULT_SHAPES = (
    "fp4:1:64:128:65536",
    "fp4:1:32:128:32768",
    "fp4:2:64:128:65536",
    "fp4:4:64:64:32768",
    "fp8:1:64:128:65536",
    "fp8:2:64:128:65536",
    "fp8:4:64:64:32768",
)
_PACKAGES = ("layouts", "jit", "schedule", "attn-scores")
# A shape's optional dtype field: (epilogue dtype, accumulator dtype) by torch name.
_DTYPES = {
    "f32": ("float32", "float32"),
    "f16": ("float16", "float32"),
    "bf16": ("bfloat16", "float32"),
    "f16acc16": ("float16", "float16"),
    "f32acc16": ("float32", "float16"),
}


def dtype_names(extras: list[str]) -> tuple[str, str]:
    """(epilogue, accumulator) torch dtype names of a shape's optional fields."""
    return _DTYPES[next((x for x in extras if x != "sfi"), "f32")]


def _child(preheat_s: float, shapes: list[str]) -> None:
    import fp8_kernel_check as check
    import torch
    from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask

    for shape in shapes:
        op, *fields = shape.split(":")
        next_n, block_size, batch, avg_len = (int(x) for x in fields[:4])
        extras = fields[4:]
        interleaved = "sfi" in extras
        epi, acc = dtype_names(extras)
        torch.manual_seed(1234)
        make_case, make_call = (
            (check.fp4_timing_case, check.fp4_call)
            if op == "fp4"
            else (check.timing_case, check.fp8_call)
        )
        case, tokens = make_case(next_n, block_size, batch, avg_len)
        dtypes = dict(epi_dtype=getattr(torch, epi))
        if op == "fp8":
            dtypes["acc_dtype"] = getattr(torch, acc)
        elif interleaved:
            dtypes["is_kv_sf_interleaved"] = True
        call = make_call(case, None, **dtypes)
        check.PREHEAT_S = preheat_s
        state = check.preheat(call)
        seconds = check.bench(call, iters=20, calls_per_graph=4)  # synchronises; output written
        storage = case["storage"]
        mask = valid_mask(case["seq_lens"].cpu(), next_n, storage.shape[1])
        valid = storage.cpu()[mask]
        digest = hashlib.sha256(valid.view(torch.int32).numpy().tobytes()).hexdigest()[:16]
        nans = int(torch.isnan(valid).sum())
        row = dict(
            shape=shape, us=seconds * 1e6, tokens=tokens, hash=digest, nans=nans, state=state
        )
        print(json.dumps(row))
        sys.stdout.flush()
        del case, call, storage


def _child_single(shapes: list[str]) -> None:
    import torch
    from bench.data import build_case
    from bench.ops import op_call
    from bench.shapes import IndexerShape
    from bench.timing import settle, time_single_replays
    from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask

    device = torch.device("cuda")
    for shape_text in shapes:
        op, *numbers = shape_text.split(":")
        next_n, block_size, batch, avg_len = (int(x) for x in numbers)
        case = build_case(IndexerShape(op, batch, avg_len, next_n, block_size), device)
        call = op_call(case, case.sets[0])  # the first rotation set only
        settle(device)
        cold = time_single_replays(call)
        warm = time_single_replays(call, cold=False)
        out = case.sets[0].out
        out.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        valid = out.float().cpu()[valid_mask(case.sets[0].seq_lens.cpu(), next_n, out.shape[1])]
        digest = hashlib.sha256(valid.view(torch.int32).numpy().tobytes()).hexdigest()[:16]
        row = dict(
            shape=shape_text,
            us=cold.median_us,
            warm_us=warm.median_us,
            tokens=sum(case.seq_lens),
            hash=digest,
            nans=int(torch.isnan(valid).sum()),
            state="",
        )
        print(json.dumps(row))
        sys.stdout.flush()
        del case, call, out


def _run_tree(root: Path, child_args: list[str], shapes: list[str]) -> list[dict]:
    env = dict(os.environ)
    paths = [str(root / "packages" / p / "src") for p in _PACKAGES] + [str(root / "tools")]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    command = [sys.executable, str(Path(__file__).resolve()), *child_args, *shapes]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"the child for {root} failed with exit status {done.returncode}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(float(sys.argv[2]), sys.argv[3:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-single":
        _child_single(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument(
        "--rounds", type=int, default=2, help="an even number puts each tree first as often"
    )
    parser.add_argument("--preheat", type=float, default=0.0, metavar="S")
    parser.add_argument("--single", action="store_true", help="one call per graph replay")
    parser.add_argument("--shapes", default=None)
    args = parser.parse_args()
    shapes = (args.shapes or ",".join(SINGLE_SHAPES if args.single else DEFAULT_SHAPES)).split(",")
    child_args = ["--child-single"] if args.single else ["--child", str(args.preheat)]
    results: dict[str, list[list[dict]]] = {"old": [], "new": []}
    for round_index in range(args.rounds):
        trees = (("old", args.old), ("new", args.new))
        for name, root in trees if round_index % 2 == 0 else trees[::-1]:
            rows = _run_tree(root, child_args, shapes)
            results[name].append(rows)
            for row in rows:
                state = f" [{row['state']}]" if row["state"] else ""
                warm = f", L2-warm {row['warm_us']:.2f} us" if "warm_us" in row else ""
                print(
                    f"round {round_index + 1} {name}: {row['shape']} {row['us']:.2f} us{warm}{state}"
                )
    print()
    single = args.single
    warm_header = " old L2-warm us | new L2-warm us | warm new / old |" if single else ""
    print(
        f"| shape | old us (rounds) | new us (rounds) | new / old (best) |{warm_header} outputs |"
    )
    print("|---|---|---|---|" + ("---|---|---|" if single else "") + "---|")
    for i, shape in enumerate(shapes):
        old = [rows[i] for rows in results["old"]]
        new = [rows[i] for rows in results["new"]]
        old_us = [r["us"] for r in old]
        new_us = [r["us"] for r in new]
        hashes = {r["hash"] for r in old + new}
        verdict = "bitwise equal" if len(hashes) == 1 else f"DIFFER ({len(hashes)} hashes)"
        if any(r["nans"] for r in old + new):
            old_nans = " / ".join(str(r["nans"]) for r in old)
            new_nans = " / ".join(str(r["nans"]) for r in new)
            verdict += f", NaN per round: old {old_nans}, new {new_nans}"
        warm = ""
        if single:
            old_warm = [r["warm_us"] for r in old]
            new_warm = [r["warm_us"] for r in new]
            warm = (
                f" {' / '.join(f'{t:.2f}' for t in old_warm)} | "
                f"{' / '.join(f'{t:.2f}' for t in new_warm)} | {min(new_warm) / min(old_warm):.3f} |"
            )
        print(
            f"| {shape} | {' / '.join(f'{t:.2f}' for t in old_us)} | "
            f"{' / '.join(f'{t:.2f}' for t in new_us)} | {min(new_us) / min(old_us):.3f} |{warm} {verdict} |"
        )


if __name__ == "__main__":
    main()
