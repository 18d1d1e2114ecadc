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
import importlib.util
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

# Modules whose docstring is shown at the head of their section (a policy or layout the
# functions' docstrings refer to).
MODULE_DOCSTRINGS = {"flashinfer_schedule.schedule"}

# Extra modules whose public functions are documented on a package's page.
EXTRA_MODULES = {
    "flashinfer_attn_scores": ["flashinfer_attn_scores.paged_mqa_logits.reference"],
}

# Section titles, in page order, of the modules that define public functions. A module not
# listed here gets its dotted name as the title and goes after the listed ones.
MODULE_TITLES = {
    "flashinfer_attn_scores.paged_mqa_logits.api": "Paged MQA logits",
    "flashinfer_attn_scores.paged_mqa_logits.precompile": "Precompiling",
    "flashinfer_attn_scores.paged_mqa_logits.reference": "Reference implementation",
    "flashinfer_schedule.sizes": "Size helpers",
    "flashinfer_schedule.schedule": "CTA schedule",
    "flashinfer_layouts.fp8": "FP8 per-token indexer cache",
    "flashinfer_layouts.mxfp4": "MXFP4: q, q_sf and kv_fused",
    "flashinfer_layouts.write": "Serving write path",
    "flashinfer_layouts.nvfp4": "NVFP4 quantisation and the 128x4 scale swizzle",
    "flashinfer_layouts.msa_page": "The packed NVFP4 MSA page",
    "flashinfer_jit.spec": "Kernel specifications",
    "flashinfer_jit.compiler": "Compiling",
    "flashinfer_jit.kernel": "Loading and launching",
    "flashinfer_jit.precompile": "Precompiling",
    "flashinfer_jit.scalars": "Typed scalar arguments",
    "flashinfer_jit.tma": "TMA descriptors",
    "flashinfer_jit.device": "Device queries",
    "flashinfer_jit.cache": "Kernel cache",
    "flashinfer_jit.resources": "Kernel resources",
    "flashinfer_jit.errors": "Errors",
}


def _defining_module(obj: object) -> str | None:
    """The module that defines a function or class; None for constants and other values."""
    if inspect.isfunction(obj) or inspect.isclass(obj):
        return obj.__module__
    return None


def _source_line(obj: object) -> int:
    try:
        return inspect.getsourcelines(obj)[1]  # type: ignore[arg-type]
    except (OSError, TypeError):
        return 0


def _sections(module_name: str, package: str) -> tuple[dict[str, list[str]], list[str], list]:
    """Public names of a module's `__all__`: callables grouped by defining module (in source
    order), constants, and re-exports from other packages as (name, defining package)."""
    module = importlib.import_module(module_name)
    names = [n for n in getattr(module, "__all__", []) if not n.startswith("_")]
    groups: dict[str, list[tuple[int, str]]] = {}
    constants, reexports = [], []
    for name in names:
        obj = getattr(module, name)
        owner = _defining_module(obj)
        if owner is None:
            constants.append(name)
        elif owner.split(".")[0] != package:
            reexports.append((name, owner.split(".")[0]))
        else:
            groups.setdefault(owner, []).append((_source_line(obj), name))
    order = list(MODULE_TITLES)
    ranked = sorted(groups, key=lambda m: (order.index(m) if m in order else len(order), m))
    return {m: [name for _, name in sorted(groups[m])] for m in ranked}, constants, reexports


def _directives(module_name: str, names: list[str]) -> list[str]:
    lines: list[str] = []
    module = importlib.import_module(module_name)
    for name in names:
        path = f"{module_name}.{name}"
        obj = getattr(module, name)
        if hasattr(module, "__path__") and importlib.util.find_spec(path) is not None:
            # A function re-exported over its own submodule's name (`flashinfer_jit.precompile`):
            # mkdocstrings would resolve the path to the module, so name the definition, and
            # head it with the name that works at run time (the package attribute is the
            # function, so `flashinfer_jit.precompile.precompile` raises AttributeError).
            lines += [
                f"::: {obj.__module__}.{obj.__qualname__}",
                "    options:",
                f"      heading: {path}",
                "",
            ]
            continue
        lines += [f"::: {path}", ""]
    return lines


def render(package: str) -> str:
    """The Markdown of one package's API page."""
    _, distribution, intro = PACKAGES[package]
    lines = [f"# {package}", "", intro, "", "```bash", f"pip install {distribution}", "```", ""]
    groups, constants, reexports = _sections(package, package)
    for module_name in EXTRA_MODULES.get(package, []):
        extra, _, _ = _sections(module_name, package)
        groups.update({f"{module_name}:{m}": names for m, names in extra.items()})
    for key, names in groups.items():
        shown_as, _, defined_in = key.partition(":")
        title = MODULE_TITLES.get(defined_in or shown_as, defined_in or shown_as)
        if defined_in:
            lines += [f"## {title}", "", f"Importable from `{shown_as}`.", ""]
            lines += _directives(shown_as, names)
        else:
            lines += [f"## {title}", ""]
            if shown_as in MODULE_DOCSTRINGS:
                lines += [
                    f"::: {shown_as}",
                    "    options:",
                    "      members: false",
                    "      show_root_heading: false",
                    "      show_root_toc_entry: false",
                    "",
                ]
            lines += _directives(package, names)
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
