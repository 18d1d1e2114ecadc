"""Many more seeded random calls than the GPU test suite runs (SM90 GPU only).

    python tools/random_cases.py [--fp8 400] [--fp4 300] [--first-seed 100000]

Each seed draws a whole call exactly as `test_gpu_random_cases.py` does (batch size, length
mix, block size, next_n, head shape and dtypes, strided views, a given or derived schedule,
`out=` or not) and checks it against the same independent float64 expectation with the same
tolerance. The suite runs 32 fp8 and 20 fp4 seeds; this widens the search. Every kernel
configuration the seeds need is compiled first, in parallel (`flashinfer_jit.precompile`).
Prints one line per failing seed (enough to rerun it: the variant and the seed) and a summary.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packages/attn-scores/tests/paged_mqa_logits"))

from flashinfer_attn_scores.paged_mqa_logits import launcher  # noqa: E402
from flashinfer_attn_scores.paged_mqa_logits.api import PagedMqaLogitsConfig  # noqa: E402
from test_gpu_random_cases import check_random_call, draw_call  # noqa: E402

FP4_NUM_HEADS, FP4_HEAD_DIM = 64, 128


def kernel_config(variant: str, call: dict) -> PagedMqaLogitsConfig:
    """The kernel specialisation `call` launches (what precompile would build for it)."""
    if variant == "fp8":
        output_dtype, epi_dtype, acc_dtype = call["dtypes"]
        return PagedMqaLogitsConfig(
            "fp8",
            call["block_size"],
            call["next_n"],
            call["num_heads"],
            call["head_dim"],
            output_dtype,
            epi_dtype,
            acc_dtype,
            False,
        )
    output_dtype, epi_dtype = call["dtypes"]
    return PagedMqaLogitsConfig(
        "fp4",
        call["block_size"],
        call["next_n"],
        FP4_NUM_HEADS,
        FP4_HEAD_DIM,
        output_dtype,
        epi_dtype,
        torch.float32,
        call["interleaved"],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp8", type=int, default=400, help="fp8 seeds to run")
    parser.add_argument("--fp4", type=int, default=300, help="fp4 seeds to run")
    parser.add_argument("--first-seed", type=int, default=100000)
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("random_cases: needs an SM90 GPU")
        return 2
    runs = [("fp8", args.first_seed + i) for i in range(args.fp8)]
    runs += [("fp4", args.first_seed + 500000 + i) for i in range(args.fp4)]
    configs = sorted(
        {kernel_config(variant, draw_call(seed, variant)) for variant, seed in runs}, key=str
    )
    began = time.perf_counter()
    launcher.compile_paged_mqa_logits_kernels(configs, torch.device("cuda"))
    print(
        f"{len(configs)} kernel configurations compiled and loaded in {time.perf_counter() - began:.0f} s"
    )
    failures: list[str] = []
    began = time.perf_counter()
    for variant, seed in runs:
        try:
            check_random_call(variant, seed)
        except Exception as exc:  # every failure is reported; none stops the run
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
            failures.append(f"FAIL {variant} seed {seed}: {detail[0][:300]}")
            print(failures[-1], flush=True)
    passed = len(runs) - len(failures)
    print(
        f"random cases: {passed} of {len(runs)} passed ({args.fp8} fp8, {args.fp4} fp4, seeds from"
        f" {args.first_seed}) in {time.perf_counter() - began:.0f} s"
    )
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
