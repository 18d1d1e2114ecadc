"""The benchmark's CPU path runs end to end: reference-checked results in its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_bench_cpu_quick_writes_checked_results(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "bench"),
            "--quick",
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "need an SM90 (Hopper) GPU" in proc.stdout

    payload = json.loads((out / "results.json").read_text())
    assert payload["mode"] == "cpu-reference"
    assert payload["torch"]
    results = payload["results"]
    assert {r["op"] for r in results} == {"fp8", "fp4"}
    for r in results:
        assert r["status"] == "PASS", r
        check = r["check"]
        assert check["unwritten"] == 0
        assert 0.0 <= check["max_error"] <= check["tolerance"]
        assert r["timing"]["median_us"] > 0
        # The byte model: 132 B (fp8) or 68 B (fp4) per KV token, plus next_n outputs.
        work = r["work"]
        per_token = 132 if r["op"] == "fp8" else 68
        assert work["kv_bytes"] == per_token * work["kv_tokens"]
        assert work["flops"] == 2 * r["num_heads"] * r["head_dim"] * r["next_n"] * work["kv_tokens"]
    assert sorted(p.name for p in out.glob("*.png")) == [
        "fp4_copy_fraction.png",
        "fp8_copy_fraction.png",
    ]


def test_bench_rejects_unknown_op(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "bench"), "--ops", "fp16", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--ops takes a comma-separated subset of fp8,fp4" in proc.stderr
