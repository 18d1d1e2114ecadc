"""Where fp8's float16 tensor-core accumulator overflows (SM90 GPU only).

    python tools/fp16_accumulator_range.py

With `acc_dtype=torch.float16` each head's dot product q_h . k accumulates in float16 on the
tensor cores, before the token's scale is applied, so it overflows once a partial sum passes
65504 however small the logit's true scale is. This fills q and every K value with one E4M3
magnitude v (all positive, so the dot product is head_dim * v^2 without cancellation) and
prints, per v, the dot product, whether the float32 and the float16 accumulators give finite
logits, and the largest |logit| each returns beside the float64 reference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packages/attn-scores/tests/paged_mqa_logits"))

import flashinfer_attn_scores as fa  # noqa: E402
from attn_scores_cases import make_fp8_case  # noqa: E402
from flashinfer_attn_scores.paged_mqa_logits.reference import (  # noqa: E402
    fp8_paged_mqa_logits_reference,
    valid_mask,
)
from script_start import script_start  # noqa: E402

HEAD_DIM, BLOCK_SIZE = 128, 64


def main() -> None:
    script_start(__doc__, "fp16_accumulator_range", needs_gpu=True)
    case = make_fp8_case(
        [256, 100], next_n=1, num_heads=64, head_dim=HEAD_DIM, block_size=BLOCK_SIZE, seed=3
    )
    print(
        "| v | head_dim * v^2 | float32 acc: finite, max |logit| | float16 acc: finite, "
        "max |logit| | reference max |logit| |"
    )
    print("|---|---|---|---|---|")
    for wanted in (8.0, 16.0, 22.0, 24.0, 32.0, 64.0, 448.0):
        stored = torch.tensor([wanted]).to(torch.float8_e4m3fn)
        v = float(stored.float())  # the E4M3 value actually used (23 would round to 24)
        byte = stored.view(torch.uint8)
        kv = case.kv_fused.clone()
        kv.view(kv.shape[0], -1)[:, : BLOCK_SIZE * HEAD_DIM] = byte
        q = torch.full(case.q.shape, v).to(torch.float8_e4m3fn)
        weights = case.weights.abs()
        args = (q, kv, weights, case.block_tables, case.seq_lens, case.max_seq_len)
        expected = fp8_paged_mqa_logits_reference(*args)
        mask = valid_mask(case.seq_lens, 1, case.max_seq_len)
        cells = []
        for acc in (torch.float32, torch.float16):
            got = fa.fp8_paged_mqa_logits(
                *(t.cuda() if isinstance(t, torch.Tensor) else t for t in args), acc_dtype=acc
            ).cpu()[mask]
            finite = bool(torch.isfinite(got).all())
            cells.append(f"{finite}, {float(got.abs().max()):.4g}")
        print(
            f"| {v:g} | {HEAD_DIM * v * v:.6g} | {cells[0]} | {cells[1]} "
            f"| {float(expected[mask].abs().max()):.4g} |",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
