"""A representative handful of paged MQA logits calls, for compute-sanitizer runs.

    compute-sanitizer --tool memcheck --error-exitcode 9 python tools/sanitize_cases.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python tools/sanitize_cases.py
    python tools/sanitize_cases.py --device cpu     # the same cases through the CPU reference

Every call is small (compute-sanitizer slows kernels 10-100x) and is checked against the
float64 reference: the output buffer is NaN-poisoned and has spare rows and columns, so the
check also catches valid elements left unwritten, rows of a zero-length request that were
written, and writes outside the padded rows. Cases:

- fp8: block size 32/64/128 x next_n 1/4, output float32 and float16, lengths 1, 0, 129, 1000
  (a zero-length request between others), one call with a precomputed schedule, and at block
  64 two calls with a float16 epilogue (next_n 2 and 3; the epilogue stages its weights as
  float16) and two with a float32 epilogue over a float16 accumulator (next_n 2 and 4);
- fp8 in a CUDA graph captured once (schedule_meta=None) and replayed after changing the
  contents of seq_lens (other lengths, other zero positions, all zero);
- fp4: block size 32 and 128 token-major, 128 with interleaved scales (next_n 2, and next_n 1
  with 1040 requests), and float16 and bfloat16 epilogues at block 64 (bfloat16 also with 260
  requests), once the fp4 kernel exists (until then its NotImplementedError is caught and
  "fp4 skipped" printed);
- only with `--only structures` (it takes longer than the rest together), 260 requests each:
  fp8 at 13 other head shapes, one per kernel structure they compile to (consumer and producer
  counts, KV stages from 2 to 12, one or two MMA commit groups), and fp4 at every next_n x
  epilogue dtype x scale layout.

Inputs are built on the CPU and copied over, so the GPU runs little besides the ops. With
PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor its own allocation, so memcheck sees exact
bounds) the graph case is skipped: graph capture needs PyTorch's caching allocator.

Exit status: 0 when every case matches, 1 on a mismatch, 2 when no suitable device exists.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import flashinfer_attn_scores as fa
import flashinfer_layouts as fl
import torch
from flashinfer_attn_scores.paged_mqa_logits.reference import (
    fp4_paged_mqa_logits_reference,
    fp8_paged_mqa_logits_reference,
    valid_mask,
)

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent / "packages/attn-scores/tests/paged_mqa_logits")
)
from test_gpu import tolerance as gpu_test_tolerance

NUM_HEADS, HEAD_DIM = 64, 128
LENGTHS = [1, 0, 129, 1000]
MAX_SEQ_LEN = 1100  # beyond every length
# Spare output rows and columns that no call may write.
SPARE_ROWS, SPARE_COLS = 2, 64
# Graph replays: new lengths cross block boundaries and move the zero; the last is all zero.
GRAPH_LENGTHS = [[129, 0, 1000, 1], [1000, 1, 0, 129], [64, 65, 999, 0], [0, 0, 0, 0]]


@dataclass
class Call:
    """One op call's inputs, on the target device, and how to run it."""

    name: str
    op: str
    args: dict[str, object]
    next_n: int
    output_dtype: torch.dtype
    out: torch.Tensor
    interleaved: bool = False
    epi_dtype: torch.dtype = torch.float32
    acc_dtype: torch.dtype = torch.float32

    @property
    def rows(self) -> int:
        return self.args["seq_lens"].shape[0] * self.next_n  # type: ignore[union-attr]

    def run(self, schedule_meta: torch.Tensor | None = None) -> torch.Tensor:
        a = self.args
        common = dict(
            out=self.out,
            output_dtype=self.output_dtype,
            epi_dtype=self.epi_dtype,
            schedule_meta=schedule_meta,
        )
        tail = (a["kv_fused"], a["weights"], a["block_tables"], a["seq_lens"], MAX_SEQ_LEN)
        if self.op == "fp8":
            return fa.fp8_paged_mqa_logits(a["q"], *tail, acc_dtype=self.acc_dtype, **common)
        return fa.fp4_paged_mqa_logits(
            a["q"], a["q_sf"], *tail, is_kv_sf_interleaved=self.interleaved, **common
        )

    def reference(self, abs_weights: bool = False) -> torch.Tensor:
        """Float64 reference on the CPU (with |weights|: the size of the summed terms)."""
        a = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in self.args.items()}
        weights = a["weights"].abs() if abs_weights else a["weights"]
        tail = (a["kv_fused"], weights, a["block_tables"], a["seq_lens"], MAX_SEQ_LEN)
        if self.op == "fp8":
            return fp8_paged_mqa_logits_reference(a["q"], *tail)
        return fp4_paged_mqa_logits_reference(
            a["q"], a["q_sf"], *tail, is_kv_sf_interleaved=self.interleaved
        )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def build_call(
    name: str,
    op: str,
    *,
    block_size: int,
    next_n: int,
    output_dtype: torch.dtype,
    device: torch.device,
    lengths: list[int] = LENGTHS,
    interleaved: bool = False,
    table_tokens: int | None = None,
    seed: int = 0,
    epi_dtype: torch.dtype = torch.float32,
    acc_dtype: torch.dtype = torch.float32,
    num_heads: int = NUM_HEADS,
    head_dim: int = HEAD_DIM,
) -> Call:
    """Random inputs on the CPU, quantised with flashinfer_layouts, moved to `device`.

    Every request owns `ceil(table_tokens / block_size)` shuffled blocks (its own length by
    default); table entries past a request's own blocks hold -1000000, an id that faults if
    it is ever read.
    """
    gen = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    owned = [_ceil_div(table_tokens or n, block_size) for n in lengths]
    num_blocks = sum(owned) + 3
    width = max(owned) + 1
    physical = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    table = torch.full((batch, width), -1_000_000, dtype=torch.int32)
    start = 0
    for b, n in enumerate(owned):
        table[b, :n] = physical[start : start + n]
        start += n

    k = torch.randn(num_blocks, block_size, head_dim, generator=gen)
    q = torch.randn(batch, next_n, num_heads, head_dim, generator=gen)
    args: dict[str, object] = {
        "weights": torch.randn(batch * next_n, num_heads, generator=gen),
        "block_tables": table,
        "seq_lens": torch.tensor(lengths, dtype=torch.int32),
    }
    if op == "fp8":
        args["kv_fused"] = fl.pack_fp8_kv_cache(*fl.quantize_fp8_per_token(k))
        args["q"] = q.to(torch.float8_e4m3fn)
    else:
        args["kv_fused"] = fl.quantize_mxfp4_kv_cache(k, interleaved=interleaved)
        args["q"], args["q_sf"] = fl.quantize_mxfp4_q(q)
    args = {key: value.to(device) for key, value in args.items()}  # type: ignore[union-attr]
    out = torch.full(
        (batch * next_n + SPARE_ROWS, fa.padded_seq_len(MAX_SEQ_LEN) + SPARE_COLS),
        float("nan"),
        dtype=output_dtype,
        device=device,
    )
    return Call(name, op, args, next_n, output_dtype, out, interleaved, epi_dtype, acc_dtype)


