"""Where the host time of one eager logits call goes, stage by stage (SM90 GPU only).

    python tools/host_time_breakdown.py [--ops fp8,fp4] [--calls 2000]

On the host-time benchmark's problem (B = 1, L = 4096, next_n = 1, block 64, `out=` given,
`schedule_meta=None`; see tools/bench/host_time.py) it times, per call, the public function
and then each layer under it with the layers above removed: the signature and remembered-call
lookup of `dispatch.py`, the remembered call, the prepared launch of the launcher, the prepared jit
launch with ready arguments (and `Kernel.launch`, the unprepared path, for comparison),
argument packing alone, a bare `cuLaunchKernel(Ex)` of pre-packed arguments through
cuda-bindings and through ctypes, the metadata reads of the call's tensors, the output view,
and a one-element `torch.add_` as the reference point of this host. Each figure is the median
over 5 loops of back-to-back calls (the GPU synchronised between loops only).
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
        self.result_seen: tuple = ()  # the arguments of the first call of what it returned

    def __enter__(self) -> Recorder:
        def record(*args, **kwargs):
            self.seen = (args, kwargs)
            result = self.original(*args, **kwargs)
            if not callable(result):
                return result

            def record_result(*result_args):
                self.result_seen = self.result_seen or result_args
                return result(*result_args)

            return record_result

        setattr(self.target, self.name, record)
        return self

    def __exit__(self, *exc) -> None:
        setattr(self.target, self.name, self.original)


class NativeLaunch:
    """`cuLaunchKernel(Ex)` called through ctypes with a launch configuration built once, to
    compare against the cuda-bindings call (which converts every argument per call)."""

    def __init__(self, function, grid, block, smem, stream, programmatic: bool) -> None:
        import ctypes

        from cuda.bindings import driver as drv
        from flashinfer_jit.kernel import _dim3

        name = "cuLaunchKernelEx" if programmatic else "cuLaunchKernel"
        err, address, _ = drv.cuGetProcAddress(name.encode(), 12080, 0)
        assert not int(err), err
        self.function = int(function)
        if programmatic:
            prototype = ctypes.CFUNCTYPE(
                ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p
            )
            self.call = prototype(int(address))
            # CUlaunchAttribute: id, 4 bytes padding, a 64-byte value union.
            self.attribute = (ctypes.c_ubyte * 72)()
            ctypes.c_int.from_buffer(
                self.attribute, 0
            ).value = 6  # PROGRAMMATIC_STREAM_SERIALIZATION
            ctypes.c_int.from_buffer(self.attribute, 8).value = 1
            # CUlaunchConfig: 7 unsigned (grid, block, shared memory), stream, attrs, numAttrs.
            self.config = (ctypes.c_ubyte * 56)()
            dims = (ctypes.c_uint * 7).from_buffer(self.config, 0)
            for i, value in enumerate((*_dim3(grid, "grid"), *_dim3(block, "block"), smem)):
                dims[i] = value
            ctypes.c_uint64.from_buffer(self.config, 32).value = int(stream)
            ctypes.c_uint64.from_buffer(self.config, 40).value = ctypes.addressof(self.attribute)
            ctypes.c_uint.from_buffer(self.config, 48).value = 1
            config_address = ctypes.addressof(self.config)
            self.launch = lambda params: self.call(config_address, self.function, params, 0)
        else:
            u = ctypes.c_uint
            prototype = ctypes.CFUNCTYPE(
                ctypes.c_int,
                ctypes.c_void_p,
                u,
                u,
                u,
                u,
                u,
                u,
                u,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_void_p,
            )
            self.call = prototype(int(address))
            stream = int(stream)
            self.launch = lambda params: self.call(
                self.function, grid, 1, 1, block, 1, 1, smem, stream, params, 0
            )

    def __call__(self, params: int) -> None:
        err = self.launch(params)
        if err:
            raise RuntimeError(f"native launch failed: {err}")


def tensor_guards_us(tensors: tuple, calls: int) -> float:
    """Per-call time of the C++ check torch.compile guards tensors with (dtype, device,
    dispatch keys, sizes, strides, requires_grad), over `tensors`: NaN where this torch lacks
    it or it does not accept them."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        guards = TensorGuards(
            *tensors,
            dynamic_dims_sizes=[list(t.shape) for t in tensors],
            dynamic_dims_strides=[list(t.stride()) for t in tensors],
        )
        if not guards.check(*tensors):
            return float("nan")
    except (ImportError, TypeError, RuntimeError):
        return float("nan")
    return per_call_us(lambda: guards.check(*tensors), calls)


