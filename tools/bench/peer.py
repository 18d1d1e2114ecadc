"""The peer's published fp8 paged MQA logits times, the reference of the speed-up target.

Transcribed from the project's performance notes (PERFORMANCE.md, "The peer to beat, measured on
this H200 (2026-11-29)"): the strongest public Hopper indexer, block size 64, H = 64, D = 128,
float32 logits, lengths uniform in 0.7..1.3 of L, timed as CUDA-graph replays of its metadata
kernel plus its logits kernel. These are the only figures the benchmark does not measure itself;
they are the published comparison point, not results of this project.
"""

from __future__ import annotations

# The only block size the peer's figures were measured at.
PEER_BLOCK_SIZE = 64

# (next_n, batch, average length L) -> median microseconds per call.
PEER_FP8_US: dict[tuple[int, int, int], float] = {
    (1, 1, 4096): 6.4,
    (1, 1, 16384): 7.0,
    (1, 1, 65536): 8.2,
    (1, 8, 4096): 8.0,
    (1, 8, 16384): 10.0,
    (1, 8, 65536): 28.4,
    (1, 64, 4096): 13.6,
    (1, 64, 16384): 47.7,
    (1, 64, 65536): 150.0,
    (1, 128, 4096): 29.0,
    (1, 128, 16384): 84.4,
    (1, 128, 65536): 292.0,
    (2, 1, 4096): 7.0,
    (2, 1, 16384): 7.3,
    (2, 1, 65536): 9.5,
    (2, 64, 4096): 16.7,
    (2, 64, 16384): 49.8,
    (2, 64, 65536): 155.0,
    (2, 128, 4096): 31.5,
    (2, 128, 16384): 89.9,
    (2, 128, 65536): 306.0,
}

# The device-to-device copy bandwidth (bytes read plus written) the peer's machine measured
# beside those times (PERFORMANCE.md). Each of our runs measures its own.
PEER_COPY_BYTES_PER_S = 4.28e12

# The published shapes whose row also gives the time as a fraction of that copy bandwidth: the
# bandwidth-bound ones. The other eight (B 1 at every L and next_n, B 8 at L 4k and 16k) are
# latency-bound and published as times alone.
PEER_SHAPES_WITH_COPY_FRACTION: frozenset[tuple[int, int, int]] = frozenset(
    {(1, 8, 65536)}
    | {(n, b, length) for n in (1, 2) for b in (64, 128) for length in (4096, 16384, 65536)}
)