def check_output(call: Call, result: torch.Tensor) -> list[str]:
    """Problems of `call.out` after one call (empty when it matches the reference)."""
    problems = []
    rows, next_n = call.rows, call.next_n
    if tuple(result.shape) != (rows, MAX_SEQ_LEN) or result.data_ptr() != call.out.data_ptr():
        return [f"returned {tuple(result.shape)}, not the [{rows}, {MAX_SEQ_LEN}] view of out"]
    storage = call.out.detach().cpu().double()
    lengths = call.args["seq_lens"].cpu()  # type: ignore[union-attr]
    mask = valid_mask(lengths, next_n, MAX_SEQ_LEN)
    got = storage[:rows, :MAX_SEQ_LEN]

    unwritten = int((torch.isnan(got) & mask).sum())
    if unwritten:
        problems.append(f"{unwritten} valid elements never written (still NaN)")
    expected = call.reference()
    magnitude = call.reference(abs_weights=True).abs().masked_fill(~mask, 0)
    row_scale = magnitude.amax(dim=1, keepdim=True).clamp_min(1e-30)
    error = ((got - expected).abs() / row_scale).masked_fill(~mask, 0).nan_to_num(nan=0.0)
    worst = float(error.amax()) if error.numel() else 0.0
    # Bound on max |got - ref| / (row maximum of the |weights| reference): the GPU tests'
    # table (test_gpu.py's TOLERANCES, measured and justified there), not a copy of it.
    tolerance = gpu_test_tolerance(call.output_dtype, call.epi_dtype, call.acc_dtype)
    if worst > tolerance:
        problems.append(f"max error {worst:.3g} of the row magnitude > {tolerance:g}")

    empty_rows = (lengths == 0).repeat_interleave(next_n)
    written_empty = int((~torch.isnan(got[empty_rows])).sum())
    if written_empty:
        problems.append(f"{written_empty} elements written in rows of zero-length requests")
    outside_rows = int((~torch.isnan(storage[rows:])).sum())
    outside_cols = int((~torch.isnan(storage[:, fa.padded_seq_len(MAX_SEQ_LEN) :])).sum())
    if outside_rows or outside_cols:
        problems.append(
            f"writes outside the padded rows: {outside_rows} in spare rows, "
            f"{outside_cols} in spare columns"
        )
    return problems


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_eager(call: Call, device: torch.device, precomputed_schedule: bool = False) -> list[str]:
    schedule = None
    if precomputed_schedule:
        schedule = fa.compute_paged_mqa_logits_schedule(
            call.args["seq_lens"],  # type: ignore[arg-type]
            device,
            next_n=call.next_n,
            variant=call.op,
        )
    call.out.fill_(float("nan"))
    result = call.run(schedule)
    _sync(device)
    return check_output(call, result)


