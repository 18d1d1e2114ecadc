"""Per-function resource usage, parsed from the `ptxas -v` report NVRTC returns as its log.

Every compile passes `--ptxas-options=-v`, so the report is stored in the cache manifest and
available without a GPU. The report looks like::

    ptxas info    : Compiling entry function 'k' for 'sm_90a'
    ptxas info    : Function properties for k
    ptxas         .     312 bytes stack frame, 316 bytes spill stores, 364 bytes spill loads
    ptxas info    : Used 32 registers, used 1 barriers, 1024 bytes smem, 312 bytes cumulative stack size

"Function properties" also appears for non-inlined device functions; their spills count. A
device function called from several entries is reported once under each, and the reports can
differ (each entry's register limit): the largest values are kept.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")
_CUMULATIVE_STACK = re.compile(r"(\d+) bytes cumulative stack size")


@dataclass(frozen=True)
class FunctionResources:
    """Resource usage of one function in a cubin, per thread unless stated.

    Attributes:
        name: Mangled (or `extern "C"`) function name.
        is_entry: True for `__global__` functions, False for non-inlined device functions.
        registers: Registers per thread (entry functions only; 0 otherwise).
        barriers: Named barriers used (entry functions only).
        static_shared_bytes: `__shared__` arrays of fixed size, per block. Dynamic shared
            memory is chosen at launch and is not part of the binary.
        constant_bytes: The first constant bank on the function's "Used" line, when ptxas
            reports one (bank 0, the kernel's parameters); user `__constant__` data is
            reported for the whole module, not here.
        stack_frame_bytes: Local memory (stack frame) per thread for this function.
        cumulative_stack_bytes: Stack including callees, when ptxas reports it.
        spill_store_bytes: Bytes of register spill stores per thread.
        spill_load_bytes: Bytes of register spill loads per thread.
    """

    name: str
    is_entry: bool
    registers: int = 0
    barriers: int = 0
    static_shared_bytes: int = 0
    constant_bytes: int = 0
    stack_frame_bytes: int = 0
    cumulative_stack_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0

    @property
    def spills(self) -> bool:
        """True when ptxas spilled registers to local memory."""
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0

    def to_json(self) -> dict[str, Any]:
        """Return the fields as a JSON-able dict (for the cache manifest)."""
        return asdict(self)


def parse_ptxas_report(log: str) -> dict[str, FunctionResources]:
    """Parse a `ptxas -v` report into per-function resources.

    Args:
        log: NVRTC log of a compile made with `--ptxas-options=-v`.

    Returns:
        Function name -> resources, entry functions and device functions alike, in the order
        ptxas reports them.
    """
    fields: dict[str, dict[str, Any]] = {}
    entry: str | None = None
    properties_of: str | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            fields.setdefault(entry, {"name": entry, "is_entry": True})["is_entry"] = True
            continue
        if m := _PROPERTIES.search(line):
            properties_of = m.group(1)
            fields.setdefault(properties_of, {"name": properties_of, "is_entry": False})
            continue
        if (m := _FRAME.search(line)) and properties_of is not None:
            target = fields[properties_of]
            for key, value in zip(
                ("stack_frame_bytes", "spill_store_bytes", "spill_load_bytes"), m.groups()
            ):
                target[key] = max(target.get(key, 0), int(value))
            continue
        if (m := _USED.search(line)) and entry is not None:
            target = fields[entry]
            target["registers"] = int(m.group(1))
            for key, pattern in (
                ("barriers", _BARRIERS),
                ("static_shared_bytes", _SMEM),
                ("constant_bytes", _CMEM),
                ("cumulative_stack_bytes", _CUMULATIVE_STACK),
            ):
                if found := pattern.search(line):
                    target[key] = int(found.group(1))
    return {name: FunctionResources(**values) for name, values in fields.items()}


def _function_from_json(name: object, values: object) -> FunctionResources:
    if not isinstance(name, str) or not isinstance(values, dict):
        raise ValueError(f"functions: expected name -> dict, got {name!r} -> {values!r}")
    expected = {f.name for f in fields(FunctionResources)}
    if set(values) != expected:
        raise ValueError(
            f"functions[{name!r}]: expected the fields {sorted(expected)}, got {sorted(values)}"
        )
    if values["name"] != name or not isinstance(values["is_entry"], bool):
        raise ValueError(
            f"functions[{name!r}]: expected its own name and a bool is_entry, got name "
            f"{values['name']!r} and is_entry {values['is_entry']!r}"
        )
    for key in expected - {"name", "is_entry"}:
        value = values[key]
        if type(value) is not int or value < 0:
            raise ValueError(f"functions[{name!r}].{key}: expected an int >= 0, got {value!r}")
    return FunctionResources(**values)


def resources_from_json(data: object) -> dict[str, FunctionResources]:
    """Rebuild the output of `parse_ptxas_report` from its manifest form.

    Args:
        data: Function name -> `FunctionResources.to_json()` dict.

    Returns:
        Function name -> resources.

    Raises:
        ValueError: `data` is not exactly what `to_json` writes (a field missing or extra,
            of another type, or negative).
    """
    if not isinstance(data, dict):
        raise ValueError(f"functions: expected a dict, got {type(data).__name__}")
    return {name: _function_from_json(name, values) for name, values in data.items()}
