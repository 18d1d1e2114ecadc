"""tools/random_cases.py's loop (`check_calls`), with a stand-in check and clock: the order of
compiling and checking, the failure lines, `--max-failures` and `--time-limit`; the fp8 / fp4
seed interleaving and the seeds a run stopped early reports."""

from __future__ import annotations

import functools

import pytest


def _check_calls():
    import random_cases

    return random_cases.check_calls


class _Recorder:
    """A check that fails on the given seeds and a compile step, both logging what they saw,
    and a clock that advances one second per check."""

    def __init__(self, failing: set[int] = frozenset()) -> None:
        self.failing = failing
        self.log: list[tuple[str, object]] = []
        self.now = 0.0

    def check(self, variant: str, seed: int) -> None:
        self.log.append(("check", seed))
        self.now += 1.0
        if seed in self.failing:
            raise ValueError(f"logits differ at seed {seed}\nsecond line")

    def compile_chunk(self, chunk: list[tuple[str, int]]) -> None:
        self.log.append(("compile", [seed for _, seed in chunk]))

    def clock(self) -> float:
        return self.now


@pytest.fixture
def sm90_stand_in(monkeypatch):
    """random_cases.main() on this machine: torch reports a 132-SM SM90 GPU, compiling is skipped."""
    import random_cases
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda *_: type("Props", (), {"multi_processor_count": 132})(),
    )
    monkeypatch.setattr(random_cases, "compile_for", lambda *args: None)


RUNS = [("fp8", 10), ("fp8", 11), ("fp8", 12), ("fp4", 20), ("fp4", 21)]


def _run(recorder: _Recorder, **options):
    defaults = dict(chunk=2, max_failures=0, time_limit=0)
    defaults.update(options)
    return _check_calls()(
        RUNS, recorder.check, recorder.compile_chunk, clock=recorder.clock, **defaults
    )


def test_each_chunk_is_compiled_before_its_calls_are_checked() -> None:
    recorder = _Recorder()
    checked, failures = _run(recorder)
    assert (checked, failures) == (5, [])
    assert recorder.log == [
        ("compile", [10, 11]),
        ("check", 10),
        ("check", 11),
        ("compile", [12, 20]),
        ("check", 12),
        ("check", 20),
        ("compile", [21]),
        ("check", 21),
    ]


def test_failures_are_reported_and_the_run_goes_on(capsys) -> None:
    checked, failures = _run(_Recorder(failing={11, 20}))
    assert checked == 5
    assert failures == [
        "FAIL fp8 seed 11: ValueError: logits differ at seed 11",
        "FAIL fp4 seed 20: ValueError: logits differ at seed 20",
    ]
    assert capsys.readouterr().out.splitlines() == failures


def test_max_failures_stops_after_that_many() -> None:
    recorder = _Recorder(failing={11, 20})
    checked, failures = _run(recorder, max_failures=1)
    assert checked == 2 and len(failures) == 1
    assert ("check", 12) not in recorder.log


@pytest.mark.parametrize(("limit", "expected"), [(0, 5), (0.5, 1), (2, 2), (2.5, 3), (100, 5)])
def test_no_call_starts_after_the_time_limit(capsys, limit, expected) -> None:
    recorder = _Recorder()
    checked, failures = _run(recorder, time_limit=limit)
    assert (checked, failures) == (expected, [])
    assert [seed for kind, seed in recorder.log if kind == "check"] == [
        seed for _, seed in RUNS[:expected]
    ]
    stopped = "stopped at the time limit" in capsys.readouterr().out
    assert stopped == (expected < len(RUNS))


def test_main_passes_the_draw_options_to_every_call(monkeypatch, capsys, sm90_stand_in) -> None:
    """The command line as a whole, with the GPU parts stood in: each seed reaches the check
    with the options given, and the summary counts what ran."""
    import random_cases

    seen: list[tuple] = []
    monkeypatch.setattr(random_cases, "check_random_call", lambda *args: seen.append(args))
    monkeypatch.setattr(random_cases, "check_schedule", lambda seed, sms: seen.append((seed, sms)))
    argv = "--fp8 2 --fp4 1 --first-seed 7 --schedules 1 --shapes wide --batches large"
    argv += " --scales wide --layouts wide --replays 3"
    monkeypatch.setattr("sys.argv", ["random_cases.py", *argv.split()])
    assert random_cases.main() == 0
    assert seen == [
        ("fp8", 7, "wide", "large", "wide", "wide", 3),
        ("fp4", 500007, "wide", "large", "wide", "wide", 3),
        ("fp8", 8, "wide", "large", "wide", "wide", 3),
        (7, 132),
    ]
    out = capsys.readouterr().out
    assert "random cases: 3 of 3 passed (2 fp8, 1 fp4, seeds from 7" in out
    assert "schedules: 1 of 1 equal to the CPU's" in out


@pytest.mark.parametrize(("fp8", "fp4"), [(3, 2), (300, 300), (200, 16), (0, 5), (7, 0), (1, 9)])
def test_interleave_keeps_each_order_and_every_prefix_in_proportion(fp8, fp4) -> None:
    import random_cases

    fp8_runs = [("fp8", seed) for seed in range(fp8)]
    fp4_runs = [("fp4", 500000 + seed) for seed in range(fp4)]
    runs = random_cases.interleave(fp8_runs, fp4_runs)
    assert sorted(runs) == sorted(fp8_runs + fp4_runs)
    assert [run for run in runs if run[0] == "fp8"] == fp8_runs
    assert [run for run in runs if run[0] == "fp4"] == fp4_runs
    for length in range(1, len(runs) + 1):
        taken = sum(variant == "fp8" for variant, _ in runs[:length])
        # Each share is within one call of its proportion at every prefix.
        assert abs(taken - length * fp8 / (fp8 + fp4)) <= 1


def test_a_run_stopped_early_names_the_seeds_it_checked(monkeypatch, capsys, sm90_stand_in) -> None:
    import random_cases

    clock = {"now": 0.0}
    checked: list[tuple[str, int]] = []

    def check(variant, seed, *options):
        checked.append((variant, seed))
        clock["now"] += 1.0

    monkeypatch.setattr(random_cases, "check_random_call", check)
    monkeypatch.setattr(
        random_cases,
        "check_calls",
        functools.partial(random_cases.check_calls, clock=lambda: clock["now"]),
    )
    argv = "--fp8 4 --fp4 4 --first-seed 100 --time-limit 5"
    monkeypatch.setattr("sys.argv", ["random_cases.py", *argv.split()])
    assert random_cases.main() == 0
    assert checked == [
        ("fp8", 100),
        ("fp4", 500100),
        ("fp8", 101),
        ("fp4", 500101),
        ("fp8", 102),
    ]
    out = capsys.readouterr().out
    assert "stopped early: 5 of the 8 planned calls checked" in out
    assert "checked seeds: fp8 100-102, fp4 500100-500101" in out
    assert "random cases: 5 of 5 passed (3 fp8, 2 fp4, seeds from 100" in out
