"""Where the host time of one eager logits call goes, stage by stage (SM90 GPU only).

    python tools/host_time_breakdown.py [--ops fp8,fp4] [--calls 2000]

On the host-time benchmark's problem (B = 1, L = 4096, next_n = 1, block 64, `out=` given,
`schedule_meta=None`; see tools/bench/host_time.py) it times, per call, the public function
and then each layer under it with the layers above removed: the signature and remembered-call
lookup of `api.py`, the remembered call, the prepared launch of the launcher, `Kernel.launch`
with ready arguments, argument packing alone, a bare `cuLaunchKernel` of pre-packed
arguments, and a one-element `torch.add_` as the reference point of this host. Each figure is
the median over 5 loops of back-to-back calls (the GPU synchronised between loops only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.host_time import _small_call


def per_call_us(call: Callable[[], object], calls: int, repeats: int = 5) -> float:
    for _ in range(50):
        call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(calls):
            call()
        samples.append((time.perf_counter() - began) * 1e6 / calls)
        torch.cuda.synchronize()
    return statistics.median(samples)


class Recorder:
    """Stands in for a callee to capture the arguments one layer passes to the next."""

    def __init__(self, target: object, name: str) -> None:
        self.target, self.name = target, name
        self.original = getattr(target, name)
        self.seen: tuple = ()

    def __enter__(self) -> Recorder:
        def record(*args, **kwargs):
            self.seen = (args, kwargs)
            return self.original(*args, **kwargs)

        setattr(self.target, self.name, record)
        return self

    def __exit__(self, *exc) -> None:
        setattr(self.target, self.name, self.original)


def breakdown(op: str, device: torch.device, calls: int) -> list[tuple[str, float]]:
    from flashinfer_attn_scores.paged_mqa_logits import api
    from flashinfer_jit import kernel as jit_kernel

    call = _small_call(op, device, precomputed_schedule=False)
    call()
    rows = [("public function (warm)", per_call_us(call, calls))]

    # Capture each layer's arguments from real calls. The prepared launch binds
    # `Kernel.launch` when it is built, so the remembered call is rebuilt around the recorder
    # and then once more without it.
    with Recorder(api, "_signature") as signature:
        call()
    key_args, _ = signature.seen
    key = api._signature(*key_args)
    api._EAGER_CALLS.pop(key)
    with Recorder(jit_kernel.Kernel, "launch") as launch:
        call()
    (kernel, *launch_args), launch_kwargs = launch.seen
    api._EAGER_CALLS.pop(key)
    call()
    eager = api._EAGER_CALLS[key]
    tensors = key_args[1]
    out = key_args[3][1]
    packer = kernel._packer
    pack_args = tuple(launch_args[2:])
    buffer, params = packer.pack(pack_args)
    grid, block = launch_args[0], launch_args[1]
    stream = torch.cuda.current_stream(device).cuda_stream
    smem = launch_kwargs["shared_mem"]
    raw = kernel._cuLaunchKernel
    handle = kernel._launch_handle

    def bare_launch():
        raw(handle, grid, 1, 1, block, 1, 1, smem, stream, params, 0)

    one = torch.zeros(1, device=device)
    rows += [
        ("  signature (api._signature)", per_call_us(lambda: api._signature(*key_args), calls)),
        ("  remembered-call lookup", per_call_us(lambda: api._eager_call(key), calls)),
        ("  remembered call", per_call_us(lambda: eager(tensors, None, out), calls)),
        ("    prepared launch (run)", per_call_us(lambda: eager._run(*tensors, out, None), calls)),
        (
            "      Kernel.launch",
            per_call_us(lambda: kernel.launch(*launch_args, **launch_kwargs), calls),
        ),
        ("        argument packing", per_call_us(lambda: packer.pack(pack_args), calls)),
        ("        bare cuLaunchKernel", per_call_us(bare_launch, calls)),
        ("torch add_ (1 element)", per_call_us(lambda: one.add_(1), calls)),
    ]
    del buffer
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="fp8,fp4")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("host_time_breakdown: needs a CUDA GPU")
        return 1
    device = torch.device("cuda", torch.cuda.current_device())
    for op in args.ops.split(","):
        print(f"\n{op}: host us per call ({torch.cuda.get_device_name(device)})")
        for name, us in breakdown(op, device, args.calls):
            print(f"{name:<36} {us:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
