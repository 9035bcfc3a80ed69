"""Read a kernel's SASS: disassemble a cubin with the tools inside the triton wheel, find the
inner loop, and count its instructions by the unit that executes them.

The figure that matters for a bias's cost is what one iteration of the hot loop issues: every
iteration handles one BLOCK_M x BLOCK_N tile, and at long sequences nearly all tiles are in the
unmasked band (kernels/bands.py). A loop is the code from a label to a branch back to it; the
hot loop is the innermost one that holds the tensor-core MMAs and none of the mask's code. The
mask is recognised by source line (nvdisasm -g prints the file and line of each instruction):
the masked bands are the only code whose lines mention `allowed` (the mask's variable in both
kernel files). Counts are static: instructions inside the loop under a predicate or a branch
count once, which is what they cost when every score of the tile is real.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

# Columns of the instruction mix, in report order. MUFU is split by function where nvdisasm
# names it; everything not named below lands in "other" (control, moves, uniform datapath,
# barriers, shuffles), so the columns always add up to the total.
COLUMNS = ("mma", "mufu.ex2", "mufu.lg2", "mufu.rcp", "mufu.other", "ldg", "ldgsts", "shared",
           "local", "int", "ffma", "fmul", "fadd", "fp.other", "convert", "other")
_INT = {"IMAD", "IADD3", "IADD", "LOP3", "LOP", "SHF", "SHL", "SHR", "ISETP", "VIADD", "VIMNMX",
        "IMNMX", "SEL", "LEA", "PRMT", "IABS", "SGXT", "BMSK", "POPC", "FLO", "IDP", "BREV", "ISCADD"}
_FP_OTHER = {"FMNMX", "FSEL", "FSETP", "FCHK", "FSWZADD", "FSET"}
_CONVERT = {"F2F", "F2FP", "I2F", "I2FP", "F2I", "F2IP", "I2I"}
_INSTR = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)(.*?);")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')


@dataclass
class Instr:
    opcode: str  # full mnemonic with modifiers, e.g. "MUFU.EX2", "LDG.E.U16"
    target: str | None = None  # a branch's label
    source: tuple[str, int] | None = None  # (file, line) from nvdisasm -g


@dataclass
class Program:
    instrs: list[Instr] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)  # label -> index of the next instruction


def parse(text: str) -> Program:
    """nvdisasm -c [-g] output -> instructions, labels and source lines."""
    prog = Program()
    source = None
    for line in text.splitlines():
        if m := _LINE.search(line):
            source = (m.group(1), int(m.group(2)))
        elif m := _LABEL.match(line):
            prog.labels[m.group(1)] = len(prog.instrs)
        elif m := _INSTR.match(line):
            target = _TARGET.search(m.group(2)) if m.group(1).startswith("BRA") else None
            prog.instrs.append(Instr(m.group(1), target.group(1) if target else None, source))
    return prog


def loops(prog: Program) -> list[tuple[int, int]]:
    """(first, last) instruction indices of each backward branch's loop, last = the branch."""
    out = []
    for i, ins in enumerate(prog.instrs):
        start = prog.labels.get(ins.target) if ins.target else None
        if start is not None and start <= i:
            out.append((start, i))
    return out


def is_mma(opcode: str) -> bool:
    return opcode.split(".")[0] in ("HGMMA", "HMMA")


def hot_loop(prog: Program, masked: Callable[[tuple[str, int]], bool],
             far: Callable[[tuple[str, int]], bool] | None = None, near: bool = False) -> tuple[int, int]:
    """The innermost loop that holds MMAs and no instruction whose source line is `masked`.
    A kernel whose unmasked band is split (KERPLE-log's far and near tiles, kernels/bands.py) has
    two: the one with a `far` source line is the hot one at long lengths (nearly every tile is
    far); near=True picks the other."""
    with_mma = [(a, b) for a, b in loops(prog) if any(is_mma(x.opcode) for x in prog.instrs[a:b + 1])]
    innermost = [(a, b) for a, b in with_mma
                 if not any((c, d) != (a, b) and a <= c and d <= b for c, d in with_mma)]
    hot = [(a, b) for a, b in innermost
           if not any(x.source and masked(x.source) for x in prog.instrs[a:b + 1])]
    if far is not None and len(hot) > 1:
        hot = [(a, b) for a, b in hot
               if any(x.source and far(x.source) for x in prog.instrs[a:b + 1]) != near]
    if len(hot) != 1:
        raise ValueError(f"expected one unmasked MMA loop, found {len(hot)} of {len(innermost)} MMA loops "
                         "(is the cubin built with line info, and does the mask still use `allowed`? A cubin Triton cached "
                         "for another checkout points at that checkout's source files: set TRITON_CACHE_DIR to an "
                         "empty directory)")
    return hot[0]


