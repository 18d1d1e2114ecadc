"""Mutation testing of the logits kernels: does the GPU checking catch realistic kernel bugs?

    python tools/kernel_mutants.py --list
    python tools/kernel_mutants.py --compile-only [--only NAME,NAME]   # CPU: NVRTC, no GPU
    python tools/kernel_mutants.py [--only ... | --shard K/N] [--jobs 4] [--fp8 100 --fp4 60]
        [--large-fp8 20 --large-fp4 12] [--pytest "ARGS" | --pytest ""]

Each mutant is one textual edit of a kernel source in `csrc/` (an off-by-one in the walk or
the schedule, a wrong scale offset, a NaN-dropping ReLU, ...), the kind of bug a kernel change
could bring in. The repository itself is never edited: every mutant is applied to a copy.
`--compile-only` compiles the configurations each mutant names for sm_90a from a mutated copy
and compares the cubins with the unmutated ones, so a mutant that does not compile, or leaves
a named configuration unchanged, is known before any GPU time is spent. On an SM90 GPU each
mutant's copy is checked by random calls (`tools/random_cases.py` in a subprocess, stopped at
the first failure: small batches, then large ones) and then `--pytest`'s GPU tests (by default
`DEFAULT_PYTEST`, the selection that catches what the random calls miss), `--jobs` copies at
once. A check that fails or crashes catches its mutant; one that runs past `--timeout` is
reported apart (a hang, or a GPU crowded by the other jobs: rerun those with `--jobs 1`), and
one that could not run (no GPU, no test selected) is an error. The unmutated copy must pass
the same checks first. The table at the end says, for each survivor, what a check would have
to exercise to catch it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "packages/attn-scores/src/flashinfer_attn_scores/paged_mqa_logits/csrc"
PACKAGE_PATHS = (
    "packages/layouts/src",
    "packages/jit/src",
    "packages/schedule/src",
    "packages/attn-scores/src",
)
FP8, FP4, COMMON = "fp8_paged_mqa_logits.cu", "fp4_paged_mqa_logits.cu", "paged_mqa_common.cuh"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # in csrc/
    old: str  # must occur exactly once in the file
    new: str
    variants: tuple[str, ...]  # whose random calls can reach the edit
    configs: tuple[str, ...]  # CONFIGS entries whose code contains the edit (--compile-only)
    catch: str  # what a check must exercise to catch it


# (variant, block, next_n, num_heads, head_dim, output, epi, acc, interleaved) by name.
CONFIGS = {
    "fp8": ("fp8", 64, 1, 64, 128, "float32", "float32", "float32", False),
    "fp8-n3": ("fp8", 128, 3, 64, 128, "float32", "float32", "float32", False),
    "fp8-n4-b32": ("fp8", 32, 4, 64, 128, "float32", "float32", "float32", False),
    "fp8-acc16": ("fp8", 64, 2, 64, 128, "float32", "float32", "float16", False),
    "fp8-epi16": ("fp8", 64, 2, 64, 128, "float16", "float16", "float16", False),
    "fp8-h4": ("fp8", 64, 2, 4, 160, "float32", "float32", "float32", False),
    "fp8-h4-epi16": ("fp8", 64, 2, 4, 160, "float16", "float16", "float32", False),
    "fp8-b128": ("fp8", 128, 1, 64, 128, "float32", "float32", "float32", False),
    "fp4": ("fp4", 64, 1, 64, 128, "bfloat16", "float32", "float32", False),
    "fp4-b128": ("fp4", 128, 2, 64, 128, "float32", "float32", "float32", False),
    "fp4-il": ("fp4", 128, 2, 64, 128, "bfloat16", "bfloat16", "float32", True),
    "fp4-f16": ("fp4", 32, 3, 64, 128, "float16", "float16", "float32", False),
    "fp4-n3": ("fp4", 64, 3, 64, 128, "float32", "float32", "float32", False),
}
BOTH = ("fp8", "fp4")
# The no-wait mutants' catch: under programmatic dependent launch a call's CTAs start while
# the previous call's slowest CTAs still run.
PDL_CATCH = (
    "a call launched while the previous call still runs on other SMs (programmatic dependent"
    " launch) writes its rows before that call has finished writing the same rows"
)
# The wait moved below the schedule, a tempting change (the scan would overlap the previous
# kernel's tail): the lengths or schedule rows are read before that kernel has written them.
WAIT_THEN_SCHEDULE = {
    FP8: (
        "  pdl_wait();\n"
        "  // The call-level readings come from the last consumer warp, which only waits at this"
        " point:\n"
        "  // thread 0 issues the first KV copy, and a reading's store can hold it back"
        " (EXP_STAMP_WALK).\n"
        "  constexpr unsigned kStampThread = kThreads - 32;\n"
        "  if (EXP_TIMESTAMPS && threadIdx.x == kStampThread) {\n"
        "    stamp(0, reading());\n"
        "    if (NUM_CONSUMERS <= 4 && EXP_TIMESTAMPS != 2) stamp(7, sm_id());\n"
        "  }\n"
        "  // `schedule` null: derive this CTA's range from seq_lens here (see schedule_rows);"
        " the scan's\n"
        "  // scratch is stage 0's KV tile, which no copy has touched yet.\n"
        "  const int* rows = schedule_rows(schedule, seq_lens, seq_lens_stride, batch_size,\n"
        "                                  EXP_TIMESTAMPS || EXP_PHASES ? nullptr :"
        " schedule_rows_out, bars.schedule_rows,\n"
        "                                  smem + SharedLayout::kKv);\n"
        "  __syncthreads();\n"
    ),
    FP4: (
        "  pdl_wait();\n"
        "  // `schedule` null: derive this CTA's range from seq_lens here (see schedule_rows);"
        " the scan's\n"
        "  // scratch is stage 0's KV tile, which no copy has touched yet.\n"
        "  const int* rows = schedule_rows(schedule, seq_lens, seq_lens_stride, batch_size,\n"
        "                                  EXP_PHASES ? nullptr : schedule_rows_out,"
        " bars.schedule_rows,\n"
        "                                  smem + SharedLayout::kKv);\n"
        "  __syncthreads();\n"
    ),
}
WAIT_THEN_SCHEDULE_CATCH = (
    "the kernel before the call in the stream writes seq_lens or schedule_meta while the call,"
    " launched programmatically, already runs"
)


def wait_moved_below_schedule(file: str) -> tuple[str, str]:
    """(old, new) of the mutant that reads the schedule's inputs before the PDL wait."""
    region = WAIT_THEN_SCHEDULE[file]
    return region, region.removeprefix("  pdl_wait();\n") + "  pdl_wait();\n"


