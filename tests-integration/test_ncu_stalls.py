"""tools/ncu_stalls.py: stall totals and the ranking of instructions from ncu's source export."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

HEADER = [
    "Address",
    "Source",
    "Warp Stall Sampling (All Samples)",
    "Instructions Executed",
    "stall_barrier",
    "stall_imc",
    "stall_no_inst",
    "stall_imc (Not Issued)",
]
# Three instructions 16 bytes apart; the not-issued column must not count as a reason.
ROWS = [
    ["0x7f0000001000", "      LDC R1, c[0x0][0x28]", "5", "2640", "0", "1", "4", "9"],
    ["0x7f0000001010", "      ULDC.64 UR4, c[0x0][0x300]", "7", "2640", "0", "6", "0", "9"],
    ["0x7f0000001020", "      BAR.SYNC.DEFER_BLOCKING 0x0", "12", "132", "11", "0", "", "9"],
]


@pytest.fixture
def export(tmp_path: Path) -> Path:
    path = tmp_path / "source.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_ALL)
        writer.writerow(["Kernel Name", "fp8_paged_mqa_logits_sm90"])
        writer.writerow(HEADER)
        writer.writerows(ROWS)
    return path


def test_totals_count_each_reason_and_skip_not_issued_columns(export):
    import ncu_stalls

    table = ncu_stalls.read_source(export)
    samples, totals = ncu_stalls.stall_totals(table)
    assert samples == 5 + 7 + 12
    assert dict(totals) == {"stall_barrier": 11, "stall_imc": 7, "stall_no_inst": 4}


def test_ranking_gives_offsets_from_the_first_instruction(export):
    import ncu_stalls

    table = ncu_stalls.read_source(export)
    imc = ncu_stalls.ranked(table, "stall_imc", top=5)
    assert [(item.offset, item.samples, item.all_samples) for item in imc] == [
        (0x10, 6, 7),
        (0, 1, 5),
    ]
    assert imc[0].source == "ULDC.64 UR4, c[0x0][0x300]"
    # Instructions without a sample of the reason are left out, and `top` caps the list.
    assert [item.offset for item in ncu_stalls.ranked(table, "stall_barrier", top=5)] == [0x20]
    assert len(ncu_stalls.ranked(table, "stall_imc", top=1)) == 1


def test_command_line_refuses_an_unknown_reason(export, capsys, monkeypatch):
    import ncu_stalls

    monkeypatch.setattr("sys.argv", ["ncu_stalls.py", str(export), "--reason", "stall_typo"])
    with pytest.raises(SystemExit) as exit_info:
        ncu_stalls.main()
    assert exit_info.value.code == 2
    assert "stall_typo" in capsys.readouterr().err
