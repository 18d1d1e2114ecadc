"""Does charging each request an entry cost in the schedule shorten a call? (GPU only.)

    python tools/schedule_policy.py [--entries 0,1,2,3,4] [--rounds 3] [--calls 4] \
        [--shapes fp8:1:64:128:4096,...] [--single]

The production policy splits a call's 64-token units evenly over the CTAs, so a CTA whose
range crosses a request boundary streams as many units as one that does not, plus the switch
(0.5-1.0 us, `tools/call_gaps.py`'s per-request rows). The policy measured here counts every
non-empty request as `units * WEIGHT + entry` virtual units (`entry` in 1/WEIGHT of a unit),
splits the virtual total evenly, and starts CTA i at the unit holding its virtual start
(`entry_cost_rows`). The kernels take the rows as `schedule_meta`, so no kernel changes: every
policy runs the production kernel with a precomputed schedule.

Per shape (op:next_n:block:B:L, lengths 0.7-1.3 of L as in `fp8_kernel_check`), `--calls`
cases with their own page pools are captured in one graph per policy; the graphs alternate
for `--rounds` rounds and each prints the median time per call. `model` is the largest CTA
cost under the policy, in units, with a switch counted as `--model-switch` units. Outputs
are hashed per policy (valid region): each unit is computed the same way wherever it runs,
so every policy must give the production policy's bytes. `--single` times one call per graph
replay instead (the small-batch target's method, L2-warm and after an L2 flush).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_kernel_check as check

WEIGHT = 4  # virtual units per 64-token unit, so an entry cost can be a quarter unit
DEFAULT_SHAPES = (
    "fp8:1:64:8:16384",
    "fp8:1:64:128:4096",
    "fp8:1:64:64:16384",
    "fp8:1:64:128:16384",
    "fp8:1:64:8:65536",
    "fp8:2:64:64:4096",
    "fp8:1:64:128:65536",
    "fp4:1:64:128:4096",
    "fp4:1:64:64:16384",
)


def _units(length: int) -> int:
    return (length - 1) // 64 + 1 if length > 0 else 0


def entry_cost_rows(lens: list[int], num_sms: int, entry: int, weight: int = WEIGHT) -> list:
    """[num_sms + 1] rows (request, unit) of the entry-cost policy (module docstring)."""
    costs = [_units(n) * weight + (entry if n > 0 else 0) for n in lens]
    total = sum(costs)
    per_sm, extra = divmod(total, num_sms)
    rows, b, prefix = [], 0, 0
    for i in range(num_sms + 1):
        g = per_sm * i + min(i, extra)
        while b < len(lens) and g >= prefix + costs[b]:  # also skips empty requests
            prefix += costs[b]
            b += 1
        rows.append((b, max(0, g - prefix - entry) // weight) if b < len(lens) else (len(lens), 0))
    return rows


def cta_costs(lens: list[int], rows: list, switch_units: float) -> list[float]:
    """Each CTA's units plus `switch_units` per request boundary inside its range."""
    units = [_units(n) for n in lens]
    costs = []
    for (b0, u0), (b1, u1) in itertools.pairwise(rows):
        if (b0, u0) == (b1, u1):
            costs.append(0.0)
            continue
        work = sum(units[b] for b in range(b0, min(b1, len(units)))) - u0 + u1
        requests = sum(1 for b in range(b0, min(b1 + (u1 > 0), len(units))) if units[b] > 0)
        costs.append(work + switch_units * (requests - 1))
    return costs


def _case(op: str, next_n: int, block: int, batch: int, length: int, seed: int):
    if op == "fp4":
        case, _ = check.fp4_timing_case(next_n, block, batch, length, seed=seed)
        return case, check.fp4_call
    case, _ = check.timing_case(next_n, block, batch, length, seed=seed)
    return case, check.fp8_call


def _digest(cases) -> str:
    from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask

    h = hashlib.sha256()
    for case in cases:
        storage = case["storage"]
        rows_per_request = storage.shape[0] // case["seq_lens"].shape[0]
        mask = valid_mask(case["seq_lens"].cpu(), rows_per_request, storage.shape[1])
        h.update(storage.cpu()[mask].view(torch.int32).numpy().tobytes())
    return h.hexdigest()[:12]


def measure_shape(shape: str, entries: list[int], args) -> None:
    from bench.timing import time_single_replays

    op, *fields = shape.split(":")
    next_n, block, batch, length = (int(x) for x in fields)
    ctas = torch.cuda.get_device_properties(0).multi_processor_count
    cases, makers = [], []
    for k in range(1 if args.single else args.calls):
        case, make_call = _case(op, next_n, block, batch, length, seed=3 + k)
        cases.append(case)
        makers.append(make_call)
    policies = {}
    for entry in entries:
        schedules = []
        model = 0.0
        for case in cases:
            lens = case["seq_lens"].tolist()
            rows = entry_cost_rows(lens, ctas, entry)
            model = max(model, max(cta_costs(lens, rows, args.model_switch)))
            schedules.append(torch.tensor(rows, dtype=torch.int32, device="cuda"))
        calls = [make(c, s) for make, c, s in zip(makers, cases, schedules, strict=True)]
        policies[entry] = (calls, model)

    times: dict[int, list[str]] = {e: [] for e in entries}
    digests = {}
    for _ in range(args.rounds):
        for entry, (calls, _) in policies.items():
            if args.single:
                warm = time_single_replays(calls[0], cold=False).median_us
                cold = time_single_replays(calls[0]).median_us
                times[entry].append(f"{warm:.2f}/{cold:.2f}")
            else:
                period = check.bench(lambda c=calls: [f() for f in c], iters=20) / len(calls)
                times[entry].append(f"{period * 1e6:.2f}")
    for entry, (calls, _) in policies.items():
        for case in cases:
            case["storage"].fill_(float("nan"))
        for call in calls:
            call()
        torch.cuda.synchronize()
        digests[entry] = _digest(cases)
    base = digests[entries[0]]
    for entry, (_, model) in policies.items():
        same = "equal" if digests[entry] == base else f"DIFFERS ({digests[entry]})"
        best = min(float(t.split("/")[0]) for t in times[entry])
        print(
            f"| {shape} | {entry / WEIGHT:.2f} | {model:.1f} | {' , '.join(times[entry])} "
            f"| {best:.2f} | {same} |"
        )
    sys.stdout.flush()
    del policies, cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", default="0,1,2,3,4", help="entry costs in units")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--model-switch", type=float, default=3.0, metavar="UNITS")
    parser.add_argument("--single", action="store_true", help="one call per graph replay")
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES))
    args = parser.parse_args()
    entries = [round(float(x) * WEIGHT) for x in args.entries.split(",")]
    kind = "L2-warm/cold us per replay" if args.single else "us per call"
    print(f"| shape | entry (units) | model (units) | {kind}, by round | best | output |")
    print("|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        measure_shape(shape, entries, args)


if __name__ == "__main__":
    main()
