"""`python -m flashinfer_jit ...`: see `flashinfer_jit.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
