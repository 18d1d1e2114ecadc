"""The Python examples of docs/quickstart.md and docs/migration.md run against this package.

Each page's ```python blocks run in order in one namespace, as a reader pasting them into one
session would, and what a block prints or states in a comment is asserted here too.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from attn_scores_cases import assert_rows_close, expected_logits

# paged_mqa_logits/ -> tests/ -> attn-scores/ -> packages/ -> repository root
DOCS = Path(__file__).resolve().parent.parent.parent.parent.parent / "docs"
QUICKSTART = DOCS / "quickstart.md"
MIGRATION = DOCS / "migration.md"

# The quickstart sets `device = "cpu"` in its first block and tells GPU readers to change that
# one line to "cuda". The GPU test makes exactly that edit, so both runs execute the page's text.
CPU_DEVICE_LINE = 'device = "cpu"\n'


def _python_blocks(doc: Path, expected: int) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.DOTALL)
    # An exact count: a renamed fence or a new example must not silently go untested.
    assert len(blocks) == expected, f"{doc.name}: {len(blocks)} python blocks, expected {expected}"
    return blocks


def _run(doc: Path, index: int, block: str, namespace: dict[str, object]) -> str:
    """Exec one block in `namespace`; return what it printed."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(block, f"{doc.name}[python block {index}]", "exec"), namespace)
    except Exception as error:  # pragma: no cover - the message is the point
        raise AssertionError(f"docs/{doc.name} python block {index} failed: {error!r}") from error
    return printed.getvalue()


def _assert_prints_as_commented(block: str, printed: str) -> None:
    """Every `print(...)  # text` line of the block printed exactly `text`."""
    stated = re.findall(r"^print\(.*\)  # (.*)$", block, flags=re.MULTILINE)
    assert stated, "the block has no commented print"
    assert printed.splitlines() == stated


def _run_quickstart(device: str) -> None:
    blocks = _python_blocks(QUICKSTART, 7)
    assert blocks[0].count(CPU_DEVICE_LINE) == 1
    blocks[0] = blocks[0].replace(CPU_DEVICE_LINE, f'device = "{device}"\n')
    on_cpu = device == "cpu"
    ns: dict[str, object] = {}

    # 0: the fp8 example.
    printed = _run(QUICKSTART, 0, blocks[0], ns)
    assert ns["blocks_per_seq"] == 250  # "# 250"
    _assert_prints_as_commented(blocks[0], printed)  # torch.Size([6, 8000]) torch.float32
    assert ns["logits"].device.type == device
    first_logits = ns["logits"]

    # 1: the valid region and a top-k over it.
    _run(QUICKSTART, 1, blocks[1], ns)
    mask = ns["mask"]
    assert mask.shape == (6, 8000) and mask.dtype == torch.bool  # [B*next_n, max_seq_len] bool
    # The prose: row b*next_n + t is valid for positions 0 .. seq_lens[b] - next_n + t.
    expected_valid = [3000 - 3 + t + 1 for t in range(3)] + [8000 - 3 + t + 1 for t in range(3)]
    assert mask.sum(dim=1).tolist() == expected_valid
    assert ns["topk_positions"].shape == (6, 2048)
    assert bool(mask.gather(1, ns["topk_positions"]).all())  # every top-k hit is a valid column

    # 2: out= sized with padded_seq_len.
    _run(QUICKSTART, 2, blocks[2], ns)
    assert ns["out"].shape == (6, 8192)  # "# 8192"
    if on_cpu:  # the float64 reference is deterministic; the kernel is compared in block 6
        assert torch.equal(ns["logits"][mask], first_logits[mask])

    # 3: kv_fused from real K rows (the block asserts the shape itself).
    _run(QUICKSTART, 3, blocks[3], ns)
    assert ns["kv_fused"].dtype == torch.uint8

    # 4: appending 4 tokens in place.
    import flashinfer_layouts as fl

    values_before, scales_before = fl.unpack_fp8_kv_cache(ns["kv_fused"])
    _run(QUICKSTART, 4, blocks[4], ns)
    block = ns["block"]
    assert 3000 // 32 == 93 and block == int(ns["block_tables"][0, 93])  # "its block 93"
    assert ns["slots"].tolist() == [block * 32 + offset for offset in range(24, 28)]  # 24..27
    assert ns["seq_lens"].tolist() == [3004, 8000]
    values, scales = fl.unpack_fp8_kv_cache(ns["kv_fused"])
    new_values, new_scales = fl.quantize_fp8_per_token(ns["new_k"])
    assert torch.equal(values[block, 24:28].view(torch.uint8), new_values.view(torch.uint8))
    assert torch.equal(scales[block, 24:28], new_scales)
    # "leaving every other byte of the pool unchanged" (values and scales are every byte).
    values[block, 24:28] = values_before[block, 24:28]
    scales[block, 24:28] = scales_before[block, 24:28]
    assert torch.equal(values.view(torch.uint8), values_before.view(torch.uint8))
    assert torch.equal(scales, scales_before)

    # 5: MXFP4.
    printed = _run(QUICKSTART, 5, blocks[5], ns)
    kv_fp4 = ns["kv_fp4"]
    assert kv_fp4.shape == (ns["num_blocks"], 32, 1, 64 + 4) and kv_fp4.dtype == torch.uint8
    _assert_prints_as_commented(blocks[5], printed)  # torch.Size([6, 8000]) torch.bfloat16

    # 6: against the float64 reference, with the page's own bound (2e-3 of each row's
    # magnitude, the GPU suite's bound for float32 output), on either device.
    _run(QUICKSTART, 6, blocks[6], ns)
    worst = float(ns["error"].max())
    assert worst <= (1e-5 if on_cpu else 2e-3), worst  # on CPU the op is the reference itself
    # The page's reference (which the CPU op runs) must itself be the formula: the logits
    # against an expectation built here, position by position, from the pool's bytes.
    expected = _expected_quickstart_logits(ns)
    assert_rows_close(ns["logits"], expected, ns["mask"], 1e-6 if on_cpu else 2e-3)
    assert_rows_close(ns["expected"], expected, ns["mask"], 1e-12)