def run_graph(device: torch.device) -> list[tuple[str, list[str]]]:
    """Capture one fp8 call (schedule inside) and replay it with other seq_lens contents."""
    call = build_call(
        "fp8 graph bs=64 next_n=1",
        "fp8",
        block_size=64,
        next_n=1,
        output_dtype=torch.float32,
        device=device,
        lengths=GRAPH_LENGTHS[0],
        table_tokens=max(max(lengths) for lengths in GRAPH_LENGTHS),
    )
    seq_lens: torch.Tensor = call.args["seq_lens"]  # type: ignore[assignment]
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        call.run()  # compile and load outside the capture
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = call.run()
    outcomes = []
    for lengths in GRAPH_LENGTHS:
        seq_lens.copy_(torch.tensor(lengths, dtype=torch.int32))
        call.out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize(device)
        outcomes.append((f"{call.name} replay lengths={lengths}", check_output(call, result)))
    return outcomes


def fp8_calls(device: torch.device) -> list[tuple[Call, bool]]:
    """(call, with a precomputed schedule) for every block size x next_n 1/4, both dtypes."""
    calls = []
    for block_size in (32, 64, 128):
        for next_n in (1, 4):
            dtypes = [torch.float32 if next_n == 1 else torch.float16]
            if block_size == 64:
                dtypes = [torch.float32, torch.float16]
            for dtype in dtypes:
                name = f"fp8 bs={block_size} next_n={next_n} out={str(dtype)[6:]}"
                calls.append(
                    (
                        build_call(
                            name,
                            "fp8",
                            block_size=block_size,
                            next_n=next_n,
                            output_dtype=dtype,
                            device=device,
                            seed=block_size + next_n,
                        ),
                        False,
                    )
                )
    scheduled = build_call(
        "fp8 bs=128 next_n=1 out=float32, precomputed schedule",
        "fp8",
        block_size=128,
        next_n=1,
        output_dtype=torch.float32,
        device=device,
        seed=7,
    )
    # More requests than one per lane of the scheduling warp: B = 40 takes schedule_rows'
    # one-warp path with up to 4 requests per lane and gives each CTA one or two requests;
    # B = 260 takes the block-wide path and gives a CTA several, so q slots are reused, and
    # some CTAs more units than the 12 KV stages, so stages are reused; B = 1040 all of them.
    batches = [
        build_call(
            f"fp8 bs=64 next_n=2 out=float32, B={4 * repeats}",
            "fp8",
            block_size=64,
            next_n=2,
            output_dtype=torch.float32,
            device=device,
            lengths=LENGTHS * repeats,
            seed=8 + repeats,
        )
        for repeats in (10, 65, 260)
    ]
    # At block 64, other epilogue and accumulator dtypes: (next_n, epilogue, accumulator, seed).
    f16, f32 = torch.float16, torch.float32
    other_dtypes = [
        build_call(
            f"fp8 bs=64 next_n={next_n} out=float32 epi={str(epi)[6:]}"
            + (" acc=float16" if acc == f16 else ""),
            "fp8",
            block_size=64,
            next_n=next_n,
            output_dtype=torch.float32,
            device=device,
            seed=seed,
            epi_dtype=epi,
            acc_dtype=acc,
        )
        for next_n, epi, acc, seed in (
            (2, f16, f32, 22),
            (3, f16, f32, 23),
            (2, f32, f16, 32),
            (4, f32, f16, 34),
        )
    ]
    return [
        *calls,
        (scheduled, True),
        *((call, False) for call in batches),
        *((call, False) for call in other_dtypes),
    ]


