"""flashinfer_jit benchmark: import time, compile times, warm-cache first call, launch overhead.

Run on the GPU machine (numbers for docs/jit.md "Measurements")::

    python packages/jit/benchmarks/launch_overhead.py --json jit-bench.json

Without a GPU it measures what it can (import, cold compiles, argument packing) and says
which figures need an SM90 GPU.

Figures:
  import             `import flashinfer_jit` in a fresh interpreter (median of 5).
  cold compile       NVRTC compile of each self-test configuration into an empty cache.
  warm first call    In a fresh process with CUDA already initialised: `load_kernel` of each
                     configuration from the warm disk cache (hash sources, read cubin, load
                     module), plus the first launch and synchronise for scale_add.
  launch overhead    Host time per launch of an empty 6-argument kernel, median over chunks of
                     200 launches (GPU synchronised between chunks, not inside), by
                     `Kernel.launch` and by a prepared launch (`Kernel.prepare_launch`), compared with
                     a raw cuda.bindings cuLaunchKernel of pre-packed arguments, cuda.core's
                     launch() and a tiny torch op.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

IMPORT_PROBE = (
    "import time; s = time.perf_counter(); import flashinfer_jit; print(time.perf_counter() - s)"
)

FIRST_CALL_PROBE = """
import json, sys, time
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
timings = {}
start = time.perf_counter()
import flashinfer_jit as jit
from flashinfer_jit.selftest import kernel_specs, SCALE_ADD
timings["import flashinfer_jit"] = time.perf_counter() - start
for spec in kernel_specs():
    start = time.perf_counter()
    jit.load_kernel(spec)
    timings["load_kernel " + spec.label] = time.perf_counter() - start
