"""Scripts parse arguments and call the package (issue 57): every entry point and tool is under 150
lines, and no test imports a script or reaches tools/ through sys.path; what a test needs is in
megatron/ (or study/, benchmarks/) and imported from there."""
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*REPO.glob("*.py"), *REPO.glob("tools/**/*.py")])
SCRIPT_MODULES = {p.stem for p in REPO.glob("*.py")} | {"tools"}
MAX_LINES = 150


def test_every_script_is_under_150_lines():
    assert len(SCRIPTS) > 10, "found too few scripts: is REPO right?"
    long = {str(p.relative_to(REPO)): n for p in SCRIPTS if (n := len(p.read_text().splitlines())) >= MAX_LINES}
    assert not long, f"scripts of {MAX_LINES} lines or more (move their logic into the package): {long}"


def test_no_test_imports_a_script_or_edits_sys_path():
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text, filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(REPO)}:{node.lineno}: imports {n}" for n in names
                      if n.split(".")[0] in SCRIPT_MODULES]
        for m in re.finditer(r"(sys\.path\.(insert|append)|spec_from_file_location|run_path)\([^)\n]*tools", text):
            found.append(f"{path.relative_to(REPO)}: {m.group(0)}")
    assert not found, "tests reaching scripts (import the package module instead):\n" + "\n".join(found)
