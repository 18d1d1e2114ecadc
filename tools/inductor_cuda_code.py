"""Inductor's CUDA (Triton) code for the layouts functions, on a machine without a GPU.

`test_compiled_bytes.py` compares compiled and eager bytes on the GPU. This tool gets at the
same generated code without one, in three steps per case of `tricky_inputs.tricky_cases`:

1. ``generate``: trace the case on the CPU with Inductor's decompositions, move the graph to
   ``cuda:0`` and run Inductor's lowering and code generation on fake CUDA inputs. The CUDA
   device queries are answered by stubs describing an H200; the Triton kernels are written
   but not loaded (there is no libcuda). Writes the output module to ``--out``.
2. ``ptx``: compile every kernel of that module for ``sm_90`` with Triton's own ptxas (no
   GPU needed), to catch compile errors and read the instructions (``.ftz``, ``div.rn``).
3. ``interpret``: run the module's kernels in Triton's interpreter (numpy) on the CPU inputs
   and compare the bytes with the eager CPU result.

The interpreter computes in IEEE arithmetic, so step 3 finds what the generated code says
(an operation missing or changed) but not the GPU's own arithmetic (flush-to-zero, the
approximate float32 division). Known interpreter artefacts (Triton 3.6 and 3.9): a float64
to bfloat16 conversion gives wrong values (512.0 becomes 9.4e-38), so ``mxfp4_dequant``
shows differences under PyTorch 2.13, whose code casts its float64 values to bfloat16
directly (2.11's goes through float32, exact for these values); and the E4M3 byte 0x7F
decodes as 480 instead of NaN (the layouts functions no longer convert from float8). The writers and a tensor global scale are not covered (their
checks read data, which this trace cannot skip as dynamo's does).

``--inline`` runs Inductor's whole pipeline (not only its lowering) with every intermediate
inlined into its consumers, as the H200's compile of the FP8 round trip was: one kernel
quantising, packing and dequantising. That is how its compile failure under Triton 3.6
(a float8 -> float64 conversion) was reproduced here. Generation and ``--ptx`` only: the
pipeline lifts constants into inputs the interpret step cannot give.

Needs ``pip install triton`` next to the CPU torch (not in the dev group: a dev tool). It
patches private PyTorch and Triton internals (written against PyTorch 2.13 with Triton 3.9,
and run under PyTorch 2.11 with Triton 3.6, the H200 image's pair), so another release may
need the stubs adjusted. PyTorch 2.11 installs on a CPU machine, in a separate venv, from
its CUDA wheel: ``pip download torch==2.11.0 --no-deps``, ``pip install --no-deps`` of that
file, then the requirements its metadata lists (``triton==3.6.0`` among them). Usage::

    python tools/inductor_cuda_code.py                  # every case: generate + interpret
    python tools/inductor_cuda_code.py mxfp4 --ptx      # one case, also compile for sm_90
    python tools/inductor_cuda_code.py fp8_pow2_dequant --inline --ptx

Exit status 1 when a case fails to generate or to run, or its bytes differ from eager's.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import pathlib
import re
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages" / "layouts" / "tests"))

OTHER_BYTES = 3  # exit status of the interpret step (1 is Python's for an exception)

# Their checks read data (slot values, a tensor global scale), which a make_fx trace lacks.
UNTRACEABLE = {"write_fp8_pow2", "write_fp8_amax", "write_mxfp4", "nvfp4_own_global"}


def case_inputs(name: str):
    """``(function of the case's input tensors, those CPU tensors)`` for one tricky case.

    A case is ``case(to_device)``: it passes each input through ``to_device``. Recording
    those calls gives the inputs in order; replaying them from arguments makes the case a
    function of tensors that make_fx can trace.
    """
    import tricky_inputs

    case = tricky_inputs.tricky_cases(tricky_inputs.tricky_rows())[name]
    inputs = []
    case(lambda t: inputs.append(t) or t)

    def traced(*args):
        given = iter(args)
        out = case(lambda _: next(given))
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    return traced, inputs


# --- step 1: generate ------------------------------------------------------------------------


def fake_cuda_device() -> None:
    """Answer the CUDA queries Inductor's code generation makes, as an H200 would."""
    import types

    import torch
    import torch.utils._triton as triton_utils
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver as triton_driver

    props = types.SimpleNamespace(
        name="NVIDIA H200", major=9, minor=0, multi_processor_count=132,
        total_memory=140 << 30, regs_per_multiprocessor=65536,
        max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32,
        L2_cache_size=60 << 20, shared_memory_per_block_optin=227 << 10, gcnArchName="",
    )  # fmt: skip
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.get_device_properties = lambda *a, **k: props
    cuda.get_device_capability = lambda *a, **k: (9, 0)
    cuda.get_device_name = lambda *a, **k: props.name
    cuda.set_device = lambda *a, **k: None
    cuda.is_initialized = lambda: True
    cuda._lazy_init = lambda: None
    cuda._exchange_device = lambda device: -1
    cuda._maybe_exchange_device = lambda device: -1
    cuda.get_rng_state = lambda *a, **k: torch.zeros(16, dtype=torch.uint8)
    cuda.set_rng_state = lambda *a, **k: None
    cuda.random.get_rng_state = cuda.get_rng_state
    cuda.random.set_rng_state = cuda.set_rng_state
    torch._C._cuda_getDevice = lambda: 0
    torch._C._cuda_getCurrentRawStream = lambda *a: 0
    # A CUDA build of torch initialises the device for its first fake CUDA tensor.
    torch._subclasses.fake_tensor.init_gpu_context = lambda device: None

    class Driver:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_device_interface(self):
            return torch.cuda

        def get_active_torch_device(self):
            return torch.device("cuda", 0)

    triton_driver.set_active(Driver())
    triton_utils.triton_backend = lambda: types.SimpleNamespace(hash=lambda: "fake")
    triton_utils.triton_hash_with_backend = lambda: "fake"


def generate(name: str, out: str, inline: bool) -> None:
    cache = tempfile.mkdtemp(prefix="inductor_cuda_code_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    fake_cuda_device()
    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    inductor_config.emulate_precision_casts = True  # as test_compiled_bytes.py sets it
    inductor_config.compile_threads = 1
    if inline:
        # Inline every intermediate into its consumers, as the H200's compile of the FP8 round
        # trip did (one kernel quantising, packing and dequantising), through the whole
        # pipeline. Its constant folding would run ops on the (absent) device, so it is off.
        inductor_config.realize_opcount_threshold = 1 << 20
        inductor_config.realize_reads_threshold = 1 << 20
        inductor_config.realize_acc_reads_threshold = 1 << 20
        inductor_config.joint_graph_constant_folding = False
    fn, inputs = case_inputs(name)
    # Traced on the CPU: this build's Python bindings refuse fake CUDA tensors for some ops
    # (indexing, ~), while the aten ops of a finished graph run on them.
    # Non-fake inputs allowed: a case may compute on its captured rows before passing them
    # through to_device (``t(x.to(dtype))``); that result is dropped for the argument.
    gm = make_fx(
        fn,
        decomposition_table=None if inline else select_decomp_table(),
        tracing_mode="fake",
        _allow_non_fake_inputs=True,
    )(*inputs)
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    for node in gm.graph.nodes:
        if node.kwargs.get("device") == cpu:
            node.kwargs = {**node.kwargs, "device": gpu}
        node.args = tuple(gpu if a == cpu else a for a in node.args)
    gm.recompile()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        args = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=gpu) for t in inputs]
    FakeTensorProp(gm, mode).propagate(*args)
    try:
        with mode:
            (compile_fx if inline else compile_fx_inner)(gm, args)
    except Exception as error:  # loading the kernels needs libcuda; the module is written
        if "libcuda" not in str(error):
            raise
    modules = [
        path
        for path in glob.glob(f"{cache}/**/*.py", recursive=True)
        if "def call(" in pathlib.Path(path).read_text()
    ]
    if not modules:
        raise SystemExit(f"{name}: Inductor wrote no output module under {cache}")
    pathlib.Path(out).write_text(pathlib.Path(max(modules, key=os.path.getmtime)).read_text())


