"""SASS instructions on a logits kernel's unit path, compiled here with NVRTC (no GPU needed).

    python tools/unit_path.py "fp4_paged_mqa_logits[bs=64, next_n=1, out=bfloat16, epi=float32]"
    python tools/unit_path.py "fp8_paged_mqa_logits[bs=64, next_n=2" -D EXP_PHASES=1
    python tools/unit_path.py --sass-file kernel.sass       # count an existing nvdisasm dump
    python tools/unit_path.py --sass-hash [label] > before.txt  # one hash per configuration

A configuration is picked by the start of its label (the labels `python -m flashinfer_jit
compile-check` prints); -D adds or replaces a define (a kernel's measurement knob). For each
match it prints registers, spills and the instruction count of the unit path: the innermost
loop that holds the consumer's first WGMMA (from the loop's label to its backward branch, the
full-barrier wait included), then that loop's opcodes by count. The kernel notes' "SASS
instructions on the unit path" tables come from here. nvdisasm comes from a CUDA toolkit on
PATH or `pip install nvidia-cuda-nvdisasm` (see `python -m flashinfer_jit inspect --sass`).

`--sass-hash` prints instead one line per matching configuration (every one without a label):
a hash of its instructions and its label. Two such files from two trees, compared with `diff`,
show whether a source change (a refactor, a comment, a moved definition) changed any SASS.
`--counts` prints one line per matching configuration: its unit-path instruction count,
registers, spill-store bytes and label; two such files show what a change did to every
configuration, including the ones no benchmark times (the forty-fourth round of the kernel
notes found two slow configurations this way).

    python tools/unit_path.py --counts -j 2 > counts.txt        # every configuration
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path

_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_BRANCH_TARGET = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")


def unit_path(sass: str) -> list[str]:
    """The instructions of the innermost loop around the first GMMA of `sass` (nvdisasm text)."""
    items: list[tuple[str, str]] = []  # ("label", name) or ("ins", text)
    for line in sass.splitlines():
        if match := _LABEL.match(line):
            items.append(("label", match.group(1)))
        elif match := _INSTRUCTION.match(line):
            items.append(("ins", match.group(1)))
    first_mma = next(
        (i for i, (kind, text) in enumerate(items) if kind == "ins" and "GMMA" in text), None
    )
    if first_mma is None:
        raise ValueError("no GMMA instruction in this SASS")
    for end in range(first_mma, len(items)):
        kind, text = items[end]
        branch = _BRANCH_TARGET.search(text) if kind == "ins" else None
        if branch is None:
            continue
        start = next(
            (i for i in range(first_mma, -1, -1) if items[i] == ("label", branch.group(1))), None
        )
        if start is not None:  # the first backward branch over the GMMA closes the innermost loop
            return [text for kind, text in items[start : end + 1] if kind == "ins"]
    raise ValueError("no loop around the first GMMA")


def opcode(instruction: str) -> str:
    """`@!P0 SYNCS.ARRIVE.TRANS64 ...` -> `SYNCS`."""
    words = instruction.split()
    if words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0]


def report(name: str, sass: str, out) -> None:
    body = unit_path(sass)
    counts = Counter(opcode(instruction) for instruction in body)
    out.write(f"{name}: {len(body)} instructions\n")
    out.write("  " + ", ".join(f"{op} {n}" for op, n in counts.most_common()) + "\n")


def sass_hash(sass: str) -> str:
    """A hash of the instructions and branch labels of `sass` (nvdisasm text), without the
    header lines, which name the cubin rather than its code."""
    kept = [
        line.strip() for line in sass.splitlines() if _INSTRUCTION.match(line) or _LABEL.match(line)
    ]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()[:16]


def _compiled(label: str, arch: str):
    from flashinfer_attn_scores.paged_mqa_logits.kernel_specs import all_kernel_specs
    from flashinfer_jit import compile_kernel

    spec = next(spec for spec in all_kernel_specs() if spec.label == label)
    return compile_kernel(spec, arch)


def _hash_line(label: str, arch: str) -> str:
    return f"{sass_hash(_sass_of(_compiled(label, arch).cubin))} {label}"


def _count_line(label: str, arch: str) -> str:
    compiled = _compiled(label, arch)
    resources = compiled.resources
    count = len(unit_path(_sass_of(compiled.cubin)))
    return f"{count:4d} {resources.registers:3d} {resources.spill_store_bytes:3d} {label}"


def _sass_of(cubin: bytes) -> str:
    from flashinfer_jit.cli import disassemble

    disassembled = disassemble(cubin)
    if disassembled is None or disassembled[0] != "nvdisasm":  # cuobjdump prints no branch labels
        sys.exit(
            "nvdisasm not found: pip install nvidia-cuda-nvdisasm, or put a CUDA toolkit's bin/ on PATH"
        )
    result = disassembled[1]
    result.check_returncode()
    return result.stdout


def _define(text: str) -> tuple[str, int | str]:
    name, _, value = text.partition("=")
    return name, int(value) if value.lstrip("-").isdigit() else value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("label", nargs="?", help="start of a configuration's label")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--sass-file", type=Path, help="count this nvdisasm output instead")
    parser.add_argument(
        "--sass-hash", action="store_true", help="print a hash of each configuration's SASS"
    )
    parser.add_argument(
        "--counts",
        action="store_true",
        help="print each configuration's unit-path count, registers and spill-store bytes",
    )
    parser.add_argument(
        "-j", "--jobs", type=int, default=os.cpu_count(), help="with --sass-hash or --counts"
    )
    args = parser.parse_args()
    if args.sass_file is not None:
        report(f"{args.sass_file}, unit path", args.sass_file.read_text(), sys.stdout)
        return 0
    if args.sass_hash and args.counts:
        parser.error("--sass-hash and --counts print one line per configuration each: pick one")
    if not args.label and not args.sass_hash and not args.counts:
        parser.error("give a label, --sass-file, --sass-hash or --counts")

    from flashinfer_attn_scores.paged_mqa_logits.kernel_specs import all_kernel_specs
    from flashinfer_jit import compile_kernel

    specs = [spec for spec in all_kernel_specs() if spec.label.startswith(args.label or "")]
    if not specs:
        sys.exit(f"no configuration's label starts with {args.label!r}")
    if args.sass_hash or args.counts:
        if args.defines:
            parser.error("--sass-hash and --counts take the configurations as registered; drop -D")
        line_of = _hash_line if args.sass_hash else _count_line
        if args.counts:
            print("path regs spill label")
        with ProcessPoolExecutor(max(1, args.jobs)) as pool:
            for line in pool.map(line_of, [spec.label for spec in specs], repeat(args.arch)):
                print(line, flush=True)
        return 0
    for spec in specs:
        if args.defines:
            spec = spec.with_defines(**dict(_define(text) for text in args.defines))
        compiled = compile_kernel(spec, args.arch)
        resources = compiled.resources
        print(
            f"{spec.label}: {resources.registers} registers, spills {resources.spill_store_bytes} bytes "
            f"stores / {resources.spill_load_bytes} bytes loads"
        )
        report("  unit path", _sass_of(compiled.cubin), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
