"""Two benchmark runs case by case: `python tools/bench --compare OLD.json NEW.json`.

Runs of unchanged kernels differ by a few % between machines at the power cap, so a change is
read from the ratio of each case's median time (new / old) over the cases both runs timed,
grouped by op, next_n and problem size (B x L tokens: the targets' regimes). Each run's device
UUID is printed beside it, where the run recorded one, to tell a machine from a run.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from .tables import (
    SIZE_GROUPS,
    case_key,
    dtype_choice,
    index_cases,
    median_us,
    size_group,
)


def time_ratios(
    old: Mapping[str, Any], new: Mapping[str, Any]
) -> dict[tuple[str, int, str], list[float]]:
    """new / old median time of every case both runs timed and passed with the same dtypes,
    by (op, next_n, group).

    Raises:
        ValueError: If the runs have no such case in common.
    """
    old_cases = index_cases(old)
    ratios: dict[tuple[str, int, str], list[float]] = {}
    for record in new["results"]:
        key = case_key(record)
        before = old_cases.get(key)
        new_us, old_us = median_us(record), median_us(before)
        if new_us is None or old_us is None or _dtypes(record) != _dtypes(before):
            continue
        op, next_n, batch, avg_len, _ = key
        ratios.setdefault((op, next_n, size_group(batch, avg_len)), []).append(new_us / old_us)
    if not ratios:
        raise ValueError(
            "the two runs have no case in common that both timed and passed with the same dtypes"
        )
    return ratios


def _dtypes(record: Mapping[str, Any]) -> tuple[str, str, str | None]:
    return (*dtype_choice(record), record.get("output_dtype"))


def _run_label(payload: Mapping[str, Any]) -> str:
    device = payload.get("device") or {}
    uuid = device.get("uuid") or "not recorded"
    dates = [run.get("date", "?") for run in payload.get("runs", [])] or [payload.get("date", "?")]
    return f"{device.get('name', '?')}, UUID {uuid}, started {', '.join(dates)}"


def _cell(values: list[float] | None) -> str:
    if not values:
        return ""
    return (
        f"{min(values):.3f}-{max(values):.3f}, median {statistics.median(values):.3f} "
        f"({len(values)})"
    )


def compare_report(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """Markdown: each run's device and start, then the new / old time ratios by group.

    Raises:
        ValueError: As `time_ratios`.
    """
    ratios = time_ratios(old, new)
    rows = sorted({(op, next_n) for op, next_n, _ in ratios})
    lines = [
        f"Old: {_run_label(old)}.",
        f"New: {_run_label(new)}.",
        "",
        "new / old median time per case (above 1: slower now): lowest-highest, median (cases)",
        "",
        "| op | next_n | " + " | ".join(f"B x L {g}" for g in SIZE_GROUPS) + " |",
        "|---|---|" + "---|" * len(SIZE_GROUPS),
    ]
    for op, next_n in rows:
        cells = [_cell(ratios.get((op, next_n, g))) for g in SIZE_GROUPS]
        lines.append(f"| {op} | {next_n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
