"""The benchmark's CPU path runs end to end: reference-checked results in its JSON."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def _bench():
    """Import tools/bench as the `bench` package (it is a script directory, not installed)."""
    import bench.cli  # imports every module of the package

    return bench


def test_grid_is_the_performance_md_grid() -> None:
    shapes = _bench().shapes
    grid = shapes.gpu_grid(["fp8"], quick=False)
    assert len(grid) == 4 * 3 * 4 * 3
    assert {s.batch for s in grid} == {1, 8, 64, 128}
    assert {s.avg_len for s in grid} == {4096, 16384, 65536}
    assert {s.next_n for s in grid} == {1, 2, 3, 4}
    assert {s.block_size for s in grid} == {32, 64, 128}


def test_lengths_are_seeded_and_uniform_in_0p7_to_1p3_of_l() -> None:
    shapes = _bench().shapes
    shape = shapes.IndexerShape("fp8", 128, 16384, 2, 64)
    lens = shape.seq_lens()
    assert lens == shapes.IndexerShape("fp8", 128, 16384, 2, 64).seq_lens()
    assert lens != shapes.IndexerShape("fp8", 128, 16384, 1, 64).seq_lens()
    assert all(0.7 * 16384 <= n <= 1.3 * 16384 for n in lens)
    # 128 uniform draws spread over the range rather than sitting on one value.
    assert min(lens) < 0.8 * 16384 and max(lens) > 1.2 * 16384


def test_work_model_counts_each_input_and_output_once() -> None:
    bench = _bench()
    shape = bench.shapes.IndexerShape("fp8", 2, 150, 2, 64)
    work = bench.models.work_model(shape, [100, 200], torch.float32)
    assert work.kv_tokens == 300
    assert work.kv_bytes == 300 * 132
    # next_n 2: slot 0 of each request sees one position fewer (the spec's valid region).
    assert work.output_bytes == (300 * 2 - 2) * 4
    # q (fp8) + weights (fp32) + the block-table entries read (ceil(100/64) + ceil(200/64)
    # int32: each request's own blocks, not the widest request's) + seq_lens.
    assert work.small_input_bytes == 2 * 2 * 64 * 128 + 4 * 64 * 4 + (2 + 4) * 4 + 2 * 4
    assert work.flops == 2 * 64 * 128 * 2 * 300
    fp4 = bench.models.work_model(
        bench.shapes.IndexerShape("fp4", 2, 150, 2, 64), [100, 200], torch.bfloat16
    )
    assert fp4.kv_bytes == 300 * 68
    assert fp4.output_bytes == (300 * 2 - 2) * 2


def test_the_output_model_counts_the_valid_region_of_every_length() -> None:
    # Against the package's own definition of the valid region, lengths below next_n included.
    from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask

    bench = _bench()
    for next_n in (1, 2, 3, 4):
        lens = [0, 1, 2, 3, 5, 64, 129]
        mask = valid_mask(torch.tensor(lens), next_n, max(lens))
        assert bench.models.valid_outputs(lens, next_n) == int(mask.sum())


def _run_bench_on_cpu(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`python tools/bench --quick --device cpu --out DIR ARGV...` in a child process; the
    finished process and DIR."""
    out = tmp_path / "bench"
    command = [sys.executable, str(REPO / "tools" / "bench"), "--quick", "--device", "cpu"]
    proc = subprocess.run(
        [*command, "--out", str(out), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    return proc, out


def test_bench_cpu_quick_writes_checked_results(tmp_path: Path) -> None:
    proc, out = _run_bench_on_cpu(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "need an SM90 (Hopper) GPU" in proc.stdout

    payload = json.loads((out / "results.json").read_text())
    assert payload["mode"] == "cpu-reference"
    assert payload["complete"] is True
    assert payload["torch"]
    # GPU-only measurements are skipped, and say why.
    ceilings = payload["ceilings_bytes_per_s"]
    assert ceilings.keys() == {"copy", "copy_start", "copy_end"}
    assert ceilings["copy"] == max(ceilings["copy_start"], ceilings["copy_end"]) > 0
    assert "before the grid" in proc.stdout and "after it" in proc.stdout
    host_time = payload["host_time"]
    assert host_time["status"] == "skipped" and host_time["results"] == []
    assert "needs an SM90 GPU" in host_time["detail"]
    assert "host time of one eager call: skipped" in proc.stdout
    results = payload["results"]
    assert {r["op"] for r in results} == {"fp8", "fp4"}
    for r in results:
        assert r["status"] == "PASS", r
        check = r["check"]
        assert check["unwritten"] == 0
        assert 0.0 <= check["max_error"] <= check["tolerance"]
        assert r["timing"]["median_us"] > 0
        assert r["gather"] is None and r["gather_fraction"] is None
        assert r["copy_fraction"] == pytest.approx(r["gb_per_s"] * 1e9 / ceilings["copy"])
        # The byte model: 132 B (fp8) or 68 B (fp4) per KV token, plus next_n outputs.
        work = r["work"]
        per_token = 132 if r["op"] == "fp8" else 68
        assert work["kv_bytes"] == per_token * work["kv_tokens"]
        assert work["flops"] == 2 * r["num_heads"] * r["head_dim"] * r["next_n"] * work["kv_tokens"]
    assert sorted(p.name for p in out.glob("*.png")) == [
        "fp4_copy_fraction.png",
        "fp8_copy_fraction.png",
    ]
    # Its markdown says the cells are host times of the reference, not kernel times.
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "bench"), "--markdown", str(out / "results.json")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "CUDA-graph" not in proc.stdout
    assert proc.stdout.count("CPU reference run, NOT kernel measurements. Each cell: the host") == 2
    assert "median of 3 timed calls after a warm-up call" in proc.stdout
    assert "NOT kernel measurements." in proc.stdout.splitlines()[0]


def test_bench_rejects_unknown_op(capsys: pytest.CaptureFixture[str]) -> None:
    cli = _bench().cli
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["--ops", "fp16"])
    assert exc.value.code == 2
    assert "--ops takes a comma-separated subset of fp8,fp4; got 'fp16'" in capsys.readouterr().err
    assert cli.parse_args(["--ops", "fp4"]).ops == ["fp4"]


def test_check_flags_wrong_and_unwritten_elements_only_in_the_valid_region() -> None:
    bench = _bench()  # bench.cli imports the check, data and ops modules
    shape = bench.shapes.IndexerShape("fp8", 3, 200, 2, 32)
    case = bench.data.build_case(shape, torch.device("cpu"))
    first = case.sets[0]
    first.out.fill_(float("nan"))
    logits = bench.ops.op_call(case, first)()
    assert bench.check.check_case(case, logits).passed

    lens = case.seq_lens
    # Row 1 (request 0, newest slot) is valid up to column lens[0] - 1; row 0 one column less.
    outside = logits[0, lens[0] - 1].clone()
    logits[0, lens[0] - 1] = 1e30
    assert bench.check.check_case(case, logits).passed
    logits[0, lens[0] - 1] = outside

    inside = logits[1, lens[0] - 1].clone()
    logits[1, lens[0] - 1] = inside + 0.01 * logits[1, : lens[0]].abs().max()
    result = bench.check.check_case(case, logits)
    assert not result.passed and result.unwritten == 0
    assert "exceeds" in result.detail

    logits[1, lens[0] - 1] = float("nan")
    result = bench.check.check_case(case, logits)
    assert not result.passed and result.unwritten == 1
    logits[1, lens[0] - 1] = inside
    assert bench.check.check_case(case, logits).passed


def test_replay_check_names_the_first_rotation_set_that_lost_its_eager_bits() -> None:
    bench = _bench()
    shape = bench.shapes.IndexerShape("fp8", 2, 128, 1, 32)
    case = bench.data.build_case(shape, torch.device("cpu"))
    # Three rotation sets with outputs of their own (a CPU case may have built only one).
    case.sets = [dataclasses.replace(case.sets[0], out=case.sets[0].out.clone()) for _ in range(3)]
    views = [bench.ops.op_call(case, inputs)() for inputs in case.sets]
    replays = bench.check.ReplayCheck(case, views)
    assert replays.mismatch("graph of 3 calls", 3) == ""

    third_before = views[2].clone()  # its padding columns may hold any bits, NaN included
    replays.poison(2)()  # the first two outputs only
    assert torch.isnan(views[0]).all() and torch.isnan(views[1]).all()
    assert torch.equal(views[2].view(torch.int32), third_before.view(torch.int32))
    detail = replays.mismatch("graph of 3 calls", 3)
    assert detail.startswith("graph of 3 calls, rotation set 0: ")
    assert replays.mismatch("one call per replay", 1).startswith("one call per replay: ")
    for view, bits in zip(views, replays.expected):  # write the eager bits back
        view.view(torch.int32)[bench.check.valid_mask(case.sets[0].seq_lens, 1, view.shape[1])] = (
            bits
        )
    views[1].view(torch.int32)[0, 0] += 1
    assert replays.mismatch("graph of 3 calls", 3).startswith(
        "graph of 3 calls, rotation set 1: 1 of "
    )

    # The eager calls of the later sets are their expectation: each must be a view of its own
    # out= and write every valid element (its out was poisoned before).
    assert replays.eager_problem() == ""
    views[2][0, 0] = float("nan")
    assert bench.check.ReplayCheck(case, views).eager_problem() == (
        "rotation set 2: 1 valid elements were never written by its eager call (still NaN)"
    )
    views[0][0, 0] = float("nan")  # set 0 is check_case's: not looked at here
    views[2][0, 0] = 0.0
    assert bench.check.ReplayCheck(case, views).eager_problem() == ""
    elsewhere = [views[0], views[1].clone(), views[2]]
    assert bench.check.ReplayCheck(case, elsewhere).eager_problem() == (
        "rotation set 1: the eager call's result is not a view of out="
    )


@pytest.mark.parametrize("op", ["fp8", "fp4"])
def test_replay_check_wants_the_checked_bits_in_every_valid_element(op) -> None:
    bench = _bench()
    shape = bench.shapes.IndexerShape(op, 3, 200, 2, 32)
    case = bench.data.build_case(shape, torch.device("cpu"))
    logits = bench.ops.op_call(case, case.sets[0])()
    checked = bench.check.valid_bits(case, logits)
    lens = case.seq_lens
    assert checked.numel() == sum(2 * n - 1 for n in lens)  # slot 0 sees one column less
    assert bench.check.replays_match(case, checked, logits, "graph") == ""

    # What the replays left: outside the valid region anything goes.
    logits[0, lens[0] - 1] = float("nan")
    assert bench.check.replays_match(case, checked, logits, "graph") == ""
    # Inside it, one unwritten element (still the poison), one rounding and a sign of zero.
    saved = logits.clone()
    logits[1, lens[0] - 1] = float("nan")
    detail = bench.check.replays_match(case, checked, logits, "graph of 4 calls")
    assert detail.startswith("graph of 4 calls: 1 of ") and "differ" in detail
    logits.copy_(saved)
    bits = logits.view(torch.int16 if logits.element_size() == 2 else torch.int32)
    bits[2, 5] += 1
    assert "1 of" in bench.check.replays_match(case, checked, logits, "graph")
    logits.copy_(saved)
    zero_row = 2 * 1 + 1
    logits[zero_row, 0] = 0.0
    checked_zero = bench.check.valid_bits(case, logits)
    logits[zero_row, 0] = -0.0
    assert "1 of" in bench.check.replays_match(case, checked_zero, logits, "graph")


def test_dtype_choice_times_the_default_run_s_data_under_its_own_label() -> None:
    shapes = _bench().shapes
    default = shapes.IndexerShape("fp8", 8, 4096, 3, 64)
    half = shapes.IndexerShape("fp8", 8, 4096, 3, 64, epi_dtype="float16", acc_dtype="float16")
    assert default.label == "fp8 B=8 L=4096 next_n=3 bs=64"
    assert half.label == "fp8 B=8 L=4096 next_n=3 bs=64 epi=float16 acc=float16"
    assert half.seed() == default.seed() and half.seq_lens() == default.seq_lens()
    grid = shapes.gpu_grid(["fp8"], quick=True, epi_dtype="float16")
    assert {(s.epi_dtype, s.acc_dtype) for s in grid} == {("float16", "float32")}


def test_op_call_passes_the_case_s_dtypes(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    seen = {}

    def record(op):
        def call(*args, **kwargs):
            seen[op] = {k: v for k, v in kwargs.items() if k.endswith("_dtype")}

        return call

    monkeypatch.setattr(bench.ops.flashinfer_attn_scores, "fp8_paged_mqa_logits", record("fp8"))
    monkeypatch.setattr(bench.ops.flashinfer_attn_scores, "fp4_paged_mqa_logits", record("fp4"))
    cpu = torch.device("cpu")
    half, single = torch.float16, torch.float32
    for shape, expected in (
        (
            bench.shapes.IndexerShape(
                "fp8", 2, 100, 1, 32, epi_dtype="float16", acc_dtype="float16"
            ),
            {"epi_dtype": half, "acc_dtype": half},
        ),
        (
            bench.shapes.IndexerShape("fp8", 2, 100, 1, 32, acc_dtype="float16"),
            {"epi_dtype": single, "acc_dtype": half},
        ),
        (
            bench.shapes.IndexerShape("fp4", 2, 100, 1, 32, epi_dtype="bfloat16"),
            {"epi_dtype": torch.bfloat16},
        ),
        (
            bench.shapes.IndexerShape("fp8", 2, 100, 1, 32),
            {"epi_dtype": single, "acc_dtype": single},
        ),
    ):
        seen.clear()
        case = bench.data.build_case(shape, cpu)
        bench.ops.op_call(case, case.sets[0])()
        assert seen == {shape.op: expected}, shape.label


def test_check_tolerance_is_the_loosest_of_output_epilogue_and_accumulator() -> None:
    bench = _bench()
    cpu = torch.device("cpu")
    errors = {}
    for dtypes in (
        {},
        {"epi_dtype": "float16"},
        {"acc_dtype": "float16"},
        {"epi_dtype": "float16", "acc_dtype": "float16"},
    ):
        shape = bench.shapes.IndexerShape("fp8", 3, 200, 1, 32, **dtypes)
        case = bench.data.build_case(shape, cpu)
        first = case.sets[0]
        first.out.fill_(float("nan"))
        logits = bench.ops.op_call(case, first)()
        # The check's yardstick: row 0's maximum of the |weights| reference.
        width = case.seq_lens[0]
        magnitude = bench.ops.reference_logits(case, first, slice(0, 1), width, abs_weights=True)
        row_max = magnitude[0].abs().max().item()
        logits[0, 0] += 0.004 * row_max  # 4e-3 of the row: beyond 2e-3, within 5e-3
        result = bench.check.check_case(case, logits)
        errors[tuple(dtypes.items())] = (result.tolerance, result.passed)
    assert errors == {
        (): (2e-3, False),
        (("epi_dtype", "float16"),): (5e-3, True),
        (("acc_dtype", "float16"),): (5e-3, True),
        (("epi_dtype", "float16"), ("acc_dtype", "float16")): (5e-3, True),
    }


def test_check_tolerances_are_the_gpu_tests_tolerances() -> None:
    """The benchmark's correctness bounds are the GPU suite's (its own copy: tools/ cannot import
    the tests); a bound tightened in one place must be tightened in the other."""
    bench = _bench()
    tests_dir = REPO / "packages/attn-scores/tests/paged_mqa_logits"
    sys.path.insert(0, str(tests_dir))
    try:
        from test_gpu import TOLERANCES
    finally:
        sys.path.remove(str(tests_dir))
    by_name = {str(dtype).split(".")[-1]: bound for dtype, bound in TOLERANCES["epilogue"].items()}
    assert bench.check.TOLERANCE == TOLERANCES["output"]
    assert bench.check.EPILOGUE_TOLERANCE == by_name
    by_name = {str(d).split(".")[-1]: bound for d, bound in TOLERANCES["accumulator"].items()}
    assert bench.check.ACCUMULATOR_TOLERANCE == by_name


def test_bench_refuses_a_dtype_an_op_does_not_take(capsys: pytest.CaptureFixture[str]) -> None:
    cli = _bench().cli
    for argv, message in (
        (["--acc-dtype", "float16"], "--acc-dtype float16 does not apply to fp4"),
        (["--ops", "fp8", "--epi-dtype", "bfloat16"], "--epi-dtype bfloat16 does not apply to fp8"),
    ):
        with pytest.raises(SystemExit) as exc:
            cli.parse_args(argv)
        assert exc.value.code == 2
        assert message in capsys.readouterr().err
    args = cli.parse_args(["--ops", "fp8", "--epi-dtype", "float16", "--acc-dtype", "float16"])
    assert (args.epi_dtype, args.acc_dtype) == ("float16", "float16")
    assert cli.parse_args(["--ops", "fp4", "--epi-dtype", "bfloat16"]).epi_dtype == "bfloat16"
    assert (cli.parse_args([]).epi_dtype, cli.parse_args([]).acc_dtype) == ("float32", "float32")


def test_bench_cpu_run_with_float16_dtypes_records_them(tmp_path: Path) -> None:
    proc, out = _run_bench_on_cpu(
        tmp_path, "--ops", "fp8", "--epi-dtype", "float16", "--acc-dtype", "float16"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every case with epi_dtype float16, acc_dtype float16" in proc.stdout
    results = json.loads((out / "results.json").read_text())["results"]
    assert results and all(r["status"] == "PASS" for r in results)
    assert {(r["epi_dtype"], r["acc_dtype"], r["check"]["tolerance"]) for r in results} == {
        ("float16", "float16", 5e-3)
    }


def test_environment_records_the_cuda_device_and_its_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()

    class Properties:  # the fields torch.cuda.get_device_properties gives
        name, major, minor = "NVIDIA H200", 9, 0
        multi_processor_count, total_memory, L2_cache_size = 132, 141 << 30, 60 << 20
        uuid = "97236da7-4baf-95b3-e1f5-eeb8a7e3fe53"

    monkeypatch.setattr(
        bench.report.torch.cuda, "get_device_properties", lambda device: Properties()
    )
    device = bench.report.environment("full", torch.device("cuda", 0))["device"]
    assert device == {
        "name": "NVIDIA H200",
        "capability": "9.0",
        "sm_count": 132,
        "memory_bytes": 141 << 30,
        "l2_bytes": 60 << 20,
        "uuid": "97236da7-4baf-95b3-e1f5-eeb8a7e3fe53",
    }
    del Properties.uuid  # an older torch without the field
    assert bench.report.environment("full", torch.device("cuda", 0))["device"]["uuid"] is None
