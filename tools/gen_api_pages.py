"""Write docs/api/<package>.md from each package's `__all__`, or check that they are current.

    python tools/gen_api_pages.py          # rewrite the pages
    python tools/gen_api_pages.py --check  # exit 1 if a page differs from what would be written

Every public name gets a mkdocstrings `:::` entry on the page of the package that defines it.
A name a package re-exports from another package (the schedule helpers in
`flashinfer_attn_scores`) is listed as a link to its defining page instead, so each object is
rendered once and cross-references stay unambiguous.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path

DOCS_API = Path(__file__).resolve().parent.parent / "docs" / "api"

# import name -> (page file, distribution, one-paragraph introduction)
PACKAGES = {
    "flashinfer_attn_scores": (
        "attn_scores.md",
        "flashinfer-attn-scores",
        "Paged MQA logits (the DeepSeek-V3.2 sparse-attention indexer) over FP8 and MXFP4 paged "
        "KV caches. CUDA tensors on SM90 run the Hopper kernels; CPU tensors run the float64 "
        "reference through the same validation. The readable reference of the exact contract is "
        "importable from `flashinfer_attn_scores.paged_mqa_logits.reference`.",
    ),
    "flashinfer_schedule": (
        "schedule.md",
        "flashinfer-schedule",
        "Size helpers and the CTA schedule of the paged MQA logits kernels. "
        "`flashinfer_attn_scores` re-exports the helpers a caller needs, so ported code can use "
        "either import.",
    ),
    "flashinfer_layouts": (
        "layouts.md",
        "flashinfer-layouts",
        "Pack, quantise and unpack every cache format of the kernels in pure PyTorch, on CPU and "
        "CUDA tensors. The byte layouts are drawn in [Cache layouts](../layouts.md).",
    ),
    "flashinfer_jit": (
        "jit.md",
        "flashinfer-jit",
        "Run-time compilation of the CUDA C++ kernels with NVRTC, the on-disk kernel cache and "
        "launches on the current PyTorch stream. See [JIT runtime](../jit.md) for the design.",
    ),
}

# Extra modules whose public functions are documented on a package's page.
EXTRA_MODULES = {
    "flashinfer_attn_scores": ["flashinfer_attn_scores.paged_mqa_logits.reference"],
}


def _defining_package(obj: object, package: str) -> str:
    module = getattr(obj, "__module__", None)
    if not (inspect.isfunction(obj) or inspect.isclass(obj)) or not module:
        return package  # constants and other values: documented where they are exported
    return module.split(".")[0]


def _entries(module_name: str, package: str) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """(callables, constants, re-exports as (name, defining package)) of a module's __all__."""
    module = importlib.import_module(module_name)
    names = [n for n in getattr(module, "__all__", []) if not n.startswith("_")]
    callables, constants, reexports = [], [], []
    for name in names:
        obj = getattr(module, name)
        owner = _defining_package(obj, package)
        if owner != package:
            reexports.append((name, owner))
        elif callable(obj):
            callables.append(name)
        else:
            constants.append(name)
    return callables, constants, reexports


def render(package: str) -> str:
    _, distribution, intro = PACKAGES[package]
    lines = [f"# {package}", "", intro, "", "```bash", f"pip install {distribution}", "```", ""]
    callables, constants, reexports = _entries(package, package)
    lines += _directives(package, callables)
    for module_name in EXTRA_MODULES.get(package, []):
        extra, _, _ = _entries(module_name, package)
        if extra:
            lines += [f"## `{module_name}`", "", *_directives(module_name, extra)]
    if constants:
        lines += ["## Constants", "", *_directives(package, constants)]
    if reexports:
        lines += ["## Re-exported", "", "| name | defined in |", "|---|---|"]
        for name, owner in reexports:
            owner_page = PACKAGES[owner][0] if owner in PACKAGES else None
            target = f"[`{owner}`]({owner_page}#{owner}.{name})" if owner_page else f"`{owner}`"
            lines.append(f"| `{package}.{name}` | {target} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _directives(module_name: str, names: list[str]) -> list[str]:
    lines: list[str] = []
    for name in names:
        lines += [f"::: {module_name}.{name}", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale pages")
    args = parser.parse_args(argv)
    stale = []
    for package, (page, _, _) in PACKAGES.items():
        path = DOCS_API / page
        text = render(package)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("stale API pages (run python tools/gen_api_pages.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
