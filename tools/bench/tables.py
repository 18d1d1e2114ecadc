"""Markdown tables from a benchmark `results.json`: `python tools/bench --markdown RESULTS.json`.

A grid run split by op (`--ops fp8`, then `--ops fp4`, to fit a time limit) is joined into one
payload first with `python tools/bench --merge A.json B.json > merged.json` (`merge_runs`).

Every figure comes from the JSON (times, fractions of the ceilings, token counts, host times)
except the peer's published times (`peer.py`), which the fp8 table and the speed-up compare
against. The functions take the parsed JSON (a dict) so they can be tested without a file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .models import decode_seconds, roofline_seconds
from .peer import (
    PEER_BLOCK_SIZE,
    PEER_COPY_BYTES_PER_S,
    PEER_FP8_US,
    PEER_SHAPES_WITH_COPY_FRACTION,
)

Record = Mapping[str, Any]
# (op, next_n, batch, avg_len, block_size)
CaseKey = tuple[str, int, int, int, int]
# (next_n, batch, avg_len)
RowKey = tuple[int, int, int]

OP_NAMES = {"fp8": "fp8_paged_mqa_logits", "fp4": "fp4_paged_mqa_logits"}
PASS = "PASS"
# The targets' regimes of B x L (PERFORMANCE.md): at least 4M tokens, 512k-4M, below.
LARGE_TOKENS = 4 << 20
MID_TOKENS = 512 << 10
SIZE_GROUPS = (">= 4M", "512k-4M", "< 512k")
# How the summary names each regime.
SIZE_GROUP_TEXT = {
    ">= 4M": "B x L >= 4M tokens",
    "512k-4M": "512k <= B x L < 4M",
    "< 512k": "B x L < 512k",
}
SMALL_BATCH, SMALL_LENGTH = 1, 4096
# PERFORMANCE.md: at B <= 8, L <= 16k, one replay of the whole call within 0.7x the peer's time.
SMALL_BATCH_PEER_RATIO = 0.7
# PERFORMANCE.md: the geometric mean of peer time / our time over the peer's shapes.
PEER_SPEEDUP_TARGET = 1.25
# PERFORMANCE.md, with no size limit: fp8 at next_n 3 and 4 at least 0.80 of the roofline
# max(bytes / copy, FLOPs / FP8 peak); fp4 at next_n 2-4 at least 0.75 of it with the decode
# counted.
FP8_ROOFLINE_TARGET, FP8_ROOFLINE_NEXT_N = 0.80, (3, 4)
FP4_ROOFLINE_TARGET, FP4_ROOFLINE_NEXT_N = 0.75, (2, 3, 4)
# Float rounding of a ratio exactly on a target (4.48 / 6.4 reads 0.7000000000000001).
RATIO_EPS = 1e-12
# The small-batch table's L2-warm ratio column: no verdict, the target is read from HBM.
WARM_RATIO_HEADER = "L2-warm / peer (not the target's reading)"
# The small-batch caption's last sentence, where the run has L2-warm replays.
WARM_NOTE = (
    "The target is judged on the replays from HBM alone: data left in L2 overstates "
    "(PERFORMANCE.md) and the peer was timed on a large pool, so the L2-warm ratios carry no "
    "verdict."
)
# The "mode" of a run of the CPU reference path (no SM90 GPU, or --device cpu).
CPU_REFERENCE = "cpu-reference"


def load_results(path: Path) -> dict[str, Any]:
    """Read a results.json written by the benchmark.

    Args:
        path: The file.

    Returns:
        The parsed JSON.

    Raises:
        ValueError: If the file is missing, is not JSON, or has no "results" list.
    """
    try:
        payload = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(
            f"{path}: no such file (expected a results.json written by tools/bench)"
        ) from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not JSON ({err})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("results"), list):
        raise ValueError(f"{path} is not a benchmark results.json: it has no 'results' list")
    return payload


def merge_runs(payloads: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Join runs of the benchmark on one device model into one payload, in the order given.

    Each record keeps the fractions of its own run's copy ceiling; the joined payload lists
    every run's date, ops and copy ceiling under "runs" (the run description prints them) and
    has no single copy ceiling of its own.

    Args:
        payloads: Parsed results.json files, each with its own cases.

    Returns:
        The joined payload.

    Raises:
        ValueError: If fewer than two runs are given, the runs name different devices,
            timed the host on different problems or ran other epilogue/accumulator dtypes,
            or two runs hold the same case.
    """
    if len(payloads) < 2:
        raise ValueError(f"merging needs at least two results files, got {len(payloads)}")
    # The same model on another machine (another UUID) may join: each record keeps its own
    # run's copy fraction. The joined payload keeps a UUID only where every run shares it.
    models = [_without_uuid(p.get("device")) for p in payloads]
    if any(model != models[0] for model in models):
        raise ValueError(f"the runs were made on different devices: {models}")
    uuids = {(p.get("device") or {}).get("uuid") for p in payloads}
    device = payloads[0].get("device") if len(uuids) == 1 else {**models[0], "uuid": None}
    choices = sorted({dtype_choice(r) for p in payloads for r in p["results"]})
    if len(choices) > 1:
        raise ValueError(
            f"the runs used different (epi_dtype, acc_dtype) choices: {choices}; "
            "their tables would mix configurations"
        )
    seen: dict[CaseKey, int] = {}
    for number, payload in enumerate(payloads, 1):
        for record in payload["results"]:
            key = case_key(record)
            if key in seen:
                raise ValueError(f"runs {seen[key]} and {number} both hold the case {key}")
            seen[key] = number
    host_sections = [
        p["host_time"] for p in payloads if (p.get("host_time") or {}).get("status") == "done"
    ]
    problems = [section.get("problem") for section in host_sections]
    if any(problem != problems[0] for problem in problems):
        raise ValueError(f"the runs timed the host on different problems: {problems}")
    host_time: dict[str, Any] = {"status": "not measured in any of the runs", "results": []}
    if host_sections:
        host_time = {
            **host_sections[0],
            "results": [row for section in host_sections for row in section["results"]],
        }
        cpus = [section.get("cpu") for section in host_sections]
        if any(cpu != cpus[0] for cpu in cpus):
            # Rows timed on different hosts: the caption names them all, not the first alone.
            named = ((cpu or {}).get("model") or "CPU not recorded" for cpu in cpus)
            models = list(dict.fromkeys(named))
            host_time["cpu"] = {"model": " / ".join(models), "logical_cpus": None}
    first = payloads[0]
    return {
        **{k: first.get(k) for k in ("date", "mode", "python", "torch", "cuda")},
        "device": device,
        "complete": all(p.get("complete", True) for p in payloads),
        "runs": [
            {
                "date": p.get("date"),
                "ops": sorted({r["op"] for r in p["results"]}),
                "copy_bytes_per_s": (p.get("ceilings_bytes_per_s") or {}).get("copy"),
            }
            for p in payloads
        ],
        "ceilings_bytes_per_s": {},
        "host_time": host_time,
        "results": [record for p in payloads for record in p["results"]],
    }