MUTANTS = [
    # ---- the walk and the schedule (paged_mqa_common.cuh)
    Mutant(
        "units-of-exact-multiple",
        COMMON,
        "return len > 0 ? (len - 1) / kTile + 1 : 0;",
        "return len > 0 ? len / kTile + 1 : 0;",
        BOTH,
        ("fp8", "fp4"),
        "a length that is a multiple of 64 gets one unit too many: a stray write past the row",
    ),
    Mutant(
        "units-of-zero-length",
        COMMON,
        "return len > 0 ? (len - 1) / kTile + 1 : 0;",
        "return len >= 0 ? (len - 1) / kTile + 1 : 0;",
        BOTH,
        ("fp8", "fp4"),
        "a zero-length request gets one unit: its rows, which must stay untouched, are written",
    ),
    Mutant(
        "unit-at-entry-charge",
        COMMON,
        "return offset > kEntryUnits ? static_cast<int>(offset - kEntryUnits) : 0;",
        "return offset > kEntryUnits ? static_cast<int>(offset - kEntryUnits + 1) : 0;",
        BOTH,
        ("fp8", "fp4"),
        "the in-kernel schedule (schedule_meta=None) maps a CTA boundary one unit late",
    ),
    Mutant(
        "block-scan-row-start",
        COMMON,
        "if (g0 >= prefix && g0 < prefix + cost) {",
        "if (g0 > prefix && g0 < prefix + cost) {",
        BOTH,
        ("fp8", "fp4"),
        "B > 128, in-kernel schedule: a CTA whose range starts at a request's first virtual unit does nothing",
    ),
    Mutant(
        "block-scan-warp-sums",
        COMMON,
        "if (lane >= offset) w += other;",
        "if (lane > offset) w += other;",
        BOTH,
        ("fp8", "fp4"),
        "B > 128, in-kernel schedule: the scan across warps drops a warp's sum",
    ),
    Mutant(
        "warp-scan-row-start",
        COMMON,
        "const bool mine_holds = mine > 0 && prefix <= g && g < inclusive;",
        "const bool mine_holds = mine > 0 && prefix < g && g < inclusive;",
        BOTH,
        ("fp8", "fp4"),
        "B <= 128, in-kernel schedule: a boundary on a lane's first request is lost",
    ),
    Mutant(
        "warp-scan-lane-threshold",
        COMMON,
        "if (batch_size <= 32) {",
        "if (batch_size <= 40) {",
        BOTH,
        ("fp8", "fp4"),
        "B 33-40, in-kernel schedule: requests 32.. are not counted, so the last CTA takes them"
        " all; the logits stay right, only the in-kernel rows differ from the helper's",
    ),
    Mutant(
        "walker-last-request",
        COMMON,
        "return b < batch_size && (b < end_b || end_u > 0);",
        "return b < batch_size && (b < end_b);",
        BOTH,
        ("fp8", "fp4"),
        "the request a CTA's range ends inside is taken as empty: its first units are not computed",
    ),
    Mutant(
        "walker-skip-empty",
        COMMON,
        "} while (units == 0 && b < end_b);",
        "} while (units == 0 && b + 1 < end_b);",
        BOTH,
        ("fp8", "fp4"),
        "an empty request just before the one a CTA's range ends in stops the CTA early",
    ),
    Mutant(
        "walker-unclamped-length",
        COMMON,
        "len = has_request() ? min(seq_lens[b * seq_lens_stride], max_len) : 0;",
        "len = has_request() ? seq_lens[b * seq_lens_stride] : 0;",
        BOTH,
        ("fp8", "fp4"),
        "a length past max_seq_len (outside the contract): its later units are stored past"
        " out's padded row, into the next rows or past the buffer",
    ),
    Mutant(
        "walker-unclamped-first-length",
        COMMON,
        "len = has_request() ? min(rows[4], max_len) : 0;",
        "len = has_request() ? rows[4] : 0;",
        BOTH,
        ("fp8", "fp4"),
        "in-kernel schedule, a CTA starting inside a request past max_seq_len (outside the"
        " contract): its first request's units are stored past out's padded row",
    ),
    Mutant(
        "walker-start-past-clamp",
        COMMON,
        "while (u >= units && b < end_b) {",
        "while (units == 0 && b < end_b) {",
        BOTH,
        ("fp8", "fp4"),
        "a CTA whose schedule range starts inside a clamped request past its end stops there:"
        " the next requests' first units in its range are never computed (needs a length past"
        " max_seq_len)",
    ),
    Mutant(
        "producer-pool-bound",
        COMMON,
        "block_ids[s] = static_cast<unsigned>(id) < static_cast<unsigned>(num_blocks) ? id : -1;",
        "block_ids[s] = id >= 0 ? id : -1;",
        BOTH,
        ("fp8", "fp4"),
        "a block id past the pool's end inside a length (outside the contract): the scales'"
        " bulk copy reads outside the pool, a fault far past it",
    ),
    Mutant(
        "walker-advance-edge",
        COMMON,
        "if (steps < units - u) {",
        "if (steps <= units - u) {",
        BOTH,
        ("fp8", "fp4"),
        "a role whose step lands exactly on a request's end walks past it, so the roles"
        " disagree on the units: a hang, or logits never written",
    ),
    Mutant(
        "table-window-slide",
        COMMON,
        "      entry = next;\n      next = load(base + 32 + lane);",
        "      entry = next;\n      next = load(base + lane);",
        ("fp8",),
        ("fp8",),
        "requests longer than 64 blocks from where a producer warp entered them (fp8 primes its window)",
    ),
    Mutant(
        "table-window-next",
        COMMON,
        "entry = valid && block == base + 32 ? next : load(block + lane);",
        "entry = valid && block == base + 32 ? next : load(block + lane + 1);",
        ("fp4",),
        ("fp4",),
        "fp4's unprimed window: a jump outside the window (any walk) loads shifted entries",
    ),
    Mutant(
        "slot-stores-odd-next-n",
        COMMON,
        "return 2 * k + 1 < NEXT_N || quad < 2;",
        "return 2 * k + 1 < NEXT_N || quad < 1;",
        BOTH,
        ("fp8", "fp8-n3", "fp4"),
        "odd next_n: the last draft slot's second row (row0 + 8) is never stored",
    ),
    Mutant(
        "quad-sum-odd-slot",
        COMMON,
        "lane_sums[k] = even_slot + shfl_xor(even_slot, 2);",
        "lane_sums[k] = even_slot;",
        BOTH,
        ("fp8", "fp8-n3", "fp4"),
        "odd next_n: the last slot's sum misses half the heads",
    ),
    Mutant(
        "slot-of-half-group",
        COMMON,
        "    const int t_lo = (8 * j) / NUM_HEADS, t_hi = (8 * j + 4) / NUM_HEADS;\n    if (t_lo == t_hi) {\n#if RELU_FORM == 2",
        "    const int t_lo = (8 * j) / NUM_HEADS, t_hi = (8 * j + 3) / NUM_HEADS;\n    if (t_lo == t_hi) {\n#if RELU_FORM == 2",
        ("fp8",),
        ("fp8-h4",),
        "num_heads % 8 == 4 (an 8-column group spans two draft slots), float32 epilogue",
    ),
    Mutant(
        "pow2-clamp",
        COMMON,
        "e = max(min(e, 252), -252);",
        "e = max(min(e, 126), -126);",
        ("fp4",),
        ("fp4-n3",),
        "fp4 next_n 3, float32 epilogue: scales whose final power of two is below 2^-126 (the"
        " float16 epilogue also uses it, but rounds such terms to 0 either way)",
    ),
    # ---- fp8 kernel
    Mutant(
        "fp8-scale-offset",
        FP8,
        "kv_base + block_ids[s] * kv_block_stride + BLOCK_SIZE * HEAD_DIM + row_in_block * 4;",
        "kv_base + block_ids[s] * kv_block_stride + BLOCK_SIZE * HEAD_DIM;",
        ("fp8",),
        ("fp8-b128",),
        "block 128: the second unit of a block takes the first unit's token scales",
    ),
    Mutant(
        "fp8-weights-per-request",
        FP8,
        "const float* w_src = weights + static_cast<long long>(b) * kN;",
        "const float* w_src = weights + static_cast<long long>(b) * NUM_HEADS;",
        ("fp8",),
        ("fp8-n4-b32", "fp8-epi16"),
        "next_n > 1 with several requests: request b reads another request's weights",
    ),
    Mutant(
        "fp8-slot-row-pitch",
        FP8,
        "for (int k = 0; k < SlotSums::kLaneSums; ++k, slot_out += 2 * out_stride) {\n      if (EXP_STORES",
        "for (int k = 0; k < SlotSums::kLaneSums; ++k, slot_out += out_stride) {\n      if (EXP_STORES",
        ("fp8",),
        ("fp8-n3", "fp8-n4-b32"),
        "next_n 3-4: slots 2-3 land in the wrong rows",
    ),
    Mutant(
        "fp8-row-scale",
        FP8,
        "const float scale = scales[stage * kTile + row];",
        "const float scale = scales[stage * kTile + row0];",
        ("fp8",),
        ("fp8",),
        "token scales that differ between rows r and r + 8",
    ),
    Mutant(
        "fp8-output-slot",
        FP8,
        "request_out = out + (static_cast<long long>(b) * NEXT_N + (quad >> 1)) * out_stride;",
        "request_out = out + (static_cast<long long>(b) * NEXT_N + (quad & 1)) * out_stride;",
        ("fp8",),
        ("fp8", "fp8-n4-b32"),
        "draft slots and rows swapped between lanes",
    ),
    Mutant(
        "fp8-acc16-relu-nan",
        FP8,
        "const __half2 r = __hmax2_nan(h, __float2half2_rn(0.f));",
        "const __half2 r = __hmax2(h, __float2half2_rn(0.f));",
        ("fp8",),
        ("fp8-acc16",),
        "a NaN score under a float16 accumulator with a float32 epilogue must stay NaN",
    ),
    Mutant(
        "fp8-epi16-relu-nan",
        FP8,
        "return __hmax2_nan(epi2_from_bits(acc[2 * j + i]), __float2half2_rn(0.f));",
        "return __hmax2(epi2_from_bits(acc[2 * j + i]), __float2half2_rn(0.f));",
        ("fp8",),
        ("fp8-epi16",),
        "a NaN score under a float16 accumulator and epilogue must stay NaN",
    ),
    Mutant(
        "fp8-packed-half-group",
        FP8,
        "const int t_lo = (8 * j) / NUM_HEADS, t_hi = (8 * j + 4) / NUM_HEADS;",
        "const int t_lo = (8 * j) / NUM_HEADS, t_hi = (8 * j + 3) / NUM_HEADS;",
        ("fp8",),
        ("fp8-h4-epi16",),
        "num_heads % 8 == 4 with the float16 epilogue",
    ),
    Mutant(
        "fp8-swizzle-mask",
        FP8,
        "return linear ^ (((linear >> 7) & (kSwizzle / 16 - 1)) << 4);",
        "return linear ^ (((linear >> 7) & (kSwizzle / 32 - 1)) << 4);",
        ("fp8",),
        ("fp8",),
        "q staged in a swizzle other than the one the MMA reads (head_dim 64 or 128)",
    ),
    Mutant(
        "fp8-q-last-unit",
        FP8,
        "constexpr int kUnits = kN * kUnitsPerRow;",
        "constexpr int kUnits = kN * kUnitsPerRow - 1;",
        ("fp8",),
        ("fp8",),
        "the last 16 bytes of a request's q (last head of the last slot) left stale",
    ),
    Mutant(
        "fp8-async-weights",
        FP8,
        "for (int idx = part * 32 + lane; idx < kN / 4; idx += kStride) {",
        "for (int idx = part * 32 + lane; idx < kN / 8; idx += kStride) {",
        ("fp8",),
        ("fp8",),
        "float32 epilogue: the second half of a request's weights left stale",
    ),
    # ---- fp4 kernel
    Mutant(
        "fp4-q-lut-clamp",
        FP4,
        "return luts[min(max_exponent - exponent, kLutLevels - 1)];",
        "return luts[max_exponent - exponent];",
        ("fp4",),
        ("fp4",),
        "a q row whose group exponents differ by more than 31 (reads past the decode tables)",
    ),
    Mutant(
        "fp4-k-lut-clamp",
        FP4,
        "const uint32_t levels = min_u16x2(maxima - exponents, (kLutLevels - 1) * 0x00010001u);",
        "const uint32_t levels = maxima - exponents;",
        ("fp4",),
        ("fp4",),
        "a token whose group exponents differ by more than 31",
    ),
    Mutant(
        "fp4-lut-scale",
        FP4,
        "const float value = ldexpf(e2m1, 6 - i / 8);",
        "const float value = ldexpf(e2m1, 5 - i / 8);",
        ("fp4",),
        ("fp4",),
        "every decoded value halved",
    ),
    Mutant(
        "fp4-interleaved-slot",
        FP4,
        "const unsigned slot = 4 * (r % 32) + r / 32 + 2 * (static_cast<unsigned>(u) & 1);",
        "const unsigned slot = 4 * (r % 32) + r / 32 + (static_cast<unsigned>(u) & 1);",
        ("fp4",),
        ("fp4-il",),
        "interleaved scales: the second unit of a 128-token block reads the wrong scale slots",
    ),
    Mutant(
        "fp4-sign-bytes",
        FP4,
        "const uint32_t signs_lo = prmt(shifted, packed, 0x5140u);",
        "const uint32_t signs_lo = prmt(shifted, packed, 0x4150u);",
        ("fp4",),
        ("fp4",),
        "signs of decoded elements 1 and 3 swapped",
    ),
    Mutant(
        "fp4-head-scale",
        FP4,
        "ldexpf(w_b, exp_b - anchor);",
        "ldexpf(w_b, exp_a - anchor);",
        ("fp4",),
        ("fp4", "fp4-il"),
        "float32 or bfloat16 epilogue: q rows (heads) of one slot whose largest group exponents"
        " differ",
    ),
    Mutant(
        "fp4-f16-head-scale",
        FP4,
        "scale_b = ldexpf(1.f, exp_b - anchor);",
        "scale_b = ldexpf(1.f, exp_a - anchor);",
        ("fp4",),
        ("fp4-f16",),
        "float16 epilogue: q rows (heads) of one slot whose largest group exponents differ",
    ),
    Mutant(
        "fp4-fold-headroom",
        FP4,
        "return min(max(largest - kFoldHeadroom, kMinAnchor), kMaxAnchor);",
        "return min(max(largest, kMinAnchor), kMaxAnchor);",
        ("fp4",),
        ("fp4", "fp4-il"),
        "float32 or bfloat16 epilogue: heads more than about 2^126 below the largest of their"
        " slot, on positions where the larger heads' ReLU is zero",
    ),
    Mutant(
        "fp4-fold-anchor-weights",
        FP4,
        "return isfinite(w) && w != 0.f ? ilogbf(w) + exp : -1000;",
        "return isfinite(w) && w != 0.f ? exp : -1000;",
        ("fp4",),
        ("fp4", "fp4-il"),
        "float32 or bfloat16 epilogue: weights far from 1 (near 2^108 the folded sums overflow)",
    ),
    Mutant(
        "fp4-slot-exponent",
        FP4,
        "return slot_exp[slot * 4 + 2 * k + (quad >> 1)] - 266 - kTwiceRelu;",
        "return slot_exp[slot * 4 + 2 * k] - 266 - kTwiceRelu;",
        ("fp4",),
        ("fp4-b128",),
        "float32 epilogue at next_n 2 or 4 (next_n 3 and the 16-bit epilogues take other"
        " paths), draft slots of different largest q exponents: slot 2k + 1 takes slot 2k's",
    ),
    Mutant(
        "fp4-small-token-exponent",
        FP4,
        "*slot_out = to_out(scale_by_pow2_from(sums.lane_sums[k], row_max + slot_exponent[k]));",
        "*slot_out = to_out(scale_by_pow2_from(sums.lane_sums[k], row_max + slot_exponent[k] - (row_max <= 120 ? 3 : 0)));",
        ("fp4",),
        ("fp4",),
        "float32 epilogue, next_n 1, 2 and 4: tokens whose largest group exponent is at most 120 come"
        " out 8x too small; a row bound set by the row's largest tokens covered them whole",
    ),
    Mutant(
        "fp4-scale-offset",
        FP4,
        "bulk_load(scales + stage * kScaleBytes + s * kBoxRows * 4, scale_region + row_in_block * 4, kBoxRows * 4,",
        "bulk_load(scales + stage * kScaleBytes + s * kBoxRows * 4, scale_region, kBoxRows * 4,",
        ("fp4",),
        ("fp4-b128",),
        "block 128, plain scales: the second unit of a block takes the first unit's scales",
    ),
    Mutant(
        "fp4-tc-second-row-exponent",
        FP4,
        "static_cast<int>(maxima >> 16) + exponent));",
        "static_cast<int>(maxima & 0xffffu) + exponent));",
        ("fp4",),
        ("fp4-il",),
        "bfloat16 epilogue: rows r and r + 8 with different largest group exponents",
    ),
    Mutant(
        "fp4-epi16-second-row-scale",
        FP4,
        "token_scale[t][1] = fminf(scale_by_pow2(1.f, max1 + q_exp[t] - 266), 3.4028235e38f);",
        "token_scale[t][1] = fminf(scale_by_pow2(1.f, max0 + q_exp[t] - 266), 3.4028235e38f);",
        ("fp4",),
        ("fp4-f16",),
        "float16 epilogue: rows r and r + 8 with different largest group exponents",
    ),
    # ---- second batch (written after the sixtieth round's GPU run)
    Mutant(
        "block-scan-end-row",
        COMMON,
        "const long long g1 = per_cta * (blockIdx.x + 1) + min(static_cast<long long>(blockIdx.x + 1), extra);",
        "const long long g1 = per_cta * (blockIdx.x + 1) + min(static_cast<long long>(blockIdx.x), extra);",
        BOTH,
        ("fp8", "fp4"),
        "B > 128, in-kernel schedule: a CTA's end falls one unit short of the next CTA's start",
    ),
    Mutant(
        "block-scan-first-length",
        COMMON,
        "rows[4] = len;",
        "rows[4] = len - 1;",
        BOTH,
        ("fp8", "fp4"),
        "B > 128, in-kernel schedule: a CTA's first request one token short, so the box (and"
        " unit) of its last token is not loaded when that token starts one",
    ),
    Mutant(
        "warp-scan-first-length",
        COMMON,
        "if (end == 0) first_len = holders ? __shfl_sync(0xffffffffu, len, holder) : 0;",
        "if (end == 0) first_len = holders ? __shfl_sync(0xffffffffu, len, 0) : 0;",
        BOTH,
        ("fp8", "fp4"),
        "B <= 128, in-kernel schedule: a CTA's first request takes lane 0's request's length",
    ),
    Mutant(
        "fp8-second-box",
        FP8,
        "uint8_t* dst = kv_tiles + stage * kKvTileBytes + c * kTile * kSwizzle + s * kBoxRows * kSwizzle;",
        "uint8_t* dst = kv_tiles + stage * kKvTileBytes + c * kTile * kSwizzle;",
        ("fp8",),
        ("fp8-n4-b32",),
        "block 32: a unit's second block lands on its first",
    ),
    Mutant(
        "fp8-weight-registers",
        FP8,
        "for (int j = 0; j < kWeightRegGroups; ++j) weight_regs[j] = slot_weights(w, j);",
        "for (int j = 0; j < kWeightRegGroups; ++j) weight_regs[j] = slot_weights(w, j ^ 1);",
        ("fp8",),
        ("fp8-n4-b32",),
        "next_n 4 (weights held in registers): neighbouring 8-head groups swap weights",
    ),
    Mutant(
        "fp4-q-exponent-byte",
        FP4,
        "const uint2 lut = lut_for(luts, row_max, (sf >> (8 * g)) & 0xff);",
        "const uint2 lut = lut_for(luts, row_max, (sf >> (8 * g)) & 0x7f);",
        ("fp4",),
        ("fp4",),
        "q group exponents of 128 and more (scales from 2): their top bit is lost",
    ),
    Mutant(
        "fp4-q-row-max",
        FP4,
        "return max(max(b0, b1), max(b2, b3));",
        "return max(max(b0, b1), b2);",
        ("fp4",),
        ("fp4",),
        "a q row whose last group has the largest exponent",
    ),
    Mutant(
        "fp4-q-column-order",
        FP4,
        "return 32 * word + (high ? 16 : 0) + 4 * group;",
        "return 32 * word + (high ? 8 : 0) + 4 * group;",
        ("fp4",),
        ("fp4",),
        "q decoded into columns other than the ones k's fragments use",
    ),
    Mutant(
        "fp4-row-exponent-selector",
        FP4,
        "const uint32_t exponent_selector = quad | (4 + quad) << 8;",
        "const uint32_t exponent_selector = quad | (4 + quad) << 12;",
        ("fp4",),
        ("fp4",),
        "a lane's second row (r + 8) takes its group exponent from the first row's group 0",
    ),
    Mutant(
        "fp4-weight-pair-position",
        FP4,
        "return kWeightPairLoads ? (column % 8 / 2) * kWeightQuadStride + column / 8 * 2 + column % 2 : column;",
        "return kWeightPairLoads ? (column % 8 / 2) * kWeightQuadStride + column / 8 + column % 2 : column;",
        ("fp4",),
        ("fp4-b128",),
        "next_n 2, float32 epilogue (weights stored quad-major): two groups' weights overlap",
    ),
    Mutant(
        "fp4-tc-weight-tile",
        FP4,
        "swizzled_128(2 * t, 2 * lane + 64)",
        "swizzled_128(2 * t, 2 * lane + 32)",
        ("fp4",),
        ("fp4-il",),
        "bfloat16 epilogue: heads 32-63's weights written over heads 16-47's in the head-sum tile",
    ),
    Mutant(
        "fp4-tc-store-slots",
        FP4,
        "if (quad < NEXT_N) {",
        "if (quad <= NEXT_N) {",
        ("fp4",),
        ("fp4-il",),
        "bfloat16 epilogue, next_n 1-3: a lane stores a slot past next_n, the next request's"
        " first row (or past the last row)",
    ),
    Mutant(
        "fp4-request-row",
        FP4,
        "out + (static_cast<long long>(request.b) * NEXT_N + (quad >> 1)) * out_stride + row0 + 8 * (quad & 1);",
        "out + (static_cast<long long>(request.b) * NEXT_N + (quad >> 1)) * out_stride + row0 + 8 * (quad >> 1);",
        ("fp4",),
        ("fp4",),
        "the CUDA-core epilogues outside next_n 3: a quad-1 lane stores its row r + 8 at row r,"
        " a quad-2 lane the other way round",
    ),
    Mutant(
        "fp8-no-pdl-wait",
        FP8,
        "  pdl_wait();\n",
        "",
        ("fp8",),
        ("fp8",),
        PDL_CATCH,
    ),
    Mutant(
        "fp4-no-pdl-wait",
        FP4,
        "  pdl_wait();\n",
        "",
        ("fp4",),
        ("fp4",),
        PDL_CATCH,
    ),
    Mutant(
        "fp8-wait-after-schedule",
        FP8,
        *wait_moved_below_schedule(FP8),
        ("fp8",),
        ("fp8",),
        WAIT_THEN_SCHEDULE_CATCH,
    ),
    Mutant(
        "fp4-wait-after-schedule",
        FP4,
        *wait_moved_below_schedule(FP4),
        ("fp4",),
        ("fp4",),
        WAIT_THEN_SCHEDULE_CATCH,
    ),
]


