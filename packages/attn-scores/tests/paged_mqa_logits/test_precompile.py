"""precompile_paged_mqa_logits: argument checks everywhere, compilation only on SM90."""

from __future__ import annotations

import flashinfer_attn_scores as fa
import numpy as np
import pytest
import torch
from attn_scores_cases import assert_rows_close, make_fp4_case, make_fp8_case
from flashinfer_attn_scores.paged_mqa_logits.reference import (
    fp4_paged_mqa_logits_reference,
    fp8_paged_mqa_logits_reference,
    valid_mask,
)


def test_cpu_device_compiles_nothing():
    assert fa.precompile_paged_mqa_logits("cpu") == []
    assert fa.precompile_paged_mqa_logits(torch.device("cpu"), ("fp8",), (torch.float16,)) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="device=None targets the GPU here")
def test_default_device_without_gpu_is_cpu():
    assert fa.precompile_paged_mqa_logits() == []


def test_default_grid_is_the_documented_one(monkeypatch):
    """The grid a CUDA target builds, listed without a GPU: the device lookup, the SM90 check
    and the compilation are replaced, so only the configuration list is observed."""
    from flashinfer_attn_scores import _validation
    from flashinfer_attn_scores.paged_mqa_logits import launcher, precompile

    compiled = []
    monkeypatch.setattr(precompile, "resolve_device", lambda device: torch.device("cuda", 0))
    monkeypatch.setattr(_validation, "check_cuda_arch", lambda op, device: None)
    monkeypatch.setattr(
        launcher,
        "compile_paged_mqa_logits_kernels",
        lambda configs, target: compiled.extend(configs),
    )
    configs = fa.precompile_paged_mqa_logits("cuda:0")
    assert compiled == configs
    got = sorted(
        (c.variant, c.block_size, c.next_n, str(c.output_dtype), c.is_kv_sf_interleaved)
        for c in configs
    )
    # fp8 builds float32 output only; fp4 builds bfloat16 and float32, plus the interleaved
    # scale order at block size 128 (and only there).
    expected = [("fp8", bs, n, "torch.float32", False) for bs in (32, 64, 128) for n in range(1, 5)]
    for bs in (32, 64, 128):
        for n in range(1, 5):
            for out in ("torch.bfloat16", "torch.float32"):
                expected += [
                    ("fp4", bs, n, out, inter) for inter in (False, True)[: 1 + (bs == 128)]
                ]
    assert got == sorted(expected)
    assert len(configs) == 12 + 24 + 8
    for c in configs:
        assert (c.num_heads, c.head_dim) == (64, 128)
        assert (c.epi_dtype, c.acc_dtype) == (torch.float32, torch.float32)


def test_a_cuda_precompile_also_compiles_the_schedule_kernel(monkeypatch, tmp_path):
    """`compute_paged_mqa_logits_schedule` launches flashinfer_schedule's own kernel on CUDA
    tensors; the precompile compiles (and loads) it with the logits kernels, whatever the
    variants, so that no first schedule call runs NVRTC. Compiled for real here, with NVRTC
    for sm_90a, which needs no GPU: only the device lookup, the SM90 check and the load on
    the device are left out."""
    import flashinfer_jit
    from flashinfer_attn_scores.paged_mqa_logits import launcher
    from flashinfer_attn_scores.paged_mqa_logits import precompile as module
    from flashinfer_schedule import SCHEDULE_REQUEST_ENTRY_UNITS, SCHEDULE_TOKENS_PER_UNIT
    from flashinfer_schedule._schedule_cuda import all_kernel_specs as schedule_kernel_specs

    compile_for_sm90a = flashinfer_jit.precompile
    summaries = []

    def compile_without_a_gpu(specs, device, *, load):
        assert device == torch.device("cuda", 0) and load
        summary = compile_for_sm90a(
            specs, arch="sm_90a", cache_dir=tmp_path, max_workers=1, progress=False
        )
        summaries.append(summary)
        return summary

    monkeypatch.setattr(flashinfer_jit, "precompile", compile_without_a_gpu)
    monkeypatch.setattr(module.v, "check_cuda_arch", lambda *args: None)
    monkeypatch.setattr(module, "resolve_device", lambda device: torch.device("cuda", 0))
    for variant in ("fp8", "fp4"):
        configs = fa.precompile_paged_mqa_logits(
            "cuda:0", variants=(variant,), block_sizes=(64,), next_ns=(1,), output_dtypes=None
        )
        summary = summaries.pop()
        compiled = [result.spec for result in summary.results]
        assert all(result.ok for result in summary.results), str(summary)
        assert compiled == [launcher.config_spec(c) for c in configs] + schedule_kernel_specs()
    # The schedule kernel that a CUDA schedule call launches, with the package's constants.
    (schedule_spec,) = schedule_kernel_specs()
    assert schedule_spec.name == "paged_mqa_logits_schedule"
    assert dict(schedule_spec.defines) == {
        "TOKENS_PER_UNIT": SCHEDULE_TOKENS_PER_UNIT,
        "ENTRY_UNITS": SCHEDULE_REQUEST_ENTRY_UNITS,
    }


