"""tools/pinned_toolchain.py: a pinned process loads the carried cache's kernels, keys them by
the recorded toolchain, and refuses to compile what the cache lacks (NVRTC, no GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent / "tools"

# Runs in a fresh interpreter, pinned (or not) by the sitecustomize.py on its PYTHONPATH.
PROBE = """
from flashinfer_jit.compiler import compile_kernel
from flashinfer_jit.selftest import EMPTY, SCALE_ADD
for spec in (SCALE_ADD, EMPTY):
    try:
        print(spec.name, "cached" if compile_kernel(spec, "sm_90a").from_cache else "compiled")
    except RuntimeError as exc:
        print(spec.name, "refused" if "not in the carried cache" in str(exc) else exc)
"""


def _probe(root: Path, pinned: bool) -> dict[str, str]:
    env = dict(os.environ)
    # The documented setup: the pin folder on the path, not the checkout's tools/ (dropped
    # from an inherited PYTHONPATH, which would otherwise make the pin importable anyway).
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    kept = [p for p in inherited if Path(p).resolve() != TOOLS]
    env["PYTHONPATH"] = os.pathsep.join([str(root), *kept])
    env["FLASHINFER_JIT_CACHE_DIR"] = str(root / "cache")
    env.pop("FLASHINFER_JIT_PINNED_TOOLCHAIN", None)
    if pinned:
        env["FLASHINFER_JIT_PINNED_TOOLCHAIN"] = str(root / "toolchain.json")
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


def test_pinned_process_uses_the_recorded_toolchain_and_never_compiles(tmp_path: Path) -> None:
    import pinned_toolchain
    from flashinfer_jit.compiler import compile_kernel
    from flashinfer_jit.selftest import SCALE_ADD

    compile_kernel(SCALE_ADD, "sm_90a", cache_dir=tmp_path / "cache")  # the carried cache
    pinned_toolchain.write_pin_files(tmp_path)

    assert _probe(tmp_path, pinned=True) == {"scale_add": "cached", "empty_kernel": "refused"}

    # Another recorded toolchain changes every key: the same cubin is no longer found.
    fingerprint = dict(json.loads((tmp_path / "toolchain.json").read_text()))
    fingerprint["nvrtc"] = "13.99"
    (tmp_path / "toolchain.json").write_text(json.dumps(sorted(fingerprint.items())))
    assert _probe(tmp_path, pinned=True) == {"scale_add": "refused", "empty_kernel": "refused"}

    # Without the environment variable the same sitecustomize.py leaves the process alone.
    assert _probe(tmp_path, pinned=False) == {"scale_add": "cached", "empty_kernel": "compiled"}
