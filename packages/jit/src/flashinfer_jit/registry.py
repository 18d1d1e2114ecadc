"""Discovering kernel configurations: the `flashinfer_jit.kernels` entry points and targets.

A kernel package registers every configuration it may compile, so CI can build them all::

    # pyproject.toml of a kernel package
    [project.entry-points."flashinfer_jit.kernels"]
    flashinfer-attn-scores = "flashinfer_attn_scores._kernels:all_kernel_specs"

The entry point is a zero-argument callable returning an iterable of `KernelSpec`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterable
from dataclasses import dataclass

from .spec import KernelSpec

ENTRY_POINT_GROUP = "flashinfer_jit.kernels"


@dataclass(frozen=True)
class SpecSource:
    """Where a group of specs came from, with the specs or the error that prevented them.

    Attributes:
        name: Entry-point name or target string.
        specs: The configurations found.
        error: Why loading failed, or None.
    """

    name: str
    specs: tuple[KernelSpec, ...]
    error: str | None = None


def _as_specs(value: object, origin: str) -> tuple[KernelSpec, ...]:
    if callable(value) and not isinstance(value, KernelSpec):
        value = value()
    if isinstance(value, KernelSpec):
        return (value,)
    if not isinstance(value, Iterable):
        raise TypeError(f"{origin}: expected KernelSpec items, got {type(value).__name__}")
    specs = tuple(value)
    for item in specs:
        if not isinstance(item, KernelSpec):
            raise TypeError(f"{origin}: expected KernelSpec items, got {type(item).__name__}")
    return specs


def load_target(target: str) -> tuple[KernelSpec, ...]:
    """Load specs from `"package.module:attribute"`.

    Args:
        target: Module path and attribute; the attribute is a KernelSpec, an iterable of
            them, or a zero-argument callable returning either.

    Returns:
        The specs.

    Raises:
        ValueError: `target` has no `:`.
        ImportError: The module cannot be imported.
        AttributeError: The attribute does not exist.
        TypeError: It does not produce KernelSpec objects.
    """
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"target: expected 'package.module:callable', got {target!r}")
    value: object = importlib.import_module(module_name)
    for part in attribute.split("."):
        value = getattr(value, part)
    return _as_specs(value, target)


def discover_registered_specs(group: str = ENTRY_POINT_GROUP) -> list[SpecSource]:
    """Load every configuration registered under an entry-point group.

    Args:
        group: Entry-point group name.

    Returns:
        One `SpecSource` per entry point, sorted by name; an entry point that fails to load
        or call carries the error instead of raising, so one broken package does not hide
        the others.
    """
    sources = []
    for entry_point in sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name):
        origin = f"{entry_point.name} ({entry_point.value})"
        try:
            specs = _as_specs(entry_point.load(), origin)
        except Exception as exc:  # report and go on: CI shows every broken registration
            sources.append(SpecSource(origin, (), f"{type(exc).__name__}: {exc}"))
        else:
            sources.append(SpecSource(origin, specs))
    return sources