def band_loops(prog: Program, masked: Callable[[tuple[str, int]], bool],
               far: Callable[[tuple[str, int]], bool]) -> dict[str, list[tuple[int, int]]]:
    """The innermost MMA loops (one per band of the walk, kernels/bands.py) by kind, each list in
    program order: "masked" (code on a `masked` source line: the diagonal's bands), "far" (a `far`
    line: KERPLE-log's far tiles) and "near" (the other unmasked ones). A band the compiler proved
    empty (the forward's first masked band of a causal call without a window) has no loop."""
    with_mma = [(a, b) for a, b in loops(prog) if any(is_mma(x.opcode) for x in prog.instrs[a:b + 1])]
    out: dict[str, list[tuple[int, int]]] = {"masked": [], "far": [], "near": []}
    for a, b in with_mma:
        if any((c, d) != (a, b) and a <= c and d <= b for c, d in with_mma):
            continue  # an outer loop (dk/dv's walk over a group's query heads)
        body = [x.source for x in prog.instrs[a:b + 1] if x.source]
        kind = "masked" if any(masked(s) for s in body) else "far" if any(far(s) for s in body) else "near"
        out[kind].append((a, b))
    return out


def skippable(prog: Program, first: int, last: int) -> int:
    """Instructions of the loop first..last that a forward branch inside it jumps over: code a tile
    runs only when a condition holds (the forward's lazy rescale), so a typical tile issues the
    loop's count minus this."""
    out = 0
    for n in range(first, last + 1):
        x = prog.instrs[n]
        if x.opcode.startswith("BRA") and x.target in prog.labels and n < prog.labels[x.target] <= last + 1:
            out += prog.labels[x.target] - n - 1
    return out


def column(opcode: str) -> str:
    base = opcode.split(".")[0]
    if is_mma(opcode):
        return "mma"
    if base == "MUFU":
        fn = opcode.split(".")[1].lower() if "." in opcode else ""
        return f"mufu.{fn}" if f"mufu.{fn}" in COLUMNS else "mufu.other"
    if base == "LDG":
        return "ldg"
    if base in ("LDGSTS", "UTMALDG"):
        return "ldgsts"
    if base in ("LDS", "STS", "LDSM", "STSM"):
        return "shared"
    if base in ("LDL", "STL"):
        return "local"
    if base in _INT:
        return "int"
    if base in ("FFMA", "FMUL", "FADD"):
        return base.lower()
    if base in _FP_OTHER:
        return "fp.other"
    if base in _CONVERT:
        return "convert"
    return "other"


def mix(instrs: list[Instr]) -> Counter:
    """Instruction counts per column, plus 'total'."""
    counts = Counter(column(x.opcode) for x in instrs)
    counts["total"] = len(instrs)
    return counts


def source_mentions(word: str) -> Callable[[tuple[str, int]], bool]:
    """A `masked` test for hot_loop: the source line contains `word` (files read once, cached)."""
    cache: dict[str, list[str]] = {}

    def test(src: tuple[str, int]) -> bool:
        path, line = src
        if path not in cache:
            try:
                with open(path) as f:
                    cache[path] = f.read().splitlines()
            except OSError:
                cache[path] = []
        lines = cache[path]
        return 0 < line <= len(lines) and word in lines[line - 1]

    return test


def tool(name: str) -> str:
    """Path of nvdisasm / cuobjdump inside the installed triton wheel."""
    import triton  # lazy: triton (~0.15 s) only to find its tools; sass_mix.py's --help imports this module

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: this triton wheel ships no {name}")
    return path


def _run_on_cubin(args: list[str], cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([*args, f.name], check=True, capture_output=True, text=True).stdout


def disassemble(cubin: bytes) -> str:
    """nvdisasm -c -g: code sections only, with each instruction's source line."""
    return _run_on_cubin([tool("nvdisasm"), "-c", "-g"], cubin)


def resource_usage(cubin: bytes) -> dict[str, int]:
    """cuobjdump -res-usage of the kernel: REG (registers per thread), STACK (bytes of stack frame
    per thread: register spills live there) and LOCAL."""
    text = _run_on_cubin([tool("cuobjdump"), "-res-usage"], cubin)
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", text)
    if not m:
        raise ValueError(f"no resource line in cuobjdump output: {text[:200]!r}")
    return {"REG": int(m.group(1)), "STACK": int(m.group(2)), "LOCAL": int(m.group(3))}
