"""Entry point: `python tools/bench [--quick] [--out DIR] [--ops fp8,fp4] [--device cpu]`."""

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# `python tools/bench` puts this directory first on sys.path, where its module names (data,
# timing, report...) could shadow installed packages. Import it as the `bench` package instead.
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path.pop(0)
sys.path.insert(0, str(_HERE.parent))

from bench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
