"""The ops with every tensor on a second GPU, whichever device is current (needs two SM90 GPUs).

A serving process often holds tensors on `cuda:1` while `cuda:0` is current, or switches
devices between calls. Compiled kernels, the kernel's dynamic shared-memory attribute and
the launch stream all belong to one device, so these tests check that each call runs on its
tensors' device and matches the float64 reference there, bitwise equal to the same call on
`cuda:0`.
"""

from __future__ import annotations

import contextlib
import threading

import flashinfer_attn_scores as fa
import pytest
import torch
from flashinfer_attn_scores.paged_mqa_logits.reference import (
    fp4_paged_mqa_logits_reference,
    fp8_paged_mqa_logits_reference,
    valid_mask,
)
from test_gpu import (
    MAX_SEQ_LEN,
    assert_nothing_written,
    check_result,
    fp4_case,
    fp4_per_token,
    fp8_case,
    magnitude_of,
    poisoned_out,
    repoison,
    tolerance,
)


def _two_sm90_gpus() -> bool:
    if torch.cuda.device_count() < 2:
        return False
    return all(torch.cuda.get_device_capability(i) == (9, 0) for i in range(2))


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _two_sm90_gpus(), reason="needs two SM90 (Hopper) GPUs"),
]

SECOND = torch.device("cuda", 1)
CALLS_PER_THREAD = 3