def _expected_quickstart_logits(ns: dict[str, object]) -> torch.Tensor:
    """`expected_logits` of the quickstart's inputs, the fp8 pool decoded from its bytes here
    (per block: block_size * head_dim E4M3 values, then block_size little-endian float32
    scales), not by the package or the reference."""
    assert sys.byteorder == "little"  # the scale bytes are viewed as this host's float32
    kv_fused = ns["kv_fused"].cpu()
    num_blocks, block_size, _, row_bytes = kv_fused.shape
    head_dim = row_bytes - 4
    flat = kv_fused.reshape(num_blocks, block_size * row_bytes)
    values = flat[:, : block_size * head_dim].contiguous().view(torch.float8_e4m3fn)
    scales = flat[:, block_size * head_dim :].contiguous().view(torch.float32)
    return expected_logits(
        ns["q"].to(torch.float64),
        values.to(torch.float64).view(num_blocks, block_size, head_dim),
        scales.to(torch.float64),
        ns["weights"],
        ns["block_tables"],
        ns["seq_lens"].cpu(),
        ns["max_seq_len"],
    )


@pytest.mark.skipif(not QUICKSTART.exists(), reason="docs/quickstart.md is not in this checkout")
def test_quickstart_examples_run_on_cpu():
    torch.manual_seed(0)
    _run_quickstart("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not QUICKSTART.exists(), reason="docs/quickstart.md is not in this checkout")
def test_quickstart_examples_run_on_gpu_with_device_cuda():
    """The page's own instruction for H100/H200 readers: the same blocks with device "cuda"."""
    torch.manual_seed(0)
    _run_quickstart("cuda")


@pytest.mark.skipif(
    not (MIGRATION.exists() and QUICKSTART.exists()),
    reason="docs/migration.md or docs/quickstart.md is not in this checkout",
)
def test_migration_example_is_a_rename_and_runs():
    (block,) = _python_blocks(MIGRATION, 1)
    before, marker, after = block.partition("# after\n")
    assert marker and before.startswith("# before\n")
    # "Porting is a rename": the before half, renamed, is the after half. The before half is
    # not run: it needs upstream FlashInfer (`import flashinfer`) and a Blackwell GPU.
    renamed = before.removeprefix("# before\n").replace("flashinfer", "flashinfer_attn_scores")
    assert renamed.strip() == after.strip()

    # The after half uses the quickstart's inputs (q, kv_fused, ...): build them with its first
    # block (device "cpu"), then the call must give the quickstart's logits on the valid region
    # (the columns past it are unspecified: whatever the fresh allocation held).
    from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask

    torch.manual_seed(0)
    ns: dict[str, object] = {}
    _run(QUICKSTART, 0, _python_blocks(QUICKSTART, 7)[0], ns)
    quickstart_logits = ns.pop("logits")
    _run(MIGRATION, 0, after, ns)
    mask = valid_mask(ns["seq_lens"], ns["next_n"], ns["max_seq_len"])
    assert torch.equal(ns["logits"][mask], quickstart_logits[mask])


def _docstring_example(function: object) -> str:
    """The indented example block of a public function's docstring (rendered on the API page)."""
    doc = inspect.getdoc(function)
    assert doc is not None
    _, marker, rest = doc.partition("\nExample")
    assert marker, f"{function.__name__}'s docstring has no Example paragraph"
    lines = rest.split("\n\n", 1)[1].split("\nArgs:", 1)[0].splitlines()
    assert lines and all(not line or line.startswith("    ") for line in lines)
    return textwrap.dedent("\n".join(lines))


def test_api_docstring_examples_run_in_order_on_cpu():
    """The fp8 example, then the fp4 one ("with the paging of the fp8 example"), pasted into one
    session after what they say comes from elsewhere: `values, scales` from
    `quantize_fp8_per_token(k)` with k `[B * width, block_size, head_dim]`, q and weights as in
    the quickstart."""
    import flashinfer_attn_scores
    import flashinfer_layouts
    from flashinfer_attn_scores.paged_mqa_logits.reference import valid_mask

    torch.manual_seed(0)
    ns: dict[str, object] = {
        "torch": torch,
        "flashinfer_attn_scores": flashinfer_attn_scores,
        "flashinfer_layouts": flashinfer_layouts,
        "device": "cpu",
    }
    fp8_example = _docstring_example(flashinfer_attn_scores.fp8_paged_mqa_logits)
    fp4_example = _docstring_example(flashinfer_attn_scores.fp4_paged_mqa_logits)
    # The first two lines of the fp8 example fix the shapes the inputs below need.
    exec(compile("\n".join(fp8_example.splitlines()[:2]), "fp8 example, head", "exec"), ns)
    B, next_n, num_heads, head_dim = (ns[name] for name in ("B", "next_n", "num_heads", "head_dim"))
    width = flashinfer_attn_scores.min_block_table_width(ns["max_seq_len"], ns["block_size"])
    k = torch.randn(B * width, ns["block_size"], head_dim)
    ns["values"], ns["scales"] = flashinfer_layouts.quantize_fp8_per_token(k)
    ns["q"] = torch.randn(B, next_n, num_heads, head_dim).to(torch.float8_e4m3fn)
    ns["weights"] = torch.randn(B * next_n, num_heads)

    exec(compile(fp8_example, "fp8_paged_mqa_logits docstring example", "exec"), ns)
    fp8_logits = ns["logits"]
    assert fp8_logits.shape == (6, 8000) and fp8_logits.dtype == torch.float32  # "# [6, 8000]"
    assert ns["width"] == 250  # "# 250"
    mask = valid_mask(ns["seq_lens"], next_n, ns["max_seq_len"])
    assert torch.isfinite(fp8_logits[mask]).all() and fp8_logits[mask].abs().max() > 0

    exec(compile(fp4_example, "fp4_paged_mqa_logits docstring example", "exec"), ns)
    fp4_logits = ns["logits"]
    # "# [B*next_n, max_seq_len] bfloat16"; zero placeholders give zero logits.
    assert fp4_logits.shape == (B * next_n, ns["max_seq_len"])
    assert fp4_logits.dtype == torch.bfloat16
    assert torch.equal(fp4_logits[mask], torch.zeros_like(fp4_logits[mask]))