def mutated(mutant: Mutant, text: str) -> str:
    """`text` (the mutant's source file) with the edit made; raises unless the mutant's text
    occurs in it exactly once."""
    count = text.count(mutant.old)
    if count != 1:
        raise ValueError(
            f"{mutant.name}: its text occurs {count} times in {mutant.file}, expected once"
        )
    return text.replace(mutant.old, mutant.new)


def apply(mutant: Mutant, root: Path) -> str:
    """Edit the source under `root` (a copy of the repository) in place; returns the original
    text."""
    path = root / CSRC.relative_to(ROOT) / mutant.file
    text = path.read_text()
    path.write_text(mutated(mutant, text))
    return text


def check_applies(mutant: Mutant) -> None:
    """Raise unless the mutant applies to the repository's sources (read only: the repository
    itself is never edited)."""
    mutated(mutant, (CSRC / mutant.file).read_text())


def _ignored_in_copy(folder: str, names: list[str]) -> set[str]:
    """copytree's ignore rule where git cannot list the files: what .gitignore names (caches,
    build outputs, virtualenvs, scratch folders) and the docs, as the git branch leaves them."""
    ignored = {n for n in names if n in ("__pycache__", ".pytest_cache", ".ruff_cache", "scratch")}
    ignored |= {n for n in names if n.startswith((".nvrtc", ".ab")) or n.endswith(".egg-info")}
    if Path(folder) == ROOT:
        top = (".git", ".venv", "venv", "docs", "site", "dist", "build", "bench-results", ".whl")
        ignored |= {n for n in names if n in top or n == ".out"}
    elif Path(folder).parent == ROOT / "packages":
        ignored |= {n for n in names if n == "dist"}
    return ignored


