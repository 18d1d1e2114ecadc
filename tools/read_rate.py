"""Read bandwidth of a paged gather on one SM90 GPU, by load path, with and without output stores.

    PYTHONPATH=packages/jit/src:packages/attn-scores/src python tools/read_rate.py [--set SET]

The FP8 logits kernel with its math switched off (the "loads only" variant) reads its pages at
about 0.96 of the copy bandwidth, while PERFORMANCE.md measured a read-only gather of the same
pages with 16-byte loads at 1.04-1.09x copy. This separates the load path from the rest of the
kernel (`tools/read_rate.cu`): the same random pages of a large pool, read by plain loads from
every warp, by cp.async.bulk copies into a ring of shared-memory slots, or by the TMA boxes
the FP8 producers issue. Variant sets:

- `paths`: load path, bytes in flight (slots), producer warps, CTAs per SM, static ranges
  against dynamic claims (atomicAdd), random against sequential pages; three page sizes.
- `hop`: the TMA ring plus the logits kernel's consumer warpgroups, then their output stores.
- `writes`: how the stores are issued (plain, streaming, L2 evict_last, bulk copies of 64 B to
  16 KB, float16, or into an L2-resident ring).
- `write-volume`: stores from every n-th page only, and other output address orders.
- `epochs`: output stores staged in shared memory and written by every SM at the same
  instants (time epochs), against plain and no stores.

Each row is the median of timed calls (CUDA events; calls rotate over four random page lists
of 1.1 GB from an 8 GiB pool, so no page comes from L2), as the GB/s read and as a fraction of
a device-to-device copy (bytes read plus written) measured in the same run. `check` compares
what the kernel saw with torch: the XOR of the words read, and the stored floats.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from flashinfer_jit import KernelSpec, i32, i64, load_kernel, make_tensor_map, sm_count, u64

CSRC = (
    Path(__file__).resolve().parents[1]
    / "packages/attn-scores/src/flashinfer_attn_scores/paged_mqa_logits/csrc"
)
SOURCE = Path(__file__).resolve().parent / "read_rate.cu"
MODES = {"ldg": 0, "bulk": 1, "tma": 2}
FP8_TOKEN_BYTES = 132  # 128 value bytes and a 4-byte scale per token


def copy_bandwidth(gib: float = 1.0, reps: int = 20) -> float:
    """Device-to-device copy bandwidth, bytes read plus written per second."""
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        dst.copy_(src)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return 2 * src.numel() / statistics.median(times)


class Pool:
    """A pool of random pages and fresh random page lists of `read_bytes` each."""

    def __init__(self, page_bytes: int, pool_gib: float, read_bytes: float, lists: int):
        self.page_bytes = page_bytes
        self.pages = int(pool_gib * 2**30) // page_bytes
        self.data = torch.empty(self.pages * page_bytes, dtype=torch.uint8, device="cuda")
        self.data.view(torch.int32).random_()
        count = int(read_bytes) // page_bytes
        self.lists = [
            torch.randperm(self.pages, device="cuda")[:count].to(torch.int32) for _ in range(lists)
        ]
        self.sequential = torch.arange(count, dtype=torch.int32, device="cuda")

    def first_words_xor(self, pages: torch.Tensor) -> int:
        """XOR of the first 32-bit word of each listed page (what BULK and TMA report)."""
        words = self.data.view(torch.int32).view(self.pages, -1)[pages.long(), 0]
        return _xor_all(words)

    def all_words_xor(self, pages: torch.Tensor) -> int:
        """XOR of every 32-bit word of the listed pages (what LDG reports)."""
        words = self.data.view(self.pages, -1)[pages.long()].view(torch.int32)
        return _xor_all(words.flatten())


def _xor_all(words: torch.Tensor) -> int:
    words = words.flatten()
    while words.numel() > 1:
        if words.numel() % 2:
            words = torch.cat([words, words.new_zeros(1)])
        half = words.numel() // 2
        words = words[:half] ^ words[half:]
    return int(words.item()) & 0xFFFFFFFF if words.numel() else 0


def run_variant(
    pool: Pool,
    mode: str,
    *,
    stages=12,
    producers=1,
    ctas_per_sm=1,
    step=1,
    min_ctas=2,
    first_bytes=0,
    chunk=0,
    consumers=0,
    writes=0,
    out_chunk=16,
    out_ring=2,
    epoch_ns=10000,
    write_every=1,
    out_order=0,
    sequential=False,
    reps=10,
):
    """(GB/s median, checksum ok) of one configuration; chunk > 0: dynamic claims of that many
    pages, else static ranges."""
    page_bytes = pool.page_bytes
    box_rows = 32 if page_bytes == 32 * FP8_TOKEN_BYTES else 64
    defines = {"MODE": MODES[mode], "PAGE_BYTES": page_bytes, "CHUNK": max(chunk, 1)}
    if mode == "ldg":
        defines |= {"STEP": step, "MIN_CTAS": min_ctas}
    else:
        defines |= {
            "PRODUCERS": producers,
            "BOX_ROWS": box_rows,
            "CONSUMERS": consumers,
            "WRITES": writes,
            "OUT_CHUNK": out_chunk,
            "WRITE_EVERY": write_every,
            "OUT_RING": out_ring,
            "EPOCH_NS": epoch_ns,
            "OUT_ORDER": out_order,
        }
    kernel = load_kernel(KernelSpec.make("read_rate", SOURCE, defines, include_dirs=(CSRC,)))
    threads = 256 if mode == "ldg" else 32 * producers + 128 * consumers + 32 * (writes >= 8)
    grid = sm_count() * ctas_per_sm
    slot_bytes = -(-page_bytes // 1024) * 1024 if mode == "tma" else page_bytes
    staged = out_ring * (out_chunk * 256 + 16) if writes >= 8 else 64 * 16
    shared = 0 if mode == "ldg" else stages * slot_bytes + 16 * stages + 1024 + 16 + staged
    tensor_map = make_tensor_map(
        pool.data.data_ptr(),
        torch.uint8,
        global_dims=(128, page_bytes // FP8_TOKEN_BYTES, pool.pages),
        global_strides_bytes=(128, page_bytes),
        box_dims=(128, box_rows, 1),
        swizzle="128B",
    )
    sink = torch.zeros(grid * threads, dtype=torch.int32, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.empty((pool.lists[0].numel() + 32 * grid) * 64 if writes else 4, device="cuda")
    lists = [pool.sequential] if sequential else pool.lists

    def call(pages):
        kernel.launch(
            grid,
            threads,
            tensor_map,
            pool.data,
            i64(page_bytes),
            pages,
            i32(pages.numel()),
            counter if chunk else u64(0),
            i32(stages),
            i32(first_bytes),
            out,
            sink,
            shared_mem=shared,
        )

    call(lists[0])
    torch.cuda.synchronize()
    got = _xor_all(sink)
    want = pool.all_words_xor(lists[0]) if mode == "ldg" else pool.first_words_xor(lists[0])
    if (
        writes in (1, 2, 3, 4, 5, 8) and write_every == 1 and out_order == 0
    ):  # page k's 64 floats: its scale words 0..31, twice
        words = pool.data.view(torch.int32).view(pool.pages, -1)[lists[0].long()]
        first_scale = (page_bytes // FP8_TOKEN_BYTES) * 128 // 4
        expected = words[:, first_scale : first_scale + 32].repeat(1, 2)
        written = out.view(torch.int32)[: expected.numel()].view(-1, 64)
        got = got if torch.equal(written, expected) else -1
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(reps):
        pages = lists[(r + 1) % len(lists)]
        if chunk:
            counter.zero_()
        start.record()
        call(pages)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return lists[0].numel() * page_bytes / statistics.median(times) / 1e9, got == want


def path_variants(page_bytes: int):
    """Load paths, work split and bytes in flight; the full set at the FP8 block-64 page."""
    rows = [
        ("ldg", {"ctas_per_sm": 2}),
        ("ldg", {"ctas_per_sm": 2, "chunk": 4}),
        ("tma", {"stages": 12, "producers": 4}),
        ("tma", {"stages": 12, "producers": 4, "chunk": 4}),
    ]
    if page_bytes != 64 * FP8_TOKEN_BYTES:
        return rows
    return [
        *rows,
        ("ldg", {"ctas_per_sm": 2, "sequential": True}),
        ("ldg", {"ctas_per_sm": 2, "chunk": 4, "sequential": True}),
        ("ldg", {"ctas_per_sm": 2, "chunk": 8}),
        ("ldg", {"ctas_per_sm": 2, "chunk": 2, "step": 2}),
        ("ldg", {"ctas_per_sm": 16}),
        ("ldg", {"ctas_per_sm": 3, "min_ctas": 3, "chunk": 4}),
        ("bulk", {"stages": 12}),
        ("bulk", {"stages": 12, "chunk": 8}),
        ("bulk", {"stages": 12, "producers": 4}),
        ("bulk", {"stages": 12, "producers": 4, "chunk": 4}),
        ("bulk", {"stages": 24, "producers": 4, "chunk": 4}),
        ("bulk", {"stages": 12, "producers": 4, "chunk": 4, "sequential": True}),
        ("tma", {"stages": 24, "producers": 4}),
        ("tma", {"stages": 24, "producers": 4, "chunk": 4}),
        ("tma", {"stages": 12, "producers": 4, "chunk": 1}),
        ("tma", {"stages": 12, "producers": 4, "chunk": 16}),
        ("tma", {"stages": 12, "producers": 1, "chunk": 8}),
        ("tma", {"stages": 8, "producers": 4, "chunk": 4}),
        ("tma", {"stages": 12, "producers": 4, "ctas_per_sm": 2}),
        ("ldg", {"ctas_per_sm": 2}),
        ("tma", {"stages": 12, "producers": 4}),
        ("tma", {"stages": 12, "producers": 4, "chunk": 4}),
    ]


def hop_variants(page_bytes: int):
    """The FP8 producers' TMA copies with the logits kernel's consumer hop and output stores
    added one at a time (4 producer warps, static ranges), in two interleaved rounds."""
    tma = {"producers": 4}
    rows = [
        {"stages": 12},
        {"stages": 12, "consumers": 4},
        {"stages": 12, "consumers": 4, "writes": 1},
        {"stages": 12, "consumers": 1},
        {"stages": 12, "consumers": 2, "writes": 1},
        {"stages": 16, "consumers": 4, "writes": 1},
        {"stages": 20, "consumers": 4, "writes": 1},
        {"stages": 8, "consumers": 4, "writes": 1},
    ]
    return [("tma", tma | row) for _ in range(2) for row in rows]


def write_variants(page_bytes: int):
    """How the consumers' output stores are issued (WRITES in read_rate.cu), interleaved twice."""
    rows = [{"stages": 12, "consumers": 4, "writes": w} for w in (0, 1, 3, 6, 7)] + [
        {"stages": 12, "consumers": 4, "writes": 8, "out_chunk": c} for c in (4, 16, 64)
    ]
    return [("tma", {"producers": 4} | row) for _ in range(2) for row in rows]