def test_fp4_bfloat16_output_is_a_valid_request():
    got = fa.precompile_paged_mqa_logits("cpu", variants=("fp4",), output_dtypes=(torch.bfloat16,))
    assert got == []


def _grid(monkeypatch, **kwargs) -> list[tuple]:
    """(variant, output dtype, epi dtype) of the configurations a CUDA precompile would build."""
    from flashinfer_attn_scores.paged_mqa_logits import precompile as module

    built = []
    monkeypatch.setattr(module.v, "check_cuda_arch", lambda *args: None)
    monkeypatch.setattr(
        module.launcher,
        "compile_paged_mqa_logits_kernels",
        lambda configs, target: built.extend(configs),
    )
    monkeypatch.setattr(module, "resolve_device", lambda device: torch.device("cuda", 0))
    fa.precompile_paged_mqa_logits("cuda:0", block_sizes=(64,), next_ns=(1,), **kwargs)
    return sorted({(c.variant, str(c.output_dtype), str(c.epi_dtype)) for c in built})


def test_both_variants_build_each_dtype_where_it_is_taken(monkeypatch):
    # fp8 has no bfloat16 output or epilogue; fp4 has both. A mixed list builds what each takes.
    got = _grid(
        monkeypatch,
        output_dtypes=(torch.bfloat16, torch.float32),
        epi_dtypes=(torch.float32, torch.bfloat16),
    )
    assert got == [
        ("fp4", "torch.bfloat16", "torch.bfloat16"),
        ("fp4", "torch.bfloat16", "torch.float32"),
        ("fp4", "torch.float32", "torch.bfloat16"),
        ("fp4", "torch.float32", "torch.float32"),
        ("fp8", "torch.float32", "torch.float32"),
    ]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"output_dtypes": (torch.bfloat16,)},
            r"^output_dtypes \('torch.bfloat16',\) leaves nothing to build for fp8, which takes "
            r"\(torch.float32, torch.float16\)",
        ),
        (
            {"epi_dtypes": (torch.bfloat16,)},
            r"^epi_dtypes \('torch.bfloat16',\) leaves nothing to build for fp8",
        ),
        (
            {"output_dtypes": (torch.float32, torch.float64)},
            r"^output_dtypes entry torch.float64: none of the variants \('fp8', 'fp4'\) takes it "
            r"\(fp8: torch.float32, torch.float16; fp4: ",
        ),
    ],
)
def test_both_variants_refuse_a_dtype_list_that_drops_something(kwargs, match):
    # Nothing asked for is silently left out: a variant left with no dtype, or a dtype no
    # variant takes, is refused.
    with pytest.raises(ValueError, match=match):
        fa.precompile_paged_mqa_logits("cpu", **kwargs)