def _without_uuid(device: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if device is None else {k: v for k, v in device.items() if k != "uuid"}


def dtype_choice(record: Record) -> tuple[str, str]:
    """A record's (epi_dtype, acc_dtype); records written before `--epi-dtype` existed ran
    the defaults."""
    return (record.get("epi_dtype", "float32"), record.get("acc_dtype", "float32"))


def dtype_choices_text(choices: list[tuple[str, str]]) -> str:
    """`epi_dtype float16, acc_dtype float16 / ...` for `dtype_choice` values."""
    return " / ".join(f"epi_dtype {epi}, acc_dtype {acc}" for epi, acc in choices)


def case_key(record: Record) -> CaseKey:
    return (
        record["op"],
        record["next_n"],
        record["batch"],
        record["avg_len"],
        record["block_size"],
    )


def index_cases(payload: Mapping[str, Any]) -> dict[CaseKey, Record]:
    """The results by (op, next_n, batch, avg_len, block_size)."""
    return {case_key(r): r for r in payload["results"]}


def median_us(record: Record | None) -> float | None:
    """The median time of a checked, timed case, else None."""
    if record is None or record.get("status") != PASS or not record.get("timing"):
        return None
    return record["timing"]["median_us"]


def token_rate(record: Record | None) -> float | None:
    """KV tokens per microsecond of a timed case (its own lengths: they are seeded per op)."""
    us = median_us(record)
    if record is None or us is None or not record.get("work"):
        return None
    return record["work"]["kv_tokens"] / us


def length_label(length: int) -> str:
    return f"{length // 1024}k" if length % 1024 == 0 else str(length)


def size_group(batch: int, avg_len: int) -> str:
    """The targets' regime (`SIZE_GROUPS`) of a case's B x L tokens."""
    tokens = batch * avg_len
    if tokens >= LARGE_TOKENS:
        return SIZE_GROUPS[0]
    return SIZE_GROUPS[1] if tokens >= MID_TOKENS else SIZE_GROUPS[2]


def geomean(values: Iterable[float]) -> float | None:
    """Geometric mean of positive values; None when there are none."""
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else None


def _ops(payload: Mapping[str, Any]) -> list[str]:
    present = {r["op"] for r in payload["results"]}
    return [op for op in OP_NAMES if op in present] + sorted(present - set(OP_NAMES))


def _axis(payload: Mapping[str, Any], op: str, field: str) -> list[int]:
    return sorted({r[field] for r in payload["results"] if r["op"] == op})


def _rows(payload: Mapping[str, Any], op: str) -> list[RowKey]:
    return sorted(
        {(r["next_n"], r["batch"], r["avg_len"]) for r in payload["results"] if r["op"] == op}
    )


def _shape_text(next_n: int | None, batch: int, avg_len: int, block: int | None) -> str:
    parts = [] if next_n is None else [f"next_n {next_n}"]
    parts += [f"B {batch}", f"L {length_label(avg_len)}"]
    if block is not None:
        parts.append(f"block {block}")
    return ", ".join(parts)


def _peer_text(us: float) -> str:
    """The peer's time as PERFORMANCE.md prints it: 6.4 us, 84.4 us, 150 us."""
    return f"{us:.0f} us" if us >= 100 else f"{us:.1f} us"


def case_cell(record: Record | None) -> str:
    """`165.0 us (0.82 copy, 0.93 gather)`; the status when the case was not timed."""
    if record is None:
        return "not run"
    us = median_us(record)
    if us is None:
        return str(record.get("status", "not timed"))
    fractions = []
    if record.get("copy_fraction") is not None:
        fractions.append(f"{record['copy_fraction']:.2f} copy")
    if record.get("gather_fraction") is not None:
        fractions.append(f"{record['gather_fraction']:.2f} gather")
    return f"{us:.1f} us" + (f" ({', '.join(fractions)})" if fractions else "")


def op_table(payload: Mapping[str, Any], op: str) -> str:
    """One row per (next_n, B, L), one column per block size; fp8 adds the peer's time.

    Args:
        payload: The parsed results.json.
        op: "fp8" or "fp4".

    Returns:
        A markdown table.
    """
    cases = index_cases(payload)
    blocks = _axis(payload, op, "block_size")
    peer = op == "fp8"
    header = ["next_n", "B", "L"] + [f"block {b}" for b in blocks]
    if peer:
        # The peer's times are H200 times: said in the header when this run is on another card.
        card = "" if peer_device_mismatch(payload) is None else f"{PEER_DEVICE}, "
        header.append(f"peer (block {PEER_BLOCK_SIZE}, {card}PERFORMANCE.md)")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for next_n, batch, avg_len in _rows(payload, op):
        cells = [str(next_n), str(batch), length_label(avg_len)]
        cells += [case_cell(cases.get((op, next_n, batch, avg_len, b))) for b in blocks]
        if peer:
            peer_us = PEER_FP8_US.get((next_n, batch, avg_len))
            cells.append("" if peer_us is None else _peer_text(peer_us))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def token_rate_ratios(payload: Mapping[str, Any]) -> dict[tuple[int, int, int, int], float]:
    """fp4 token rate over fp8 token rate for every (next_n, B, L, block) timed for both ops."""
    cases = index_cases(payload)
    ratios = {}
    for (op, next_n, batch, avg_len, block), record in cases.items():
        if op != "fp4":
            continue
        fp4_rate = token_rate(record)
        fp8_rate = token_rate(cases.get(("fp8", next_n, batch, avg_len, block)))
        if fp4_rate is not None and fp8_rate is not None:
            ratios[(next_n, batch, avg_len, block)] = fp4_rate / fp8_rate
    return dict(sorted(ratios.items()))


def fp4_vs_fp8_table(payload: Mapping[str, Any], block_size: int = PEER_BLOCK_SIZE) -> str:
    """fp4 and fp8 side by side at one block size: both times, the token-rate ratio, and fp4's
    fraction of copy under its own byte model (68 B per token plus its bfloat16 outputs).

    Args:
        payload: The parsed results.json.
        block_size: The block size of the compared cases.

    Returns:
        A markdown table.
    """
    cases = index_cases(payload)
    ratios = token_rate_ratios(payload)
    rows = sorted(set(_rows(payload, "fp4")) | set(_rows(payload, "fp8")))
    header = ["next_n", "B", "L", "fp4", "fp8", "fp4 / fp8 token rate", "fp4 of copy"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for next_n, batch, avg_len in rows:
        fp4 = cases.get(("fp4", next_n, batch, avg_len, block_size))
        fp8 = cases.get(("fp8", next_n, batch, avg_len, block_size))
        ratio = ratios.get((next_n, batch, avg_len, block_size))
        fp4_us, fp8_us = median_us(fp4), median_us(fp8)
        copy = fp4.get("copy_fraction") if fp4 is not None and fp4_us is not None else None
        cells = [
            str(next_n),
            str(batch),
            length_label(avg_len),
            f"{fp4_us:.1f} us" if fp4_us is not None else case_cell(fp4),
            f"{fp8_us:.1f} us" if fp8_us is not None else case_cell(fp8),
            "" if ratio is None else f"{ratio:.2f}x",
            "" if copy is None else f"{copy:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def peer_speedups(payload: Mapping[str, Any]) -> dict[RowKey, float]:
    """Peer time over our fp8 time at the peer's block size, for every published shape timed."""
    cases = index_cases(payload)
    speedups = {}
    for (next_n, batch, avg_len), peer_us in PEER_FP8_US.items():
        ours = median_us(cases.get(("fp8", next_n, batch, avg_len, PEER_BLOCK_SIZE)))
        if ours is not None:
            speedups[(next_n, batch, avg_len)] = peer_us / ours
    return speedups


def peer_speedups_one_replay(
    payload: Mapping[str, Any], field: str = "single_replay"
) -> dict[RowKey, float]:
    """`peer_speedups` with our time taken from one call per graph replay wherever the run has
    one (the small-batch shapes), as the peer was timed (PERFORMANCE.md: graph replays of its
    metadata and logits kernels). The op tables' graphs of many back-to-back calls overlap each
    call's launch and prologue with the call before (PDL), which flatters the latency-bound
    shapes. `field` "single_replay" is after an L2 flush, "single_replay_warm" with the pages in
    L2; shapes without a single replay keep the graph-of-many-calls time."""
    cases = index_cases(payload)
    speedups = {}
    for (next_n, batch, avg_len), peer_us in PEER_FP8_US.items():
        record = cases.get(("fp8", next_n, batch, avg_len, PEER_BLOCK_SIZE))
        ours = single_replay_us(record, field) or median_us(record)
        if ours is not None:
            speedups[(next_n, batch, avg_len)] = peer_us / ours
    return speedups


def run_copy_bytes_per_s(record: Record) -> float | None:
    """The copy bandwidth of the run that timed `record` (its effective bandwidth over its
    fraction of copy); None for a record without both."""
    if not record.get("copy_fraction") or not record.get("gb_per_s"):
        return None
    return record["gb_per_s"] * 1e9 / record["copy_fraction"]


def peer_speedups_at_equal_copy(payload: Mapping[str, Any]) -> dict[RowKey, float]:
    """`peer_speedups` with the peer's bandwidth-bound shapes compared as fractions of copy.

    PERFORMANCE.md asks for fractions of the copy bandwidth measured in the same run, because
    absolute times drift between machines. The peer's table gives such a fraction for its
    bandwidth-bound shapes (`PEER_SHAPES_WITH_COPY_FRACTION`), on a machine whose copy read
    `PEER_COPY_BYTES_PER_S`. At those shapes the ratio of the two fractions is the time ratio
    times peer copy / our copy; the other shapes are latency-bound and keep the time ratio.
    A shape whose record lacks its run's copy bandwidth is left out. The fractions printed in
    the peer's table are not read: they do not follow one byte model (B 64, L 4k reads 0.41 at
    13.6 us, B 128, L 4k 0.69 at 29.0 us, twice the tokens in 2.1 times the time).
    """
    cases = index_cases(payload)
    speedups = {}
    for shape, speedup in peer_speedups(payload).items():
        if shape not in PEER_SHAPES_WITH_COPY_FRACTION:
            speedups[shape] = speedup
            continue
        ours = run_copy_bytes_per_s(cases[("fp8", *shape, PEER_BLOCK_SIZE)])
        if ours is not None:
            speedups[shape] = speedup * PEER_COPY_BYTES_PER_S / ours
    return speedups


def best_copy_case(payload: Mapping[str, Any], op: str, next_n: int) -> Record | None:
    """The timed case of `op` at `next_n` with the largest fraction of copy."""
    timed = [
        r
        for r in payload["results"]
        if r["op"] == op
        and r["next_n"] == next_n
        and median_us(r) is not None
        and r.get("copy_fraction") is not None
    ]
    return max(timed, key=lambda r: r["copy_fraction"], default=None)


def large_copy_range(
    payload: Mapping[str, Any], op: str, next_n: int
) -> tuple[float, float] | None:
    """Smallest and largest fraction of copy of `op` at `next_n` over B x L >= 4M tokens."""
    fractions = [
        r["copy_fraction"]
        for r in payload["results"]
        if r["op"] == op
        and r["next_n"] == next_n
        and r["batch"] * r["avg_len"] >= LARGE_TOKENS
        and median_us(r) is not None
        and r.get("copy_fraction") is not None
    ]
    return (min(fractions), max(fractions)) if fractions else None


def roofline_fraction(record: Record, sm_count: int, with_decode: bool = False) -> float | None:
    """The roofline time over the measured time of one timed case (`models.roofline_seconds`,
    the copy bandwidth of the case's own run); `with_decode` adds fp4's E2M1 decode. None for
    an untimed case or one whose record lacks the byte and FLOP model."""
    work = record.get("work") or {}
    us = median_us(record)
    copy_bytes_per_s = run_copy_bytes_per_s(record)
    if us is None or copy_bytes_per_s is None:
        return None
    if "total_bytes" not in work or "flops" not in work:
        return None
    decode_s = 0.0
    if with_decode:
        decode_s = decode_seconds(work["kv_tokens"], record["head_dim"], sm_count)
    return roofline_seconds(work["total_bytes"], work["flops"], copy_bytes_per_s, decode_s) / (
        us * 1e-6
    )


def roofline_fractions(
    payload: Mapping[str, Any],
    op: str,
    next_n: int,
    with_decode: bool = False,
    group: str | None = None,
) -> list[float]:
    """Every `roofline_fraction` of `op` at `next_n`, over the cases of one size regime
    (`SIZE_GROUPS`) or, with `group` None, over every size; [] when the decode is asked for and
    the payload has no SM count."""
    sm_count = (payload.get("device") or {}).get("sm_count")
    if with_decode and not sm_count:
        return []
    return [
        f
        for r in payload["results"]
        if r["op"] == op
        and r["next_n"] == next_n
        and (group is None or size_group(r["batch"], r["avg_len"]) == group)
        for f in [roofline_fraction(r, sm_count, with_decode)]
        if f is not None
    ]


def roofline_range(
    payload: Mapping[str, Any],
    op: str,
    next_n: int,
    with_decode: bool = False,
    group: str | None = None,
) -> tuple[float, float] | None:
    """Smallest and largest of `roofline_fractions`; None when there are none."""
    fractions = roofline_fractions(payload, op, next_n, with_decode, group)
    return (min(fractions), max(fractions)) if fractions else None


def large_roofline_range(
    payload: Mapping[str, Any], op: str, next_n: int, with_decode: bool = False
) -> tuple[float, float] | None:
    """Smallest and largest `roofline_fraction` of `op` at `next_n` over B x L >= 4M tokens."""
    return roofline_range(payload, op, next_n, with_decode, SIZE_GROUPS[0])


def summary_table(payload: Mapping[str, Any]) -> str:
    """Per op and next_n: the best fraction of copy (and that case's fraction of gather), the
    range over B x L >= 4M tokens, and the times at B = 1, L = 4k for every block size."""
    cases = index_cases(payload)
    header = [
        "op",
        "next_n",
        "best of copy",
        "best case",
        "of copy, B x L >= 4M tokens",
        "B = 1, L = 4k (graph of many calls)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for op in _ops(payload):
        blocks = _axis(payload, op, "block_size")
        for next_n in _axis(payload, op, "next_n"):
            best = best_copy_case(payload, op, next_n)
            if best is None:
                best_text, where = "", ""
            else:
                best_text = f"{best['copy_fraction']:.2f}"
                if best.get("gather_fraction") is not None:
                    best_text += f" ({best['gather_fraction']:.2f} of gather)"
                where = _shape_text(None, best["batch"], best["avg_len"], best["block_size"])
            large = large_copy_range(payload, op, next_n)
            large_text = "" if large is None else f"{large[0]:.2f}-{large[1]:.2f}"
            small = []
            for block in blocks:
                us = median_us(cases.get((op, next_n, SMALL_BATCH, SMALL_LENGTH, block)))
                small.append("-" if us is None else f"{us:.1f}")
            small_text = " / ".join(small) + f" us (block {' / '.join(map(str, blocks))})"
            cells = [op, str(next_n), best_text, where, large_text, small_text]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The peer's figures (peer.py) were measured on an NVIDIA H200: only a run on one gets a verdict
# against them.
PEER_DEVICE = "H200"


def peer_device_mismatch(payload: Mapping[str, Any]) -> str | None:
    """Why the run's times cannot be judged against the peer's, or None: the peer was timed on
    an H200, and another card (an H100 has less bandwidth) would get a verdict it did not earn."""
    name = (payload.get("device") or {}).get("name") or "an unknown device"
    if PEER_DEVICE in name:
        return None
    return f"the peer was timed on an NVIDIA {PEER_DEVICE}, this run on {name}"


def peer_verdict_blocker(payload: Mapping[str, Any]) -> str | None:
    """Why no time of the run can be judged against the peer's, or None: another card
    (`peer_device_mismatch`), or fp8 cases run at other than the float32 defaults, at which the
    peer was timed and the targets are read."""
    mismatch = peer_device_mismatch(payload)
    if mismatch:
        return mismatch
    choices = sorted({dtype_choice(r) for r in payload["results"] if r["op"] == "fp8"})
    if choices and choices != [("float32", "float32")]:
        return (
            "the peer was timed at the float32 defaults, this run's fp8 cases at "
            + dtype_choices_text(choices)
        )
    return None


def small_batch_caption(payload: Mapping[str, Any]) -> str:
    """How the run took its single replays: up to the twentieth run a window of 32 graphs, one
    per rotation set; since then one graph, each cold replay after an L2 flush."""
    flushed = any(
        "L2 flush" in (r.get("single_replay") or {}).get("method", "") for r in payload["results"]
    )
    if flushed:
        method = (
            "Each cell: median time of one call captured in a CUDA graph of its own, one replay "
            "between two CUDA events after an L2 flush (a read of four times its size), so the "
            "pages come from HBM; `L2-warm`: 32 replays of that graph in a row, each finding its "
            "inputs in L2. "
        )
    else:
        method = (
            "Each cell: median time per call over windows of 32 one-call CUDA graphs replayed in "
            "turn between two CUDA events. One graph per rotation set, so the pages come from "
            "HBM; `L2-warm`: one rotation set in every graph. "
        )
    caption = (
        method
        + "Each sample is queued behind a spin kernel so the host's launch is not timed; graph "
        "launches do not overlap, so each call runs alone. This is the measurement of the "
        "small-batch target; the op tables time graphs of many back-to-back calls, which "
        "overlap through PDL."
    )
    if any(single_replay_us(r, "single_replay_warm") for r in payload["results"]):
        caption += " " + WARM_NOTE
    blocker = peer_verdict_blocker(payload)
    if blocker:
        caption += f" No ratio gets a verdict: {blocker}."
    return caption


def single_replay_us(record: Record | None, field: str = "single_replay") -> float | None:
    """The median time of one call per graph replay, for checked small-batch cases; `field`
    "single_replay_warm" gives the L2-warm one."""
    if median_us(record) is None or not record.get(field):
        return None
    return record[field]["median_us"]


def _ratio_text(ratio: float, target: float) -> str:
    """`ratio` at two decimals, or more where two would round it onto the other side of
    `target` (0.7008 against 0.7 prints 0.701)."""
    meets = ratio <= target + RATIO_EPS
    for decimals in range(2, 7):
        text = f"{ratio:.{decimals}f}"
        if (float(text) <= target) == meets:
            return text
    return text


def _fraction_text(value: float, target: float | None) -> str:
    """A fraction of a roofline at two decimals, or more where two would round it onto the
    other side of `target` (a lower bound; 0.7458 against 0.75 prints 0.746)."""
    text = f"{value:.2f}"
    if target is None:
        return text
    reached = value >= target
    for decimals in range(2, 7):
        text = f"{value:.{decimals}f}"
        if (float(text) >= target) == reached:
            return text
    return text


def _ratio_cell(ours: float | None, peer_us: float | None, verdict: bool = True) -> str:
    """`0.72 (over)`: our time over the peer's, against `SMALL_BATCH_PEER_RATIO`, the unrounded
    ratio compared (0.7008 is over); without `verdict` the ratio alone."""
    if peer_us is None or ours is None:
        return ""
    ratio = ours / peer_us
    if not verdict:
        return f"{ratio:.2f}"
    meets = ratio <= SMALL_BATCH_PEER_RATIO + RATIO_EPS
    return f"{_ratio_text(ratio, SMALL_BATCH_PEER_RATIO)} ({'meets' if meets else 'over'})"


def small_batch_table(payload: Mapping[str, Any]) -> str:
    """The small-batch target: one call per CUDA-graph replay, against the peer's time.

    One row per (op, next_n, B, L) that has a single-replay time; a column per block size, the
    L2-warm single-replay time (when the run has one) and the graph-of-many-calls time at the
    peer's block size beside it, and for the peer's shapes its time and the ratios at its block
    size. Only the replay from HBM gets a verdict against `SMALL_BATCH_PEER_RATIO`: data left in
    L2 overstates (PERFORMANCE.md), and the peer was timed on a large pool.
    Returns "" when no case of the payload has a single-replay time (runs before it existed).
    """
    cases = index_cases(payload)
    rows = sorted(
        {
            (r["op"], r["next_n"], r["batch"], r["avg_len"])
            for r in payload["results"]
            if single_replay_us(r) is not None
        },
        key=lambda row: (list(OP_NAMES).index(row[0]) if row[0] in OP_NAMES else 99, *row[1:]),
    )
    if not rows:
        return ""
    blocks = sorted({r["block_size"] for r in payload["results"] if single_replay_us(r)})
    warm = any(single_replay_us(r, "single_replay_warm") for r in payload["results"])
    header = ["op", "next_n", "B", "L"]
    header += [f"one replay, block {b}" for b in blocks]
    if warm:
        header.append(f"one replay L2-warm, block {PEER_BLOCK_SIZE}")
    header += [f"graph of many calls, block {PEER_BLOCK_SIZE}", "peer"]
    header.append(f"one replay / peer (target <= {SMALL_BATCH_PEER_RATIO})")
    if warm:
        header.append(WARM_RATIO_HEADER)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    comparable = peer_verdict_blocker(payload) is None
    for op, next_n, batch, avg_len in rows:
        cells = [op, str(next_n), str(batch), length_label(avg_len)]
        for block in blocks:
            us = single_replay_us(cases.get((op, next_n, batch, avg_len, block)))
            cells.append("-" if us is None else f"{us:.2f} us")
        at_peer_block = cases.get((op, next_n, batch, avg_len, PEER_BLOCK_SIZE))
        warm_us = single_replay_us(at_peer_block, "single_replay_warm")
        if warm:
            cells.append("-" if warm_us is None else f"{warm_us:.2f} us")
        many = median_us(at_peer_block)
        cells.append("-" if many is None else f"{many:.2f} us")
        peer_us = PEER_FP8_US.get((next_n, batch, avg_len)) if op == "fp8" else None
        cells.append("" if peer_us is None else _peer_text(peer_us))
        cells.append(_ratio_cell(single_replay_us(at_peer_block), peer_us, verdict=comparable))
        if warm:
            cells.append(_ratio_cell(warm_us, peer_us, verdict=False))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _lowest_and_highest(values: Mapping) -> tuple:
    """The keys of the smallest and the largest value."""
    return min(values, key=values.__getitem__), max(values, key=values.__getitem__)


# The geometric means over graphs of many back-to-back calls get no verdict: there each call's
# launch and prologue overlap the call before (PDL), which a serving step does not give, and
# the peer was timed one call per graph replay.
MANY_CALLS_NOT_THE_TARGET = "not the target's reading: back-to-back calls overlap through PDL"


def _against_speedup_target(speedup: float) -> str:
    """`1.250x (target 1.25x: not met)`: three decimals, so a mean just under the target does
    not print as the target itself."""
    verdict = "met" if speedup >= PEER_SPEEDUP_TARGET else "not met"
    return f"{speedup:.3f}x (target {PEER_SPEEDUP_TARGET:.2f}x: {verdict})"


def summary_lines(payload: Mapping[str, Any]) -> str:
    """The peer speed-up and the fp4 / fp8 token-rate ratio as a markdown list."""
    items = []
    speedups = peer_speedups(payload)
    mismatch = peer_device_mismatch(payload)
    if speedups and mismatch:
        items.append(
            f"No speed-up below gets a verdict: {mismatch}. The plain time ratios compare the "
            "two cards as much as the two kernels; the second line rescales the ratios of the "
            "peer's bandwidth-bound shapes by the two copy bandwidths and keeps the others."
        )
    if speedups:
        low, high = _lowest_and_highest(speedups)
        items.append(
            f"fp8 against the peer at block {PEER_BLOCK_SIZE}, {len(speedups)} of its "
            f"{len(PEER_FP8_US)} published shapes, our time from graphs of many back-to-back "
            f"calls (their launches overlap through PDL; the peer was timed one call per graph "
            f"replay, as in the one-replay lines below): geometric-mean speed-up "
            f"{geomean(speedups.values()):.3f}x ({MANY_CALLS_NOT_THE_TARGET}) (peer time / our "
            f"time; above "
            f"1 is faster than the peer), from {speedups[low]:.2f}x ({_shape_text(*low, None)}) to "
            f"{speedups[high]:.2f}x ({_shape_text(*high, None)})."
        )
    at_equal_copy = peer_speedups_at_equal_copy(payload)
    if at_equal_copy:
        scaled = len(PEER_SHAPES_WITH_COPY_FRACTION & at_equal_copy.keys())
        items.append(
            f"The same, with the time ratios at the peer's {scaled} bandwidth-bound shapes "
            f"rescaled by the two runs' copy bandwidths (this run's against the "
            f"{PEER_COPY_BYTES_PER_S / 1e12:.2f} TB/s beside the peer's figures: the ratio of "
            f"fractions of copy under one byte model; the peer's printed fractions are not "
            f"used): geometric-mean speed-up "
            f"{geomean(at_equal_copy.values()):.3f}x ({MANY_CALLS_NOT_THE_TARGET}) over "
            f"{len(at_equal_copy)} shapes."
        )
    blocker = peer_verdict_blocker(payload)
    for field, where in (
        ("single_replay_warm", "pages in L2"),
        ("single_replay", "after an L2 flush"),
    ):
        one_replay = peer_speedups_one_replay(payload, field)
        replaced = sum(
            single_replay_us(index_cases(payload).get(("fp8", *shape, PEER_BLOCK_SIZE)), field)
            is not None
            for shape in one_replay
        )
        if replaced:
            mean = geomean(one_replay.values())
            # Pages in L2 overstate (PERFORMANCE.md): no verdict on that reading.
            # After a flush every one-replay time here was slower than the same shape's graph
            # of many calls, so keeping those for the other shapes flatters the mean; an
            # L2-warm replay can be the faster of the two, so no such claim for it.
            flattered = (
                " (which flatters them, so this is an upper bound)"
                if field == "single_replay"
                else ""
            )
            if field != "single_replay":
                reading = f"{mean:.3f}x (not the target's reading: pages in L2 overstate)"
            elif blocker:
                reading = f"{mean:.3f}x (no verdict: {blocker})"
            elif len(one_replay) < len(PEER_FP8_US):
                reading = (
                    f"{mean:.3f}x (no verdict: the target is the mean over all "
                    f"{len(PEER_FP8_US)} of the peer's shapes, this run has {len(one_replay)})"
                )
            else:
                reading = _against_speedup_target(mean)
            items.append(
                f"The same with our time from one call per graph replay ({where}), as the peer "
                f"was timed, at the {replaced} shapes that have one; the other "
                f"{len(one_replay) - replaced} from graphs of many calls as in the first line"
                f"{flattered}: "
                f"geometric-mean speed-up {reading}."
            )
    ratios = token_rate_ratios(payload)
    if ratios:
        low, high = _lowest_and_highest(ratios)
        items.append(
            f"fp4 token rate / fp8 token rate over {len(ratios)} shapes timed for both: "
            f"geometric mean {geomean(ratios.values()):.2f}x, from {ratios[low]:.2f}x "
            f"({_shape_text(*low)}) to {ratios[high]:.2f}x ({_shape_text(*high)})."
        )
        large = [
            v for (n, b, length, _), v in ratios.items() if n == 1 and b * length >= LARGE_TOKENS
        ]
        if large:
            items.append(
                f"fp4 / fp8 token rate at next_n 1, B x L >= 4M tokens: "
                f"{min(large):.2f}x-{max(large):.2f}x ({len(large)} shapes)."
            )
    items += _roofline_items(payload)
    return "\n".join(f"- {item}" for item in items)


def _roofline_items(payload: Mapping[str, Any]) -> list[str]:
    """The roofline fractions by size regime and over every size, against the targets, which
    hold at every size: fp8 at next_n 3 and 4, and fp4 at next_n 2-4 with and without its
    decode (the target counts the decode)."""

    def ranges(
        op: str, next_ns: Sequence[int], with_decode: bool, group: str | None, target: float | None
    ) -> str:
        found = {n: roofline_range(payload, op, n, with_decode, group) for n in next_ns}
        return ", ".join(
            f"next_n {n} {_fraction_text(span[0], target)}-{_fraction_text(span[1], target)}"
            for n, span in found.items()
            if span
        )

    def by_size(
        op: str, next_ns: Sequence[int], with_decode: bool, target: float | None = None
    ) -> str:
        parts = [
            f"{SIZE_GROUP_TEXT[group]}: {found}"
            for group in SIZE_GROUPS
            if (found := ranges(op, next_ns, with_decode, group, target))
        ]
        found = ranges(op, next_ns, with_decode, None, target)
        return "; ".join([*parts, f"every size: {found}"]) if found else ""

    def reaching(op: str, next_ns: Sequence[int], target: float, with_decode: bool) -> str:
        """`cases at 0.80 or more: 0 of 36 at next_n 3, ...`, the unrounded fractions."""
        counts = []
        for n in next_ns:
            fractions = roofline_fractions(payload, op, n, with_decode)
            if fractions:
                met = sum(f >= target for f in fractions)
                counts.append(f"{met} of {len(fractions)} at next_n {n}")
        return f"cases at {target:.2f} or more: {', '.join(counts)}"

    items = []
    fp8 = by_size("fp8", FP8_ROOFLINE_NEXT_N, False, FP8_ROOFLINE_TARGET)
    if fp8:
        items.append(
            "fp8 of the roofline max(bytes / copy, FLOPs / 1.48 PFLOP/s) (target >= "
            f"{FP8_ROOFLINE_TARGET:.2f} at next_n 3 and 4, at every size), {fp8}; "
            f"{reaching('fp8', FP8_ROOFLINE_NEXT_N, FP8_ROOFLINE_TARGET, False)}."
        )
    fp4_decoded = by_size("fp4", FP4_ROOFLINE_NEXT_N, True, FP4_ROOFLINE_TARGET)
    if fp4_decoded:
        items.append(
            "fp4 of the roofline with the decode counted, max(bytes / copy, FLOPs / 1.48 "
            "PFLOP/s + one ALU instruction per E2M1 value at 64 per clock per SM and 1.98 GHz) "
            f"(target >= {FP4_ROOFLINE_TARGET:.2f} at next_n 2-4, at every size), "
            f"{fp4_decoded}; "
            f"{reaching('fp4', FP4_ROOFLINE_NEXT_N, FP4_ROOFLINE_TARGET, True)}."
        )
        items.append(
            "fp4 of the roofline without the decode, max(bytes / copy, FLOPs / 1.48 PFLOP/s) "
            f"(not the target's measure), {by_size('fp4', FP4_ROOFLINE_NEXT_N, False)}."
        )
    return items


def host_time_table(payload: Mapping[str, Any]) -> str:
    """The "host_time" section as a markdown table, or a line saying why there is none."""
    section = payload.get("host_time") or {}
    if section.get("status") != "done":
        status = section.get("status", "not in this results.json")
        detail = section.get("detail") or ""
        return f"Host time not measured: {status}" + (f" ({detail})." if detail else ".")
    target = section.get("target_us")
    header = [
        "op",
        "schedule",
        "host us/call",
        "min",
        "device us/call (events)",
        "GPU work us/call (graph)",
        "note",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in section.get("results", []):
        schedule = row["schedule"]
        schedule = f"`{schedule}`" if "=" in schedule else schedule
        if row.get("status") != "measured":
            cells = [row["op"], schedule, "", "", "", "", row.get("detail", "")]
        else:
            notes = []
            if target is not None:
                verdict = "meets" if row["host_us"] <= target else "over"
                notes.append(f"{verdict} the {target:g} us target")
            if row.get("device_bound"):
                notes.append("GPU work ~ host time: an upper bound")
            cells = [
                row["op"],
                schedule,
                f"{row['host_us']:.1f}",
                f"{row['host_us_min']:.1f}",
                f"{row['device_us']:.1f}",
                f"{row['graph_us']:.1f}",
                "; ".join(notes),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def host_time_caption(payload: Mapping[str, Any]) -> str:
    """What the host-time rows measured, from the section's "problem" and the row counts."""
    section = payload.get("host_time") or {}
    problem = section.get("problem")
    measured = [r for r in section.get("results", []) if r.get("status") == "measured"]
    if section.get("status") != "done" or not problem or not measured:
        return ""
    out = ", `out=` given" if problem.get("out") else ""
    caption = (
        f"Host wall-clock time per eager call (median of {measured[0]['repeats']} loops of "
        f"{measured[0]['calls']} back-to-back calls), B = {problem['batch']}, "
        f"L = {problem['seq_len']}, next_n = {problem['next_n']}, block "
        f"{problem['block_size']}{out}."
    )
    cpu = section.get("cpu") or {}
    if cpu.get("model"):
        count = f", {cpu['logical_cpus']} logical CPUs" if cpu.get("logical_cpus") else ""
        caption += f" Host CPU: {cpu['model']}{count}."
    return caption


def run_description(payload: Mapping[str, Any]) -> str:
    """Device, software, date, the copy ceiling and how many cases passed the check."""
    device = payload.get("device") or {}
    hardware = [f"{device['sm_count']} SMs"] if device.get("sm_count") else []
    if device.get("l2_bytes"):
        hardware.append(f"{device['l2_bytes'] / 2**20:g} MiB L2")
    name = device.get("name", "unknown device") + (f" ({', '.join(hardware)})" if hardware else "")
    copy = (payload.get("ceilings_bytes_per_s") or {}).get("copy")
    statuses = [r["status"] for r in payload["results"]]
    passed = statuses.count(PASS)
    text = f"Device: {name}; torch {payload.get('torch')}, CUDA {payload.get('cuda')}; "
    runs = payload.get("runs")
    if runs:
        for run in runs:
            text += f"{', '.join(run['ops'])} run started {run['date']}"
            if run.get("copy_bytes_per_s"):
                text += f", its copy ceiling {run['copy_bytes_per_s'] / 1e12:.2f} TB/s"
            text += "; "
        text += (
            "each case's fractions are of its own run's copy ceiling (bytes read plus written); "
        )
    else:
        text += f"started {payload.get('date')}; "
    if copy:
        text += f"device copy ceiling {copy / 1e12:.2f} TB/s (bytes read plus written); "
    text += f"{passed} of {len(statuses)} cases PASS the float64 check"
    if any("replays_checked" in r for r in payload["results"]):  # since 2026-12-06
        text += " and the check of their timed replays"
    if payload.get("mode") == CPU_REFERENCE:
        text += (
            '; a CPU reference run (`"mode": "cpu-reference"`): its times are host wall-clock '
            "times of the reference path and its copy ceiling a host memory copy, NOT kernel "
            "measurements"
        )
    choices = sorted({dtype_choice(r) for r in payload["results"]})
    if choices and choices != [("float32", "float32")]:
        text += "; every case ran " + dtype_choices_text(choices)
        text += " (not the defaults: the targets are read at the float32 defaults)"
    if not payload.get("complete", True):
        text += " (the run did not finish: `complete` is false)"
    return text + "."


def cell_caption(payload: Mapping[str, Any]) -> str:
    """What an op table's cells hold: kernel times over CUDA-graph replays, or, in a run of
    the CPU reference path (`"mode": "cpu-reference"`), host wall-clock times of the reference."""
    if payload.get("mode") != CPU_REFERENCE:
        return (
            "Each cell: median time per call over CUDA-graph replays, then the effective "
            "bandwidth (the byte model, outputs included) as a fraction of the run's copy "
            "bandwidth and of the gather kernel's bandwidth on the same pages."
        )
    samples = {(r.get("timing") or {}).get("samples") for r in payload["results"]}
    samples.discard(None)
    calls = f"{samples.pop()} timed calls" if len(samples) == 1 else "the timed calls"
    return (
        "CPU reference run, NOT kernel measurements. Each cell: the host wall-clock time of one "
        f"call of the CPU reference path (median of {calls} after a warm-up call), then its "
        "effective bandwidth (the byte model, outputs included) as a fraction of a host memory "
        "copy's bandwidth measured in the same run."
    )


def markdown_report(payload: Mapping[str, Any], block_size: int = PEER_BLOCK_SIZE) -> str:
    """Everything above as one markdown document, subsections at heading level 4.

    Args:
        payload: The parsed results.json.
        block_size: The block size of the fp4 / fp8 comparison.

    Returns:
        The markdown text.
    """
    parts = [run_description(payload)]
    cell = cell_caption(payload)
    ops = _ops(payload)
    for op in ops:
        parts += [f"#### {OP_NAMES.get(op, op)}", cell, op_table(payload, op)]
    if {"fp4", "fp8"} <= set(ops):
        parts += [
            f"#### fp4 against fp8 (block {block_size})",
            "Token rate: KV tokens per second of each case's own lengths (the two ops draw "
            "different lengths for the same shape). `fp4 of copy` counts fp4's 68 B per token "
            "plus its bfloat16 outputs.",
            fp4_vs_fp8_table(payload, block_size),
        ]
    small = small_batch_table(payload)
    if small:
        parts += [
            "#### Small batches, one call per graph replay",
            small_batch_caption(payload),
            small,
        ]
    parts += ["#### Summary", summary_table(payload)]
    lines = summary_lines(payload)
    if lines:
        parts.append(lines)
    parts += ["#### Host time of one eager call"]
    caption = host_time_caption(payload)
    if caption:
        parts.append(caption)
    parts.append(host_time_table(payload))
    return "\n\n".join(parts) + "\n"
