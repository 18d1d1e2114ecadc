"""Every attribute the tests reach on a package module exists (a static check, CPU only).

Many GPU tests patch or read package internals (`monkeypatch.setattr(dispatch,
"_EAGER_CALLS", {})`, `launcher.prepare_fp8_paged_mqa_logits`). On a machine without an SM90
GPU those tests are skipped, so a renamed or moved name would fail only on the GPU. This test
reads every test file and tool with `ast`, resolves the names bound by `from flashinfer_* import
module` / `import flashinfer_*... as name`, and checks each `module.attribute` and each
`monkeypatch.setattr(module, "name", ...)` / `delattr` target against the imported module.
"""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    [
        *ROOT.glob("packages/*/tests/**/*.py"),
        *ROOT.glob("tests-integration/*.py"),
        *ROOT.glob("tools/**/*.py"),
    ]
)


def _module_bindings(tree: ast.Module) -> dict[str, types.ModuleType]:
    """Names bound to one of our package modules anywhere in the file."""
    bound: dict[str, types.ModuleType] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("flashinfer_"):
                continue
            for alias in node.names:
                try:
                    value = getattr(importlib.import_module(node.module), alias.name, None)
                    if value is None:
                        value = importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    continue
                if isinstance(value, types.ModuleType):
                    bound[alias.asname or alias.name] = value
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("flashinfer_") and alias.asname:
                    bound[alias.asname] = importlib.import_module(alias.name)
    return bound


def _missing_attributes(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    bound = _module_bindings(tree)
    missing = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if isinstance(node.ctx, ast.Load):
                target = (node.value.id, node.attr, node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            target = (node.args[0].id, node.args[1].value, node.lineno)
        if target and target[0] in bound and not hasattr(bound[target[0]], target[1]):
            missing.append(f"{path.relative_to(root)}:{target[2]}: {target[0]}.{target[1]}")
    return missing


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_attribute_exists(path):
    assert _missing_attributes(path) == []


def test_the_check_finds_a_missing_name(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        "from flashinfer_attn_scores.paged_mqa_logits import api, dispatch\n"
        "def test(monkeypatch):\n"
        "    monkeypatch.setattr(api, '_EAGER_CALLS', {})\n"
        "    return dispatch.EagerCall, dispatch._no_such_name\n"
    )
    assert _missing_attributes(source, root=tmp_path) == [
        "probe.py:3: api._EAGER_CALLS",
        "probe.py:4: dispatch._no_such_name",
    ]
