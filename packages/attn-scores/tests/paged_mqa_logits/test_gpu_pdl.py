"""Programmatic dependent launch (PDL): a logits call may start while the kernel before it in
the stream still runs, so it must read no input before its `griddepcontrol.wait`.

The kernel before it is `late_copy` (pdl_test_kernels.cu), a stand-in for what a serving loop
runs just before the indexer (the KV cache append, the lengths update, the schedule helper):
one CTA that lets the next kernel launch at once, idles, then writes one of the call's inputs.
A call that read that input early would see its old contents, zeros. Each case runs eagerly
and captured in a CUDA graph, where the programmatic launch becomes a programmatic edge.
(test_gpu.py's `test_a_call_waits_until_the_previous_call_has_finished` covers the other
order: writing `out` before the wait.)
"""

from __future__ import annotations

from pathlib import Path

import flashinfer_attn_scores as fa
import flashinfer_jit as jit
import pytest
import torch
from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask
from test_gpu import VARIANTS, poisoned_out

TEST_KERNELS = Path(__file__).with_name("pdl_test_kernels.cu")
LATE_COPY = jit.KernelSpec.make("late_copy", TEST_KERNELS)
EARLY_READ = jit.KernelSpec.make("early_read", TEST_KERNELS)
# Far longer than a logits call's host time, launch and prologue (tens of microseconds): the
# read-order test below needs the host back from the call while late_copy still idles. At 1 ms
# the host missed that in three whole-suite runs (twice on 2026-12-02, once on 2026-12-05 with
# this file running alone after the other shards).
DELAY_NS = 20_000_000


def late_copy(dst: torch.Tensor, src: torch.Tensor, delay_ns: int = DELAY_NS) -> None:
    """Launch late_copy on the current stream: `dst` gets `src`'s bytes `delay_ns` after it
    starts, and the next kernel may start at once."""
    assert dst.is_contiguous() and src.is_contiguous() and dst.nbytes == src.nbytes
    kernel = jit.load_kernel(LATE_COPY, dst.device)
    kernel.launch(1, 1024, dst, src, jit.i64(dst.nbytes), jit.i64(delay_ns))


def warm_up(early_read: jit.Kernel, buffer: torch.Tensor) -> None:
    """Launch both test kernels once, on nothing, and wait. The first launch of a kernel in a
    process costs 0.3-0.8 ms of host time on the H200 (tools/first_launch_probe.py); the two
    cold launches together outlast late_copy's idle, so a cold early_read would be launched
    only after late_copy had written."""
    late_copy(buffer, buffer, delay_ns=0)
    early_read.launch(1, 32, buffer, buffer, jit.i64(0), programmatic=True)
    torch.cuda.synchronize()


def test_the_test_kernels_compile(tmp_path):
    """On any machine (NVRTC needs no GPU): the GPU tests below depend on these kernels."""
    for spec in (LATE_COPY, EARLY_READ):
        assert jit.compile_kernel(spec, "sm_90a", cache_dir=tmp_path).cubin


@pytest.mark.gpu
def test_a_dependent_launch_starts_before_late_copy_has_written():
    """The premise of the tests below: a kernel launched programmatically after late_copy runs
    while late_copy still idles, so it reads the old bytes. Launched without the attribute,
    the same kernel waits for late_copy and reads the new ones."""
    src = torch.arange(1, 4097, dtype=torch.int32, device="cuda")
    seen = torch.empty_like(src)
    early_read = jit.load_kernel(EARLY_READ, src.device)
    warm_up(early_read, seen)
    for programmatic, expected in ((True, torch.zeros_like(src)),) * 3 + ((False, src),):
        dst = torch.zeros_like(src)
        torch.cuda.synchronize()
        late_copy(dst, src)
        early_read.launch(4, 256, seen, dst, jit.i64(dst.nbytes), programmatic=programmatic)
        torch.cuda.synchronize()
        assert torch.equal(dst, src)
        assert torch.equal(seen, expected), (
            "a programmatic launch did not overlap late_copy (launches serialised, for example"
            " by CUDA_LAUNCH_BLOCKING=1 or a profiler): the read-order tests prove nothing here"
            if programmatic
            else "a launch without the attribute read before late_copy had written"
        )


