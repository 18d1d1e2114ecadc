"""The Python examples of docs/layouts.md run, in order, against this package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# tests/ -> layouts/ -> packages/ -> repository root (.parent never fails, unlike parents[3])
DOC = Path(__file__).resolve().parent.parent.parent.parent / "docs" / "layouts.md"


@pytest.mark.skipif(not DOC.exists(), reason="docs/layouts.md is not part of this checkout")
def test_layouts_guide_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 8
    namespace: dict[str, object] = {}
    for index, block in enumerate(blocks):
        try:
            exec(compile(block, f"{DOC.name}[python block {index}]", "exec"), namespace)
        except Exception as error:  # pragma: no cover - the message is the point
            raise AssertionError(
                f"docs/layouts.md python block {index} failed: {error!r}"
            ) from error
