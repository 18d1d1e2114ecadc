"""Run a Python module or script with the NVRTC of another CUDA toolkit, on the CPU.

    python tools/with_nvrtc.py DIR -m flashinfer_jit compile-check --arch sm_90a
    python tools/with_nvrtc.py DIR tools/unit_path.py "fp4_paged_mqa_logits[bs=64, next_n=3"

DIR holds `libnvrtc.so.13` and `libnvrtc-builtins.so.*` (the `nvidia/cu13/lib` folder of a
`pip download nvidia-cuda-nvrtc==13.0.88` wheel, unpacked). They are loaded before cuda-bindings
opens its own, so every compile in this process uses them; that is how the kernel notes compared
the GPU image's NVRTC 13.0.88 with CI's newest 13.x on a machine without a GPU. The same files go
into `LD_PRELOAD` for the processes it starts, so `compile-check`'s and `precompile`'s worker
processes compile with them too (without that, they loaded the default NVRTC again, and
`compile-check --jobs 2` reported NVRTC 13.5's spills under the banner of 13.0). The headers stay
those of the installed `nvidia-cuda-cccl` and runtime.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import sys
from pathlib import Path


def preload(folder: Path) -> tuple[int, int]:
    """Load DIR's NVRTC into this process (globally) and into the processes it starts; return
    the version cuda-bindings sees."""
    builtins = sorted(folder.glob("libnvrtc-builtins.so*"))
    library = folder / "libnvrtc.so.13"
    if not builtins or not library.is_file():
        raise SystemExit(f"{folder}: needs libnvrtc.so.13 and libnvrtc-builtins.so.*")
    preloaded = [str(path.resolve()) for path in [*builtins, library]]
    if any(":" in path or " " in path for path in preloaded):  # LD_PRELOAD's separators
        raise SystemExit(f"{folder}: a path with ':' or ' ' cannot go into LD_PRELOAD")
    for path in preloaded:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    # Child processes (compile workers) map the same files before cuda-bindings looks for NVRTC.
    os.environ["LD_PRELOAD"] = ":".join(filter(None, [*preloaded, os.environ.get("LD_PRELOAD")]))
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return major, minor


def main() -> None:
    if len(sys.argv) < 3 or (sys.argv[2] == "-m" and len(sys.argv) < 4):
        raise SystemExit(__doc__)
    major, minor = preload(Path(sys.argv[1]))
    print(f"with_nvrtc: NVRTC {major}.{minor} from {sys.argv[1]}", file=sys.stderr, flush=True)
    if sys.argv[2] == "-m":
        sys.argv = [sys.argv[3], *sys.argv[4:]]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[2:]
        sys.path.insert(0, str(Path(sys.argv[0]).resolve().parent))
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
