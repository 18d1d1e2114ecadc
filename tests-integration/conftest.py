"""The developer scripts under tools/ (the `bench` package, unit_path, sanitize_cases) are not
installed; these tests import them from there."""

import sys
from pathlib import Path

_TOOLS = str(Path(__file__).resolve().parent.parent / "tools")
if _TOOLS not in sys.path:
    sys.path.insert(0, _TOOLS)