# One fp8 head shape (head_dim, num_heads, next_n) per distinct kernel structure the
# contract's shapes compile to at a float32 epilogue: (consumer warpgroups, producer warps,
# KV stages) of `Fp8KernelConfig.pipeline`, one or two MMA commit groups, weights in
# registers or in shared memory. The H 64, D 128 calls above cover (4, 4, 12) only, and
# (3, 4, 12) / (2, 4, 12) at N = 192 / 256. `test_sanitize_cases.py` checks that this list
# still reaches every structure.
HEAD_SHAPES = [
    (640, 64, 1),  # 2 consumers, 2 producers, 2 stages
    (352, 64, 4),  # the same, two commit groups
    (320, 28, 6),  # 2 consumers, 4 stages, one commit group (N = 168)
    (256, 64, 3),  # 2 consumers, 4 stages, two commit groups
    (224, 28, 6),  # 2 consumers, 8 stages, one commit group
    (224, 64, 3),  # 2 consumers, 8 stages, two commit groups
    (64, 8, 31),  # 2 consumers, 12 stages, one commit group (N = 248)
    (128, 32, 8),  # 2 consumers, 12 stages, two commit groups
    (96, 24, 7),  # 3 consumers, 12 stages, one commit group (N = 168)
    (64, 36, 4),  # 3 consumers, 12 stages, two commit groups
    (512, 16, 1),  # 4 consumers, 4 stages
    (320, 64, 1),  # 4 consumers, 8 stages
    (96, 8, 1),  # 4 consumers, 12 stages, N = 8
]
# Four requests repeated this often: about 10 units per CTA, so every CTA runs several
# requests (q slots reused) and rings of 2, 4 and 8 stages go round more than once.
STRUCTURE_REPEATS = 65


def head_shape_call(index: int, device: torch.device) -> Call:
    """The fp8 call at `HEAD_SHAPES[index]`, block size 32 / 64 / 128 in turn, float32 output."""
    head_dim, num_heads, next_n = HEAD_SHAPES[index]
    block_size = (32, 64, 128)[index % 3]
    return build_call(
        f"fp8 bs={block_size} D={head_dim} H={num_heads} next_n={next_n} out=float32, "
        f"B={4 * STRUCTURE_REPEATS}",
        "fp8",
        block_size=block_size,
        next_n=next_n,
        output_dtype=torch.float32,
        device=device,
        lengths=LENGTHS * STRUCTURE_REPEATS,
        seed=200 + index,
        num_heads=num_heads,
        head_dim=head_dim,
    )


def fp4_calls(device: torch.device) -> list[Call]:
    # (block size, next_n, interleaved scales, requests): the B = 260 ones reuse q slots in a
    # CTA (next_n 1 runs five consumer warpgroups, next_n 2 three), and B = 1040 gives every CTA
    # more units than next_n 1's 20 KV stages, so stages are reused too.
    # The last three: 16-bit epilogues (epilogue dtype, the rest float32); the bfloat16 one
    # with B = 260 rewrites its tensor-core head-sum tile in reused q slots.
    specs = [
        (32, 1, False, 1, torch.float32),
        (128, 4, False, 1, torch.float32),
        (128, 2, True, 1, torch.float32),
        (128, 1, True, 260, torch.float32),
        (64, 1, False, 65, torch.float32),
        (64, 2, False, 65, torch.float32),
        (64, 1, False, 260, torch.float32),
        (64, 1, False, 1, torch.float16),
        (64, 3, False, 1, torch.bfloat16),
        (64, 2, False, 65, torch.bfloat16),
    ]
    return [
        fp4_call(bs, n, inter, repeats, epi, seed=100 + bs + n, device=device)
        for bs, n, inter, repeats, epi in specs
    ]