# --- steps 2 and 3: ptx, interpret -----------------------------------------------------------

KERNEL = re.compile(r"async_compile\.triton\('(\w+)', '''(.*?)''', device_str", re.S)


def plain_jit(source: str) -> str:
    """A kernel's source without Inductor's autotuning decorator and driver selection."""
    source = re.sub(r"@triton_heuristics\.\w+\((?:.|\n)*?\n\)\n@triton\.jit", "@triton.jit", source)
    return source.replace("triton_helpers.set_driver_to_gpu()", "")


def kernel_sources(module_text: str) -> list[tuple[str, str]]:
    """``(name, source as Inductor wrote it)`` of each Triton kernel of an output module."""
    return KERNEL.findall(module_text)


def load_kernel(name: str, source: str, folder: str):
    """The kernel's JITFunction, from a file (Triton reads a kernel's source by inspect)."""
    import importlib.util

    path = pathlib.Path(folder) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def ptx(module_path: str) -> None:
    import ast

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    folder = tempfile.mkdtemp(prefix="inductor_cuda_ptx_")
    for name, source in kernel_sources(pathlib.Path(module_path).read_text()):
        signature = ast.literal_eval(re.search(r"'signature': (\{.*?\})", source).group(1))
        constexprs = {arg: 32 for arg, kind in signature.items() if kind == "constexpr"}
        kernel = load_kernel(name, plain_jit(source), folder)
        try:
            compiled = triton.compile(
                ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                target=GPUTarget("cuda", 90, 32),
            )
        except Exception as error:
            print(f"  {name}: does not compile: {error}")
            continue
        (pathlib.Path(folder) / f"{name}.ptx").write_text(compiled.asm["ptx"])
        print(f"  {name}: compiles; PTX in {folder}/{name}.ptx")


