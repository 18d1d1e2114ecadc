"""Static checks of the kernel sources that no GPU test can see."""

from __future__ import annotations

import re
import subprocess
import sys
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


def test_the_work_unit_is_one_size_in_the_schedule_the_launchers_and_the_kernels():
    # A work unit is 64 KV tokens: the schedule's unit (flashinfer_schedule), what the
    # launchers size shared memory and TMA boxes by (fp8_sm90, which fp4_sm90 imports), and
    # the kernels' kTile, fixed by WGMMA's M. A schedule row's unit index means nothing to a
    # kernel whose tile is another size.
    import flashinfer_schedule
    from flashinfer_attn_scores.paged_mqa_logits import fp4_sm90, fp8_sm90

    header = (CSRC / "paged_mqa_common.cuh").read_text()
    tiles = re.findall(r"^\s*constexpr\s+int\s+kTile\s*=\s*(\d+)\s*;", header, re.MULTILINE)
    assert len(tiles) == 1, f"expected one `constexpr int kTile = N;` in the header, got {tiles}"
    assert (
        int(tiles[0])
        == fp8_sm90.TOKENS_PER_UNIT
        == fp4_sm90.TOKENS_PER_UNIT
        == flashinfer_schedule.SCHEDULE_TOKENS_PER_UNIT
        == 64
    )


def test_the_launchers_take_the_work_unit_from_the_schedule_package():
    # One definition in Python: with the schedule's unit changed before the launchers are
    # imported (a fresh interpreter), fp8_sm90 and fp4_sm90 follow it.
    script = (
        "import flashinfer_schedule\n"
        "flashinfer_schedule.SCHEDULE_TOKENS_PER_UNIT = 128\n"
        "from flashinfer_attn_scores.paged_mqa_logits import fp4_sm90, fp8_sm90\n"
        "print(fp8_sm90.TOKENS_PER_UNIT, fp4_sm90.TOKENS_PER_UNIT)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["128", "128"]
