"""tools/unit_path.py: the unit path is the innermost loop around the first GMMA, and the
compiled kernels have one."""

from __future__ import annotations

from pathlib import Path

import pytest

# An outer loop (.L_x_1) around an inner one (.L_x_3) that holds the GMMAs; a forward branch
# (.L_x_4) and a branch back to the outer loop come after the GMMA and must not be taken for
# the inner loop's end.
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   IMAD R2, R3, 0x4, RZ ;
.L_x_2:
        /*0020*/                   LDS R4, [R2] ;
.L_x_3:
        /*0030*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R5+URZ+0x100], R6 ;
        /*0040*/              @!P0 BRA `(.L_x_3) ;
        /*0050*/                   WARPGROUP.ARRIVE ;
        /*0060*/                   QGMMA.64x64x32.F32.E4M3.E4M3 R24, R56, gdesc[UR4], RZ, !UPT ;
        /*0070*/                   QGMMA.64x64x32.F32.E4M3.E4M3 R24, R60, gdesc[UR8], R24, gsb0 ;
        /*0080*/               @P1 BRA `(.L_x_4) ;
        /*0090*/                   FFMA R7, R24, R8, R7 ;
.L_x_4:
        /*00a0*/                   VIADD R9, R9, 0x5 ;
        /*00b0*/              @!P2 BRA `(.L_x_3) ;
        /*00c0*/              @!P3 BRA `(.L_x_1) ;
        /*00d0*/                   EXIT ;
"""


def _unit_path():
    import unit_path

    return unit_path


def test_innermost_loop_around_the_first_gmma() -> None:
    up = _unit_path()
    body = up.unit_path(SASS)
    assert [up.opcode(i) for i in body] == [
        "SYNCS", "BRA", "WARPGROUP", "QGMMA", "QGMMA", "BRA", "FFMA", "VIADD", "BRA",
    ]  # fmt: skip


def test_sass_without_a_loop_is_refused() -> None:
    up = _unit_path()
    with pytest.raises(ValueError, match="no GMMA"):
        up.unit_path("        /*0000*/                   EXIT ;\n")
    with pytest.raises(ValueError, match="no loop"):
        up.unit_path(
            "        /*0000*/                   QGMMA.64x64x32.F32.E4M3.E4M3 R24, R56, gdesc[UR4], RZ ;\n"
        )


def test_sass_hash_follows_the_code_not_the_header() -> None:
    up = _unit_path()
    header = '\t.headerflags\t@"EF_CUDA_SM90"\n\t//--------------------- .text.kernel\n'
    same_code_other_header = header.replace("kernel", "other_name") + SASS
    assert up.sass_hash(header + SASS) == up.sass_hash(same_code_other_header)
    changed = SASS.replace("VIADD R9, R9, 0x5", "VIADD R9, R9, 0x6")
    assert up.sass_hash(header + changed) != up.sass_hash(header + SASS)
    relabelled = SASS.replace(".L_x_4", ".L_x_5")
    assert up.sass_hash(relabelled) != up.sass_hash(SASS)


def _has_nvdisasm() -> bool:
    from flashinfer_jit.cli import find_sass_tool

    tool = find_sass_tool()
    return tool is not None and Path(tool[0]).name == "nvdisasm"  # the one with branch labels


@pytest.mark.skipif(not _has_nvdisasm(), reason="needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
def test_compiled_fp4_kernel_has_a_unit_path() -> None:
    from flashinfer_attn_scores.paged_mqa_logits.kernel_specs import all_kernel_specs
    from flashinfer_jit import compile_kernel

    up = _unit_path()
    label = "fp4_paged_mqa_logits[bs=64, next_n=1, out=bfloat16, epi=float32]"
    spec = next(s for s in all_kernel_specs() if s.label == label)
    body = up.unit_path(up._sass_of(compile_kernel(spec, "sm_90a").cubin))
    opcodes = [up.opcode(i) for i in body]
    # Four k-steps of the MMA, one store of the bfloat16 logit, and the E2M1 decode's table
    # lookups (two PRMT per eight values, 64 values per thread and unit).
    assert opcodes.count("QGMMA") == 4
    assert opcodes.count("STG") == 1
    assert opcodes.count("PRMT") >= 16


def test_sass_hash_and_counts_are_exclusive(monkeypatch, capsys) -> None:
    up = _unit_path()
    monkeypatch.setattr("sys.argv", ["unit_path.py", "--sass-hash", "--counts"])
    with pytest.raises(SystemExit) as exit_info:
        up.main()
    assert exit_info.value.code == 2
    assert "pick one" in capsys.readouterr().err


@pytest.mark.skipif(not _has_nvdisasm(), reason="needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
def test_counts_line_matches_the_unit_path() -> None:
    from flashinfer_attn_scores.paged_mqa_logits.kernel_specs import all_kernel_specs
    from flashinfer_jit import compile_kernel

    up = _unit_path()
    label = "fp4_paged_mqa_logits[bs=64, next_n=1, out=bfloat16, epi=float32]"
    compiled = compile_kernel(next(s for s in all_kernel_specs() if s.label == label), "sm_90a")
    count, registers, spill, rest = up._count_line(label, "sm_90a").split(maxsplit=3)
    assert int(count) == len(up.unit_path(up._sass_of(compiled.cubin)))
    assert int(registers) == compiled.resources.registers
    assert int(spill) == compiled.resources.spill_store_bytes
    assert rest == label