def write_volume_variants(page_bytes: int):
    """The logits kernel's stores (WRITES 1) from every n-th page only, interleaved twice."""
    rows = [{"writes": 0}] + [{"writes": 1, "write_every": n} for n in (1, 2, 8, 32, 256)]
    rows += [{"writes": 1, "out_order": 1}, {"writes": 1, "out_order": 2}]
    return [
        ("tma", {"producers": 4, "stages": 12, "consumers": 4} | row)
        for _ in range(2)
        for row in rows
    ]


def epoch_variants(page_bytes: int):
    """Output stores staged in shared memory and written by all SMs at the same instants."""
    base = {"producers": 4, "stages": 12, "consumers": 4}
    rows = [
        {"writes": 0},
        {"writes": 1},
        {"writes": 8, "out_chunk": 16, "out_ring": 8},
        {"writes": 9, "out_chunk": 16, "out_ring": 8, "epoch_ns": 5000},
        {"writes": 9, "out_chunk": 16, "out_ring": 8, "epoch_ns": 10000},
        {"writes": 9, "out_chunk": 16, "out_ring": 16, "epoch_ns": 20000},
        {"writes": 9, "out_chunk": 8, "out_ring": 16, "epoch_ns": 2000},
    ]
    return [("tma", base | row) for _ in range(2) for row in rows]


