"""Which first launch waits for the device, and why? Each scenario runs in a fresh process
and times the two launches of tools/pdl_overlap_probe.py's trial separately: late_copy
(idles, then copies) and early_read launched programmatically behind it.

    python tools/first_launch_probe.py            # every scenario x loading mode
    python tools/first_launch_probe.py breakdown  # where a first launch's host time goes

Module loading modes: `lazy` (CUDA's default) and `eager` (CUDA_MODULE_LOADING=EAGER).
Measured on the H200 (2026-12-02): no first launch waited for the device; each cost 0.3-0.8 ms
of host time, most of it in the first argument packing (docs/jit.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from pdl_overlap_probe import KERNELS, what_early_read_saw
from script_start import script_start

SCENARIOS = {
    "both cold": (),
    "late warmed": ("late",),
    "early warmed": ("early",),
    "both warmed": ("late", "early"),
    "torch spin, early cold": ("spin",),
}
MODES = ("lazy", "eager")


def run_scenario(scenario: str) -> str:
    import flashinfer_jit as jit
    import torch

    late = jit.load_kernel(jit.KernelSpec.make("late_copy", KERNELS), 0)
    early = jit.load_kernel(jit.KernelSpec.make("early_read", KERNELS), 0)
    src = torch.arange(1, 4097, dtype=torch.int32, device="cuda")
    seen = torch.full_like(src, -1)
    dst = torch.zeros_like(src)
    scratch = torch.zeros_like(src)
    warm = SCENARIOS[scenario]
    if "late" in warm:
        late.launch(1, 1024, scratch, src, jit.i64(dst.nbytes), jit.i64(0))
    if "early" in warm:
        early.launch(4, 256, scratch, src, jit.i64(dst.nbytes), programmatic=True)
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if "spin" in warm:
        torch.cuda._sleep(2_000_000)
        dst.copy_(src)
    else:
        late.launch(1, 1024, dst, src, jit.i64(dst.nbytes), jit.i64(1_000_000))
    t1 = time.perf_counter()
    early.launch(4, 256, seen, dst, jit.i64(dst.nbytes), programmatic=True)
    t2 = time.perf_counter()
    pending = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    verdict = what_early_read_saw(seen, src)
    first = "spin+copy" if "spin" in warm else "late_copy"
    return (
        f"{first} {(t1 - t0) * 1e6:7.1f} us, early_read {(t2 - t1) * 1e6:7.1f} us, "
        f"pending {pending!s:5s} {verdict}"
    )


def breakdown() -> str:
    """Times the first argument packing and the raw driver launches of two never-launched
    kernels with the same parameter list: one through its CUkernel handle (as load_kernel
    launches), one through its context's CUfunction."""
    import flashinfer_jit as jit
    import torch

    src = torch.arange(1, 4097, dtype=torch.int32, device="cuda")
    seen = torch.empty_like(src)
    torch.cuda.synchronize()
    rows = []
    for via, defines in (("CUkernel", {"PROBE_COPY": 1}), ("CUfunction", {"PROBE_COPY": 2})):
        kernel = jit.load_kernel(jit.KernelSpec.make("early_read", KERNELS, defines), 0)
        t0 = time.perf_counter()
        buffer, params = kernel._packer.pack((seen, src, jit.i64(src.nbytes)))
        t1 = time.perf_counter()
        handle = kernel._launch_handle
        if via == "CUfunction":
            handle = type(handle)(int(kernel._function))
        stream = torch.cuda.current_stream().cuda_stream
        times = []
        for _ in range(3):
            start = time.perf_counter()
            (err,) = kernel._cuLaunchKernel(handle, 4, 1, 1, 256, 1, 1, 0, stream, params, 0)
            times.append((time.perf_counter() - start) * 1e6)
            assert not err, err
        torch.cuda.synchronize()
        del buffer
        launches = ", ".join(f"{t:6.1f}" for t in times)
        rows.append(f"{via:10s} pack {(t1 - t0) * 1e6:6.1f} us, cuLaunchKernel x3 {launches} us")
    return " | ".join(rows)


def main() -> int:
    if len(sys.argv) == 2 and sys.argv[1] == "breakdown":
        print(breakdown(), flush=True)
        return 0
    if len(sys.argv) == 3:  # scenario, mode (the mode is in the environment)
        print(run_scenario(sys.argv[1]), flush=True)
        return 0
    script_start(__doc__, "first_launch_probe", needs_gpu=True)
    for mode in MODES:
        env = dict(os.environ)
        if mode == "eager":
            env["CUDA_MODULE_LOADING"] = "EAGER"
        for scenario in SCENARIOS:
            result = subprocess.run(
                [sys.executable, __file__, scenario, mode],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            line = result.stdout.strip() or result.stderr.strip().splitlines()[-1]
            print(f"{mode:12s} {scenario:24s} {line}", flush=True)
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, __file__, "breakdown"], capture_output=True, text=True, check=False
        )
        print("breakdown", result.stdout.strip() or result.stderr.strip()[-2000:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