def copy_tree(dest: Path) -> None:
    """Copy the repository's files to `dest`: what git tracks plus what it does not ignore,
    or, without git, everything but caches, build folders and the docs."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True
    )
    if listed.returncode != 0:
        # dest exists already (the callers' temporary folders).
        shutil.copytree(ROOT, dest, ignore=_ignored_in_copy, dirs_exist_ok=True)
        return
    for name in listed.stdout.decode().split("\0"):
        source = ROOT / name
        if name and source.is_file() and not name.startswith(("docs/", "site/")):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a subprocess that must import the packages of `tree`: its source
    folders first, entries of the repository itself dropped."""
    kept = [
        entry
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if entry and not (ROOT / entry).resolve().is_relative_to(ROOT)
    ]
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join([*(str(tree / p) for p in PACKAGE_PATHS), *kept])
    )


def config_specs(names: tuple[str, ...]) -> list:
    import torch
    from flashinfer_attn_scores.paged_mqa_logits import PagedMqaLogitsConfig, launcher

    specs = []
    for name in names:
        variant, block, next_n, heads, head_dim, out, epi, acc, interleaved = CONFIGS[name]
        config = PagedMqaLogitsConfig(
            variant, block, next_n, heads, head_dim,
            getattr(torch, out), getattr(torch, epi), getattr(torch, acc), interleaved,
        )  # fmt: skip
        specs.append(launcher.config_spec(config))
    return specs


