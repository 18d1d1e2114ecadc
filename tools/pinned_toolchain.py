"""Run the kernels another NVRTC built: a carried kernel cache and its toolchain, pinned.

The device image compiles with its own NVRTC (13.0.88, paired with its CUDA 13.0 PyTorch),
while `pip install` on a machine without such a pin resolves the newest 13.x wheel. To run
what those users get on the GPU, build the cache here and carry it:

    python tools/pinned_toolchain.py build DIR [--fp8 300 --fp4 200 --first-seed S ...]

compiles, with this machine's NVRTC and headers, the schedule package's kernels, the
configurations of the given random-case seeds (`tools/random_cases.py`'s draws) and of the
`tools/tree_ab.py` shapes given with `--ab-shapes` (every registered configuration with
`--registered`) into `DIR/cache`, and records this machine's toolchain fingerprint in
`DIR/toolchain.json`. On the GPU machine, with `DIR` on `PYTHONPATH` and

    FLASHINFER_JIT_CACHE_DIR=DIR/cache FLASHINFER_JIT_PINNED_TOOLCHAIN=DIR/toolchain.json

the `sitecustomize.py` written beside them (with a copy of this module, which it imports)
calls `pin()`: every cache key then carries the
recorded fingerprint, so the carried cubins are the ones loaded, and a configuration missing
from the cache raises instead of being compiled by the local NVRTC under the recorded name.
That `sitecustomize.py` hides the interpreter's own (the device image has one, from its Linux
distribution); nothing these runs do needed it.

An A/B of the two compilers on one GPU (`tools/tree_ab.py` puts each tree's `tools/` on its
child's path, so only the copy is pinned; the old tree compiles its own keys into the same cache):

    cp -r DIR/cache /tmp/cache && mkdir /tmp/new && cp -r packages tools /tmp/new/
    cp DIR/sitecustomize.py /tmp/new/tools/
    FLASHINFER_JIT_CACHE_DIR=/tmp/cache FLASHINFER_JIT_PINNED_TOOLCHAIN=$PWD/DIR/toolchain.json \\
        python tools/tree_ab.py . /tmp/new [--single]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

SITECUSTOMIZE = '''\
"""Written by tools/pinned_toolchain.py: pins flashinfer_jit to a carried toolchain's cache."""
import os

if os.environ.get("FLASHINFER_JIT_PINNED_TOOLCHAIN"):
    import pinned_toolchain

    pinned_toolchain.pin(os.environ["FLASHINFER_JIT_PINNED_TOOLCHAIN"])
'''


def pin(fingerprint_file: str) -> None:
    """Make this process's cache keys use the recorded fingerprint and refuse to compile."""
    import flashinfer_jit.compiler as compiler
    import flashinfer_jit.toolchain as toolchain

    recorded = json.loads(Path(fingerprint_file).read_text())
    pinned = tuple((str(name), str(version)) for name, version in recorded)
    toolchain.toolchain_fingerprint = lambda: pinned

    def refuse(spec, arch, source_text):
        raise RuntimeError(
            f"pinned toolchain {dict(pinned)['nvrtc']}: {spec.label} for {arch} is not in the"
            " carried cache, and compiling it here would store another NVRTC's cubin under"
            " the pinned key"
        )

    compiler._nvrtc_compile = refuse
    print(f"pinned toolchain: {dict(pinned)}", file=sys.stderr, flush=True)


def random_case_specs(args: argparse.Namespace) -> list:
    """The kernel specs of `tools/random_cases.py`'s seeds (its draws, its config mapping)."""
    import random_cases
    from flashinfer_attn_scores.paged_mqa_logits import launcher

    configs = {
        random_cases.kernel_config(
            variant, random_cases.draw_call(seed, variant, args.shapes, args.batches)
        )
        for variant, seed in random_cases.planned_runs(args.first_seed, args.fp8, args.fp4)
    }
    return [launcher.config_spec(c) for c in configs]


def tree_ab_specs(shapes: str) -> list:
    """The kernel specs `tools/tree_ab.py` times for `shapes` (its shape syntax; float32 out)."""
    import torch
    import tree_ab
    from flashinfer_attn_scores.paged_mqa_logits import fp4_sm90, fp8_sm90

    specs = []
    for shape in filter(None, shapes.split(",")):
        op, *fields = shape.split(":")
        next_n, block_size = int(fields[0]), int(fields[1])
        extras = fields[4:]
        epi, acc = (getattr(torch, name) for name in tree_ab.dtype_names(extras))
        if op == "fp4":
            config = fp4_sm90.fp4_config(block_size, next_n, torch.float32, epi, "sfi" in extras)
        else:
            config = fp8_sm90.fp8_config(block_size, 128, 64, next_n, torch.float32, epi, acc)
        specs.append(config.spec)
    return specs


def build(args: argparse.Namespace) -> int:
    from flashinfer_jit import precompile
    from flashinfer_jit.registry import discover_registered_specs
    from flashinfer_jit.toolchain import toolchain_fingerprint

    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    wanted = None if args.registered else {"flashinfer-schedule"}
    specs = [
        spec
        for source in discover_registered_specs()
        if wanted is None or source.name.split()[0] in wanted
        for spec in source.specs
    ]
    specs += random_case_specs(args) + tree_ab_specs(args.ab_shapes)
    summary = precompile(specs, arch="sm_90a", cache_dir=root / "cache", progress=False)
    print(summary)
    write_pin_files(root)
    print(f"{root}: toolchain {dict(toolchain_fingerprint())}")
    return 0 if not summary.failures else 1


def write_pin_files(root: Path) -> None:
    """Record this machine's toolchain fingerprint and the `sitecustomize.py` that pins it,
    with a copy of this module for it to import, so `root` alone on `PYTHONPATH` pins."""
    from flashinfer_jit.toolchain import toolchain_fingerprint

    (root / "toolchain.json").write_text(json.dumps([list(x) for x in toolchain_fingerprint()]))
    (root / "sitecustomize.py").write_text(SITECUSTOMIZE)
    shutil.copyfile(__file__, root / "pinned_toolchain.py")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="compile the cache to carry")
    build_parser.add_argument("dir")
    build_parser.add_argument("--fp8", type=int, default=0, help="random_cases fp8 seeds")
    build_parser.add_argument("--fp4", type=int, default=0, help="random_cases fp4 seeds")
    build_parser.add_argument("--first-seed", type=int, default=100000)
    build_parser.add_argument("--shapes", choices=("suite", "wide"), default="suite")
    build_parser.add_argument("--batches", choices=("small", "large"), default="small")
    build_parser.add_argument("--ab-shapes", default="", help="tools/tree_ab.py shapes")
    build_parser.add_argument(
        "--registered", action="store_true", help="every registered configuration too"
    )
    args = parser.parse_args()
    return build(args)


if __name__ == "__main__":
    sys.exit(main())
