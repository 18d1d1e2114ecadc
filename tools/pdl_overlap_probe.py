"""Does a programmatic launch overlap the kernel before it? Probes the premise of
test_gpu_pdl.py under the conditions that might serialise it: the dependent kernel's first
launch in the process (cold), a warmed dependent, and a primary launched programmatically.
Each row launches late_copy (idles DELAY_NS, then copies) and then early_read (no wait) and
says whether early_read saw the bytes before the copy (overlap) or after it. The cold row
reads "after the copy" because the two first launches take longer on the host (0.9-1.4 ms)
than late_copy's 300 us idle, not because a first launch waits for the device: see
tools/first_launch_probe.py, which times each launch separately.

    python tools/pdl_overlap_probe.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import flashinfer_jit as jit
import torch
from script_start import script_start

KERNELS = Path(__file__).resolve().parents[1] / (
    "packages/attn-scores/tests/paged_mqa_logits/pdl_test_kernels.cu"
)


def what_early_read_saw(seen: torch.Tensor, src: torch.Tensor) -> str:
    """early_read copied late_copy's destination: zeros if it ran first, `src` if after."""
    if torch.equal(seen, torch.zeros_like(src)):
        return "overlap (read zeros)"
    if torch.equal(seen, src):
        return "after the copy"
    return "mixed"


def main() -> int:
    script_start(__doc__, "pdl_overlap_probe", needs_gpu=True)
    late = jit.load_kernel(jit.KernelSpec.make("late_copy", KERNELS), 0)
    early = jit.load_kernel(jit.KernelSpec.make("early_read", KERNELS), 0)
    src = torch.arange(1, 4097, dtype=torch.int32, device="cuda")
    seen = torch.empty_like(src)

    def trial(primary_programmatic: bool, dependent_programmatic: bool, delay_ns: int) -> str:
        dst = torch.zeros_like(src)
        seen.fill_(-1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        late.launch(
            1,
            1024,
            dst,
            src,
            jit.i64(dst.nbytes),
            jit.i64(delay_ns),
            programmatic=primary_programmatic,
        )
        early.launch(4, 256, seen, dst, jit.i64(dst.nbytes), programmatic=dependent_programmatic)
        host_us = (time.perf_counter() - t0) * 1e6
        pending = not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        verdict = what_early_read_saw(seen, src)
        return f"{verdict:22s} host {host_us:7.1f} us, stream pending after launch: {pending}"

    rows = [("cold dependent, plain primary", False, True, 300_000)]
    for _ in range(3):
        rows.append(("warm dependent, plain primary", False, True, 300_000))
    for _ in range(3):
        rows.append(("warm dependent, programmatic primary", True, True, 300_000))
    for _ in range(2):
        rows.append(("plain dependent (control)", False, False, 300_000))
    rows.append(("warm dependent, plain primary, 2 ms", False, True, 2_000_000))
    for label, primary, dependent, delay in rows:
        print(f"{label:40s} {trial(primary, dependent, delay)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