def cubin_digests(names: tuple[str, ...], cache_dir: str) -> list[str | None]:
    """SHA-256 of each named configuration's cubin, compiled for sm_90a from the sources of
    the imported package; None where it failed to compile."""
    from flashinfer_jit import compile_kernel

    digests: list[str | None] = []
    for spec in config_specs(names):
        try:
            cubin = compile_kernel(spec, "sm_90a", cache_dir=cache_dir).cubin
            digests.append(hashlib.sha256(cubin).hexdigest())
        except Exception as exc:  # a mutant that does not compile is reported, not raised
            print(f"    {spec.label}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            digests.append(None)
    return digests


def compile_only(mutants: list[Mutant]) -> int:
    """Per mutant: compile its configurations from a mutated copy of the repository (in a
    subprocess that imports the copy) and compare the cubins with the unmutated ones."""
    status = 0
    with tempfile.TemporaryDirectory() as cache_dir:
        names = tuple(sorted({c for m in mutants for c in m.configs}))
        pristine = dict(zip(names, cubin_digests(names, cache_dir)))
        for mutant in mutants:
            with tempfile.TemporaryDirectory(prefix="mutant-") as folder:
                tree = Path(folder)
                copy_tree(tree)
                apply(mutant, tree)
                command = [
                    sys.executable, "tools/kernel_mutants.py", "--cubin-digests",
                    ",".join(mutant.configs), "--cache-dir", cache_dir,
                ]  # fmt: skip
                done = subprocess.run(
                    command, cwd=tree, env=tree_env(tree), capture_output=True, text=True
                )
            try:
                digests = json.loads(done.stdout.splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                print(f"CHECK {mutant.name}: no digests ({(done.stderr or done.stdout)[-300:]})")
                status = 1
                continue
            failed = sum(d is None for d in digests)
            changed = sum(
                d is not None and d != pristine[c] for c, d in zip(mutant.configs, digests)
            )
            # Every configuration a mutant names must contain its edit.
            verdict = "ok" if not failed and changed == len(digests) else "CHECK"
            status |= verdict != "ok"
            print(
                f"{verdict:5} {mutant.name}: {len(digests) - failed} of {len(digests)} configurations"
                f" compile, {changed} with a cubin that differs from the unmutated one",
                flush=True,
            )
    return status


# Exit statuses that say a check could not run (no GPU, a usage error, no test selected)
# rather than that it failed.
NOT_RUN = {"random": {2}, "pytest": {2, 3, 4, 5}}


def run_in_tree(
    command: list[str], tree: Path, env: dict[str, str], timeout: float
) -> tuple[str, int | None]:
    """(output, exit status) of `command` run from `tree`, stdout and stderr together; the
    status is None when it ran past `timeout` s and was killed with its process group."""
    with subprocess.Popen(
        command,
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the compile workers die with it
    ) as child:
        try:
            return child.communicate(timeout=timeout)[0], child.returncode
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            return child.communicate()[0], None


def run_check(
    label: str, kind: str, command: list[str], tree: Path, timeout: float
) -> tuple[str, str]:
    """Run one check in a subprocess from `tree` (its packages imported). Returns (status,
    detail): "passed"; "failed" (a failing call or test, or a crash); "timeout" (killed with
    its process group after `timeout` s: a hang, or a GPU shared by too many jobs); "error"
    (it could not run: NOT_RUN)."""
    output, returncode = run_in_tree(command, tree, tree_env(tree), timeout)
    if returncode is None:
        return "timeout", f"{label}: no result within {timeout:.0f} s"
    if returncode == 0:
        return "passed", ""
    lines = output.splitlines()
    failing = [line for line in lines if line.startswith(("FAIL", "FAILED", "ERROR"))] or lines[-1:]
    detail = f"{label}: {failing[0][:240] if failing else f'exit status {returncode}'}"
    return ("error" if returncode in NOT_RUN[kind] else "failed"), detail


def checks(args: argparse.Namespace, variants: tuple[str, ...]) -> list[tuple[str, str, list[str]]]:
    """(label, kind, command) of each check, in the order they run."""

    def random_calls(fp8: int, fp4: int, batches: str) -> list[str]:
        return [
            sys.executable, "tools/random_cases.py", "--fp8", str(fp8 if "fp8" in variants else 0),
            "--fp4", str(fp4 if "fp4" in variants else 0), "--batches", batches,
            "--first-seed", str(args.first_seed), "--max-failures", "1", "--chunk", "40",
            "--scales", args.scales,
        ]  # fmt: skip

    stages = []
    if args.fp8 or args.fp4:
        stages.append(("small batches", "random", random_calls(args.fp8, args.fp4, "small")))
    if args.large_fp8 or args.large_fp4:
        stages.append(
            ("large batches", "random", random_calls(args.large_fp8, args.large_fp4, "large"))
        )
    if args.pytest:
        pytest = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-x", "-p", "no:cacheprovider"]
        stages.append(("pytest", "pytest", [*pytest, *shlex.split(args.pytest)]))
    return stages


def check_tree(mutant: Mutant | None, args: argparse.Namespace) -> tuple[str, str, float]:
    """Copy the repository, apply `mutant` to the copy (None: leave it unmutated) and run the
    checks there until one does not pass; the repository itself is never edited, so mutants
    run side by side. Returns (status of the last check run, its detail, seconds)."""
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mutant-") as folder:
        tree = Path(folder)
        copy_tree(tree)
        if mutant is not None:
            apply(mutant, tree)
        probe = [sys.executable, "-c", "import flashinfer_attn_scores as m; print(m.__file__)"]
        where = subprocess.run(
            probe, cwd=tree, env=tree_env(tree), capture_output=True, text=True
        ).stdout.strip()
        if not where.startswith(str(tree)):
            raise RuntimeError(f"the copy's package is not the one imported: {where!r}")
        status, detail = "passed", ""
        for label, kind, command in checks(args, mutant.variants if mutant else BOTH):
            status, detail = run_check(label, kind, command, tree, args.timeout)
            if status != "passed":
                break
    return status, detail, time.perf_counter() - began


VERDICT = {"failed": "caught", "timeout": "timeout", "passed": "SURVIVED", "error": "error"}


def on_gpu(mutants: list[Mutant], args: argparse.Namespace) -> int:
    status, detail, seconds = check_tree(None, args)
    print(f"unmutated tree: {status} {detail} ({seconds:.0f} s)", flush=True)
    if status != "passed":
        print("the checks do not pass without a mutation; mutants not run")
        return 2
    rows = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(check_tree, mutant, args): mutant for mutant in mutants}
        for future in as_completed(futures):
            mutant = futures[future]
            try:
                status, detail, seconds = future.result()
            except Exception as exc:  # one broken copy must not lose the other rows
                status, detail, seconds = "error", f"{type(exc).__name__}: {exc}", 0.0
            rows.append((mutant, VERDICT[status], detail, seconds))
            print(f"{VERDICT[status]:8} {mutant.name} ({seconds:.0f} s) {detail}", flush=True)
    rows.sort(key=lambda row: MUTANTS.index(row[0]))
    counts = {v: sum(row[1] == v for row in rows) for v in VERDICT.values()}
    print(
        f"\n{len(rows)} mutants: {counts['caught']} caught by a failing check, {counts['timeout']}"
        f" by a timeout (rerun those with --jobs 1 to tell a hang from a crowded GPU),"
        f" {counts['SURVIVED']} survived, {counts['error']} could not be checked"
    )
    print("| mutant | result | s | first failure / what a check must exercise |")
    print("|---|---|---|---|")
    for mutant, verdict, detail, seconds in rows:
        text = detail if verdict != "SURVIVED" else mutant.catch
        text = text.replace("|", "\\|")
        print(f"| {mutant.name} | {verdict} | {seconds:.0f} | {text} |")
    return 0 if counts["caught"] + counts["timeout"] == len(rows) else 1


# The GPU tests that catch the mutants the random calls miss (sixtieth and sixty-first rounds of
# docs/fp8-kernel-notes.md): NaN propagation, the in-kernel schedule rows, fp4 scales far apart,
# the long requests and many short ones, a call overlapping the previous kernel (both orders).
DEFAULT_PYTEST = (
    "packages/attn-scores/tests/paged_mqa_logits/test_gpu.py"
    " packages/attn-scores/tests/paged_mqa_logits/test_gpu_in_kernel_schedule.py"
    " packages/attn-scores/tests/paged_mqa_logits/test_gpu_fp4_scales.py"
    " packages/attn-scores/tests/paged_mqa_logits/test_gpu_long_request.py"
    " packages/attn-scores/tests/paged_mqa_logits/test_gpu_pdl.py"
    " -k 'nan_in_k or nan_in_one or in_kernel_rows or q_scales_differ or far_below_one"
    " or ue8m0 or exact_window or million or many_short or back_to_back or waits_until"
    " or dependent_launch or reads_its_inputs or past_max_seq_len or outside_the_pool'"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--compile-only", action="store_true", help="compile each mutant (no GPU)")
    parser.add_argument("--only", help="comma-separated mutant names")
    parser.add_argument(
        "--shard",
        help="K/N: only every N-th mutant from the K-th (1-based), to split a run over device"
        " calls",
    )
    parser.add_argument("--fp8", type=int, default=100, help="fp8 random calls, small batches")
    parser.add_argument("--fp4", type=int, default=60, help="fp4 random calls, small batches")
    parser.add_argument("--large-fp8", type=int, default=20, help="fp8 random calls, large batches")
    parser.add_argument("--large-fp4", type=int, default=12, help="fp4 random calls, large batches")
    parser.add_argument("--first-seed", type=int, default=5000000)
    parser.add_argument(
        "--scales",
        choices=("suite", "wide"),
        default="suite",
        help="the random calls' fp4 scales (random_cases.py --scales)",
    )
    parser.add_argument(
        "--pytest",
        default=DEFAULT_PYTEST,
        help='pytest arguments of the last check (GPU tests); "" for none. Default: the'
        " selections that catch what the random calls miss",
    )
    parser.add_argument("--timeout", type=float, default=200, help="seconds per check")
    parser.add_argument("--jobs", type=int, default=4, help="mutants checked at once (one GPU)")
    parser.add_argument("--cubin-digests", help=argparse.SUPPRESS)  # compile_only's subprocess
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cubin_digests:
        print(json.dumps(cubin_digests(tuple(args.cubin_digests.split(",")), args.cache_dir)))
        return 0
    mutants = MUTANTS
    if args.only is not None:
        wanted = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = sorted(set(wanted) - {m.name for m in MUTANTS})
        if not wanted or unknown:
            parser.error(f"--only: no mutant named {', '.join(unknown) or repr(args.only)}")
        mutants = [m for m in MUTANTS if m.name in wanted]
    if args.shard is not None:
        k, _, n = args.shard.partition("/")
        if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
            parser.error(f"--shard: expected K/N with 1 <= K <= N, got {args.shard!r}")
        mutants = mutants[int(k) - 1 :: int(n)]
    for mutant in mutants:  # every edit applies once, before anything runs
        check_applies(mutant)
    if args.list:
        for mutant in mutants:
            print(f"{mutant.name:30} {mutant.file:28} {'/'.join(mutant.variants):8} {mutant.catch}")
        return 0
    if args.compile_only:
        return compile_only(mutants)
    if not checks(args, BOTH):
        parser.error("no check to run: random calls or --pytest are needed")
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("kernel_mutants: needs an SM90 GPU (or --compile-only)")
        return 2
    return on_gpu(mutants, args)


if __name__ == "__main__":
    sys.exit(main())
