"""The runtime package (megatron/) never imports what sits beside it for the reproduction and the
benchmarks (study/, benchmarks/): a training or evaluation run must not depend on the analysis of
many runs, and the study can change without touching what users run (issue 46)."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUTSIDE = ("study", "benchmarks", "tools", "tests")


def test_megatron_imports_nothing_from_outside_the_runtime_package():
    bad = []
    for path in sorted((REPO / "megatron").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            bad += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names if n.split(".")[0] in OUTSIDE]
    assert not bad, bad


def test_the_study_and_benchmarks_are_not_in_the_runtime_package():
    assert not (REPO / "megatron" / "study").exists() and not (REPO / "megatron" / "benchmarks").exists()
    assert (REPO / "study" / "__init__.py").is_file() and (REPO / "benchmarks" / "__init__.py").is_file()


def test_no_tool_edits_sys_path():
    """`make setup` installs the checkout as a package (pyproject.toml), so a tool imports `megatron`,
    `study` and `benchmarks` as any user script would; no preamble puts the repository on sys.path."""
    found = [f"{p.relative_to(REPO)}" for p in sorted((REPO / "tools").rglob("*.py")) if "sys.path" in p.read_text()]
    assert not found, found


def test_config_imports_nothing_from_the_model():
    """config/ is pure data below model/ (issue 46: config/model_size.py imported model.gpt for the
    scheme's spec, which now lives with the schemes: megatron/positional/base.py)."""
    bad = []
    for path in sorted((REPO / "megatron" / "config").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names
                    if n.startswith(("megatron.model", "megatron.training", "megatron.checkpoint"))]
    assert not bad, bad
