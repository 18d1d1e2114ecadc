"""Compile worker process for `precompile` (`python -m flashinfer_jit._worker`).

Reads `(spec, arch, cache_dir)` frames on stdin, answers one `PrecompileResult` frame each
on the original stdout, and exits at end of input. Anything the compiler prints goes to
stderr so it cannot corrupt the frames.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any


def main(compile_one: Callable[..., Any] | None = None) -> None:
    """Serve compile requests until stdin closes.

    Args:
        compile_one: Called as `compile_one(spec, arch, cache_dir)` for each request;
            default `flashinfer_jit.precompile.compile_one`.
    """
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    protocol_in = sys.stdin.buffer

    from flashinfer_jit.precompile import compile_one as default_compile_one
    from flashinfer_jit.precompile import read_frame, write_frame

    compile_one = compile_one or default_compile_one
    while True:
        try:
            spec, arch, cache_dir = read_frame(protocol_in)
        except EOFError:
            break
        write_frame(protocol_out, compile_one(spec, arch, cache_dir))


if __name__ == "__main__":
    main()
