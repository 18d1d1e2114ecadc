"""docs/api/*.md are generated from the packages' `__all__` (tools/gen_api_pages.py); a public
name added, removed or moved without regenerating them must fail here, not in a reader's hands."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import gen_api_pages


def test_api_pages_are_current(capsys):
    assert gen_api_pages.main(["--check"]) == 0, capsys.readouterr().out