PRECOMPILE_ERRORS = {
    "variant_unknown": (
        {"variants": ("fp16",)},
        ValueError,
        "variants entries must be 'fp8' or 'fp4'",
    ),
    "variant_not_str": (
        {"variants": ("fp8", 1)},
        TypeError,
        r"variants entries must be 'fp8' or 'fp4', got int \(1\)",
    ),
    "variants_str": ({"variants": "fp8"}, TypeError, "variants must be a non-empty sequence"),
    "variants_empty": ({"variants": ()}, ValueError, "variants must be a non-empty sequence"),
    "block_sizes_empty": ({"block_sizes": ()}, ValueError, "block_sizes must be a non-empty"),
    "block_sizes_int": ({"block_sizes": 64}, TypeError, "block_sizes must be a non-empty"),
    "output_dtypes_empty": ({"output_dtypes": []}, ValueError, "output_dtypes must be a non-"),
    "fp8_bf16_output": (
        {"variants": ("fp8",), "output_dtypes": (torch.bfloat16,)},
        ValueError,
        "bfloat16 is deliberately unsupported",
    ),
    "output_dtypes_not_dtypes": (
        {"output_dtypes": ("float32",)},
        TypeError,
        "output_dtypes entries must be torch.dtype",
    ),
    "block_size_48": ({"block_sizes": (32, 48)}, ValueError, "block_sizes entry 48: must be in"),
    "next_n_5_fp4": (
        {"variants": ("fp4",), "next_ns": (5,)},
        ValueError,
        r"fp4 supports next_n 1\.\.4",
    ),
    "next_n_0": ({"next_ns": (0,)}, ValueError, "next_ns entry 0: must be >= 1"),
    "fp8_num_heads_6": (
        {"variants": ("fp8",), "num_heads": 6},
        ValueError,
        "num_heads must be a positive multiple of 4, got 6",
    ),
    "fp8_head_dim_48": (
        {"variants": ("fp8",), "head_dim": 48},
        ValueError,
        "head_dim must be a positive multiple of 32, got 48",
    ),
    "fp8_head_dim_beyond_shared_memory": (
        {"variants": ("fp8",), "head_dim": 384, "next_ns": (1, 4)},
        ValueError,
        r"head_dim=384 with num_heads=64 and next_n=4 does not fit .* largest head_dim that fits is 352",
    ),
    "epi_dtype_float64": ({"epi_dtypes": (torch.float64,)}, ValueError, "epi_dtypes"),
    "acc_dtype_bf16": (
        {"variants": ("fp8",), "acc_dtypes": (torch.bfloat16,)},
        ValueError,
        "acc_dtypes",
    ),
    "batch_size_0": ({"batch_sizes": (0,)}, ValueError, "batch_sizes entry 0: must be >= 1"),
    "block_size_bool": ({"block_sizes": (True,)}, TypeError, "block_sizes entry must be an int"),
    "block_size_numpy_48": (
        {"block_sizes": (np.int64(48),)},
        ValueError,
        "block_sizes entry 48: must be in",
    ),
    "num_heads_numpy_float": (
        {"variants": ("fp8",), "num_heads": np.float32(64)},
        TypeError,
        r"num_heads must be an int, got numpy\.float32",
    ),
    "device_meta": ({"device": "meta"}, ValueError, "device must be a CUDA or CPU device"),
    "device_float": ({"device": 1.5}, TypeError, "device must be a torch.device"),
    "device_bool": ({"device": True}, TypeError, "device must be a torch.device"),
    "device_unparsable": ({"device": "xyz"}, ValueError, "device: cannot parse 'xyz'"),
    "device_negative": ({"device": -1}, ValueError, "device: cannot parse -1"),
}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"), PRECOMPILE_ERRORS.values(), ids=PRECOMPILE_ERRORS.keys()
)
def test_precompile_argument_errors(kwargs, error, match):
    kwargs = {"device": "cpu", **kwargs}
    with pytest.raises(error, match=match):
        fa.precompile_paged_mqa_logits(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without usable CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 1), 0, 1])
def test_precompile_for_cuda_without_cuda_is_a_value_error(device):
    # torch itself answers with a bare AssertionError ("Torch not compiled with CUDA enabled").
    with pytest.raises(ValueError, match=r"device: got .*CUDA is not available"):
        fa.precompile_paged_mqa_logits(device)


@pytest.mark.gpu
def test_precompile_fp8_grid_on_sm90():
    configs = fa.precompile_paged_mqa_logits(variants=("fp8",))
    # fp8: 3 block sizes x 4 next_n, float32 output.
    assert len(configs) == 12
    assert len(set(configs)) == len(configs)


def test_numpy_integers_are_valid_entries():
    got = fa.precompile_paged_mqa_logits(
        "cpu",
        variants=("fp8",),
        block_sizes=(np.int64(64), np.int32(128)),
        next_ns=(np.int16(2),),
        num_heads=np.int64(32),
        head_dim=np.int64(128),
        batch_sizes=(np.int64(8),),
    )
    assert got == []


@pytest.mark.gpu
def test_numpy_integers_build_the_configurations_of_ints():
    from_numpy = fa.precompile_paged_mqa_logits(
        variants=("fp8",), block_sizes=(np.int64(64),), next_ns=(np.int32(1),)
    )
    from_ints = fa.precompile_paged_mqa_logits(variants=("fp8",), block_sizes=(64,), next_ns=(1,))
    assert from_numpy == from_ints
    assert [repr(c) for c in from_numpy] == [repr(c) for c in from_ints]


