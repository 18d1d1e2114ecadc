"""Fixtures of the flashinfer_jit tests: an isolated kernel cache per test session."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_cache_dir(tmp_path_factory):
    # Never write into the user's real cache; GPU tests share one session cache.
    previous = os.environ.get("FLASHINFER_JIT_CACHE_DIR")
    folder = tmp_path_factory.mktemp("jit-cache")
    os.environ["FLASHINFER_JIT_CACHE_DIR"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("FLASHINFER_JIT_CACHE_DIR", None)
    else:
        os.environ["FLASHINFER_JIT_CACHE_DIR"] = previous


@pytest.fixture
def cache_dir(tmp_path):
    """A fresh, empty cache root for one test."""
    folder = tmp_path / "cache"
    folder.mkdir()
    return folder
