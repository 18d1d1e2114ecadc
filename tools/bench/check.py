"""Check one result against the float64 reference on the valid region, before any timing.

The output buffer is poisoned with NaN before the call, so a valid element the op forgot to
write shows up as NaN. Errors are measured against the size of what each row sums: the row
maximum of the reference computed with |weights| (sum_h |w_h| relu(q_h . k), times the token
scale for fp8), as the attn-scores GPU tests do. The head terms are summed with weights of both
signs, so a logit can be far smaller than the terms it came from and keeps their absolute
error; an element-wise relative bound would flag correct results. Requests are independent, so
the check walks the batch in chunks of a bounded number of KV tokens: the float64 reference
output of a chunk stays small however large the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask

from .data import CaseData
from .ops import reference_logits

# Bound on max |got - ref| / (row maximum of the |weights| reference): the largest of the
# output dtype's, the epilogue's and the accumulator's entries, the same values as the
# attn-scores GPU tests' tolerance table (`test_gpu.TOLERANCES`).
#   float32 output: Hopper's FP8 WGMMA adds the aligned products with a narrower adder than
#            IEEE float32 (as few as ~14 kept bits reported), about 2^-13 of the summed
#            magnitude; 2e-3 leaves a margin over the ~1e-3 that gives on random data.
#   float16 / bfloat16 output: one more rounding of the stored element, 2^-11 / 2^-8 of it.
#   float16 epilogue: each of the 64 head terms and partial sums rounded; bfloat16 (fp4's
#            tensor-core head sum): each relu(score) and weight rounded once, 2 * 2^-8, plus
#            the bfloat16 output's 2^-8 and the float32 path's 2e-3: 1.37e-2 at worst.
#   float16 accumulator: each of the 128 product additions rounded; 5e-3 is 14x the largest
#            error measured on the suite's cases (3.5e-4, 2026-12-04; 2e-2 before).
TOLERANCE = {torch.float32: 2e-3, torch.float16: 5e-3, torch.bfloat16: 8e-3}
EPILOGUE_TOLERANCE = {"float32": 0.0, "float16": 5e-3, "bfloat16": 1.5e-2}
ACCUMULATOR_TOLERANCE = {"float32": 0.0, "float16": 5e-3}
CHUNK_TOKENS = 1 << 16


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one correctness check.

    Attributes:
        passed: Every valid element was written and within tolerance.
        max_error: Largest |got - ref| over the valid region, as a fraction of the row
            maximum of the |weights| reference.
        tolerance: The bound `max_error` was held to.
        unwritten: Valid elements still NaN after the call (never written).
        detail: One line for a human when the check fails, else "".
    """

    passed: bool
    max_error: float
    tolerance: float
    unwritten: int
    detail: str


def _chunks(seq_lens: list[int]) -> list[slice]:
    chunks, start, tokens = [], 0, 0
    for b, length in enumerate(seq_lens):
        if b > start and tokens + length > CHUNK_TOKENS:
            chunks.append(slice(start, b))
            start, tokens = b, 0
        tokens += length
    chunks.append(slice(start, len(seq_lens)))
    return chunks


def check_case(case: CaseData, result: torch.Tensor) -> CheckResult:
    """Compare `result` (the op's output for rotation set 0) with the float64 reference.

    Args:
        case: The case; the op must have written set 0's `out`, poisoned with NaN beforehand.
        result: The view the op returned.

    Returns:
        The check's outcome; `passed` is False on any shape, dtype, aliasing or value error.
    """
    inputs, shape = case.sets[0], case.shape
    tolerance = max(
        TOLERANCE[case.output_dtype],
        EPILOGUE_TOLERANCE[shape.epi_dtype],
        ACCUMULATOR_TOLERANCE[shape.acc_dtype],
    )
    expected_shape = (shape.batch * shape.next_n, case.max_seq_len)
    if tuple(result.shape) != expected_shape or result.dtype != case.output_dtype:
        return CheckResult(
            False,
            float("inf"),
            tolerance,
            0,
            f"returned {tuple(result.shape)} {result.dtype}, expected {expected_shape} {case.output_dtype}",
        )
    if result.data_ptr() != inputs.out.data_ptr():
        return CheckResult(False, float("inf"), tolerance, 0, "result is not a view of out=")

    n = shape.next_n
    worst, unwritten = 0.0, 0
    for requests in _chunks(case.seq_lens):
        width = max(case.seq_lens[requests])
        expected = reference_logits(case, inputs, requests, width)
        magnitude = reference_logits(case, inputs, requests, width, abs_weights=True)
        rows = slice(requests.start * n, requests.stop * n)
        got = result[rows, :width].double()
        mask = valid_mask(inputs.seq_lens[requests], n, width)

        unwritten += int((torch.isnan(got) & mask).sum())
        row_scale = magnitude.abs().masked_fill(~mask, 0).amax(dim=1, keepdim=True)
        error = ((got - expected).abs() / row_scale.clamp_min(1e-30)).masked_fill(~mask, 0)
        worst = max(worst, float(error.nan_to_num(nan=0.0).amax()))

    passed = unwritten == 0 and worst <= tolerance
    detail = ""
    if unwritten:
        detail = f"{unwritten} valid elements were never written (still NaN)"
    elif not passed:
        detail = f"max error {worst:.3g} of the row magnitude exceeds {tolerance:.3g}"
    return CheckResult(passed, worst, tolerance, unwritten, detail)


