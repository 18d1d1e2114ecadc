"""Static checks of the kernel sources that no GPU test can see."""

from __future__ import annotations

import re
from pathlib import Path

import flashinfer_attn_scores.paged_mqa_logits as paged_mqa_logits

CSRC = Path(paged_mqa_logits.__file__).parent / "csrc"
# `bar.sync` / `bar.arrive` / `barrier.sync.aligned` in inline PTX: the .aligned barriers.
ALIGNED_NAMED_BARRIER = re.compile(
    r"\bbar\.(sync|arrive|red)\b|\bbarrier\.(sync|arrive|red)\.aligned\b"
)


def test_inline_ptx_barriers_are_not_aligned():
    # An .aligned barrier requires every participating thread to execute the same barrier
    # instruction. Code that runs per request is inlined at several places of the walk, and warps
    # reach the same request at different ones, so the staging warps' barrier must be the
    # non-aligned `barrier.sync` (compute-sanitizer synccheck reported the .aligned one on the
    # H200, 2026-11-30). __syncthreads() is not inline PTX and is not affected by this check.
    sources = sorted(CSRC.glob("*.cu")) + sorted(CSRC.glob("*.cuh"))
    assert sources, f"no kernel sources under {CSRC}"
    offenders = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ALIGNED_NAMED_BARRIER.search(line) and not line.lstrip().startswith("//")
    ]
    assert not offenders, "aligned barriers in inline PTX:\n" + "\n".join(offenders)
