"""tools/sass_mix.py and benchmarks/sass.py: the loop finding and counting on a handcrafted
nvdisasm listing (no compiler), then one real sm_90 compile of the plain forward kernel."""
import importlib.util
import os
import subprocess
import sys

import pytest

from benchmarks import sass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_tool():
    return importlib.import_module("benchmarks.sass_mix")


def listing(src: str) -> str:
    """nvdisasm -c -g shaped text. Three loops: .L_x_1 (masked: its code comes from line 2 of
    `src`, which mentions `allowed`), .L_x_3 (the unmasked band: MMAs, line 3) holding an inner
    loop .L_x_4 without MMAs (a bucket loop), and .L_x_6, a loop without MMAs."""
    return f"""
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_1:
\t//## File "{src}", line 2
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0020*/                   FSEL R3, R3, -1.00000001504746621788e+30, P0 ;
        /*0030*/              @!P0 BRA `(.L_x_1) ;
        /*0040*/               @P0 BRA `(.L_x_2) ;
.L_x_3:
\t//## File "{src}", line 3
        /*0050*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0060*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;
        /*0070*/                   MUFU.EX2 R5, R5 ;
        /*0080*/              @!P1 MUFU.LG2 R6, R6 ;
        /*0090*/                   MUFU.RCP R7, R7 ;
        /*00a0*/                   MUFU.TANH R7, R7 ;
        /*00b0*/                   LDG.E.U16 R9, desc[UR6][R10.64] ;
        /*00c0*/                   LDGSTS.E.BYPASS.128 [R2], desc[UR6][R4.64] ;
        /*00d0*/                   LDSM.16.MT88.4 R20, [R2] ;
        /*00e0*/                   STL [R1+0x10], R47 ;
        /*00f0*/                   IMAD.IADD R11, R11, 0x1, R15 ;
        /*0100*/                   LOP3.LUT R0, R0, 0x4, RZ, 0xfc, !PT ;
        /*0110*/                   FFMA.FTZ R4, R4, R5, R6 ;
        /*0120*/                   FFMA R4, R4, R5, R6 ;
        /*0130*/                   FMUL R4, R4, 0.5 ;
        /*0140*/                   FADD R4, R4, -R5 ;
        /*0150*/                   FMNMX R4, R4, R5, !PT ;
        /*0160*/                   I2FP.F32.S32 R4, R4 ;
.L_x_4:
        /*0170*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0180*/              @P2 BRA `(.L_x_4) ;
        /*0190*/                   SHFL.BFLY PT, R3, R4, 0x1, 0x1f ;
        /*01a0*/              @!P0 BRA `(.L_x_3) ;
.L_x_2:
.L_x_6:
        /*01b0*/                   IADD3 R2, R2, 0x1, RZ ;
        /*01c0*/                   BRA `(.L_x_6);
        /*01d0*/                   EXIT ;
"""


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "kernel.py"
    path.write_text("def k():\n    s = tl.where(allowed, s, NEG)\n    s = s + bias\n")
    return str(path)


def test_parse_finds_labels_branches_and_source_lines(src):
    prog = sass.parse(listing(src))
    assert len(prog.instrs) == 30
    assert prog.labels == {".L_x_1": 1, ".L_x_3": 5, ".L_x_4": 23, ".L_x_2": 27, ".L_x_6": 27}
    assert prog.instrs[3].opcode == "BRA" and prog.instrs[3].target == ".L_x_1"
    assert prog.instrs[8].opcode == "MUFU.LG2"  # the predicate is not part of the opcode
    assert prog.instrs[0].source is None and prog.instrs[5].source == (src, 3)
    # backward branches only: .L_x_2 is a forward jump
    assert sass.loops(prog) == [(1, 3), (23, 24), (5, 26), (27, 28)]


def test_hot_loop_is_the_unmasked_mma_loop_counted_once_per_instruction(src):
    prog = sass.parse(listing(src))
    first, last = sass.hot_loop(prog, sass.source_mentions("allowed"))
    assert (first, last) == (5, 26)
    counts = sass.mix(prog.instrs[first:last + 1])
    expected = {"mma": 2, "mufu.ex2": 1, "mufu.lg2": 1, "mufu.rcp": 1, "mufu.other": 1, "ldg": 1, "ldgsts": 1,
                "shared": 1, "local": 1, "int": 3, "ffma": 2, "fmul": 1, "fadd": 1, "fp.other": 1, "convert": 1,
                "other": 3, "total": 22}
    assert dict(counts) == expected
    assert sum(counts[c] for c in sass.COLUMNS) == counts["total"]


def test_split_band_far_loop_is_the_hot_one_and_near_its_other(tmp_path):
    """Two unmasked MMA loops (KERPLE-log's far and near tiles): the one with a `far` source line is
    the hot loop, near=True gives the other; without a `far` test both are refused as ambiguous."""
    path = tmp_path / "kernel.py"
    path.write_text("def k():\n    far_h = a5 * delta + a4\n    s = s + bias\n")
    text = "".join(f"""
.L_x_{n}:
\t//## File "{path}", line {line}
        /*0{n}00*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0{n}10*/                   FFMA R4, R4, R5, R6 ;
        /*0{n}20*/              @!P0 BRA `(.L_x_{n}) ;""" for n, line in ((1, 3), (2, 2)))
    prog = sass.parse(text)
    masked, far = sass.source_mentions("allowed"), sass.source_mentions("far_h")
    assert sass.hot_loop(prog, masked, far) == (3, 5)
    assert sass.hot_loop(prog, masked, far, near=True) == (0, 2)
    with pytest.raises(ValueError, match="found 2 of 2 MMA loops"):
        sass.hot_loop(prog, masked)


