"""Shared pytest configuration: `gpu`-marked tests run only where an SM90 GPU exists."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def _sm90_skip_reason() -> str | None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "needs an SM90 (Hopper) GPU: torch.cuda.is_available() is False on this machine"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        name = torch.cuda.get_device_name()
        return f"needs an SM90 (Hopper) GPU; found {name} with compute capability {major}.{minor}"
    return None


def pytest_configure(config):
    # Registered here rather than in a pytest ini section, so that the packages' sdists, which
    # ship this file beside their tests, know the markers too.
    config.addinivalue_line(
        "markers", "gpu: needs an SM90 (Hopper) GPU; skipped with a reason elsewhere"
    )
    config.addinivalue_line("markers", "slow: long-running test")


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or _sm90_skip_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
