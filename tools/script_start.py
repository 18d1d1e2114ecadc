"""The start of the developer scripts that take no options: `--help` prints the docstring
(instead of running the script), and a script that needs a GPU says so instead of failing in
a traceback."""

from __future__ import annotations

import argparse
import sys


def script_start(doc: str | None, name: str, *, needs_gpu: bool) -> None:
    """Parse the (empty) command line; exit 1 with a message where a needed GPU is missing."""
    argparse.ArgumentParser(
        prog=name, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    if needs_gpu:
        import torch

        if not torch.cuda.is_available():
            sys.exit(f"{name}: needs an SM90 GPU (torch.cuda.is_available() is False)")
