"""Make the shared case builders (`attn_scores_cases`) importable by the test modules here."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