# The interpreter does not implement libdevice; these replacements are exact.
LIBDEVICE = [
    (r"libdevice\.isnan\((\w+)\)", r"(\1 != \1)"),
    (r"libdevice\.isinf\((\w+)\)", r"((\1 == float('inf')) | (\1 == float('-inf')))"),
    (r"libdevice\.signbit\((\w+)\)", r"(\1.to(tl.int32, bitcast=True) < 0)"),  # float32 only
]


def one_program_blocks(params: list[str], args: tuple) -> dict[str, int]:
    """Block sizes for one program covering a kernel's whole range: each ``<dim>numel``
    argument sizes its ``<DIM>BLOCK`` (xnumel -> XBLOCK, ynumel -> YBLOCK, r0_numel ->
    R0_BLOCK) to the next power of two. Blocks the kernel fixes itself are not parameters."""
    blocks = {}
    for name, value in zip(params, args):
        block = name[: -len("numel")].upper() + "BLOCK"
        if name.endswith("numel") and block in params:
            blocks[block] = 1 << (value - 1).bit_length()
    return blocks


class InterpretedKernel:
    """``kernel.run(*args, stream=...)`` as Inductor's wrapper calls it, one program."""

    def __init__(self, name: str, source: str, folder: str):
        for pattern, replacement in LIBDEVICE:
            source = re.sub(pattern, replacement, source)
        missing = set(re.findall(r"libdevice\.\w+", source))
        if missing:
            raise SystemExit(f"{name}: no interpreter replacement for {sorted(missing)}")
        self.kernel = load_kernel(name, source, folder)

    def run(self, *args, stream=None):
        import inspect

        params = list(inspect.signature(self.kernel.fn).parameters)
        self.kernel[(1,)](*args, **one_program_blocks(params, args))


