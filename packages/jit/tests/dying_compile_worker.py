"""A precompile worker that dies (os._exit) on specs labelled "die ...", like a compiler crash.

Run as `python -m dying_compile_worker` by the precompile tests, with this folder on
PYTHONPATH.
"""

from __future__ import annotations

import os

from flashinfer_jit import _worker
from flashinfer_jit.precompile import compile_one


def compile_or_die(spec, arch, cache_dir):
    if spec.label.startswith("die"):
        os._exit(86)
    return compile_one(spec, arch, cache_dir)


if __name__ == "__main__":
    _worker.main(compile_or_die)
