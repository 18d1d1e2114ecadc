"""Report: a table on stdout, a JSON file, and plots of the fraction of copy bandwidth."""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

from .check import CheckResult
from .gather import GatherCeiling
from .models import DEFAULT_OUTPUT_DTYPE, WorkModel
from .shapes import IndexerShape
from .timing import Timing

PASS, FAIL = "PASS", "FAIL"
KERNEL_NOT_BUILT = "kernel not built"
TOO_LARGE = "skipped: does not fit in memory"
ERROR = "error"

PACKAGES = ("flashinfer-layouts", "flashinfer-jit", "flashinfer-schedule", "flashinfer-attn-scores")


@dataclass
class CaseResult:
    """One row of the report.

    Attributes:
        shape: The case.
        status: PASS (checked, then timed, then its replays checked), FAIL (a wrong eager
            result, not timed; or timed replays that did not repeat the checked call's bits,
            timed), "kernel not built", a skip or "error".
        work: Byte and FLOP model of the call, when the data was built.
        check: The correctness check, when it ran.
        timing: The timing, only for results that passed the float64 check.
        rotations: Rotation sets replayed per sample.
        pool_bytes: Size of the page pool.
        detail: Human-readable reason for anything but PASS.
        gather: The read-only paged-gather ceiling measured on this case's own pages
            (CUDA only, for timed cases).
        gather_error: Why the gather ceiling could not be measured, else "".
        single_replay: Small-batch shapes only (CUDA): one call per graph replay, the
            measurement the small-batch target names (`timing.time_single_replays`), each
            replay after an L2 flush (its pages from HBM).
        single_replay_warm: The same graph replayed over and over, so its pages, table and q
            stay in L2: the figure a benchmark that does not rotate reports.
        replays_checked: The timings whose replays were checked after they ran: the outputs
            they write, poisoned with NaN before the timed replays, hold what the last timed
            replay wrote, compared bit for bit with an eager call of the same rotation set
            (for set 0 the checked one; `check.replays_match`). A mismatch makes the case
            FAIL.
        derived: GB/s, fractions of the ceilings and TFLOP/s (see `derive`).
    """

    shape: IndexerShape
    status: str
    work: WorkModel | None = None
    check: CheckResult | None = None
    timing: Timing | None = None
    rotations: int = 0
    pool_bytes: int = 0
    detail: str = ""
    gather: GatherCeiling | None = None
    gather_error: str = ""
    single_replay: Timing | None = None
    single_replay_warm: Timing | None = None
    replays_checked: list[str] = field(default_factory=list)
    derived: dict[str, float | None] = field(default_factory=dict)

    def derive(self, copy_bw: float | None) -> None:
        """Fill GB/s, fractions of the ceilings and TFLOP/s from the timing and the model.

        Both fractions divide the op's effective bandwidth (model bytes, inputs and outputs,
        over its time) by a ceiling: the copy bandwidth of the run, and the bandwidth of the
        gather kernel on this case's own pages (bytes it read over its time).
        """
        if self.timing is None or self.work is None:
            return
        seconds = self.timing.median_us * 1e-6
        achieved = self.work.total_bytes / seconds
        gather_bw = self.gather.bytes_per_s if self.gather else None
        self.derived = {
            "gb_per_s": achieved / 1e9,
            "copy_fraction": achieved / copy_bw if copy_bw else None,
            "gather_gb_per_s": gather_bw / 1e9 if gather_bw else None,
            "gather_fraction": achieved / gather_bw if gather_bw else None,
            "tflop_per_s": self.work.flops / seconds / 1e12,
        }


def environment(mode: str, device: torch.device) -> dict[str, object]:
    """Date, device and software versions for the JSON header."""
    info: dict[str, object] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mode": mode,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "argv": sys.argv[1:],
        "packages": {},
    }
    for name in PACKAGES:
        try:
            info["packages"][name] = metadata.version(name)  # type: ignore[index]
        except metadata.PackageNotFoundError:
            info["packages"][name] = None  # type: ignore[index]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["device"] = {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
            "l2_bytes": props.L2_cache_size,
            # Runs of unchanged kernels differ by a few % between machines at the power cap;
            # the UUID tells a machine from a run.
            "uuid": str(props.uuid) if hasattr(props, "uuid") else None,
        }
    else:
        info["device"] = {"name": platform.processor() or platform.machine(), "capability": None}
    return info


def _fmt(value: float | None, spec: str) -> str:
    if value is None:
        width = spec.split(".")[0]
        return "-".rjust(int(width) if width.isdigit() else 1)
    return format(value, spec)


def table_header() -> str:
    """The header line (and rule) of the results table."""
    header = (
        f"{'op':<4} {'B':>4} {'L':>6} {'next_n':>6} {'block':>5} {'time us':>10} "
        f"{'GB/s':>8} {'of copy':>7} {'gather GB/s':>11} {'of gather':>9} {'TFLOP/s':>8}  status"
    )
    return header + "\n" + "-" * len(header)