class InterpretingCompiler:
    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="inductor_cuda_interp_")

    def triton(self, name, source, device_str=None, **_):
        return InterpretedKernel(name, plain_jit(source), self.folder)

    def wait(self, scope):
        pass


def interpret(name: str, module_path: str) -> int:
    """Run the module on the case's CPU inputs; return the number of differing bytes."""
    import torch

    text = pathlib.Path(module_path).read_text()
    text = text.replace(
        "from torch._C import _cuda_getCurrentRawStream as get_raw_stream",
        "get_raw_stream = lambda device: None",
    )
    text = text.replace("async_compile = AsyncCompile()", "async_compile = _Interpreting()")
    text = text.replace("torch.cuda._DeviceGuard(0)", "_nullcontext()")
    text = text.replace("torch.cuda.set_device(0)", "pass")
    text = text.replace("empty_strided_cuda(", "empty_strided_cpu(")
    scope = {"_Interpreting": InterpretingCompiler, "_nullcontext": contextlib.nullcontext}
    exec(compile(text, module_path, "exec"), scope)
    fn, inputs = case_inputs(name)
    eager = fn(*[t.clone() for t in inputs])
    compiled = scope["call"]([t.clone() for t in inputs])
    total = 0
    for index, (e, c) in enumerate(zip(eager, compiled)):
        e_bytes = e.contiguous().reshape(-1).view(torch.uint8)
        c_bytes = c.contiguous().reshape(-1).view(torch.uint8)
        differ = (e_bytes != c_bytes).nonzero().flatten()
        total += differ.numel()
        if differ.numel():
            at = differ[:8].tolist()
            print(f"  output {index} ({e.dtype}): {differ.numel()} bytes differ, first at {at}")
    return total


def last_line(text: str) -> str:
    return (text.strip().splitlines() or ["(no output)"])[-1]


def main() -> int | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="tricky case names (default: all traceable)")
    parser.add_argument("--ptx", action="store_true", help="also compile the kernels for sm_90")
    parser.add_argument(
        "--inline", action="store_true", help="fuse every intermediate (see generate)"
    )
    parser.add_argument("--step", choices=["generate", "interpret"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step == "generate":
        return generate(args.cases[0], args.out, args.inline)
    if args.step == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"
        sys.exit(OTHER_BYTES if interpret(args.cases[0], args.out) else 0)

    import tricky_inputs

    names = args.cases or [
        n for n in tricky_inputs.tricky_cases(tricky_inputs.tricky_rows()) if n not in UNTRACEABLE
    ]
    folder = tempfile.mkdtemp(prefix="inductor_cuda_code_")
    results = {}
    for name in names:
        module = f"{folder}/{name}.py"
        # Separate processes: the CUDA stubs of `generate` must not reach the interpreter.
        step = [sys.executable, __file__, name, "--out", module, "--step"]
        inline = ["--inline"] if args.inline else []
        generated = subprocess.run([*step, "generate", *inline], capture_output=True, text=True)
        if generated.returncode:
            results[name] = "generation failed: " + last_line(generated.stderr)
            continue
        print(f"{name}: module {module}")
        if args.ptx:
            ptx(module)
        if args.inline:  # the whole pipeline lifts constants into inputs this tool cannot give
            results[name] = "generated (not interpreted with --inline)"
            continue
        ran = subprocess.run([*step, "interpret"], capture_output=True, text=True)
        print(ran.stdout, end="")
        outcome = {0: "same bytes", OTHER_BYTES: "other bytes"}
        results[name] = outcome.get(ran.returncode, "error: " + last_line(ran.stderr))
    print("\ncase                      interpreted CUDA code vs eager CPU")
    for name, result in results.items():
        print(f"{name:25s} {result}")
    # Exit 1 when a case failed to generate or to run, or its bytes differ from eager's.
    passed = ("same bytes", "generated (not interpreted with --inline)")
    return 0 if all(result in passed for result in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
