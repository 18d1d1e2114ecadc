"""What a prepared launch hands the kernel, without a GPU: the loaded kernel and the tensor-map
encoder are replaced by recorders, so the argument list, grid, block and shared memory of
`fp8_sm90.prepare` / `fp4_sm90.prepare` can be checked on any machine (the GPU tests run the
real launches against the reference)."""

from __future__ import annotations

import flashinfer_jit
import pytest
import torch
from attn_scores_cases import make_fp4_case, make_fp8_case
from flashinfer_attn_scores.paged_mqa_logits import fp4_sm90, fp8_sm90
from flashinfer_schedule import DEFAULT_CPU_NUM_SMS


class RecordingKernel:
    def __init__(self) -> None:
        self.launches: list[tuple] = []
        self.programmatic: list[bool] = []

        self.devices_checked: list[bool] = []
        self.clusters: list = []

    def prepare_launch(
        self, grid, block, *, cluster=None, shared_mem=0, programmatic=False, devices_checked=False
    ):
        self.devices_checked.append(devices_checked)
        self.clusters.append(cluster)

        def launch(*args):
            self.launches.append((grid, block, args, shared_mem))
            self.programmatic.append(programmatic)

        return launch


@pytest.fixture
def recorded(monkeypatch):
    kernel = RecordingKernel()
    specs = []

    def load_kernel(spec, device=None):
        specs.append(spec)
        return kernel

    maps = []

    def tensor_map(kv_fused, *layout):
        maps.append(kv_fused.data_ptr())
        return ("tensor map", kv_fused.data_ptr(), layout)

    monkeypatch.setattr(flashinfer_jit, "load_kernel", load_kernel)
    monkeypatch.setattr(fp8_sm90, "kv_values_tensor_map", tensor_map)
    monkeypatch.setattr(fp4_sm90, "kv_values_tensor_map", tensor_map)
    return kernel, specs, maps


def test_fp8_prepared_launch_passes_the_kernel_signature_in_order(recorded):
    kernel, specs, maps = recorded
    case = make_fp8_case([40, 0, 70], next_n=2, num_heads=64, head_dim=128, block_size=64)
    tables = case.block_tables.repeat_interleave(2, dim=0)[::2]  # a row stride of 2 rows
    out = torch.empty(case.rows + 1, 256)
    run = fp8_sm90.prepare(
        case.q, case.kv_fused, case.weights, tables, case.seq_lens, out, None, max_seq_len=100,
        output_dtype=torch.float32, epi_dtype=torch.float32, acc_dtype=torch.float32,
    )  # fmt: skip
    run(case.q, case.kv_fused, case.weights, tables, case.seq_lens, out, None)
    config = fp8_sm90.fp8_config(64, 128, 64, 2, torch.float32, torch.float32, torch.float32)
    assert specs == [config.spec]
    assert kernel.devices_checked == [False]  # by default the jit launch checks devices
    assert kernel.clusters == [None]  # clusters only under the EXP_CLUSTER measurement knob
    grid, block, args, shared_mem = kernel.launches[0]
    assert (grid, block, shared_mem) == (
        DEFAULT_CPU_NUM_SMS,
        config.threads,
        config.shared_memory_bytes(config.stages),
    )
    assert args[0][:2] == ("tensor map", case.kv_fused.data_ptr())
    assert args[1] is case.kv_fused and args[2] == flashinfer_jit.i64(64 * 132)  # block pitch
    assert args[3] is case.q and args[4] is case.weights
    assert args[5] is tables and args[6] == flashinfer_jit.i64(tables.stride(0))
    assert args[7] is case.seq_lens and args[8] == flashinfer_jit.i64(1)
    assert args[9] == flashinfer_jit.u64(0) and args[10] == flashinfer_jit.u64(0)  # no schedule
    assert args[11] == flashinfer_jit.i32(3)
    # The limits a contract-breaking call is held to: lengths, block ids.
    assert args[12] == flashinfer_jit.i32(100)
    assert args[13] == flashinfer_jit.i32(case.kv_fused.shape[0])
    assert args[14] is out and args[15] == flashinfer_jit.i64(256)
    assert len(args) == 16

    # A given schedule is passed as is; a new pool gets its own tensor map, once.
    schedule = torch.zeros(DEFAULT_CPU_NUM_SMS + 1, 2, dtype=torch.int32)
    other_pool = case.kv_fused.clone()
    run(case.q, other_pool, case.weights, tables, case.seq_lens, out, schedule)
    run(case.q, other_pool, case.weights, tables, case.seq_lens, out, schedule)
    assert kernel.launches[1][2][9] is schedule
    assert kernel.launches[2][2][0][1] == other_pool.data_ptr()
    assert maps == [case.kv_fused.data_ptr(), other_pool.data_ptr()]


def test_fp4_prepared_launch_adds_q_sf_after_q(recorded):
    kernel, specs, _ = recorded
    case = make_fp4_case([40, 70], next_n=1, block_size=128, interleaved=True)
    out = torch.empty(case.rows, 256, dtype=torch.bfloat16)
    run = fp4_sm90.prepare(
        case.q, case.q_sf, case.kv_fused, case.weights, case.block_tables, case.seq_lens, out,
        None, max_seq_len=90, output_dtype=torch.bfloat16, epi_dtype=torch.float32,
        is_kv_sf_interleaved=True,
    )  # fmt: skip
    run(case.q, case.q_sf, case.kv_fused, case.weights, case.block_tables, case.seq_lens, out, None)
    config = fp4_sm90.fp4_config(128, 1, torch.bfloat16, torch.float32, True)
    assert specs == [config.spec]
    _, block, args, shared_mem = kernel.launches[0]
    assert (block, shared_mem) == (config.threads, config.shared_memory_bytes(config.stages))
    assert args[1] is case.kv_fused and args[2] == flashinfer_jit.i64(128 * 68)  # block pitch
    expected = (case.q, case.q_sf, case.weights, case.block_tables)
    assert all(a is b for a, b in zip(args[3:7], expected))
    assert args[7] == flashinfer_jit.i64(case.block_tables.stride(0))
    assert args[8] is case.seq_lens and args[12] == flashinfer_jit.i32(2)
    assert args[13] == flashinfer_jit.i32(90)
    assert args[14] == flashinfer_jit.i32(case.kv_fused.shape[0])
    assert args[15] is out and args[16] == flashinfer_jit.i64(256) and len(args) == 17


@pytest.mark.parametrize(
    "setting, expected",
    [
        (None, True),
        ("", True),
        ("1", True),
        ("on", True),
        ("0", False),
        (" False ", False),
        ("no", False),
        ("OFF", False),
    ],
)
def test_programmatic_dependent_launch_follows_flashinfer_pdl(
    recorded, monkeypatch, setting, expected
):
    kernel, _, _ = recorded
    if setting is None:
        monkeypatch.delenv("FLASHINFER_PDL", raising=False)
    else:
        monkeypatch.setenv("FLASHINFER_PDL", setting)
    case = make_fp8_case([40, 70], next_n=1, num_heads=64, head_dim=128, block_size=64)
    out = torch.empty(case.rows, 128)
    run = fp8_sm90.prepare(
        case.q, case.kv_fused, case.weights, case.block_tables, case.seq_lens, out, None,
        max_seq_len=case.max_seq_len, output_dtype=torch.float32, epi_dtype=torch.float32,
        acc_dtype=torch.float32,
    )  # fmt: skip
    run(case.q, case.kv_fused, case.weights, case.block_tables, case.seq_lens, out, None)
    assert kernel.programmatic == [expected]
