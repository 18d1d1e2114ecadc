"""Test inputs for the paged MQA logits ops, and an independent float64 expectation.

The caches are assembled byte by byte from the spec's layout description here (not through
`flashinfer_layouts`), and the expectation is computed from the source values with a
per-position gather and a matmul, so neither shares code with the package's reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# E2M1 code -> value (bit 3 sign, bits 2..1 exponent, bit 0 mantissa).
E2M1_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=torch.float64,
)


# The fill of an output buffer whose untouched parts a test checks: finite and exact in every
# output dtype, so a stray write shows whatever it writes (a NaN-filled buffer would hide a
# write of NaN, e.g. of the reference's fill for the elements it does not compute).
UNTOUCHED = -3072.0


def untouched_buffer(rows: int, cols: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.full((rows, cols), UNTOUCHED, dtype=dtype)


def is_untouched(t: torch.Tensor) -> bool:
    return bool((t == UNTOUCHED).all())


# The FP8 tensor cores' accumulation error that `assert_rows_close` accepts per element, as a
# fraction of `dot_magnitude` (scale * sum_h |w_h| sum_d |q_hd k_d|): `accumulation_error`.
# Measured with one head per row (`keep_one_head_per_row`, `tools/fp8_accumulation_error.py`;
# H200, 2026-12-01, nine seeds, ~600k logits per head_dim), the largest error was, as log2:
#
#   head_dim (k steps)   32 (1)   128 (4)   160 (5)   576 (18)   1024 (32)   1600 (50)
#   float32 accumulator  -12.74   -12.03    -11.93    -11.12     -11.24      -10.94
#   float16 accumulator  -11.42   -10.81    -10.97    -10.91     -10.86      -10.93
#
# The float32 accumulator's error grows with the number of k steps S = head_dim / 32, slower
# than S (each step's rounding has its own sign): the bound is 2**-11 * sqrt(max(1, S / 4)),
# at least 2x the largest error at every head_dim measured. The float16 accumulator rounds to
# float16 at every step whatever S is: 2**-9, 3x its largest.
FLOAT32_ACCUMULATION_AT_4_STEPS = 2.0**-11
FLOAT16_ACCUMULATION = 2.0**-9


def accumulation_error(acc_dtype: torch.dtype, head_dim: int) -> float:
    """The per-element bound of the FP8 tensor cores' accumulation error, as a fraction of
    scale * sum_h |w_h| sum_d |q_hd k_d| (see the table above)."""
    if acc_dtype == torch.float16:
        return FLOAT16_ACCUMULATION
    steps = head_dim / 32
    return FLOAT32_ACCUMULATION_AT_4_STEPS * max(1.0, steps / 4) ** 0.5


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class PagedCase:
    """One call's inputs plus the float64 source values they encode."""

    q: torch.Tensor
    kv_fused: torch.Tensor
    weights: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    max_seq_len: int
    next_n: int
    q64: torch.Tensor  # [B, next_n, H, D] dequantised queries
    k64: torch.Tensor  # [num_blocks, block_size, D] dequantised keys
    token_scale64: torch.Tensor | None  # [num_blocks, block_size] fp8 per-token scales
    q_sf: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return self.q.shape[0] * self.next_n

    def fp8_args(self) -> tuple:
        return (
            self.q,
            self.kv_fused,
            self.weights,
            self.block_tables,
            self.seq_lens,
            self.max_seq_len,
        )

    def fp4_args(self) -> tuple:
        return (
            self.q,
            self.q_sf,
            self.kv_fused,
            self.weights,
            self.block_tables,
            self.seq_lens,
            self.max_seq_len,
        )

    def to(self, device: str) -> PagedCase:
        moved = {
            name: (value.to(device) if isinstance(value, torch.Tensor) else value)
            for name, value in self.__dict__.items()
        }
        return PagedCase(**moved)

    def expected(self, abs_weights: bool = False) -> torch.Tensor:
        """The float64 logits; with `abs_weights` the same sums with |weights|, the size of
        the head terms each logit sums (the row magnitude of `assert_rows_close`)."""
        return expected_logits(
            self.q64,
            self.k64,
            self.token_scale64,
            self.weights.abs() if abs_weights else self.weights,
            self.block_tables,
            self.seq_lens,
            self.max_seq_len,
        )

    def token_scales(self, interleaved: bool = False) -> torch.Tensor:
        """An MXFP4 case's `fp4_token_scales` at its current lengths."""
        return fp4_token_scales(
            self.kv_fused,
            self.block_tables,
            self.seq_lens,
            self.next_n,
            self.max_seq_len,
            interleaved,
        )

    def dot_magnitude(self) -> torch.Tensor:
        """The float64 sums of |products| (sum_h |w_h| sum_d |q_hd| |k_d|, times the token
        scale): what the tensor cores' accumulation error scales with (`assert_rows_close`'s
        `dot_magnitude`)."""
        return expected_logits(
            self.q64.abs(),
            self.k64.abs(),
            self.token_scale64,
            self.weights.abs(),
            self.block_tables,
            self.seq_lens,
            self.max_seq_len,
        )