def table_row(r: CaseResult) -> str:
    """One row of the results table."""
    s, t, d = r.shape, r.timing, r.derived
    status = r.status if not r.detail else f"{r.status}: {r.detail}"
    if r.single_replay:
        warm = r.single_replay_warm
        status += f" (one call per replay: {r.single_replay.median_us:.2f} us"
        status += f", L2-warm {warm.median_us:.2f} us)" if warm else ")"
    if r.gather_error:
        status += f" (gather ceiling failed: {r.gather_error})"
    return (
        f"{s.op:<4} {s.batch:>4} {s.avg_len:>6} {s.next_n:>6} {s.block_size:>5} "
        f"{_fmt(t.median_us if t else None, '10.2f')} {_fmt(d.get('gb_per_s'), '8.4g')} "
        f"{_fmt(d.get('copy_fraction'), '7.3f')} {_fmt(d.get('gather_gb_per_s'), '11.4g')} "
        f"{_fmt(d.get('gather_fraction'), '9.3f')} {_fmt(d.get('tflop_per_s'), '8.3g')}  {status}"
    )


def _record(r: CaseResult) -> dict[str, object]:
    return {
        **asdict(r.shape),
        "output_dtype": str(DEFAULT_OUTPUT_DTYPE[r.shape.op]).removeprefix("torch."),
        "status": r.status,
        "detail": r.detail,
        "work": None if r.work is None else {**asdict(r.work), "total_bytes": r.work.total_bytes},
        "check": None if r.check is None else asdict(r.check),
        "timing": None if r.timing is None else asdict(r.timing),
        "gather": None
        if r.gather is None
        else {**asdict(r.gather), "bytes_per_s": r.gather.bytes_per_s},
        "gather_error": r.gather_error,
        "single_replay": None if r.single_replay is None else asdict(r.single_replay),
        "single_replay_warm": None
        if r.single_replay_warm is None
        else asdict(r.single_replay_warm),
        "replays_checked": r.replays_checked,
        "rotations": r.rotations,
        "pool_bytes": r.pool_bytes,
        **r.derived,
    }


def write_json(
    path: Path,
    env: dict[str, object],
    ceilings: dict[str, float | None],
    results: list[CaseResult],
    *,
    complete: bool,
    host_time: dict[str, object] | None = None,
) -> None:
    """Write the results so far; `complete` is False while cases remain (a killed run keeps
    what it measured). Written to a temporary name and renamed, so the file is never torn.
    `host_time` is the host-time section (see `host_time.py`), stored under "host_time"."""
    payload = {
        **env,
        "complete": complete,
        "ceilings_bytes_per_s": ceilings,
        "host_time": host_time,
        "results": [_record(r) for r in results],
    }
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(payload, indent=2) + "\n")
    partial.replace(path)


def _length_label(length: int) -> str:
    return f"{length // 1024}k" if length % 1024 == 0 else str(length)


def plotted_cases(results: list[CaseResult], op: str) -> list[CaseResult]:
    """The cases of `op` a plot shows: PASS with a fraction of copy. A case whose timed
    replays failed their check keeps its timing in the JSON, not in a plot."""
    return [
        r
        for r in results
        if r.shape.op == op and r.status == PASS and r.derived.get("copy_fraction")
    ]


def write_plots(out_dir: Path, results: list[CaseResult], title_note: str) -> list[Path]:
    """One PNG per op: fraction of copy bandwidth against average L, a line per (B, next_n),
    one panel per block size, `plotted_cases` only. Returns the files written (none without
    timed results)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots written (pip install matplotlib)")
        return []

    written = []
    for op in sorted({r.shape.op for r in results}):
        timed = plotted_cases(results, op)
        if not timed:
            continue
        blocks = sorted({r.shape.block_size for r in timed})
        keys = sorted({(r.shape.batch, r.shape.next_n) for r in timed})
        colours = plt.get_cmap("tab20")
        fig, axes = plt.subplots(
            1, len(blocks), figsize=(5 * len(blocks), 4), sharey=True, squeeze=False
        )
        for ax, block in zip(axes[0], blocks):
            for i, (batch, next_n) in enumerate(keys):
                points = sorted(
                    (r.shape.avg_len, r.derived["copy_fraction"])
                    for r in timed
                    if (r.shape.block_size, r.shape.batch, r.shape.next_n) == (block, batch, next_n)
                )
                if points:
                    ax.plot(
                        *zip(*points),
                        marker="o",
                        color=colours(i % 20),
                        label=f"B={batch} next_n={next_n}",
                    )
            lengths = sorted({r.shape.avg_len for r in timed})
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [_length_label(length) for length in lengths])
            ax.minorticks_off()
            ax.set_xlabel("average KV length L")
            ax.set_title(f"block size {block}")
            ax.grid(True, alpha=0.3)
        axes[0][0].set_ylabel("fraction of measured copy bandwidth")
        handles, labels = [], []
        for ax in axes[0]:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                if label not in labels:
                    handles.append(handle)
                    labels.append(label)
        fig.legend(handles, labels, loc="center right", fontsize="small")
        fig.suptitle(f"{op} paged MQA logits: {title_note}")
        fig.tight_layout(rect=(0, 0, 0.86, 1))
        path = out_dir / f"{op}_copy_fraction.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
