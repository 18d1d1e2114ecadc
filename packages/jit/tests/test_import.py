"""Importing flashinfer_jit is cheap and leaves CUDA alone."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys, time
start = time.perf_counter()
import flashinfer_jit
seconds = time.perf_counter() - start
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "cuda.")))
import torch
print(json.dumps({"seconds": seconds, "heavy": heavy,
                  "cuda_initialized": torch.cuda.is_initialized()}))
"""


def test_import_is_cheap_and_does_not_initialise_cuda(record_property):
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    record_property("import_seconds", probe["seconds"])
    print(f"import flashinfer_jit: {probe['seconds'] * 1e3:.0f} ms (target < 500 ms)")
    assert probe["heavy"] == []  # neither torch nor cuda.* is imported by the package
    assert probe["cuda_initialized"] is False
    assert probe["seconds"] < 5.0  # only a gross regression fails; the target is reported