def _paging(
    gen: torch.Generator,
    lens: list[int],
    block_size: int,
    spare_blocks: int,
    table_width: int | None,
) -> tuple[torch.Tensor, int]:
    """A block table over a shuffled pool; unread entries hold garbage ids."""
    used = [ceil_div(n, block_size) for n in lens]
    num_blocks = sum(used) + spare_blocks
    width = table_width if table_width is not None else max([1, *used])
    physical = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    # Entries past a request's own blocks are never read: fill them with ids that would fault.
    table = torch.full((len(lens), width), -(10**6), dtype=torch.int32)
    start = 0
    for b, n in enumerate(used):
        table[b, :n] = physical[start : start + n]
        start += n
    return table, num_blocks


def make_fp8_case(
    lens: list[int],
    *,
    next_n: int = 1,
    num_heads: int = 8,
    head_dim: int = 32,
    block_size: int = 32,
    max_seq_len: int | None = None,
    spare_blocks: int = 3,
    table_width: int | None = None,
    negative_scales: bool = False,
    seed: int = 0,
) -> PagedCase:
    """`negative_scales` flips the sign of about half the per-token scales (drawn after
    everything else, so a seed's other data stay the same): the spec's formula multiplies
    the head sum by the scale, which only a scale applied after the ReLU honours."""
    gen = torch.Generator().manual_seed(seed)
    batch_size = len(lens)
    table, num_blocks = _paging(gen, lens, block_size, spare_blocks, table_width)
    values = (torch.randn(num_blocks, block_size, head_dim, generator=gen) * 1.5).to(
        torch.float8_e4m3fn
    )
    # Per-token scales spanning a few binades so a misplaced scale is visible.
    scales = torch.rand(num_blocks, block_size, generator=gen) * 3.9 + 0.1
    q = (torch.randn(batch_size, next_n, num_heads, head_dim, generator=gen) * 1.5).to(
        torch.float8_e4m3fn
    )
    weights = torch.randn(batch_size * next_n, num_heads, generator=gen)  # both signs
    if negative_scales:
        scales = torch.where(torch.rand(scales.shape, generator=gen) < 0.5, -scales, scales)
    # The spec's two-region recipe: all values of a block, then all its float32 scales.
    kv_fused = torch.cat(
        [values.view(torch.uint8).flatten(1), scales.view(torch.uint8).flatten(1)], dim=1
    ).view(num_blocks, block_size, 1, head_dim + 4)
    return PagedCase(
        q=q,
        kv_fused=kv_fused,
        weights=weights,
        block_tables=table,
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        max_seq_len=max(lens, default=0) if max_seq_len is None else max_seq_len,
        next_n=next_n,
        q64=q.to(torch.float64),
        k64=values.to(torch.float64),
        token_scale64=scales.to(torch.float64),
    )