_SAME_WIDTH_INT = {2: torch.int16, 4: torch.int32}


def valid_bits(
    case: CaseData, result: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The valid elements of `result` (an output view of the case) as raw integers, 1-D.

    Compared as bits, so a NaN the op wrote compares equal to itself and -0.0 differs from 0.0.
    `mask`: the case's `valid_mask` at this width, when the caller already has it (every
    rotation set has the same lengths).
    """
    if mask is None:
        mask = valid_mask(case.sets[0].seq_lens, case.shape.next_n, result.shape[1])
    return result.view(_SAME_WIDTH_INT[result.element_size()])[mask]


def replays_match(
    case: CaseData,
    checked: torch.Tensor,
    result: torch.Tensor,
    timed: str,
    mask: torch.Tensor | None = None,
) -> str:
    """Compare what timed replays left in a rotation set's output with its eager call's bits.

    The output was poisoned with NaN just before the timed replays (`before_samples`), so an
    element the replays did not write, or wrote differently, shows here; the kernels are
    deterministic, so the graph replays must repeat the eager call bit for bit.

    Args:
        case: The case (every rotation set has the same lengths, so one valid region).
        checked: `valid_bits` of the set's eager call: for set 0 the one that passed
            `check_case`.
        result: The set's output view after the timed replays.
        timed: What was timed (and which set), for the message.
        mask: As for `valid_bits`.

    Returns:
        "" when every valid element matches, else one line for a human.
    """
    got = valid_bits(case, result, mask)
    differing = int((got != checked).sum())
    if not differing:
        return ""
    return (
        f"{timed}: {differing} of {checked.numel()} valid elements differ from the eager "
        "call's bits"
    )


class ReplayCheck:
    """What the timed replays of a case must repeat: each rotation set's eager output, bit for
    bit. `poison` goes before a timing's samples (`before_samples`), `mismatch` after them.

    Args:
        case: The case.
        views: One output view per rotation set, as its eager call returned it (set 0: the
            call that passed `check_case`); their valid bits are kept now.
    """

    def __init__(self, case: CaseData, views: Sequence[torch.Tensor]) -> None:
        self.case, self.views = case, list(views)
        # One mask for every set: the same lengths and the same output width.
        self.mask = valid_mask(case.sets[0].seq_lens, case.shape.next_n, self.views[0].shape[1])
        self.expected = [valid_bits(case, view, self.mask) for view in self.views]

    def eager_problem(self) -> str:
        """Why the eager calls of the sets after the first cannot serve as the replays'
        expectation, or "": a view that is not its set's `out` (the poison would never reach
        it), or valid elements still NaN (their outputs were poisoned before the calls)."""
        for index, (inputs, view) in enumerate(zip(self.case.sets, self.views)):
            if index == 0:
                continue  # `check_case` checked it against the float64 reference
            if view.data_ptr() != inputs.out.data_ptr():
                return f"rotation set {index}: the eager call's result is not a view of out="
            unwritten = int((torch.isnan(view) & self.mask).sum())
            if unwritten:
                return (
                    f"rotation set {index}: {unwritten} valid elements were never written by "
                    "its eager call (still NaN)"
                )
        return ""

    def poison(self, sets: int) -> Callable[[], None]:
        """Fill the first `sets` rotation sets' outputs with NaN."""

        def fill() -> None:
            for inputs in self.case.sets[:sets]:
                inputs.out.fill_(float("nan"))

        return fill

    def mismatch(self, timed: str, sets: int) -> str:
        """The first of the first `sets` outputs that does not hold its eager bits, as one
        line for a human, or ""."""
        for index in range(sets):
            where = timed if sets == 1 else f"{timed}, rotation set {index}"
            found = replays_match(
                self.case, self.expected[index], self.views[index], where, self.mask
            )
            if found:
                return found
        return ""
