"""Parsing ptxas' resource report."""

from __future__ import annotations

import pytest
from flashinfer_jit.resources import FunctionResources, parse_ptxas_report, resources_from_json

# A real report (NVRTC 13, sm_90a, --maxrregcount=32) of two kernels and a device function.
REPORT = """\
ptxas info    : Overriding maximum register limit 256 for 'spill' with  32 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'local_arr' for 'sm_90a'
ptxas info    : Function properties for local_arr
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 0 barriers
ptxas info    : Compile time = 13.181 ms
ptxas info    : Compiling entry function 'spill' for 'sm_90a'
ptxas info    : Function properties for spill
ptxas         .     312 bytes stack frame, 316 bytes spill stores, 364 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 1024 bytes smem, 380 bytes cmem[0], 312 bytes cumulative stack size
ptxas info    : Compile time = 40.445 ms
ptxas info    : Function properties for _Z6helperPKfi
ptxas         .     16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""


def test_report_is_parsed_per_function():
    functions = parse_ptxas_report(REPORT)
    assert list(functions) == ["local_arr", "spill", "_Z6helperPKfi"]
    assert functions["local_arr"] == FunctionResources(
        name="local_arr", is_entry=True, registers=30
    )
    assert functions["spill"] == FunctionResources(
        name="spill",
        is_entry=True,
        registers=32,
        barriers=1,
        static_shared_bytes=1024,
        constant_bytes=380,
        stack_frame_bytes=312,
        cumulative_stack_bytes=312,
        spill_store_bytes=316,
        spill_load_bytes=364,
    )
    assert functions["spill"].spills and not functions["local_arr"].spills
    helper = functions["_Z6helperPKfi"]
    assert not helper.is_entry and helper.stack_frame_bytes == 16 and not helper.spills


def test_manifest_round_trip():
    functions = parse_ptxas_report(REPORT)
    assert resources_from_json({k: v.to_json() for k, v in functions.items()}) == functions


def test_empty_log_gives_no_functions():
    assert parse_ptxas_report("") == {}


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"registers": "abc"}, r"functions\['spill'\]\.registers: expected an int >= 0, got 'abc'"),
        ({"spill_store_bytes": None}, r"\.spill_store_bytes: expected an int >= 0, got None"),
        ({"barriers": True}, r"\.barriers: expected an int >= 0, got True"),
        ({"stack_frame_bytes": -1}, r"\.stack_frame_bytes: expected an int >= 0, got -1"),
        ({"is_entry": 1}, "a bool is_entry"),
        ({"name": "other"}, "its own name"),
        ({"bogus": 1}, "expected the fields"),
    ],
)
def test_manifest_fields_of_another_type_are_rejected(change, fragment):
    data = {k: v.to_json() for k, v in parse_ptxas_report(REPORT).items()}
    data["spill"].update(change)
    with pytest.raises(ValueError, match=fragment):
        resources_from_json(data)


def test_a_device_function_reported_under_several_entries_keeps_its_largest_spills():
    # ptxas reports a non-inlined device function once per calling entry; under a tight
    # register limit it spills, under a loose one not. The spill must not be lost to the
    # order of the reports (found by a review: compile-check passed a spilling kernel).
    report = """\
ptxas info    : Compiling entry function 'tight' for 'sm_90a'
ptxas info    : Function properties for _Z5heavyPKfi
ptxas         .     8 bytes stack frame, 1152 bytes spill stores, 1152 bytes spill loads
ptxas info    : Function properties for tight
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 368 bytes cmem[0]
ptxas info    : Compiling entry function 'loose' for 'sm_90a'
ptxas info    : Function properties for _Z5heavyPKfi
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Function properties for loose
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 120 registers, used 0 barriers, 368 bytes cmem[0]
"""
    heavy = parse_ptxas_report(report)["_Z5heavyPKfi"]
    assert (heavy.stack_frame_bytes, heavy.spill_store_bytes, heavy.spill_load_bytes) == (
        8,
        1152,
        1152,
    )
    assert heavy.spills and not heavy.is_entry
