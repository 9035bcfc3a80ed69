"""Imports inside functions only where they defer something heavy, each saying why (issue 46).

An import inside a function hides a dependency from the top of its file. One is kept only where
the top would cost a fast answer (`--help`, a flag, config or missing-file refusal answered without
torch, DeepSpeed, lm-eval, matplotlib or megatron-core), where the import order matters (DeepSpeed
picks its accelerator when imported; the Triton kernels read TRITON_INTERPRET when imported) or for
a package not every run needs; and then a comment on its line, or on the line just above it, says
which: `# lazy: <why>`. One comment may head a run of imports that follow each other in a function.

The files are read with `ast` and `tokenize`: nothing is imported.
"""
import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Every file of the runtime package, the reproduction's analysis, the benchmark helpers, the tools
# and the entry points beside them.
PACKAGES = ("megatron", "study", "benchmarks", "tools")
REASON = re.compile(r"\blaz(?:y|ily)\b\W+\w.{4,}", re.IGNORECASE)  # "lazy: <why>"

# Files other work is changing now, whose function-level imports are not yet explained: each is
# to get its reasons (or lose the import) and then be deleted here. The test fails on a listed file
# that has none left.
PENDING: set[str] = set()  # files not yet checked (none left)


def checked_files(root: Path = REPO) -> list[Path]:
    files = sorted(root.glob("*.py"))
    for package in PACKAGES:
        files += sorted((root / package).rglob("*.py"))
    return files


def comment_lines(source: str) -> dict[int, str]:
    """Line number -> the text of the comment on that line."""
    return {tok.start[0]: tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT}


def unexplained_imports(source: str) -> list[tuple[int, str]]:
    """(line, statement) of each import inside a function without a `lazy: <why>` comment on its
    own lines, on the line just above it, or heading the run of imports it ends."""
    tree = ast.parse(source)
    comments = comment_lines(source)
    lines = source.splitlines()

    def explained(first: int, last: int) -> bool:
        return any(REASON.search(comments.get(n, "")) for n in range(first, last + 1))

    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            run_start = None  # first line of the run of imports this statement belongs to
            for stmt in block:
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    run_start = stmt.lineno if run_start is None else run_start
                    above = run_start - 1
                    heads = above >= 1 and lines[above - 1].strip().startswith("#") and explained(above, above)
                    if in_function and not (explained(run_start, stmt.end_lineno) or heads):
                        found.append((stmt.lineno, lines[stmt.lineno - 1].strip()))
                else:
                    run_start = None
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return sorted(found)


def test_every_import_inside_a_function_says_why():
    missing, pending_seen = [], set()
    for path in checked_files():
        rel = path.relative_to(REPO).as_posix()
        found = unexplained_imports(path.read_text())
        if rel in PENDING:
            if found:
                pending_seen.add(rel)
            continue
        missing += [f"{rel}:{line}: {text}" for line, text in found]
    assert not missing, ("imports inside functions without a reason: move each to the top of its file, or say "
                         "on its line or the line above `# lazy: <what heavy import or which order it defers>`:\n"
                         + "\n".join(missing))
    done = PENDING - pending_seen
    assert not done, f"no unexplained import left in these PENDING files (delete them there): {sorted(done)}"


def test_the_checker_sees_a_missing_reason():
    source = '''
import os


def top():
    return os.sep


def f():
    import torch  # lazy: torch; --help answers without it
    return torch


def g():
    # lazy: DeepSpeed picks its accelerator on import
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    from megatron.model import GPTModel
    return deepspeed, safe_get_full_grad, GPTModel


def h():
    x = 1
    from megatron.config import load_config
    import yaml  # noqa: E401
    return x, load_config, yaml


class C:
    def m(self):
        if self:
            from megatron.model import GPTModel  # pulls in torch
            return GPTModel
        # lazy
        import transformers
        return transformers
'''
    assert unexplained_imports(source) == [
        (25, "from megatron.config import load_config"),   # code above, no comment
        (26, "import yaml  # noqa: E401"),                   # a comment that gives no reason
        (33, "from megatron.model import GPTModel  # pulls in torch"),  # no `lazy:`
        (36, "import transformers"),                          # `# lazy` with no reason after it
    ]


# Fast answers: none of these imports torch (nor DeepSpeed, lm-eval, transformers). Each runs the
# script as `python SCRIPT ...` does and reports which of them it imported.
# the probe of tests/integration/test_cli_fast_answers.py, one definition for both
from tests.integration.test_cli_fast_answers import HEAVY, PROBE  # noqa: E402

# Tools that import torch at their top by design: benchmarks of torch code. build_deepspeed_ops.py
# takes no flags (its --help would build the op).
TORCH_TOOLS = {"bench_attention.py", "bench_checkpoint_manifest.py", "bench_data_loader.py", "bench_eval_forward.py",
               "bench_gqa_memory.py", "bench_train_step.py", "build_deepspeed_ops.py", "gpu_results.py"}
ENTRY_POINTS = ["deepy.py", "train.py", "evaluate.py", "eval.py", "generate.py"]
FAST = ([(script, ["--help"], 0) for script in ENTRY_POINTS]
        + [(f"tools/{p.name}", ["--help"], 0) for p in sorted((REPO / "tools").glob("*.py")) if p.name not in TORCH_TOOLS]
        + [("deepy.py", ["train.py", "configs/no-such-config.yml"], 2),  # a config refusal
           ("deepy.py", ["train.py", "configs/quickstart_rotary.yml", "-o", "pos-emb=kerple-log"], 2),  # a pos-emb refusal
           ("deepy.py", ["train.py", "configs/quickstart.yml", "-o", "num-layers=0"], 2),  # it sets attention-backend
           ("evaluate.py", ["--checkpoint", "no-such-checkpoint"], 2)])  # a missing checkpoint


def test_every_tool_is_either_checked_or_imports_torch_by_design():
    tools = {p.name for p in (REPO / "tools").glob("*.py")}
    assert TORCH_TOOLS <= tools, f"no such tool (delete it from TORCH_TOOLS): {sorted(TORCH_TOOLS - tools)}"


def _name(case) -> str:
    script, argv, _ = case.values if hasattr(case, "values") else case
    return " ".join([script, *argv])


@pytest.mark.parametrize("script,argv,status", FAST, ids=[_name(c) for c in FAST])
def test_fast_answers_import_no_torch(script, argv, status):
    proc = subprocess.run([sys.executable, "-c", PROBE.format(root=str(REPO), heavy=HEAVY), str(REPO / script), *argv],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == status, proc.stderr[-2000:]
    heavy = proc.stderr.rsplit("HEAVY=", 1)[1].strip()
    assert heavy == "", f"{script} {' '.join(argv)} imported {heavy}"