@pytest.mark.gpu
def test_precompile_default_grid_on_sm90():
    configs = fa.precompile_paged_mqa_logits()
    # fp8: 3 block sizes x 4 next_n; fp4: 3 x 4 x (bf16, fp32) plus the interleaved order at
    # block size 128 (4 next_n x 2 dtypes).
    assert len(configs) == 12 + 24 + 8
    assert len(set(configs)) == len(configs)


@pytest.mark.gpu
def test_a_call_after_precompile_compiles_and_loads_nothing(monkeypatch):
    """The point of precompiling: the kernels are loaded on the device by
    `precompile_paged_mqa_logits` itself, and a serving call of a precompiled configuration
    (or of the CUDA schedule) then neither compiles nor loads code (a cold load would raise
    here)."""
    from flashinfer_attn_scores.paged_mqa_logits import launcher
    from flashinfer_jit import kernel as jit_kernel
    from flashinfer_schedule._schedule_cuda import all_kernel_specs as schedule_kernel_specs

    monkeypatch.setattr(jit_kernel, "_LOADED", {})  # as in a fresh process
    configs = fa.precompile_paged_mqa_logits(
        variants=("fp8", "fp4"),
        block_sizes=(32,),
        next_ns=(1, 3),
        output_dtypes=(torch.float32,),
    )
    device = torch.cuda.current_device()
    assert {(launcher.config_spec(c), device) for c in configs} <= set(jit_kernel._LOADED)
    assert {(spec, device) for spec in schedule_kernel_specs()} <= set(jit_kernel._LOADED)

    def cold_load(spec, index, cache_dir):
        raise AssertionError(f"{spec.label} was compiled or loaded by a call after precompile")

    monkeypatch.setattr(jit_kernel, "_load_cold", cold_load)
    seq_lens = torch.tensor([5, 0, 70], dtype=torch.int32, device="cuda")
    schedule = fa.compute_paged_mqa_logits_schedule(seq_lens)
    expected = fa.compute_paged_mqa_logits_schedule(seq_lens.cpu(), num_sms=schedule.shape[0] - 1)
    assert torch.equal(schedule.cpu(), expected)
    for next_n in (1, 3):
        fp8 = make_fp8_case(
            [5, 0, 70], next_n=next_n, num_heads=64, head_dim=128, block_size=32, seed=next_n
        ).to("cuda")
        fp4 = make_fp4_case([70, 0, 5], next_n=next_n, block_size=32, seed=next_n).to("cuda")
        calls = (
            (fa.fp8_paged_mqa_logits, fp8.fp8_args(), fp8_paged_mqa_logits_reference, fp8),
            (fa.fp4_paged_mqa_logits, fp4.fp4_args(), fp4_paged_mqa_logits_reference, fp4),
        )
        for op, args, reference, case in calls:
            got = op(*args, output_dtype=torch.float32)
            mask = valid_mask(case.seq_lens.cpu(), next_n, case.max_seq_len)
            assert_rows_close(got, reference(*args), mask, 2e-3)


def test_a_cuda_precompile_inside_torch_compile_is_refused_by_name(monkeypatch):
    """A start-up step: under fullgraph the trace stops with the reason, instead of failing
    somewhere inside the JIT's worker processes and cache."""
    from flashinfer_attn_scores.paged_mqa_logits import launcher
    from flashinfer_attn_scores.paged_mqa_logits import precompile as precompile_module

    def no_compile(*args):
        raise AssertionError("compiled while dynamo traced")

    monkeypatch.setattr(precompile_module, "resolve_device", lambda d: torch.device("cuda", 0))
    monkeypatch.setattr(launcher, "compile_paged_mqa_logits_kernels", no_compile)
    compiled = torch.compile(
        lambda: fa.precompile_paged_mqa_logits(device="cuda", variants=("fp8",)), fullgraph=True
    )
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"cannot run inside torch\.compile"):
        compiled()


@pytest.mark.gpu
def test_a_cuda_precompile_inside_torch_compile_is_refused_on_the_gpu():
    compiled = torch.compile(
        lambda: fa.precompile_paged_mqa_logits(device="cuda", variants=("fp8",), next_ns=(1,)),
        fullgraph=True,
    )
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"cannot run inside torch\.compile"):
        compiled()
    # Without fullgraph dynamo falls back to running the frame eagerly, which compiles.
    assert torch.compile(
        lambda: fa.precompile_paged_mqa_logits(device="cuda", variants=("fp8",), next_ns=(1,))
    )()
