"""Summarise a `tools/ncu_stalls.sh` source export: warp-stall samples by reason, and the SASS
instructions that hold the most samples of one reason.

    python tools/ncu_stalls.py OUT/fp8-1_64_64_4096-source.csv
    python tools/ncu_stalls.py OUT/fp8-1_64_1_4096-source.csv --reason stall_imc --reason stall_barrier --top 10

A sample is one warp seen at one instruction, so a stall that all warps of a CTA share (a
barrier, a miss at a launch's start) counts once per waiting warp: the figures say where warps
wait, not which wait lies on the path to the kernel's end.
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from pathlib import Path
from typing import NamedTuple

ALL_SAMPLES = "Warp Stall Sampling (All Samples)"


class SourceTable(NamedTuple):
    """ncu's `--page source --csv` table: its column names and its rows, one per instruction."""

    header: list[str]
    rows: list[list[str]]

    def column(self, name: str) -> int:
        return self.header.index(name)

    def count(self, row: list[str], name: str) -> int:
        return int(row[self.column(name)] or 0)

    def reasons(self) -> list[str]:
        """The stall-reason columns of all samples (not the not-issued ones)."""
        return [n for n in self.header if n.startswith("stall_") and "Not Issued" not in n]


class Ranked(NamedTuple):
    offset: int  # bytes from the kernel's first instruction
    samples: int  # of the ranked reason
    all_samples: int
    executed: str
    source: str


def read_source(path: Path) -> SourceTable:
    """The table of an export (the lines before its header name the kernel)."""
    with path.open(newline="") as handle:
        lines = list(csv.reader(handle))
    header_at = next(i for i, line in enumerate(lines) if line and line[0] == "Address")
    return SourceTable(lines[header_at], [line for line in lines[header_at + 1 :] if line])


def stall_totals(table: SourceTable) -> tuple[int, Counter]:
    """All warp samples, and the samples of each stall reason."""
    samples = sum(table.count(row, ALL_SAMPLES) for row in table.rows)
    return samples, Counter(
        {name: sum(table.count(row, name) for row in table.rows) for name in table.reasons()}
    )


def ranked(table: SourceTable, reason: str, top: int) -> list[Ranked]:
    """The `top` instructions with the most samples of `reason` (none with zero)."""
    base = int(table.rows[0][table.column("Address")], 16)
    result = []
    for row in sorted(table.rows, key=lambda row: -table.count(row, reason))[:top]:
        if table.count(row, reason) == 0:
            break
        result.append(
            Ranked(
                int(row[table.column("Address")], 16) - base,
                table.count(row, reason),
                table.count(row, ALL_SAMPLES),
                row[table.column("Instructions Executed")],
                row[table.column("Source")].strip(),
            )
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source_csv", type=Path)
    parser.add_argument(
        "--reason",
        action="append",
        help="a column to rank instructions by (repeatable; default stall_no_inst)",
    )
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()

    table = read_source(args.source_csv)
    reasons = args.reason or ["stall_no_inst"]
    for reason in reasons:
        if reason not in table.header:
            parser.error(f"--reason: no column {reason!r}; the stall columns are {table.reasons()}")
    samples, totals = stall_totals(table)
    print(f"{args.source_csv.name}: {samples} warp samples")
    for name, value in totals.most_common():
        if value:
            print(f"  {name:26s} {value:7d}  {100 * value / samples:5.1f} %")
    for reason in reasons:
        print(f"\ninstructions with the most {reason} samples (offset from the kernel's start):")
        for item in ranked(table, reason, args.top):
            print(
                f"  {item.offset:#07x}  {item.samples:5d} of {item.all_samples:5d}"
                f"  executed {item.executed:>7}  {item.source}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