def test_hot_loop_refuses_when_every_mma_loop_is_masked(src):
    prog = sass.parse(listing(src))
    with pytest.raises(ValueError, match="found 0 of 2 MMA loops"):
        sass.hot_loop(prog, lambda source: True)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_plain_forward_compiles_and_its_row_reaches_the_doc(tmp_path):
    """One real compile (~10 s): the tool finds the loop in nvdisasm's own output and writes its section."""
    out = tmp_path / "bench.md"
    out.write_text("# Benchmarks\n\nkept\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    # A cache of its own: a cubin cached from another checkout carries that checkout's source paths in
    # its line info, and the loop finder reads the source lines through them (seen: a removed worktree).
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton_cache")
    res = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "sass_mix.py"), "--kernels", "fwd",
                          "--schemes", "plain", "--head-dim", "64", "--out", str(out)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nkept\n") and "<!-- bench:sass:begin -->" in text
    assert "compiled for sm_90 on a CPU machine, static counts" in text
    row = next(line for line in text.splitlines() if line.startswith("| fwd | plain"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    total, skipped, per_score, mma, mufu = int(cells[5]), int(cells[6]), float(cells[7]), int(cells[9]), cells[10]
    assert cells[8] == "1.00x" and mma > 0 and total > mma
    # the lazy rescale: acc * alpha (128 x 64 fp32 over 256 threads: 32 FMULs) behind a branch
    assert 32 <= skipped < total / 4
    assert per_score == pytest.approx(total / 32, abs=0.05)  # 128 x 64 tile, 8 warps: 32 scores a thread
    assert int(mufu.split()[0]) > 0 and "/0/0)" in mufu  # the softmax's exp2 only


def test_skippable_counts_what_a_forward_branch_in_the_loop_jumps_over(src):
    text = f"""
.L_x_0:
\t//## File "{src}", line 3
        /*0000*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0010*/              @!P1 BRA `(.L_x_1) ;
        /*0020*/                   FMUL R12, R12, R103 ;
        /*0030*/                   FMUL R13, R13, R103 ;
        /*0040*/                   MUFU.EX2 R5, R5 ;
.L_x_1:
        /*0050*/                   FADD R4, R4, -R5 ;
        /*0060*/              @P0 BRA `(.L_x_0) ;
        /*0070*/                   EXIT ;
"""
    prog = sass.parse(text)
    first, last = sass.hot_loop(prog, sass.source_mentions("allowed"))
    assert (first, last) == (0, 6) and sass.skippable(prog, first, last) == 3
    assert sass.skippable(prog, 2, 6) == 0  # the branch itself outside the range: nothing counted


def test_band_loops_sorts_the_innermost_mma_loops_by_kind(tmp_path):
    """masked (a line mentioning `allowed`), far (`far_h`) and near, each in program order; the loop
    without MMAs and the one around the others are left out."""
    path = tmp_path / "kernel.py"
    path.write_text("def k():\n    far_h = a5 * delta + a4\n    s = s + bias\n    s = tl.where(allowed, s, NEG)\n")

    def loop(n, line, mma=True):
        op = "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0" if mma else "IADD3 R2, R2, 0x1, RZ"
        return f"""
.L_x_{n}:
\t//## File "{path}", line {line}
        /*0{n}00*/                   {op} ;
        /*0{n}10*/              @!P0 BRA `(.L_x_{n}) ;"""
    outer = "\n.L_x_9:" + loop(1, 4) + loop(2, 2) + loop(3, 3) + loop(4, 3, mma=False) + loop(5, 4) + """
        /*0900*/              @!P1 BRA `(.L_x_9) ;"""
    prog = sass.parse(outer)
    bands = sass.band_loops(prog, sass.source_mentions("allowed"), sass.source_mentions("far_h"))
    assert bands == {"masked": [(0, 1), (8, 9)], "far": [(2, 3)], "near": [(4, 5)]}


def test_model_estimate_is_tiles_times_loop_instructions_plus_programs():
    """L = 256 on the forward's 128 x 64 tile: query block 0 walks 2 key tiles, both on the diagonal;
    block 1 walks 4, the first 2 unmasked: 4 masked, 2 near, 2 programs, 8 warps each."""
    tool = load_tool()
    cost = {"blocks": (128, 64), "warps": 8, "masked": 10, "near": 5, "outside": 100}
    assert tool.kernel_estimate(cost, "fwd", 256, r2=1.0) == 8 * (4 * 10 + 2 * 5 + 2 * 100)
    # far tiles only where the scheme has a far loop: at 2048, 100 of the 240 unmasked tiles
    far = {**cost, "far": 1}
    assert tool.kernel_estimate(cost, "fwd", 2048, 1.0) - tool.kernel_estimate(far, "fwd", 2048, 1.0) == 8 * 100 * 4
