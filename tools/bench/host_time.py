"""Host time of one eager op call: what Python, validation and the launches cost per call.

A small problem (B = 1, L = 4096, next_n = 1, block 64) is called back to back many times
with `out=` given, once with `schedule_meta=None` (the schedule kernel runs inside every call)
and once with a schedule computed beforehand. The host time per call is the wall-clock time
of the loop divided by the number of calls, with no synchronisation inside the loop; the
device time per call comes from CUDA events recorded around the same loop. When the device
time is about as large as the host time, the launch queue was full and the host waited on the
GPU: the event time alone cannot tell (the GPU also idles between calls the host has not
issued yet), so the same call is also timed as replays of one CUDA graph holding `GRAPH_CALLS`
copies of it on the same tensors: the GPU work per call without host cost, with the data in L2
and each call's launch and prologue overlapping the call before (PDL), so less than one call
alone would take. When that is close to the host time, the host may have waited on a full
launch queue and its time is only an upper bound on the Python-side cost.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import flashinfer_attn_scores
import torch
from flashinfer_schedule import compute_paged_mqa_logits_schedule, padded_seq_len

from .data import _random_kv_blocks, _random_q
from .models import DEFAULT_OUTPUT_DTYPE
from .shapes import IndexerShape
from .timing import time_graph_replays

# The target for one eager call, Python included.
TARGET_US = 10.0
CALLS = 2000
REPEATS = 5
WARMUP_CALLS = 50
# GPU work per call at least this fraction of the host time: the host may have been throttled.
DEVICE_BOUND_RATIO = 0.9
GRAPH_CALLS = 20

BATCH, LENGTH, NEXT_N, BLOCK_SIZE = 1, 4096, 1, 64

MEASURED, SKIPPED = "measured", "skipped"
SCHEDULE_MODES = ("schedule_meta=None", "precomputed schedule")


def host_cpu() -> dict[str, object]:
    """The CPU that timed the calls: its model and how many logical CPUs this process sees.

    Host time is Python and the driver's launch path, so the figure belongs with the host that
    measured it: one package version read 15.5 to 30.4 us per call across H200 machines
    (benchmark runs of 2026-12-04). Virtual machines may report a generic model name.
    """
    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"model": model or platform.processor() or None, "logical_cpus": os.cpu_count()}


@dataclass(frozen=True)
class HostTime:
    """Host and device time per eager call of one (op, schedule mode).

    Attributes:
        op: "fp8" or "fp4".
        schedule: One of `SCHEDULE_MODES`.
        status: "measured" or "skipped".
        calls: Back-to-back calls per repeat.
        repeats: Timed repeats; the medians are reported.
        host_us: Median over repeats of loop wall-clock time / calls, microseconds.
        host_us_min: Smallest repeat, microseconds.
        device_us: Median over repeats of CUDA-event time of the loop / calls.
        graph_us: GPU work per call: median replay time of a CUDA graph of the same call.
        device_bound: `graph_us >= 0.9 * host_us` (see the module docstring).
        detail: Why it was skipped, else "".
    """

    op: str
    schedule: str
    status: str
    calls: int = 0
    repeats: int = 0
    host_us: float | None = None
    host_us_min: float | None = None
    device_us: float | None = None
    graph_us: float | None = None
    device_bound: bool = False
    detail: str = ""


def _small_call(
    op: str, device: torch.device, precomputed_schedule: bool
) -> Callable[[], torch.Tensor]:
    """The op on a B=1, L=4096 problem with out= (and a precomputed schedule if asked)."""
    shape = IndexerShape(op, BATCH, LENGTH, NEXT_N, BLOCK_SIZE)
    gen = torch.Generator(device=device).manual_seed(shape.seed())
    blocks = -(-LENGTH // BLOCK_SIZE)
    kv_fused = _random_kv_blocks(shape, 2 * blocks, gen, device)
    table = (
        torch.randperm(2 * blocks, generator=gen, device=device)[:blocks]
        .to(torch.int32)
        .view(BATCH, blocks)
    )
    seq_lens = torch.full((BATCH,), LENGTH, dtype=torch.int32, device=device)
    q, q_sf = _random_q(shape, gen, device)
    weights = torch.randn(BATCH * NEXT_N, shape.num_heads, generator=gen, device=device)
    out = torch.empty(
        BATCH * NEXT_N, padded_seq_len(LENGTH), dtype=DEFAULT_OUTPUT_DTYPE[op], device=device
    )
    schedule = (
        compute_paged_mqa_logits_schedule(seq_lens, device, next_n=NEXT_N, variant=op)
        if precomputed_schedule
        else None
    )
    if op == "fp8":
        return lambda: flashinfer_attn_scores.fp8_paged_mqa_logits(
            q, kv_fused, weights, table, seq_lens, LENGTH, schedule_meta=schedule, out=out
        )
    return lambda: flashinfer_attn_scores.fp4_paged_mqa_logits(
        q, q_sf, kv_fused, weights, table, seq_lens, LENGTH, schedule_meta=schedule, out=out
    )


def time_eager_calls(
    call: Callable[[], object], calls: int = CALLS, repeats: int = REPEATS
) -> tuple[list[float], list[float]]:
    """Per-call host and device microseconds of `repeats` loops of `calls` back-to-back calls.

    The host clock stops when the last call returns, before the one synchronisation.
    """
    for _ in range(WARMUP_CALLS):
        call()
    torch.cuda.synchronize()
    host_us, device_us = [], []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        began = time.perf_counter()
        for _ in range(calls):
            call()
        host_us.append((time.perf_counter() - began) * 1e6 / calls)
        end.record()
        end.synchronize()
        device_us.append(start.elapsed_time(end) * 1e3 / calls)
    return host_us, device_us


def measure_host_times(
    ops: list[str], device: torch.device, calls: int = CALLS, repeats: int = REPEATS
) -> list[HostTime]:
    """Host time per eager call of every op in `ops`, both schedule modes.

    An op whose kernel is not built (`NotImplementedError`) gives skipped rows that say so.
    """
    results = []
    for op in ops:
        for mode in SCHEDULE_MODES:
            call = _small_call(op, device, precomputed_schedule=mode != SCHEDULE_MODES[0])
            try:
                call()
            except NotImplementedError as exc:
                reason = f"{op} kernel not built: {str(exc).splitlines()[0]}"
                results.append(HostTime(op, mode, SKIPPED, detail=reason))
                continue
            host, dev = time_eager_calls(call, calls, repeats)
            host_median, device_median = statistics.median(host), statistics.median(dev)
            graph = time_graph_replays([call] * GRAPH_CALLS, budget_s=0.05).median_us
            results.append(
                HostTime(
                    op,
                    mode,
                    MEASURED,
                    calls=calls,
                    repeats=repeats,
                    host_us=host_median,
                    host_us_min=min(host),
                    device_us=device_median,
                    graph_us=graph,
                    device_bound=graph >= DEVICE_BOUND_RATIO * host_median,
                )
            )
    return results


def host_time_table(results: list[HostTime]) -> str:
    """The host-time table: one line per (op, schedule mode)."""
    header = (
        f"{'op':<4} {'schedule':<22} {'host us/call':>12} {'min':>7} {'device us/call':>14} "
        f"{'graph us/call':>13}  note (target <= {TARGET_US:g} us host time; "
        f"B={BATCH} L={LENGTH} out= given)"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        if r.status != MEASURED:
            lines.append(
                f"{r.op:<4} {r.schedule:<22} {'-':>12} {'-':>7} {'-':>14} {'-':>13}  {r.detail}"
            )
            continue
        host_us = r.host_us or 0.0
        notes = ["meets target" if host_us <= TARGET_US else "over target"]
        if r.device_bound:
            notes.append("GPU work ~ host time: the host may have waited, an upper bound")
        lines.append(
            f"{r.op:<4} {r.schedule:<22} {host_us:>12.2f} {r.host_us_min or 0.0:>7.2f} "
            f"{r.device_us or 0.0:>14.2f} {r.graph_us or 0.0:>13.2f}  {'; '.join(notes)}"
        )
    return "\n".join(lines)