def with_fp8_values(case: PagedCase, q_values: torch.Tensor, k_values: torch.Tensor) -> PagedCase:
    """`case` (an fp8 case on the CPU) with other query and key values, its scales, paging and
    weights kept. The values must be exact in E4M3 (checked): `[B, next_n, H, D]` and
    `[num_blocks, block_size, D]`."""
    q = q_values.to(torch.float8_e4m3fn)
    values = k_values.to(torch.float8_e4m3fn)
    if not (
        torch.equal(q.double(), q_values.double())
        and torch.equal(values.double(), k_values.double())
    ):
        raise ValueError("with_fp8_values needs values that E4M3 holds exactly")
    num_blocks, block_size, _, row_bytes = case.kv_fused.shape
    scales = case.token_scale64.to(torch.float32)
    kv_fused = torch.cat(
        [values.view(torch.uint8).flatten(1), scales.view(torch.uint8).flatten(1)], dim=1
    ).view(num_blocks, block_size, 1, row_bytes)
    moved = dict(case.__dict__, q=q, kv_fused=kv_fused, q64=q.double(), k64=values.double())
    return PagedCase(**moved)


def keep_one_head_per_row(case: PagedCase) -> None:
    """Weights 1 on head (row % num_heads) and 0 elsewhere, so each logit is one head's
    relu(q_h . k) times the token scale, and `dot_magnitude` that one head's summed
    |products|: the accumulation error of one dot product, unaveraged by other heads."""
    rows, num_heads = case.weights.shape
    weights = torch.zeros_like(case.weights)
    weights[torch.arange(rows), torch.arange(rows) % num_heads] = 1.0
    case.weights = weights


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Even element in the low nibble, odd element in the high nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def decode_mxfp4(codes: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """E2M1 codes [..., D] and UE8M0 bytes [..., D/32] -> float64 values [..., D]."""
    scale = torch.pow(2.0, exponents.to(torch.float64) - 127)
    return E2M1_VALUES[codes.long()] * scale.repeat_interleave(32, dim=-1)


def interleaved_token_of_slot(block_size: int) -> torch.Tensor:
    slot = torch.arange(block_size)
    return (slot % 4) * (block_size // 4) + slot // 4


def fp4_token_scales(
    kv_fused: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    next_n: int,
    max_seq_len: int,
    interleaved: bool = False,
) -> torch.Tensor:
    """2^(e - 127) for the largest UE8M0 group exponent e of the token behind each output
    element: `[batch_size * next_n, max_seq_len]` float64 on the host, 1 where no token is.
    Read from the cache's scale bytes as the layout places them (slot k of an interleaved
    block holds token `interleaved_token_of_slot(block_size)[k]`)."""
    kv = kv_fused.cpu()
    num_blocks, block_size = kv.shape[:2]
    packed_bytes = kv.shape[-1] - 4
    slots = kv.reshape(num_blocks, -1)[:, block_size * packed_bytes :].reshape(
        num_blocks, block_size, 4
    )
    largest = slots.amax(dim=2).to(torch.float64)  # [block, slot]
    if interleaved:
        by_token = torch.empty_like(largest)
        by_token[:, interleaved_token_of_slot(block_size)] = largest
        largest = by_token
    token_scale = torch.exp2(largest - 127)
    tables = block_tables.cpu().to(torch.int64)
    scales = torch.ones(len(seq_lens) * next_n, max_seq_len, dtype=torch.float64)
    for b, length in enumerate(seq_lens.tolist()):
        pos = torch.arange(length)
        scales[b * next_n : (b + 1) * next_n, :length] = token_scale[
            tables[b, pos // block_size], pos % block_size
        ]
    return scales


def make_fp4_case(
    lens: list[int],
    *,
    next_n: int = 1,
    block_size: int = 32,
    interleaved: bool = False,
    max_seq_len: int | None = None,
    spare_blocks: int = 2,
    exponent_range: tuple[int, int] = (120, 128),
    q_slot_exponent_shifts: tuple[int, ...] = (),
    seed: int = 0,
) -> PagedCase:
    """`q_slot_exponent_shifts[t]` moves every UE8M0 byte of draft slot t's q rows by that many
    binades (clamped to [0, 254]), so the slots' largest q scales differ; the default leaves
    them drawn alike (and every earlier seed's case unchanged)."""
    num_heads, head_dim = 64, 128
    gen = torch.Generator().manual_seed(seed)
    batch_size = len(lens)
    table, num_blocks = _paging(gen, lens, block_size, spare_blocks, None)
    low, high = exponent_range

    k_codes = torch.randint(0, 16, (num_blocks, block_size, head_dim), generator=gen)
    k_exp = torch.randint(low, high + 1, (num_blocks, block_size, 4), generator=gen)
    scale_slots = k_exp.to(torch.uint8)
    if interleaved:
        # slot s of a block holds the scales of token (s % 4) * (block_size // 4) + s // 4
        scale_slots = scale_slots[:, interleaved_token_of_slot(block_size)]
    kv_fused = torch.cat([pack_nibbles(k_codes).flatten(1), scale_slots.flatten(1)], dim=1).view(
        num_blocks, block_size, 1, head_dim // 2 + 4
    )

    q_codes = torch.randint(0, 16, (batch_size, next_n, num_heads, head_dim), generator=gen)
    q_exp = torch.randint(low, high + 1, (batch_size, next_n, num_heads, 4), generator=gen)
    if q_slot_exponent_shifts:
        if len(q_slot_exponent_shifts) != next_n:
            raise ValueError(
                f"q_slot_exponent_shifts: expected one shift per draft slot ({next_n}), got"
                f" {q_slot_exponent_shifts!r}"
            )
        shifts = torch.tensor(q_slot_exponent_shifts).view(1, next_n, 1, 1)
        q_exp = (q_exp + shifts).clamp(0, 254)
    # Byte k of each little-endian int32 is the scale of elements [32k, 32k + 32).
    q_sf = q_exp.to(torch.uint8).contiguous().view(torch.int32).squeeze(-1)
    weights = torch.randn(batch_size * next_n, num_heads, generator=gen)
    return PagedCase(
        q=pack_nibbles(q_codes),
        q_sf=q_sf,
        kv_fused=kv_fused,
        weights=weights,
        block_tables=table,
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        max_seq_len=max(lens, default=0) if max_seq_len is None else max_seq_len,
        next_n=next_n,
        q64=decode_mxfp4(q_codes, q_exp),
        k64=decode_mxfp4(k_codes, k_exp),
        token_scale64=None,
    )


def expected_logits(
    q64: torch.Tensor,
    k64: torch.Tensor,
    token_scale64: torch.Tensor | None,
    weights: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
) -> torch.Tensor:
    """Float64 logits for every p < seq_lens[b] (NaN elsewhere), position by position,
    returned on the host.

    The sums run on the device `q64` is on (IEEE float64 there too: torch's gather and
    matmul, nothing of the package), so a GPU test's expectation of a large batch does not
    wait seconds for the host's float64 arithmetic."""
    device = q64.device
    k64, block_tables = k64.to(device), block_tables.to(device)
    if token_scale64 is not None:
        token_scale64 = token_scale64.to(device)
    batch_size, next_n = q64.shape[:2]
    block_size = k64.shape[1]
    w64 = weights.to(device, torch.float64)
    out = torch.full(
        (batch_size * next_n, max_seq_len), float("nan"), dtype=torch.float64, device=device
    )
    for b, length in enumerate(seq_lens.tolist()):
        pos = torch.arange(length, device=device)
        block = block_tables[b].to(torch.int64)[pos // block_size]
        slot = pos % block_size
        keys = k64[block, slot]  # [L, D]
        dots = q64[b] @ keys.T  # [next_n, H, L]
        rows = slice(b * next_n, (b + 1) * next_n)
        logits = (w64[rows, :, None] * dots.clamp_min(0)).sum(dim=1)
        if token_scale64 is not None:
            logits = logits * token_scale64[block, slot]
        out[rows, :length] = logits
    return out.cpu()


def assert_rows_close(
    got: torch.Tensor,
    expected: torch.Tensor,
    mask: torch.Tensor,
    rel_to_row_max: float,
    magnitude: torch.Tensor | None = None,
    dot_magnitude: torch.Tensor | None = None,
    rel_to_dot_magnitude: float = 0.0,
    column_scale: torch.Tensor | None = None,
    abs_floor: float = 0.0,
) -> None:
    """|got - expected| <= rel * (row max of `magnitude`) on every masked element, or (where
    larger) rel_dot * dot_magnitude, plus `abs_floor`.

    `magnitude` defaults to |expected|. Kernel tests pass the reference computed with |weights|
    (sum_h |w_h| relu(q_h . k) * scale): the size of the terms that were summed, which a row
    whose heads cancel (weights of both signs, few valid positions) does not understate.

    `dot_magnitude` (per element, sum_h |w_h| sum_d |q_hd| |k_d| * scale, from
    `expected_logits` on |q|, |k| and |weights|) adds the FP8 tensor cores' accumulation
    error, which scales with the summed |products| of each dot product rather than with the
    dot product itself: in a row of few terms (a handful of heads, one valid position) every
    q_h . k can be a small remainder of large products of both signs, and then that error is
    more than `rel` of the row's largest term. Elsewhere the row bound is the larger one and
    stays the test.

    `column_scale` (per element, positive) is divided out of got, expected and both magnitudes
    first, and out of `abs_floor`. MXFP4 tests pass each token's largest group scale
    (`fp4_token_scales`): a token's logits scale with it, and the row bound of a row whose
    tokens lie binades apart would otherwise cover the smaller tokens' logits whole (zeroing
    them passed). `abs_floor` is the error a rounding below a dtype's normal range may add,
    in the units of `got` (`test_gpu.absolute_floor`); it matters only where a result or a
    float16 head term is that small.
    """
    assert got.shape == expected.shape, (
        f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    )
    if expected.numel() == 0:  # e.g. max_seq_len 0: no element to compare
        return
    got64 = got.detach().cpu().to(torch.float64)
    expected, mask = expected.cpu(), mask.cpu()
    assert torch.isfinite(got64[mask]).all(), "a valid element was not written (NaN/inf)"
    size = expected.abs() if magnitude is None else magnitude.cpu().abs()
    floor = torch.full_like(expected, abs_floor)
    if column_scale is not None:
        scale = torch.where(mask, column_scale.cpu().to(torch.float64), torch.ones_like(expected))
        assert (scale > 0).all() and torch.isfinite(scale).all(), "column_scale must be positive"
        got64, expected, size, floor = got64 / scale, expected / scale, size / scale, floor / scale
        if dot_magnitude is not None:
            dot_magnitude = dot_magnitude.cpu() / scale
    magnitude = torch.where(mask, size, torch.zeros_like(expected)).amax(dim=1)
    bound = (rel_to_row_max * magnitude.clamp_min(1e-30))[:, None].expand_as(expected)
    if dot_magnitude is not None:
        dots = torch.where(mask, dot_magnitude.cpu().abs(), torch.zeros_like(expected))
        bound = torch.maximum(bound, rel_to_dot_magnitude * dots)
    bound = bound + floor
    err = torch.where(mask, (got64 - expected).abs(), torch.zeros_like(expected))
    worst = (err / bound).amax()
    assert (err <= bound).all(), f"error up to {float(worst):.3g} x the bound"
