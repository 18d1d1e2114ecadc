"""Every CPU path works where the CUDA wheels are absent (they are not installed on macOS).

The script below runs in a fresh interpreter in which importing `cuda` (cuda-python) or
`nvidia` (the NVRTC / runtime wheels) fails, as it would on a machine without them: the four
packages import, and the references, the schedule helper, the size helpers and the layouts
all run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import importlib.abc, sys

    class NoCudaWheels(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("cuda", "nvidia"):
                raise ImportError(f"{name} is not installed here")

    sys.meta_path.insert(0, NoCudaWheels())

    import torch
    import flashinfer_attn_scores as fa
    import flashinfer_jit
    import flashinfer_layouts as fl
    import flashinfer_schedule as fs

    gen = torch.Generator().manual_seed(0)
    seq_lens = torch.tensor([100, 0, 37], dtype=torch.int32)
    table = torch.randperm(12, generator=gen).to(torch.int32).view(3, 4)
    weights = torch.randn(3, 64, generator=gen)
    schedule = fs.compute_paged_mqa_logits_schedule(seq_lens, device="cpu", next_n=1)
    assert schedule.shape == (133, 2), schedule.shape
    assert fs.padded_seq_len(100) == 256 and fs.min_block_table_width(100, 32) == 4

    k = torch.randn(12, 32, 128, generator=gen)
    kv_fp8 = fl.pack_fp8_kv_cache(*fl.quantize_fp8_per_token(k))
    q_fp8 = torch.randn(3, 1, 64, 128, generator=gen).to(torch.float8_e4m3fn)
    logits = fa.fp8_paged_mqa_logits(q_fp8, kv_fp8, weights, table, seq_lens, 100)
    assert logits.shape == (3, 100) and torch.isfinite(logits[0]).all()

    q_fp4, q_sf = fl.quantize_mxfp4_q(torch.randn(3, 1, 64, 128, generator=gen))
    kv_fp4 = fl.quantize_mxfp4_kv_cache(k)
    logits = fa.fp4_paged_mqa_logits(q_fp4, q_sf, kv_fp4, weights, table, seq_lens, 100)
    assert logits.shape == (3, 100) and torch.isfinite(logits[0]).all()

    assert fa.precompile_paged_mqa_logits("cpu") == []
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("cuda", "nvidia"))
    assert not loaded, loaded
    print("ok")
    """
)


def test_cpu_paths_need_no_cuda_wheels():
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("ok")