def poisoned(rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return poisoned_out(rows, MAX_SEQ_LEN, dtype, device=device)


def run_fp8(case, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    out = poisoned(case.rows, torch.float32, device)
    got = fa.fp8_paged_mqa_logits(*case.fp8_args(), out=out)
    return got, out


def run_fp4(case, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    out = poisoned(case.rows, torch.bfloat16, device)
    got = fa.fp4_paged_mqa_logits(*case.fp4_args(), out=out)
    return got, out


def same_valid_bits(case, got: torch.Tensor, other: torch.Tensor) -> bool:
    """Bitwise equality on the valid region (the rest is unspecified and may differ)."""
    mask = valid_mask(case.seq_lens.cpu(), case.next_n, got.shape[1])
    bits = torch.int16 if got.element_size() == 2 else torch.int32
    return torch.equal(got.cpu()[mask].view(bits), other.cpu()[mask].view(bits))


def check_fp8(case, got, out, next_n):
    expected = fp8_paged_mqa_logits_reference(*case.fp8_args())
    magnitude = magnitude_of(fp8_paged_mqa_logits_reference, case.fp8_args())
    check_result(got, out, expected, case.seq_lens, next_n, tolerance(torch.float32), magnitude)


def check_fp4(case, got, out, next_n):
    """Per token (`fp4_per_token`), at the case's current lengths."""
    expected = fp4_paged_mqa_logits_reference(*case.fp4_args())
    magnitude = magnitude_of(fp4_paged_mqa_logits_reference, case.fp4_args())
    tol, per_token = tolerance(torch.bfloat16), fp4_per_token(case, torch.bfloat16)
    check_result(got, out, expected, case.seq_lens, next_n, tol, magnitude, **per_token)


@pytest.mark.parametrize("current", [0, 1])
@pytest.mark.parametrize(("block_size", "next_n"), [(64, 1), (32, 2), (128, 4)])
def test_fp8_on_second_device(current, block_size, next_n):
    seed = 7 * block_size + next_n
    with torch.cuda.device(current):
        case = fp8_case(block_size, next_n, seed, device=SECOND)
        got, out = run_fp8(case, SECOND)
        torch.cuda.synchronize(SECOND)
    assert got.device == SECOND and out.device == SECOND
    check_fp8(case, got, out, next_n)
    # The same inputs on cuda:0 (same kernel, same SM count) give the same bits.
    first = torch.device("cuda", 0)
    got0, _ = run_fp8(fp8_case(block_size, next_n, seed, device=first), first)
    torch.cuda.synchronize(first)
    assert same_valid_bits(case, got, got0)


@pytest.mark.parametrize("current", [0, 1])
@pytest.mark.parametrize(("block_size", "next_n"), [(64, 1), (128, 3)])
def test_fp4_on_second_device(current, block_size, next_n):
    seed = 5 * block_size + next_n
    with torch.cuda.device(current):
        case = fp4_case(block_size, next_n, seed, device=SECOND)
        got, out = run_fp4(case, SECOND)
        torch.cuda.synchronize(SECOND)
    assert got.device == SECOND
    check_fp4(case, got, out, next_n)
    first = torch.device("cuda", 0)
    got0, _ = run_fp4(fp4_case(block_size, next_n, seed, device=first), first)
    torch.cuda.synchronize(first)
    assert same_valid_bits(case, got, got0)


def test_calls_alternating_between_devices():
    """The same argument signature apart from the device, called on cuda:0, cuda:1, cuda:0,
    cuda:1 with cuda:0 current: each call is remembered per device and runs on its own."""
    devices = [torch.device("cuda", 0), SECOND]
    cases = {d: fp8_case(64, 2, seed=11 + d.index, device=d) for d in devices}
    with torch.cuda.device(0):
        for _ in range(2):
            for d in devices:
                got, out = run_fp8(cases[d], d)
                torch.cuda.synchronize(d)
                assert got.device == d
                check_fp8(cases[d], got, out, 2)


def test_side_stream_of_second_device():
    """A launch on a non-default stream of cuda:1, cuda:0 current: the kernel runs on that
    stream (the result is complete once that stream alone is synchronised)."""
    case = fp8_case(64, 1, seed=3, device=SECOND)
    stream = torch.cuda.Stream(SECOND)
    with torch.cuda.device(0):
        stream.wait_stream(torch.cuda.current_stream(SECOND))
        with torch.cuda.stream(stream):
            got, out = run_fp8(case, SECOND)
        stream.synchronize()
    check_fp8(case, got, out, 1)


def test_schedule_on_second_device_matches_cpu():
    lens = [0, 1, 4097, 0, 70000, 129, 3, 65]
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    num_sms = torch.cuda.get_device_properties(SECOND).multi_processor_count
    for next_n, variant in [(1, "fp8"), (4, "fp4")]:
        with torch.cuda.device(0):
            on_gpu = fa.compute_paged_mqa_logits_schedule(
                seq_lens.to(SECOND), next_n=next_n, variant=variant
            )
        on_cpu = fa.compute_paged_mqa_logits_schedule(
            seq_lens, next_n=next_n, variant=variant, num_sms=num_sms
        )
        assert on_gpu.device == SECOND
        assert torch.equal(on_gpu.cpu(), on_cpu)


# Lengths at capture (each request maps 16 blocks of 64 tokens), then the contents of two
# replays: zeros, lengths at and across block edges, a request that grows back.
CAPTURE_LENGTHS = [1000] * 6
REPLAY_LENGTHS = ([5, 0, 64, 65, 1000, 1], [1000, 999, 0, 129, 63, 700])


@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_graph_on_second_device_follows_seq_lens(variant):
    """Captured on cuda:1 (schedule derived inside the call), replayed after each change of
    the lengths' contents."""
    make, run, check = (
        (fp8_case, run_fp8, check_fp8) if variant == "fp8" else (fp4_case, run_fp4, check_fp4)
    )
    next_n = 2
    case = make(64, next_n, seed=21, device=SECOND, lens=CAPTURE_LENGTHS)
    with torch.cuda.device(SECOND):
        run(case, SECOND)  # compiles and loads outside the capture
        torch.cuda.synchronize()
        out = poisoned(case.rows, torch.float32 if variant == "fp8" else torch.bfloat16, SECOND)
        graph = torch.cuda.CUDAGraph()
        args = case.fp8_args() if variant == "fp8" else case.fp4_args()
        op = fa.fp8_paged_mqa_logits if variant == "fp8" else fa.fp4_paged_mqa_logits
        # torch.cuda.graph's default capture stream is one per process, made on the device
        # current at the first capture (cuda:0 after the other GPU tests): capturing cuda:1
        # work needs a stream of cuda:1, or the calls run at capture time, outside the graph.
        with torch.cuda.graph(graph, stream=torch.cuda.Stream(SECOND)):
            got = op(*args, out=out)
        for lens in REPLAY_LENGTHS:
            case.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
            repoison(out, case.rows, MAX_SEQ_LEN)
            graph.replay()
            torch.cuda.synchronize()
            check(case, got, out, next_n)


def test_inputs_on_two_devices_are_refused():
    case = fp8_case(64, 1, seed=1, device=torch.device("cuda", 0))
    args = list(case.fp8_args())
    args[1] = args[1].to(SECOND)  # kv_fused on the other GPU
    with pytest.raises(ValueError, match="kv_fused"):
        fa.fp8_paged_mqa_logits(*args)


def test_precompile_for_second_device():
    configs = fa.precompile_paged_mqa_logits(
        device=SECOND, variants=("fp8",), block_sizes=(64,), next_ns=(1,)
    )
    assert len(configs) == 1


def test_a_capture_on_another_devices_stream_is_refused():
    """Capturing on a cuda:0 stream while calling with cuda:1 tensors would run the kernel at
    capture time only (it goes to cuda:1's default stream): the launch raises instead, and
    no kernel runs."""
    case = fp8_case(64, 1, seed=6, device=SECOND)
    run_fp8(case, SECOND)  # compiled, loaded and remembered outside the capture
    torch.cuda.synchronize(SECOND)
    out = poisoned(case.rows, torch.float32, SECOND)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="outside the graph"):
        with torch.cuda.graph(graph, stream=torch.cuda.Stream(0)):
            fa.fp8_paged_mqa_logits(*case.fp8_args(), out=out)
    torch.cuda.synchronize(SECOND)
    assert_nothing_written(out, case.rows, MAX_SEQ_LEN)


@pytest.mark.parametrize("stream_kind", ["default-stream", "own-stream"])
@pytest.mark.parametrize("current", ["as-found", "other-device"])
@pytest.mark.parametrize("variant", ["fp8", "fp4"])
def test_one_thread_per_device_at_once(variant, current, stream_kind):
    """A thread per GPU calling at the same time, the same inputs on both, in a configuration
    the other tests here do not build for cuda:1 (its first calls there load the kernel while
    the other thread launches). The current device is the one the thread finds (cuda:0 and no
    driver context for a fresh thread on the default stream; the stream's device inside
    `torch.cuda.stream`) or the other GPU, set last, so a default-stream launch must find its
    own device's context. Each device's results match the float64 reference and each other,
    bit for bit."""
    make, run, check = (
        (fp8_case, run_fp8, check_fp8) if variant == "fp8" else (fp4_case, run_fp4, check_fp4)
    )
    block_size, next_n = (32, 3) if variant == "fp8" else (32, 4)
    devices = [torch.device("cuda", 0), SECOND]
    cases = [make(block_size, next_n, seed=31, device=d) for d in devices]
    for d in devices:
        torch.cuda.synchronize(d)
    start = threading.Barrier(len(devices))
    results: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in devices]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        device = devices[i]
        try:
            with contextlib.ExitStack() as scope:
                if stream_kind == "own-stream":
                    # Also makes `device` current; the current stream is kept per device.
                    scope.enter_context(torch.cuda.stream(torch.cuda.Stream(device)))
                if current == "other-device":
                    torch.cuda.set_device(devices[1 - i])
                start.wait()
                for _ in range(CALLS_PER_THREAD):
                    results[i].append(run(cases[i], device))
                torch.cuda.current_stream(device).synchronize()
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(devices))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for i, device in enumerate(devices):
        assert len(results[i]) == CALLS_PER_THREAD
        for got, out in results[i]:
            assert got.device == device
            check(cases[i], got, out, next_n)
    for (got0, _), (got1, _) in zip(results[0], results[1]):
        assert same_valid_bits(cases[0], got1, got0)
