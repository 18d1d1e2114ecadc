"""tools/sanitize_cases.py: its cases pass through the CPU reference path, and its check flags
wrong, unwritten and out-of-place elements."""

from __future__ import annotations

import pytest
import torch

CPU = torch.device("cpu")


def _sanitize_cases():
    import sanitize_cases

    return sanitize_cases


def test_fp8_cases_cover_the_listed_shapes() -> None:
    sc = _sanitize_cases()
    calls = sc.fp8_calls(CPU)
    seen = {(c.args["kv_fused"].shape[1], c.next_n, c.output_dtype) for c, _ in calls}
    assert {bs for bs, _, _ in seen} == {32, 64, 128}
    # next_n 2 in the many-request cases, 2 and 3 in the float16-epilogue ones
    assert {n for _, n, _ in seen} == {1, 2, 3, 4}
    assert {dtype for _, _, dtype in seen} == {torch.float32, torch.float16}
    float16_epilogue = [c for c, _ in calls if c.epi_dtype == torch.float16]
    assert sorted(c.next_n for c in float16_epilogue) == [2, 3]
    assert any(scheduled for _, scheduled in calls)
    # Four requests per case, repeated 10, 65 and 260 times in the many-request cases (one or
    # two requests per CTA, then several: q slots reused inside a CTA, then KV stages too).
    batches = sorted(c.args["seq_lens"].shape[0] for c, _ in calls)
    assert batches == [4] * (len(calls) - 3) + [40, 260, 1040]
    for call, _ in calls:
        lengths = call.args["seq_lens"].tolist()
        assert lengths == [1, 0, 129, 1000] * (len(lengths) // 4)


def test_eager_cases_pass_on_the_cpu_reference_path(capsys: pytest.CaptureFixture[str]) -> None:
    sc = _sanitize_cases()
    assert sc.main(["--device", "cpu", "--only", "eager"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    assert "16 of 16 cases match the reference" in out


def test_fp4_cases_include_both_16_bit_epilogues() -> None:
    calls = _sanitize_cases().fp4_calls(CPU)
    assert {c.epi_dtype for c in calls} == {torch.float32, torch.float16, torch.bfloat16}
    assert {c.interleaved for c in calls} == {False, True}
    assert max(c.args["seq_lens"].shape[0] for c in calls) == 1040  # KV stages reused


def test_an_fp4_interleaved_case_passes_on_the_cpu_reference_path() -> None:
    sc = _sanitize_cases()
    call = sc.build_call(
        "fp4 interleaved",
        "fp4",
        block_size=128,
        next_n=2,
        output_dtype=torch.bfloat16,
        device=CPU,
        interleaved=True,
    )
    assert sc.run_eager(call, CPU) == []


def test_graph_case_is_skipped_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    sc = _sanitize_cases()
    assert sc.main(["--device", "cpu", "--only", "graph"]) == 0
    assert "graph skipped: CUDA graphs need a GPU" in capsys.readouterr().out


def test_check_flags_each_kind_of_wrong_output() -> None:
    sc = _sanitize_cases()
    call = sc.build_call(
        "small", "fp8", block_size=32, next_n=1, output_dtype=torch.float32, device=CPU
    )
    call.out.fill_(float("nan"))
    result = call.run()
    assert sc.check_output(call, result) == []
    lengths = call.args["seq_lens"].tolist()  # [1, 0, 129, 1000]

    def problems_after(row: int, col: int, value: float) -> list[str]:
        saved = call.out[row, col].clone()
        call.out[row, col] = value
        try:
            return sc.check_output(call, result)
        finally:
            call.out[row, col] = saved

    row_max = float(result[3, : lengths[3]].abs().max())
    assert "max error" in problems_after(3, 500, float(result[3, 500]) + 0.01 * row_max)[0]
    assert "never written" in problems_after(2, 128, float("nan"))[0]
    assert "zero-length" in problems_after(1, 0, 1.0)[0]
    assert "spare rows" in problems_after(4, 0, 1.0)[0]
    spare_col = call.out.shape[1] - 1
    assert "1 in spare columns" in problems_after(0, spare_col, 1.0)[0]
    # Beyond a row's valid region (but inside the padded row) anything may be written.
    assert problems_after(0, 5, 1.0) == []
    assert sc.check_output(call, result) == []


def test_without_a_gpu_the_default_device_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device exists here")
    assert _sanitize_cases().main([]) == 2
    assert "needs an SM90 GPU" in capsys.readouterr().err


def _structure(head_dim: int, num_heads: int, next_n: int) -> tuple | None:
    """What a float32 fp8 kernel at this head shape is built from, or None if it does not fit."""
    from flashinfer_attn_scores.paged_mqa_logits import fp8_sm90

    f32 = torch.float32
    config = fp8_sm90.fp8_config(64, head_dim, num_heads, next_n, f32, f32, f32)
    if not config.fits:
        return None
    return (
        tuple(config.pipeline),
        fp8_sm90.mma_halves_for(config.n),
        fp8_sm90.weight_register_groups(config.n, config.consumers) > 0,
    )


def test_head_shapes_reach_every_kernel_structure() -> None:
    """Every (pipeline, commit groups, weights in registers) any admissible head shape compiles
    to at a float32 epilogue has a case in HEAD_SHAPES, one case each."""
    admissible = set()
    for num_heads in range(4, 257, 4):
        for next_n in range(1, 257 // num_heads + 1):
            n = num_heads * next_n
            if n % 8 or not 8 <= n <= 256:
                continue
            head_dim = 32
            while (structure := _structure(head_dim, num_heads, next_n)) is not None:
                admissible.add(structure)
                head_dim += 32
    covered = [_structure(*shape) for shape in _sanitize_cases().HEAD_SHAPES]
    assert None not in covered
    assert len(set(covered)) == len(covered)
    assert set(covered) == admissible


def test_head_shape_cases_pass_on_the_cpu_reference_path() -> None:
    sc = _sanitize_cases()
    index = len(sc.HEAD_SHAPES) - 1  # the smallest; the others differ only in size on the CPU
    call = sc.head_shape_call(index, CPU)
    head_dim, num_heads, next_n = sc.HEAD_SHAPES[index]
    assert tuple(call.args["q"].shape) == (4 * sc.STRUCTURE_REPEATS, next_n, num_heads, head_dim)
    assert sc.run_eager(call, CPU) == []


def test_fp4_structures_reach_every_fp4_kernel_configuration() -> None:
    """Every fp4 kernel structure (pipeline, commit groups, weight loads, epilogue dtype, scale
    layout) some block size and output dtype compile to has a case in FP4_STRUCTURES."""
    from flashinfer_attn_scores.paged_mqa_logits import fp4_sm90, fp8_sm90

    def structure(block_size, next_n, epi, interleaved):
        config = fp4_sm90.fp4_config(block_size, next_n, torch.bfloat16, epi, interleaved)
        return (
            tuple(config.pipeline),
            fp8_sm90.mma_halves_for(config.n),
            fp4_sm90.weight_pair_loads(next_n, epi),
            epi,
            interleaved,
        )

    epilogues = (torch.float32, torch.float16, torch.bfloat16)
    every = {
        structure(block_size, next_n, epi, interleaved)
        for block_size in (32, 64, 128)
        for next_n in (1, 2, 3, 4)
        for epi in epilogues
        for interleaved in ((False, True) if block_size == 128 else (False,))
    }
    cases = _sanitize_cases().FP4_STRUCTURES
    assert {structure(bs, n, epi, inter) for n, epi, inter, bs in cases} == every
    assert {(n, epi, inter) for n, epi, inter, _ in cases} == {
        (n, epi, inter) for n in (1, 2, 3, 4) for epi in epilogues for inter in (False, True)
    }
    assert {bs for _, _, inter, bs in cases if not inter} == {32, 64}


def test_an_fp4_structure_case_passes_on_the_cpu_reference_path() -> None:
    sc = _sanitize_cases()
    index = sc.FP4_STRUCTURES.index((3, torch.float32, True, 128))
    call = sc.fp4_structure_call(index, CPU)
    assert call.interleaved and call.next_n == 3
    assert call.args["seq_lens"].shape[0] == 4 * sc.STRUCTURE_REPEATS
    assert sc.run_eager(call, CPU) == []