def fp4_call(
    block_size: int,
    next_n: int,
    interleaved: bool,
    repeats: int,
    epi_dtype: torch.dtype,
    *,
    seed: int,
    device: torch.device,
) -> Call:
    """An fp4 call (bfloat16 output) over `LENGTHS` repeated `repeats` times."""
    return build_call(
        f"fp4 bs={block_size} next_n={next_n}{' interleaved' if interleaved else ''} out=bfloat16"
        + (f", B={4 * repeats}" if repeats > 1 else "")
        + (f" epi={str(epi_dtype)[6:]}" if epi_dtype != torch.float32 else ""),
        "fp4",
        block_size=block_size,
        next_n=next_n,
        output_dtype=torch.bfloat16,
        device=device,
        lengths=LENGTHS * repeats,
        interleaved=interleaved,
        seed=seed,
        epi_dtype=epi_dtype,
    )


# fp4 (next_n, epilogue dtype, interleaved scales, block size): every next_n x epilogue dtype x
# scale layout, token-major at blocks 32 and 64 in turn, interleaved at 128 (the only block
# size that has them). The output dtype and the block size do not change a kernel's structure.
FP4_STRUCTURES = [
    (next_n, epi, interleaved, 128 if interleaved else (32, 64)[(next_n + k) % 2])
    for next_n in (1, 2, 3, 4)
    for k, epi in enumerate((torch.float32, torch.float16, torch.bfloat16))
    for interleaved in (False, True)
]


def fp4_structure_call(index: int, device: torch.device) -> Call:
    """The fp4 call at `FP4_STRUCTURES[index]`, bfloat16 output."""
    next_n, epi, interleaved, block_size = FP4_STRUCTURES[index]
    return fp4_call(
        block_size, next_n, interleaved, STRUCTURE_REPEATS, epi, seed=300 + index, device=device
    )


def pick_device(choice: str) -> tuple[torch.device | None, str]:
    if choice == "cpu":
        return torch.device("cpu"), ""
    if not torch.cuda.is_available():
        return None, "no CUDA device is available"
    if torch.cuda.get_device_capability() != (9, 0):
        return None, f"{torch.cuda.get_device_name()} is not an SM90 (Hopper) GPU"
    return torch.device("cuda", torch.cuda.current_device()), ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the reference path"
    )
    parser.add_argument(
        "--only",
        choices=("eager", "graph", "fp4", "structures"),
        help="run one group only (structures: fp8 at other head shapes and every fp4"
        " configuration, not in the default run)",
    )
    args = parser.parse_args(argv)
    device, why_not = pick_device(args.device)
    if device is None:
        print(f"sanitize_cases: needs an SM90 GPU ({why_not}); use --device cpu", file=sys.stderr)
        return 2

    outcomes: list[tuple[str, list[str]]] = []

    def report(name: str, problems: list[str]) -> None:
        outcomes.append((name, problems))
        lines = [f"{'FAIL' if problems else 'ok  '} {name}", *(f"     {p}" for p in problems)]
        print("\n".join(lines), flush=True)

    if args.only in (None, "eager"):
        for call, scheduled in fp8_calls(device):
            report(call.name, run_eager(call, device, precomputed_schedule=scheduled))
    if args.only in (None, "graph"):
        if device.type != "cuda":
            print("graph skipped: CUDA graphs need a GPU")
        elif os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
            print("graph skipped: capture needs PyTorch's caching allocator")
        else:
            for name, problems in run_graph(device):
                report(name, problems)
    if args.only in (None, "fp4"):
        for call in fp4_calls(device):
            try:
                problems = run_eager(call, device)
            except NotImplementedError as exc:
                print(f"fp4 skipped: {str(exc).splitlines()[0]}")
                break
            report(call.name, problems)

    if args.only == "structures":
        for index in range(len(HEAD_SHAPES)):
            call = head_shape_call(index, device)
            report(call.name, run_eager(call, device))
        for index in range(len(FP4_STRUCTURES)):
            call = fp4_structure_call(index, device)
            report(call.name, run_eager(call, device))

    failed = [name for name, problems in outcomes if problems]
    print(f"{len(outcomes) - len(failed)} of {len(outcomes)} cases match the reference")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