def breakdown(op: str, device: torch.device, calls: int) -> list[tuple[str, float]]:
    from flashinfer_attn_scores.paged_mqa_logits import dispatch
    from flashinfer_jit import kernel as jit_kernel

    call = _small_call(op, device, precomputed_schedule=False)
    call()
    rows = [("public function (warm)", per_call_us(call, calls))]

    # Capture each layer's arguments from real calls. The remembered call holds the launch
    # `Kernel.prepare_launch` returned when it was built, so it is rebuilt around the recorder
    # and then once more without it.
    with Recorder(dispatch, "signature") as signature:
        call()
    key_args, key_kwargs = signature.seen  # negatable=: the negated-view checks a call makes
    key = dispatch.signature(*key_args, **key_kwargs)
    dispatch._EAGER_CALLS.pop(key)
    with Recorder(jit_kernel.Kernel, "prepare_launch") as prepared:
        call()
    (kernel, grid, block), options = prepared.seen
    pack_args = prepared.result_seen
    dispatch._EAGER_CALLS.pop(key)
    call()
    eager = dispatch._EAGER_CALLS[key]
    tensors = key_args[1]
    out = key_args[3][1]
    launch = kernel.prepare_launch(grid, block, **options)
    packer = kernel._unchecked_packer() if options.get("devices_checked") else kernel._packer
    buffer, params = packer.pack(pack_args)
    stream = torch.cuda.current_stream(device).cuda_stream
    smem = options["shared_mem"]
    raw = kernel._cuLaunchKernel
    handle = kernel._launch_handle

    def bare_launch():
        raw(handle, grid, 1, 1, block, 1, 1, smem, stream, params, 0)

    one = torch.zeros(1, device=device)
    config = kernel._configs[next(iter(kernel._configs))] if kernel._configs else None
    native = NativeLaunch(handle, grid, block, smem, stream, programmatic=config is not None)
    meta = tuple(t for t in (*tensors, out) if isinstance(t, torch.Tensor))
    rows += [
        (
            "  signature (dispatch.signature)",
            per_call_us(lambda: dispatch.signature(*key_args, **key_kwargs), calls),
        ),
        ("  remembered-call lookup", per_call_us(lambda: dispatch.eager_call(key), calls)),
        ("  remembered call", per_call_us(lambda: eager(tensors, None, out), calls)),
        ("    prepared launch (run)", per_call_us(lambda: eager._run(*tensors, out, None), calls)),
        ("      prepared jit launch", per_call_us(lambda: launch(*pack_args), calls)),
        (
            "      Kernel.launch (the unprepared path)",
            per_call_us(
                lambda: kernel.launch(
                    grid,
                    block,
                    *pack_args,
                    shared_mem=smem,
                    programmatic=options.get("programmatic", False),
                ),
                calls,
            ),
        ),
        ("        argument packing", per_call_us(lambda: packer.pack(pack_args), calls)),
        ("        bare cuLaunchKernel", per_call_us(bare_launch, calls)),
        (
            "        bare cuLaunchKernelEx (cuda-bindings)",
            per_call_us(lambda: kernel._cuLaunchKernelEx(config, handle, params, 0), calls)
            if config is not None
            else float("nan"),
        ),
        (
            "        native launch (ctypes, prebuilt config)",
            per_call_us(lambda: native(params), calls),
        ),
        (
            f"  metadata: dtype of {len(meta)} tensors",
            per_call_us(lambda: [t.dtype for t in meta], calls),
        ),
        (
            f"  metadata: device of {len(meta)}",
            per_call_us(lambda: [t.device for t in meta], calls),
        ),
        (
            f"  metadata: get_device() of {len(meta)}",
            per_call_us(lambda: [t.get_device() for t in meta], calls),
        ),
        (f"  metadata: shape of {len(meta)}", per_call_us(lambda: [t.shape for t in meta], calls)),
        (
            f"  metadata: stride() of {len(meta)}",
            per_call_us(lambda: [t.stride() for t in meta], calls),
        ),
        (
            f"  metadata: data_ptr() of {len(meta)}",
            per_call_us(lambda: [t.data_ptr() for t in meta], calls),
        ),
        (
            "  output view (as_strided)",
            per_call_us(lambda: out.as_strided((1, 4096), (out.stride(0), 1)), calls),
        ),
        ("  empty list comprehension over them", per_call_us(lambda: [t for t in meta], calls)),
        (
            f"  torch's C++ tensor guards, check of {len(meta)}",
            tensor_guards_us(meta, calls),
        ),
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