@pytest.mark.gpu
def test_a_dependent_launch_starts_early_inside_a_cuda_graph():
    """The premise of the graph cases below: captured, the programmatic launch becomes a
    programmatic edge, and on replay early_read still runs while late_copy idles."""
    src = torch.arange(1, 4097, dtype=torch.int32, device="cuda")
    dst, seen = torch.zeros_like(src), torch.empty_like(src)
    early_read = jit.load_kernel(EARLY_READ, src.device)
    warm_up(early_read, seen)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        late_copy(dst, src)
        early_read.launch(4, 256, seen, dst, jit.i64(dst.nbytes), programmatic=True)
    for replay in range(3):
        dst.zero_()
        seen.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(dst, src)
        assert torch.equal(seen, torch.zeros_like(src)), (
            f"replay {replay}: the captured programmatic launch did not overlap late_copy: the"
            " graph cases of the read-order test prove nothing here"
        )


INPUTS = {
    "fp8": ["q", "kv_fused", "weights", "block_tables", "seq_lens", "schedule_meta"],
    "fp4": ["q", "q_sf", "kv_fused", "weights", "block_tables", "seq_lens", "schedule_meta"],
}
ARGUMENT_NAMES = {
    "fp8": ["q", "kv_fused", "weights", "block_tables", "seq_lens", "max_seq_len"],
    "fp4": ["q", "q_sf", "kv_fused", "weights", "block_tables", "seq_lens", "max_seq_len"],
}


@pytest.mark.gpu
@pytest.mark.parametrize("launch", ["eager", "graph"])
@pytest.mark.parametrize(
    ("variant", "written"), [(v, name) for v, names in INPUTS.items() for name in names]
)
def test_a_call_reads_its_inputs_only_after_the_kernel_before_it(variant, written, launch):
    """late_copy writes one input (zeros until then) while the call is launched right after it,
    eagerly or both captured in one CUDA graph. Zeros read early would change the logits (zero
    q, K, weights or q scales; every table entry block 0) or leave them unwritten (zero lengths
    or schedule rows: empty CTA ranges). The call must give, bit for bit, the logits it gives
    with the input in place."""
    kind = VARIANTS[variant]
    next_n = 2
    case = kind.make_case(64, next_n, seed=31, lens=[1300, 0, 1000, 1250, 1, 700] * 8)
    args = dict(zip(ARGUMENT_NAMES[variant], kind.args(case)))
    args = {name: a.contiguous() if isinstance(a, torch.Tensor) else a for name, a in args.items()}
    schedule = fa.compute_paged_mqa_logits_schedule(case.seq_lens, next_n=next_n, variant=variant)
    schedule_meta = schedule if written == "schedule_meta" else None
    dtype = kind.output_dtype
    mask = valid_mask(case.seq_lens, next_n, case.max_seq_len)
    placed = kind.op(
        **args,
        schedule_meta=schedule_meta,
        out=poisoned_out(case.rows, case.max_seq_len, dtype),
    ).clone()
    assert torch.isfinite(placed[mask]).all()

    src = schedule if written == "schedule_meta" else args[written]
    dst = torch.zeros_like(src)
    late_args = dict(args)
    if written == "schedule_meta":
        late_schedule = dst
    else:
        late_args[written], late_schedule = dst, schedule_meta
    poison = poisoned_out(case.rows, case.max_seq_len, dtype)
    out = poison.clone()

    def late_copy_then_call() -> torch.Tensor:
        late_copy(dst, src)
        return kind.op(**late_args, schedule_meta=late_schedule, out=out)

    if launch == "graph":
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = late_copy_then_call()
    for attempt in range(3):
        dst.zero_()
        out.copy_(poison)
        torch.cuda.synchronize()
        if launch == "graph":
            graph.replay()
        else:
            got = late_copy_then_call()
            # The host got here while late_copy still idled (the call did not synchronise),
            # so the call's kernel was launched behind it: the premise test shows it starts.
            assert not torch.cuda.current_stream().query(), (
                f"attempt {attempt}: the call waited on the host (or the host stalled for"
                f" {DELAY_NS / 1e6:g} ms): the read order was not tested"
            )
        torch.cuda.synchronize()
        assert torch.equal(dst, src)
        wrong = int((got[mask] != placed[mask]).sum())
        assert wrong == 0, f"attempt {attempt}: {wrong} of {int(mask.sum())} logits differ"
