"""The benchmark's paged-gather ceiling kernel: NVRTC compile for sm_90a on the CPU, its byte
count, and (on an SM90 GPU) its XOR against the same bytes gathered with torch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

# (op, block size) at D = 128: every fp8 block size; fp4 differs only in its value bytes.
GEOMETRIES = [("fp8", 32), ("fp8", 64), ("fp8", 128), ("fp4", 128)]


def _bench():
    """Import tools/bench as the `bench` package (it is a script directory, not installed)."""
    import bench.gather

    return bench


def test_geometry_of_each_op_at_head_dim_128() -> None:
    gather = _bench().gather
    assert gather.geometry_for("fp8", 64, 128) == gather.GatherGeometry(64, 128, 4)
    assert gather.geometry_for("fp4", 32, 128) == gather.GatherGeometry(32, 64, 4)
    assert gather.geometry_for("fp8", 32, 128).block_bytes == 32 * 132


def test_bytes_read_counts_valid_tokens_and_rounds_each_scale_slice_to_16_bytes() -> None:
    geometry = _bench().gather.GatherGeometry(block_size=64, value_bytes=128, scale_bytes=4)
    # 0 tokens: nothing. 1: 128 B of values + 4 B of scale read as one 16 B vector.
    # 64: one full block, 8192 + 256. 65: 8320 + 256 + 16. 129: 16512 + 2 * 256 + 16.
    assert geometry.bytes_read([0]) == 0
    assert geometry.bytes_read([1]) == 144
    assert geometry.bytes_read([64]) == 8448
    assert geometry.bytes_read([65]) == 8592
    assert geometry.bytes_read([129]) == 17040
    assert geometry.bytes_read([0, 1, 64, 65, 129]) == 144 + 8448 + 8592 + 17040
    # 4 tokens fill a 16 B scale vector exactly; 5 need a second one.
    assert geometry.bytes_read([4]) - 4 * 128 == 16
    assert geometry.bytes_read([5]) - 5 * 128 == 32


def test_geometry_rejects_sizes_the_16_byte_loads_cannot_cover() -> None:
    gather = _bench().gather
    with pytest.raises(ValueError, match="value_bytes per token must be a positive multiple"):
        gather.GatherGeometry(64, 72, 4)
    with pytest.raises(ValueError, match="block_size must be a positive multiple of 16"):
        gather.GatherGeometry(24, 128, 4)


def _sass(cubin: bytes) -> str | None:
    from flashinfer_jit.cli import disassemble

    disassembled = disassemble(cubin)
    if disassembled is None:
        return None
    result = disassembled[1]
    result.check_returncode()
    return result.stdout


@pytest.mark.parametrize(("op", "block_size"), GEOMETRIES)
def test_kernel_compiles_for_sm90a_without_spills_and_batches_its_loads(
    op: str, block_size: int, tmp_path: Path
) -> None:
    from flashinfer_jit import compile_kernel

    gather = _bench().gather
    spec = gather.gather_spec(gather.geometry_for(op, block_size, 128))
    compiled = compile_kernel(spec, "sm_90a", cache_dir=tmp_path / "cache")
    assert compiled.entry_name == "paged_gather_xor"
    resources = compiled.resources
    assert resources.is_entry
    assert not compiled.spills, compiled.log
    assert resources.stack_frame_bytes == 0
    # __launch_bounds__(THREADS, MIN_CTAS_PER_SM) caps registers at 64k / (256 * 2).
    assert 0 < resources.registers <= 65536 // (gather.THREADS * gather.MIN_CTAS_PER_SM)

    sass = _sass(compiled.cubin)
    if sass is None:
        pytest.skip("no nvdisasm/cuobjdump: the load batching in the SASS was not checked")
    instructions = [line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    vector_loads = [i for i, line in enumerate(instructions) if "LDG.E.NA.128.CONSTANT" in line]
    assert vector_loads, "no 16-byte non-coherent loads in the SASS"
    # Between the first 16-byte load and the first XOR, every load of the batch is issued:
    # LOADS_PER_LANE value vectors plus the scale vector.
    first_xor = next(
        i
        for i in range(vector_loads[0], len(instructions))
        if re.search(r"LOP3\.LUT .*0x(96|3c)", instructions[i])
    )
    in_flight = sum(1 for i in vector_loads if i < first_xor)
    assert in_flight >= gather.LOADS_PER_LANE + 1


@pytest.mark.parametrize(("op", "block_size"), [*GEOMETRIES, ("fp4", 32)])
def test_copies_kernel_compiles_for_sm90a_and_its_ring_fits_shared_memory(
    op: str, block_size: int, tmp_path: Path
) -> None:
    from flashinfer_jit import compile_kernel

    gather = _bench().gather
    geometry = gather.geometry_for(op, block_size, 128)
    compiled = compile_kernel(gather.copies_spec(geometry), "sm_90a", cache_dir=tmp_path / "cache")
    assert compiled.entry_name == "paged_gather_copies_xor"
    assert not compiled.spills, compiled.log
    assert compiled.resources.stack_frame_bytes == 0
    stages = gather.copies_stages(geometry)
    assert stages % 4 == 0 and 4 <= stages <= 64
    # H100/H200: 227 KB of shared memory per block (the static part is 32 bytes).
    assert stages * (geometry.block_bytes + 20) + 32 <= 227 * 1024
    assert stages * geometry.block_bytes <= gather.COPIES_SLOT_BUDGET


def test_block_list_pairs_each_block_with_its_valid_tokens_in_request_order() -> None:
    gather = _bench().gather
    table = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4], [9, 10, 11, 12]], dtype=torch.int32)
    # 130 tokens: 64 + 64 + 2; 0: nothing (and no table read); -3 counts as 0; 64: one block.
    lens = torch.tensor([[130, 0], [0, 0], [64, 0]], dtype=torch.int32)[:, 0]
    got = gather.block_list(table, lens, 64)
    assert got.dtype == torch.int32 and got.is_contiguous()
    assert got.tolist() == [[5, 64], [6, 64], [7, 2], [9, 64]]
    assert gather.block_list(table, torch.tensor([0, -3, 0], dtype=torch.int32), 64).shape == (0, 2)
    assert gather.block_list(table[:2], torch.tensor([1, 33], dtype=torch.int32), 32).tolist() == [
        [5, 1],
        [1, 32],
        [2, 1],
    ]


def _xor_reduce(words: torch.Tensor) -> int:
    """XOR of all int32 words, by halving (torch has no XOR reduction)."""
    words = words.flatten().to(torch.int32)
    while words.numel() > 1:
        if words.numel() % 2:
            words = torch.cat([words, words.new_zeros(1)])
        words = words[0::2] ^ words[1::2]
    return int(words[0]) & 0xFFFFFFFF if words.numel() else 0


def _expected_xor(
    pool: torch.Tensor, table: torch.Tensor, lens: list[int], block_size: int, value_bytes: int
) -> int:
    """XOR of the bytes the kernel must read, gathered block by block from the layout."""
    blocks = pool.view(pool.shape[0], -1)
    pieces = []
    for b, length in enumerate(lens):
        for j in range(-(-length // block_size)):
            tokens = min(block_size, length - j * block_size)
            block = blocks[int(table[b, j])]
            pieces.append(block[: tokens * value_bytes])
            scales = block_size * value_bytes
            pieces.append(block[scales : scales + -(-tokens * 4 // 16) * 16])
    if not pieces:
        return 0
    return _xor_reduce(torch.cat(pieces).view(torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("programmatic", [False, True])
@pytest.mark.parametrize("kind", ["loads", "copies"])
@pytest.mark.parametrize(
    ("op", "block_size", "lens"),
    [
        ("fp8", 32, [1, 0, 31, 32, 33, 100]),
        ("fp8", 64, [129, 0, 0, 1000, 64, 65] * 7),  # 42 requests: two groups of 32
        ("fp8", 128, [4095, 1, 257]),
        ("fp4", 64, [5, 0, 640, 77]),
        ("fp8", 32, [32 * 3000]),  # more blocks than the grid has warps: deals wrap around
        ("fp8", 64, [0, 1, 65, 200] * 650),  # 2600 requests: three chunks of up to 1024
    ],
)
def test_gather_xor_equals_torch_xor_of_the_same_bytes(
    kind, op, block_size, lens, programmatic
) -> None:
    gather = _bench().gather
    device = torch.device("cuda")
    geometry = gather.geometry_for(op, block_size, 128)
    gen = torch.Generator().manual_seed(sum(lens) + block_size)
    used = [-(-n // block_size) for n in lens]
    num_blocks = sum(used) + 5
    pool = torch.randint(
        0,
        256,
        (num_blocks, block_size, 1, geometry.value_bytes + 4),
        generator=gen,
        dtype=torch.uint8,
    )
    # Shuffled blocks; unread table entries hold other valid ids (reading them would change
    # the XOR); the table's rows are strided and seq_lens is a strided view.
    width = max(used) + 3
    storage = torch.randint(0, num_blocks, (len(lens), width + 5), generator=gen).to(torch.int32)
    physical = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    start = 0
    for b, n in enumerate(used):
        storage[b, :n] = physical[start : start + n]
        start += n
    table = storage[:, :width]
    lens_storage = torch.tensor([[n, 7] for n in lens], dtype=torch.int32)

    runner = gather.PagedGather(geometry, device, kind, programmatic=programmatic)
    # Slice after the copy: .to() of a strided view would make it contiguous.
    table_dev = storage.to(device)[:, :width]
    assert table_dev.stride(0) == width + 5
    run = runner.launcher(pool.to(device), table_dev, lens_storage.to(device)[:, 0])
    run()  # a second launch behind the first: with PDL it may start before the first ends
    got = _xor_reduce(run().cpu())
    torch.cuda.synchronize()
    expected = _expected_xor(pool, table, lens, block_size, geometry.value_bytes)
    assert got == expected
    assert expected != 0  # random bytes: a zero XOR would make the comparison weak


def test_each_row_reports_its_fraction_of_the_gather_ceiling_next_to_copy() -> None:
    bench = _bench()
    import bench.report as report
    from bench.models import work_model
    from bench.shapes import IndexerShape
    from bench.timing import Timing

    shape = IndexerShape("fp8", 2, 150, 1, 64)
    work = work_model(shape, [100, 200], torch.float32)
    result = report.CaseResult(shape, report.PASS, work)
    result.timing = Timing(10.0, 9.0, 11.0, 20, "test")
    # The gather read 40_000 bytes in 5 us: 8 GB/s; the op moved work.total_bytes in 10 us.
    result.gather = bench.gather.GatherCeiling(40_000, Timing(5.0, 5.0, 5.0, 10, "test"), 264)
    result.derive(copy_bw=4e9)
    op_bytes_per_s = work.total_bytes / 10e-6
    assert result.derived["gather_gb_per_s"] == pytest.approx(8.0)
    assert result.derived["gather_fraction"] == pytest.approx(op_bytes_per_s / 8e9)
    assert result.derived["copy_fraction"] == pytest.approx(op_bytes_per_s / 4e9)
    row = report.table_row(result)
    assert f"{op_bytes_per_s / 8e9:9.3f}" in row and "      8" in row
    assert "of gather" in report.table_header() and "of copy" in report.table_header()


def test_launch_arguments_and_grid_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import flashinfer_jit

    gather = _bench().gather
    launches = []

    class RecordingKernel:
        def max_active_blocks_per_sm(self, threads: int) -> int:
            assert threads == gather.THREADS
            return 3

        def launch(self, grid, block, *args, programmatic=False):
            launches.append((grid, block, args, programmatic))

    monkeypatch.setattr(flashinfer_jit, "load_kernel", lambda spec, device: RecordingKernel())
    monkeypatch.setattr(flashinfer_jit, "sm_count", lambda device: 132)
    geometry = gather.geometry_for("fp8", 32, 128)
    runner = gather.PagedGather(geometry, torch.device("cpu"))
    assert runner.grid == 132 * 3 and runner.out.shape == (396,)

    pool = torch.zeros(10, 32, 1, 132, dtype=torch.uint8)
    table = torch.zeros(3, 9, dtype=torch.int32)[:, :4]
    lens = torch.zeros(3, 2, dtype=torch.int32)[:, 1]
    assert runner.launcher(pool, table, lens)() is runner.out
    grid, block, args, programmatic = launches[0]
    assert (grid, block, programmatic) == (396, 256, False)
    assert args[0] is pool and args[2] is table and args[4] is lens and args[7] is runner.out
    assert [a.value for a in (args[1], args[3], args[5], args[6])] == [32 * 132, 9, 2, 3]
    with_pdl = gather.PagedGather(geometry, torch.device("cpu"), programmatic=True)
    with_pdl.launcher(pool, table, lens)()
    assert launches[1][3] is True

    with pytest.raises(ValueError, match="contiguous blocks of 4224 bytes"):
        runner.launcher(torch.zeros(10, 64, 1, 132, dtype=torch.uint8), table, lens)
    with pytest.raises(ValueError, match="block_tables: expected 3 rows"):
        runner.launcher(pool, table[:2], lens)
    with pytest.raises(ValueError, match="seq_lens: expected a 1-D int32"):
        runner.launcher(pool, table, lens.long())


def test_copies_launch_arguments_and_grid_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import flashinfer_jit

    gather = _bench().gather
    launches = []

    class RecordingKernel:
        def launch(self, grid, block, *args, shared_mem=0, programmatic=False):
            launches.append((grid, block, args, shared_mem, programmatic))

    monkeypatch.setattr(flashinfer_jit, "load_kernel", lambda spec, device: RecordingKernel())
    monkeypatch.setattr(flashinfer_jit, "sm_count", lambda device: 132)
    geometry = gather.geometry_for("fp8", 64, 128)
    runner = gather.PagedGather(geometry, torch.device("cpu"), "copies")
    assert runner.grid == 132 and runner.out.shape == (132,)

    pool = torch.zeros(10, 64, 1, 132, dtype=torch.uint8)
    table = torch.tensor([[3, 4], [7, 8]], dtype=torch.int32)
    lens = torch.tensor([65, 10], dtype=torch.int32)
    assert runner.launcher(pool, table, lens)() is runner.out
    grid, block, args, shared_mem, programmatic = launches[0]
    assert (grid, block, programmatic) == (132, 256, False)
    assert shared_mem == gather.copies_stages(geometry) * (64 * 132 + 20)
    assert args[0] is pool and args[1].value == 64 * 132 and args[4] is runner.out
    assert args[2].tolist() == [[3, 64], [4, 1], [7, 10]] and args[3].value == 3
    gather.PagedGather(geometry, torch.device("cpu"), "copies", programmatic=True).launcher(
        pool, table, lens
    )()
    assert launches[1][4] is True
    with pytest.raises(ValueError, match="kind: expected one of"):
        gather.PagedGather(geometry, torch.device("cpu"), "ldg")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["loads", "copies"])
def test_a_programmatic_gather_writes_out_only_after_the_previous_one_finished(kind) -> None:
    """A long gather, then a short one from the same `PagedGather` (one `out`), with PDL and
    no synchronisation between them: the short one may start early, but it must wait for the
    long one before it writes, so `out` ends as the short one alone leaves it."""
    gather = _bench().gather
    device = torch.device("cuda")
    block_size = 64
    geometry = gather.geometry_for("fp8", block_size, 128)
    gen = torch.Generator().manual_seed(7)
    num_blocks = 16384  # 138 MB of pages: the long gather takes tens of microseconds
    pool = torch.randint(
        0,
        256,
        (num_blocks, block_size, 1, geometry.value_bytes + 4),
        generator=gen,
        dtype=torch.uint8,
    ).to(device)
    long_table = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(128, 128).to(device)
    long_lens = torch.full((128,), 128 * block_size, dtype=torch.int32, device=device)
    short_table = torch.tensor([[5]], dtype=torch.int32, device=device)
    short_lens = torch.tensor([1], dtype=torch.int32, device=device)

    runner = gather.PagedGather(geometry, device, kind, programmatic=True)
    run_long = runner.launcher(pool, long_table, long_lens)
    run_short = runner.launcher(pool, short_table, short_lens)
    short_alone = run_short().clone()
    torch.cuda.synchronize()
    for _ in range(5):
        run_long()
        run_short()
        torch.cuda.synchronize()
        assert torch.equal(runner.out, short_alone)


def test_plots_show_only_passing_cases(tmp_path) -> None:
    """A case whose timed replays failed their check is timed and derived (the JSON keeps it)
    but is not plotted; nor is a case without a fraction of copy, or another op's."""
    _bench()
    import bench.report as report
    from bench.models import work_model
    from bench.shapes import IndexerShape
    from bench.timing import Timing

    results = []
    for status, batch in ((report.PASS, 2), (report.FAIL, 4), (report.PASS, 8)):
        shape = IndexerShape("fp8", batch, 150, 1, 64)
        result = report.CaseResult(shape, status, work_model(shape, [100] * batch, torch.float32))
        result.timing = Timing(10.0, 9.0, 11.0, 20, "test")
        result.derive(copy_bw=4e9)
        results.append(result)
    results[2].derived["copy_fraction"] = None
    assert all(r.derived.get("copy_fraction") for r in results[:2])
    assert report.plotted_cases(results, "fp8") == [results[0]]
    assert report.plotted_cases(results, "fp4") == []
    written = report.write_plots(tmp_path, results, "test")
    assert [path.name for path in written] == ["fp8_copy_fraction.png"]
