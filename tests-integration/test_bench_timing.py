"""The benchmark's timing, on a GPU kernel of known length."""

from __future__ import annotations

import pytest
import torch


def _timing():
    from bench import timing

    return timing


def _spin_alone_us(cycles: int) -> float:
    """A spin kernel's own length, from events around it in a stream of many."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)
    start.record()
    for _ in range(20):
        torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / 20


@pytest.mark.gpu
def test_single_replays_time_one_call_alone_without_the_host_launch() -> None:
    timing = _timing()
    cycles = 100_000  # about 50 us
    alone_us = _spin_alone_us(cycles)

    for cold in (True, False):  # one replay after an L2 flush, or 32 in a row
        measured = timing.time_single_replays(
            lambda: torch.cuda._sleep(cycles), cold=cold, samples=5
        )
        assert measured.samples == 5
        # The call itself plus a graph launch on the device: a few microseconds, never the
        # host's launch latency of each replay (which the spin hides).
        assert alone_us * 0.95 <= measured.median_us <= alone_us + 8.0, (cold, measured, alone_us)


@pytest.mark.gpu
def test_spin_timer_keeps_a_slow_host_launch_out_of_the_sample() -> None:
    import time

    timing = _timing()
    cycles = 20_000  # about 10 us
    alone_us = _spin_alone_us(cycles)

    def slow_launch() -> None:
        time.sleep(300e-6)  # a host that takes 300 us to queue the kernel
        torch.cuda._sleep(cycles)

    # The first spin (about 20 us) is shorter than the host's queueing: the timer must notice,
    # lengthen the spin and take the sample again.
    timer = timing.SpinTimer(timing.SPIN_CYCLES_PER_GRAPH)
    samples_us = [timer.sample_ms(slow_launch) * 1e3 for _ in range(5)]
    assert timer.spin_cycles > timing.SPIN_CYCLES_PER_GRAPH
    for sample_us in samples_us:
        assert alone_us * 0.95 <= sample_us <= alone_us + 5.0, (samples_us, alone_us)


@pytest.mark.gpu
def test_graph_replays_hold_no_host_launch() -> None:
    timing = _timing()
    cycles = 20_000
    alone_us = _spin_alone_us(cycles)
    measured = timing.time_graph_replays([lambda: torch.cuda._sleep(cycles)], min_samples=10)
    assert alone_us * 0.95 <= measured.median_us <= alone_us + 5.0, (measured, alone_us)


@pytest.mark.gpu
@pytest.mark.parametrize("timer", ["graph of many calls", "one replay cold", "one replay warm"])
def test_before_samples_runs_after_every_eager_call_and_before_the_timed_replays(timer) -> None:
    """The benchmark poisons its output in `before_samples` and checks what the timed replays
    wrote: the hook must come after the last eager run of the closure (warm-up and capture)
    and before the first timed replay."""
    timing = _timing()
    counter = torch.zeros(1, dtype=torch.int64, device="cuda")
    host_calls = []
    calls_at_hook = []

    def call() -> None:
        host_calls.append(1)  # runs eagerly and once at capture, never in a replay
        counter.add_(1)

    def hook() -> None:
        calls_at_hook.append(len(host_calls))
        counter.zero_()

    if timer == "graph of many calls":
        measured = timing.time_graph_replays(
            [call], min_samples=5, budget_s=0.0, before_samples=hook
        )
        per_sample = 1
    else:
        cold = timer == "one replay cold"
        measured = timing.time_single_replays(call, cold=cold, samples=5, before_samples=hook)
        per_sample = 1 if cold else timing.SINGLE_REPLAY_WINDOW
    torch.cuda.synchronize()
    assert calls_at_hook == [len(host_calls)]  # once, after every eager run and the capture
    assert len(host_calls) == timing.WARMUP_CALLS + 1
    # Every timed replay ran after the hook (a refused sample repeats its replays).
    replays = int(counter.item())
    assert replays >= measured.samples * per_sample and replays % per_sample == 0


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("batch", "avg_len", "fault", "faulty_set", "failed_timing"),
    [
        (2, 4096, "perturb", 0, "one call per replay, after an L2 flush"),  # a small batch
        (16, 2048, "perturb", 0, "graph of"),
        (16, 2048, "skip", 0, "graph of"),
        (16, 2048, "perturb", 2, "graph of"),  # a later rotation set: its own eager bits
    ],
)
def test_run_case_fails_a_case_whose_timed_replays_differ_from_the_eager_calls(
    monkeypatch, batch, avg_len, fault, faulty_set, failed_timing
) -> None:
    """Each rotation set's first closure (the eager call run_case keeps the bits of; for set
    0 also the one checked against the float64 reference) is honest; the closure that is then
    timed adds 1 to one valid logit ("perturb") or launches nothing ("skip"). The case must
    FAIL, naming the first timing whose replays were checked and, for a graph of many calls,
    the rotation set."""
    from bench import cli

    honest = cli.op_call
    made = []

    def faulty_op_call(case, inputs):
        call = honest(case, inputs)
        if inputs is not case.sets[faulty_set]:
            return call
        made.append(1)
        if len(made) == 1 and faulty_set == 0:
            return call  # the eager call that run_case checks against the reference

        calls_made = []

        def faulty():
            calls_made.append(1)
            if faulty_set != 0 and len(calls_made) == 1:
                return call()  # a later set's first call: the eager bits run_case keeps
            if fault == "skip":
                return inputs.out
            result = call()
            inputs.out[0, 0].add_(1.0)  # row 0, position 0: valid for every length >= 1
            return result

        return faulty

    monkeypatch.setattr(cli, "op_call", faulty_op_call)
    shape = cli.IndexerShape("fp8", batch, avg_len, 1, 64)
    result = cli.run_case(shape, torch.device("cuda"), gather=False)
    assert result.check is not None and result.check.passed
    assert result.status == cli.FAIL, result.detail
    assert result.detail.startswith(failed_timing) and "differ from the eager" in result.detail
    if failed_timing == "graph of":
        assert f", rotation set {faulty_set}: 1 of " in result.detail or fault == "skip"
    assert result.replays_checked  # the timing that failed is listed

    monkeypatch.setattr(cli, "op_call", honest)
    result = cli.run_case(shape, torch.device("cuda"), gather=False)
    assert result.status == cli.PASS, result.detail
    expected = 3 if shape.small_batch else 1
    assert len(result.replays_checked) == expected
