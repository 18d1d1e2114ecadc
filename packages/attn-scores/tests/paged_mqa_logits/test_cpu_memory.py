"""The CPU ops build nothing as wide as `max_seq_len`: a wide `max_seq_len` over short
requests costs the output and one request's float64 keys and logits, not a float64 copy of
every row, however such a copy would be allocated (the peak resident size of a fresh process
is measured around each call)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
MAX_SEQ_LEN = 1 << 22  # out is 48 MiB of float16; a float64 copy of its rows would be 192 MiB
LENS = [70, 0, 33]

MEASURE = textwrap.dedent(
    f"""
    import json, resource, sys
    import torch
    sys.path.insert(0, {str(HERE)!r})
    from attn_scores_cases import make_fp4_case, make_fp8_case
    from flashinfer_attn_scores import fp4_paged_mqa_logits, fp8_paged_mqa_logits, padded_seq_len

    def peak_kib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux

    lens, rows = {LENS}, {len(LENS) * 2}
    calls = {{
        "fp8": (fp8_paged_mqa_logits, make_fp8_case(lens, next_n=2, max_seq_len={MAX_SEQ_LEN}, seed=3).fp8_args()),
        "fp4": (fp4_paged_mqa_logits, make_fp4_case(lens, next_n=2, max_seq_len={MAX_SEQ_LEN}, seed=3).fp4_args()),
    }}
    out = torch.full((rows, padded_seq_len({MAX_SEQ_LEN})), float("nan"), dtype=torch.float16)
    result = {{}}
    for name, (op, args) in calls.items():
        op(*args[:-1], 128, output_dtype=torch.float16)  # warm: imports, first-call caches
        before = peak_kib()
        logits = op(*args, out=out, output_dtype=torch.float16)
        result[name] = {{
            "grew_mib": (peak_kib() - before) / 1024,
            "nan_left_in_computed": [bool(logits[2 * b : 2 * b + 2, :n].isnan().any()) for b, n in enumerate(lens) if n],
            "empty_request_untouched": bool(out[2:4].isnan().all()),
            "written_past": bool((~out[:, max(lens):].isnan()).any()),
        }}
    print(json.dumps(result))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss is in KiB on Linux")
def test_a_wide_max_seq_len_costs_no_memory_as_wide():
    done = subprocess.run(
        [sys.executable, "-c", MEASURE], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    for variant, found in measured.items():
        assert found["grew_mib"] < 48, f"{variant}: the call raised the peak by {found}"
        assert found["nan_left_in_computed"] == [False, False], f"{variant}: {found}"
        assert found["empty_request_untouched"], f"{variant}: the empty request's rows were written"
        assert not found["written_past"], f"{variant}: columns past every length were written"