x = torch.zeros(256, device="cuda")
start = time.perf_counter()
jit.load_kernel(SCALE_ADD).launch(1, 256, x, x, x, jit.f32(1.0), jit.i32(256))
torch.cuda.synchronize()
timings["first launch + sync scale_add"] = time.perf_counter() - start
print(json.dumps(timings))
"""


def measure_import(repeats: int = 5) -> float:
    samples = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, check=True
        )
        samples.append(float(out.stdout.strip()))
    return statistics.median(samples)


def measure_cold_compiles(cache_dir: Path) -> dict[str, float]:
    import flashinfer_jit as jit
    from flashinfer_jit.selftest import kernel_specs

    results = {}
    for spec in kernel_specs():
        start = time.perf_counter()
        compiled = jit.compile_kernel(spec, "sm_90a", cache_dir=cache_dir)
        elapsed = time.perf_counter() - start
        tag = " (entry shared with an earlier spec)" if compiled.from_cache else ""
        results[spec.label + tag] = elapsed
    return results


def per_launch_us(launch: Callable[[], None], sync: Callable[[], None]) -> float:
    for _ in range(200):
        launch()
    sync()
    samples = []
    for _ in range(30):
        start = time.perf_counter()
        for _ in range(200):
            launch()
        samples.append((time.perf_counter() - start) / 200)
        sync()
    return statistics.median(samples) * 1e6


def measure_launch_overhead() -> dict[str, float | str]:
    import flashinfer_jit as jit
    import torch
    from flashinfer_jit.selftest import EMPTY

    sync = torch.cuda.synchronize
    x = torch.zeros(16, device="cuda")
    y = torch.zeros(16, device="cuda")
    args = (x, x, x, jit.i32(16), jit.i64(16), jit.f32(1.0))
    kernel = jit.load_kernel(EMPTY)
    side = torch.cuda.Stream()
    results: dict[str, float | str] = {}
    results["Kernel.launch, current stream (6 args)"] = per_launch_us(
        lambda: kernel.launch(1, 32, *args), sync
    )
    with torch.cuda.stream(side):
        results["Kernel.launch, non-default current stream"] = per_launch_us(
            lambda: kernel.launch(1, 32, *args), sync
        )
    results["Kernel.launch, explicit stream="] = per_launch_us(
        lambda: kernel.launch(1, 32, *args, stream=side), sync
    )
    results["load_kernel(spec) + launch"] = per_launch_us(
        lambda: jit.load_kernel(EMPTY).launch(1, 32, *args), sync
    )
    results["Kernel.launch, cluster=(1,1,1)"] = per_launch_us(
        lambda: kernel.launch(1, 32, *args, cluster=1), sync
    )
    prepared = kernel.prepare_launch(1, 32)
    results["prepared launch (Kernel.prepare_launch), current stream"] = per_launch_us(
        lambda: prepared(*args), sync
    )
    prepared_unchecked = kernel.prepare_launch(1, 32, devices_checked=True)
    results["prepared launch, devices_checked=True"] = per_launch_us(
        lambda: prepared_unchecked(*args), sync
    )
    results["Kernel.launch, programmatic=True (PDL)"] = per_launch_us(
        lambda: kernel.launch(1, 32, *args, programmatic=True), sync
    )
    prepared_pdl = kernel.prepare_launch(1, 32, programmatic=True)
    results["prepared launch, programmatic=True (PDL)"] = per_launch_us(
        lambda: prepared_pdl(*args), sync
    )

    # Baseline: the driver call alone, arguments packed once beforehand.
    from cuda.bindings import driver

    buffer, address = kernel._packer.pack(args)
    handle = kernel._launch_handle
    stream = side.cuda_stream

    def raw() -> None:
        driver.cuLaunchKernel(handle, 1, 1, 1, 32, 1, 1, 0, stream, address, 0)

    results["baseline: raw cuLaunchKernel, pre-packed"] = per_launch_us(raw, sync)
    del buffer

    try:
        from cuda.core import LaunchConfig, ObjectCode, Stream, launch

        core_kernel = ObjectCode.from_cubin(kernel.compiled.cubin).get_kernel("empty_kernel")
        core_stream = Stream.from_handle(stream)
        config = LaunchConfig(grid=1, block=32)
        core_args = (
            x.data_ptr(),
            x.data_ptr(),
            x.data_ptr(),
            ctypes.c_int32(16),
            ctypes.c_int64(16),
            ctypes.c_float(1.0),
        )
        results["baseline: cuda.core launch()"] = per_launch_us(
            lambda: launch(core_stream, config, core_kernel, *core_args), sync
        )
    except Exception as exc:  # report instead of failing: the other figures still matter
        results["baseline: cuda.core launch()"] = f"n/a ({type(exc).__name__}: {exc})"

    results["baseline: torch.add(x, 1, out=y)"] = per_launch_us(
        lambda: torch.add(x, 1, out=y), sync
    )
    return results


def measure_packing_only() -> float:
    import torch
    from flashinfer_jit import f32, i32, i64
    from flashinfer_jit.arguments import ArgumentPacker

    packer = ArgumentPacker([(0, 8), (8, 8), (16, 8), (24, 4), (32, 8), (40, 4)], -1, "bench")
    x = torch.zeros(16)
    args = (x, x, x, i32(16), i64(16), f32(1.0))
    return per_launch_us(lambda: packer.pack(args), lambda: None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    report: dict[str, object] = {}

    report["import flashinfer_jit (s)"] = measure_import()
    with tempfile.TemporaryDirectory() as folder:
        cache = Path(folder)
        report["cold compile per configuration, sm_90a (s)"] = measure_cold_compiles(cache)

        import torch

        has_sm90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
        if has_sm90:
            env_probe = subprocess.run(
                [sys.executable, "-c", FIRST_CALL_PROBE],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "FLASHINFER_JIT_CACHE_DIR": str(cache)},
            )
            report["warm-cache first call (s)"] = json.loads(env_probe.stdout.splitlines()[-1])
            report["host overhead per launch (us)"] = measure_launch_overhead()
            report["device"] = torch.cuda.get_device_name()
        else:
            report["argument packing only, 6 args (us)"] = measure_packing_only()
            report["note"] = "no SM90 GPU here: warm-cache first call and launch overhead need one"

    for section, value in report.items():
        if isinstance(value, dict):
            print(f"{section}:")
            for name, figure in value.items():
                shown = f"{figure:10.4f}" if isinstance(figure, float) else f"  {figure}"
                print(f"  {name:60s} {shown}")
        else:
            shown = f"{value:.4f}" if isinstance(value, float) else value
            print(f"{section}: {shown}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
