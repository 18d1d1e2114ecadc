"""tools/sanitizer_controls.py: every planted bug still applies to the kernel sources, each
sanitizer tool has one, and a control's verdict is read from the tool's summary line (a report
is "reported", a clean run "SILENT", a run without a summary an error), with the kernel filter
and the tool passed to compute-sanitizer."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest


def _controls():
    import sanitizer_controls

    return sanitizer_controls


def test_every_control_applies_once_and_each_tool_has_one() -> None:
    sc = _controls()
    names = [c.mutant.name for c in sc.CONTROLS]
    assert len(names) == len(set(names))
    assert {c.tool for c in sc.CONTROLS} == {"memcheck", "racecheck", "synccheck"}
    for control in sc.CONTROLS:
        sc.check_applies(control.mutant)  # raises unless the text occurs exactly once
        assert control.mutant.new != control.mutant.old, control.mutant.name


def test_controls_reach_their_code_paths() -> None:
    sc = _controls()
    by_tool = {c.tool: c for c in sc.CONTROLS}
    # The block-wide scan only runs for more than 128 requests; the warp scan up to 128.
    assert by_tool["racecheck"].calls[by_tool["racecheck"].calls.index("--batches") + 1] == "large"
    assert by_tool["synccheck"].calls[by_tool["synccheck"].calls.index("--batches") + 1] == "small"
    # Out-of-bounds writes are only seen at exact bounds: one allocation per tensor.
    assert by_tool["memcheck"].no_caching_allocator


@pytest.mark.parametrize(
    ("log", "count"),
    [
        ("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 320 errors\n", 320),
        ("========= ERROR SUMMARY: 1 error\n", 1),
        ("========= ERROR SUMMARY: 0 errors\n", 0),
        ("========= RACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 warnings)\n", 3),
        ("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n", 0),
        ("========= COMPUTE-SANITIZER\nrandom cases: 6 of 6 passed\n", None),
    ],
)
def test_reported_reads_the_summary_line(log: str, count: int | None) -> None:
    assert _controls().reported(log) == count


def _fake_sanitizer(tmp_path: Path, printed: str) -> Path:
    """A stand-in for compute-sanitizer: records its arguments, prints `printed` (a printf
    format: no % or single quote)."""
    script = tmp_path / "fake-sanitizer"
    script.write_text(f"#!/bin/sh\necho \"args: $*\"\nprintf '{printed}'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


@pytest.mark.parametrize(
    ("printed", "verdict"),
    [
        (
            "========= Invalid __global__ write of size 4 bytes\\n========= ERROR SUMMARY: 5 errors\\n",
            "reported",
        ),
        ("========= ERROR SUMMARY: 0 errors\\n", "SILENT"),
        ("no summary\\n", "error"),
    ],
)
def test_check_gives_the_verdict_of_the_summary(tmp_path, printed: str, verdict: str) -> None:
    sc = _controls()
    control = next(c for c in sc.CONTROLS if c.tool == "memcheck")
    logs = tmp_path / "logs"
    logs.mkdir()
    got, detail, _ = sc.check(
        control, str(_fake_sanitizer(tmp_path, printed)), "paged_mqa", 60, logs
    )
    assert got == verdict, detail
    if verdict == "reported":
        assert detail == "5: Invalid __global__ write of size 4 bytes"
    log = (logs / f"{control.mutant.name}.log").read_text()
    assert "--tool memcheck" in log and "--kernel-name kns=paged_mqa" in log
    assert "tools/random_cases.py" in log and "--report-api-errors no" in log


def test_no_kernel_filter_when_kernels_is_empty(tmp_path) -> None:
    sc = _controls()
    control = next(c for c in sc.CONTROLS if c.tool == "synccheck")
    sanitizer = _fake_sanitizer(tmp_path, "========= ERROR SUMMARY: 0 errors\\n")
    sc.check(control, str(sanitizer), "", 60, tmp_path)
    log = (tmp_path / f"{control.mutant.name}.log").read_text()
    assert "--tool synccheck" in log and "--kernel-name" not in log


def test_every_planted_bug_compiles_and_changes_the_cubin() -> None:
    """NVRTC on the CPU: a kernel edit that leaves a control's text in place but its code dead
    (the cubin unchanged) or uncompilable would make the control's next GPU run meaningless."""
    tools = Path(__file__).resolve().parent.parent / "tools"
    done = subprocess.run(
        [sys.executable, str(tools / "sanitizer_controls.py"), "--compile-only"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ok = [line for line in done.stdout.splitlines() if line.startswith("ok ")]
    assert len(ok) == len(_controls().CONTROLS), done.stdout