VARIANT_SETS = {
    "epochs": epoch_variants,
    "write-volume": write_volume_variants,
    "paths": path_variants,
    "hop": hop_variants,
    "writes": write_variants,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-gib", type=float, default=8.0)
    parser.add_argument("--read-gb", type=float, default=1.1, help="bytes read per call (GB)")
    parser.add_argument(
        "--page-bytes",
        type=int,
        nargs="*",
        default=[64 * FP8_TOKEN_BYTES, 32 * FP8_TOKEN_BYTES, 128 * FP8_TOKEN_BYTES],
    )
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--set", choices=sorted(VARIANT_SETS), default="paths")
    parser.add_argument(
        "--persisting-l2-mb",
        type=int,
        default=0,
        help="set the device's persisting L2 carve-out first (what evict_last lines may use)",
    )
    args = parser.parse_args()
    if args.persisting_l2_mb:
        from cuda.bindings import runtime

        limit = runtime.cudaLimit.cudaLimitPersistingL2CacheSize
        (err,) = runtime.cudaDeviceSetLimit(limit, args.persisting_l2_mb << 20)
        print(
            f"persisting L2 carve-out: {err}, now {runtime.cudaDeviceGetLimit(limit)[1] >> 20} MB"
        )
    copy = copy_bandwidth()
    print(f"copy {copy / 1e9:.0f} GB/s (read + written), {sm_count()} SMs")
    print(f"{'page':>6} {'mode':>5} {'options':<58} {'GB/s':>7} {'of copy':>8} {'check':>6}")
    for page_bytes in args.page_bytes:
        pool = Pool(page_bytes, args.pool_gib, args.read_gb * 1e9, lists=4)
        for mode, options in VARIANT_SETS[args.set](page_bytes):
            rate, ok = run_variant(pool, mode, reps=args.reps, **options)
            text = " ".join(f"{k}={v}" for k, v in options.items())
            print(
                f"{page_bytes:>6} {mode:>5} {text:<58} {rate:>7.0f} {rate * 1e9 / copy:>8.3f}"
                f" {'ok' if ok else 'FAIL':>6}"
            )
        del pool
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
